"""Log lines: one per finished run of a ladder, for output that is not a terminal (a CI log, a
``nohup`` file), printed as the runs finish."""

from __future__ import annotations

__all__ = ["RunLines", "run_line"]


def run_line(entry: dict, k: int, budget: float | None) -> str:
    """One finished run as a log line (output that is not a terminal: a CI log, a nohup file).

    Example:
        >>> run_line({"spec": "bf16", "s": 3.14, "elapsed_s": 41.0,
        ...           "throughput": {"value": 12345.6, "unit": "samples/s"}, "measured_s": 2.04, "steps": 130}, 7, 300)
        'ladder: run 7 (bf16): 12,346 samples/s in 3.1 s (measured 2.04 s, 130 steps); 41 s of the 300 s budget'
    """
    tp = entry.get("throughput") or {}
    rate = f"{tp['value']:,.0f} {tp.get('unit', '')}".strip() if tp.get("value") else "failed"
    of = f" of the {budget:.0f} s budget" if budget else ""
    window = f" (measured {entry['measured_s']:.2f} s, {entry.get('steps')} steps)" if entry.get("measured_s") else ""
    return (
        f"ladder: run {k} ({entry.get('spec')}): {rate} in {entry.get('s', 0):.1f} s{window}; "
        f"{entry.get('elapsed_s', 0):.0f} s{of}"
    )


class RunLines:
    """Prints each finished run of a ladder once, as a line, from the document's run log."""

    def __init__(self) -> None:
        self.printed = 0

    def __call__(self, doc: dict) -> None:
        log = doc.get("run_log") or []
        for k in range(self.printed, len(log)):
            print(run_line(log[k], k + 1, doc.get("budget_s")), flush=True)
        self.printed = len(log)
