"""Measuring configurations against each other: interleaved fresh-process runs, failures kept,
partial results handed out after every run (so an interrupted or crashed comparison loses only
the configuration that was running).

Used by :mod:`fastloop.drivers.ab` and :mod:`fastloop.drivers.ladder`; knows no speedup names.

Example:
    >>> fake = lambda t, s, **k: {"step_s_all": [0.01 if s == "none" else 0.005] * 5, "speedups": [],
    ...                           "items_per_step": 8, "throughput": {"value": 1.0, "unit": "samples/s"},
    ...                           "data_wait_frac": 0.0, "loss": {"first": 1.0, "last": 0.5}}
    >>> runs = measure_interleaved("x", ["none", "bf16"], 3, measure=fake, steps=5, warmup=1, device="cpu")
    >>> compare(runs["none"], runs["bf16"])["ratio"]
    2.0
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from fastloop.errors import ConfigurationFailed
from fastloop.measure.run_result import RunResult
from fastloop.measure.stats import one_run_ci, run_ratio_ci, summarize, verdict

__all__ = [
    "VERDICT_CONFIDENCE",
    "Runs",
    "compare",
    "compare_verdict",
    "measure_interleaved",
    "merge_runs",
    "per_item",
    "step_rate_of",
    "unsteady_note",
]

VERDICT_CONFIDENCE = 0.97
"""Confidence of the intervals behind every verdict. With 5 interleaved runs per side it keeps
A-vs-A "significant" below 5% and detects a true 10% speed-up in ~90% of experiments under a
noise model of 3% per fresh process and 1% per step (tests/test_stats_simulation.py)."""


@dataclass
class Runs:
    """Every run of one configuration: the documents of those that finished, and the failures."""

    spec: str
    docs: list[dict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    returncodes: list[int | None] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    """The failed processes' stderr (the user's frames when their code raised)."""
    settled: str = ""
    """Why this configuration is not run again although it has fewer runs than asked (``done``)."""

    @property
    def ok(self) -> bool:
        return bool(self.docs)


def measure_interleaved(
    target: str,
    specs: list[str],
    repeats: int,
    *,
    measure: Callable[..., dict],
    steps: int,
    warmup: int,
    device: str,
    runs: dict[str, Runs] | None = None,
    progress: Callable[[str], None] | None = None,
    on_run: Callable[[], None] | None = None,
    up_to: int | None = None,
    done: Callable[[str, dict], str] | None = None,
    stop: Callable[[str], bool] | None = None,
    told: dict[str, float | None] | None = None,
    order: list[str] | None = None,
    counterbalance: bool = True,
) -> dict[str, Runs]:
    """``repeats`` rounds of one run per spec, counterbalanced (A B, then B A, A B, B A, ...: the
    order of each round alternates, so drift between consecutive processes, such as warm caches
    or GPU clocks favouring the second, lands on both sides alike; ``counterbalance=False``: the
    older fixed order A B A B); each run's spec is appended to ``order`` as it starts. The runs
    stay paired by round. ``measure`` is called with
    ``profile=True`` for a spec's first run only (the GPU profile is taken once per configuration).
    ``done(spec, doc)``, after each run, may return a reason to run that spec no more (the
    ladder: the candidate's speedup skipped itself, so further runs would measure the base again).
    With ``up_to``, a spec that
    already has that many runs is not run again (runs are topped up, still interleaved). A failed
    run is kept as a failure and the spec is not run again; ``on_run`` is called after every run.
    ``stop(spec)``, before each run, may end the whole measurement (the ladder's budget).
    ``told``: the step rate (steps/s) to declare to a spec's runs (``measure(..., step_rate=)``)."""
    runs = runs if runs is not None else {}
    for spec in specs:
        runs.setdefault(spec, Runs(spec))
    for _ in range(repeats):
        done_rounds = min(len(runs[s].docs) + len(runs[s].failures) for s in specs)
        for spec in specs[::-1] if counterbalance and done_rounds % 2 else specs:
            r = runs[spec]
            if r.failures or r.settled or (up_to is not None and len(r.docs) >= up_to):
                continue
            if stop is not None and stop(spec):
                return runs
            if progress:
                progress(f"run {len(r.docs) + 1} of {spec or 'none'}")
            if order is not None:
                order.append(spec)
            try:
                # the first run of each configuration profiles its GPU; the others skip that cost
                rate = (told or {}).get(spec)
                r.docs.append(
                    measure(
                        target,
                        spec,
                        steps=steps,
                        warmup=warmup,
                        device=device,
                        profile=not r.docs,
                        **({"step_rate": rate} if rate else {}),
                    )
                )
                if done is not None:
                    r.settled = done(spec, r.docs[-1]) or ""
            except ConfigurationFailed as err:
                r.failures.append(str(err))
                r.returncodes.append(err.returncode)
                r.details.append(err.detail)
            if on_run:
                on_run()
    return runs


def loss_finite(doc: dict) -> bool:
    """False when the run's loss went NaN/inf (the runner sets ``loss_finite``)."""
    return RunResult.from_dict(doc).loss_finite is not False


def loss_agreement(a: list | None, b: list | None, tail: int = 50) -> dict | None:
    """How far B's per-step losses are from A's (same seed, so the same batches in the same order).

    ``max_rel_diff``: the largest per-step ``|b - a| / |a|``; ``tail_rel_diff``: the relative
    difference of the mean over the last ``tail`` steps (a quarter of the run when shorter), the
    figure that says whether B trains to the same loss. None without comparable finite losses.

    Example:
        >>> d = loss_agreement([2.0, 1.0, 0.5, 0.5], [2.0, 1.1, 0.5, 0.5])
        >>> round(d["max_rel_diff"], 3), d["identical"], d["steps"]
        (0.1, False, 4)
    """
    if not a or not b:
        return None
    pairs = [
        (float(x), float(y))
        for x, y in zip(a, b)
        if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
    ]
    if not pairs:
        return None
    rel = [abs(y - x) / max(abs(x), 1e-12) for x, y in pairs]
    k = min(tail, max(1, len(pairs) // 4))
    ma = sum(x for x, _ in pairs[-k:]) / k
    mb = sum(y for _, y in pairs[-k:]) / k
    return {
        "steps": len(pairs),
        "max_rel_diff": max(rel),
        "tail_steps": k,
        "a_tail_mean": ma,
        "b_tail_mean": mb,
        "tail_rel_diff": (mb - ma) / max(abs(ma), 1e-12),
        "identical": all(x == y for x, y in pairs),
    }


def loss_line(agreement: dict | None, a: str = "A", b: str = "B") -> str | None:
    """One sentence for the reports."""
    if not agreement:
        return None
    if agreement.get("comparable") is False:
        return str(agreement.get("note") or "not compared")
    if agreement["identical"]:
        return f"{b}'s loss equals {a}'s at every one of {agreement['steps']} steps (bitwise)."
    return (
        f"{b} vs {a} over {agreement['steps']} steps (first run of each, same batches): mean of the last "
        f"{agreement['tail_steps']} steps {agreement['b_tail_mean']:.4f} vs {agreement['a_tail_mean']:.4f} "
        f"({100 * agreement['tail_rel_diff']:+.3g}%); largest per-step difference "
        f"{100 * agreement['max_rel_diff']:.3g}%."
    )


def merge_runs(runs: Runs) -> dict:
    """One measured configuration from all of its runs (statistics over every measured step)."""
    if not runs.docs:
        return {
            "spec": runs.spec,
            "failed": True,
            "reason": runs.failures[-1] if runs.failures else "not run",
            "speedups": [],
            "repeats": 0,
        }
    doc = dict(runs.docs[-1])
    results = [RunResult.from_dict(r) for r in runs.docs]
    steps_all = [x for r in results for x in r.step_s_all]
    doc["step_s"] = summarize(steps_all)
    doc["run_mean_step_s"] = [sum(r.step_s_all) / len(r.step_s_all) for r in results]
    doc["run_measured_s"] = [sum(r.step_s_all) for r in results]  # each run's window: its steps' times summed
    short = sorted({r.window_short for r in results if r.window_short})
    if short:
        doc["window_short"] = short
    tp = results[-1].throughput
    if tp.value and all(_items(r) for r in runs.docs):
        # every item trained over all measured time (runs may differ in batch size: the search's choice)
        items = sum(_items(d) * len(r.step_s_all) for d, r in zip(runs.docs, results))
        doc["throughput"] = {"value": items / sum(steps_all), "unit": tp.unit}
    for key in ("data_wait_frac", "host_wait_frac", "host_fetch_s", "host_copy_s"):  # per-run figures: their mean
        values = [getattr(r, key) for r in results if getattr(r, key) is not None]
        doc[key] = sum(values) / len(values) if values else None
    doc["warnings"] = sorted({w for r in results for w in r.warnings})
    if not all(r.loss_finite is not False for r in results):
        doc["loss_finite"] = False
        doc["warnings"].append("the loss was not finite (NaN/inf) in at least one run: its speed says nothing")
    profiled = [r.gpu_profile for r in results if r.gpu_profile]
    doc["gpu_profile"] = profiled[0] if profiled else None  # only the first run is profiled
    doc["repeats"] = len(runs.docs)
    doc["spec"] = runs.spec
    if runs.failures:
        doc["failures"] = runs.failures
    return doc


def _items(doc: dict) -> int | None:
    items = RunResult.from_dict(doc).items_per_step
    return int(items) if isinstance(items, (int, float)) and items > 0 else None


def per_item(a: Runs, b: Runs) -> bool:
    """True when the two sides train on different numbers of items per step (a batch-size change):
    then they are compared by time per item (1 / throughput), not by time per step."""
    if not a.docs or not b.docs:
        return False
    counts = [_items(r) for r in a.docs + b.docs]
    return None not in counts and len(set(counts)) > 1


def compare(
    a: Runs,
    b: Runs,
    confidence: float = VERDICT_CONFIDENCE,
    one_run: bool = False,
    paired: bool = True,
    labels: tuple[str, str] | None = None,
) -> dict | None:
    """Run-level CI of mean step time A / B (``ratio > 1``: B faster), None if a side has no run.
    The verdict names the two configurations: ``labels`` (A's, B's), else the runs' specs.

    ``one_run``: B has one run; the interval is :func:`~fastloop.measure.stats.one_run_ci`'s
    (B's run against the spread of A's runs), which the ladder uses only to stop early.

    When the sides train on different numbers of items per step (``batch_size``), each run's step
    times are divided by its items per step first: the ratio is then one of throughputs, B / A.
    Runs are paired when both sides have the same count (they were interleaved).

    Example:
        >>> a = Runs("x", docs=[{"step_s_all": [0.01] * 10, "items_per_step": 16}] * 3)
        >>> b = Runs("y", docs=[{"step_s_all": [0.05] * 10, "items_per_step": 128}] * 3)
        >>> d = compare(a, b)
        >>> round(d["ratio"], 2), d["per"]
        (1.6, 'item')
    """
    if not a.docs or not b.docs:
        return None
    by_item = per_item(a, b)

    def times(r: dict) -> list[float]:
        steps = RunResult.from_dict(r).step_s_all
        return [t / _items(r) for t in steps] if by_item else steps

    if one_run:
        ci = one_run_ci([times(r) for r in a.docs], times(b.docs[-1]), confidence=confidence)
    else:
        ci = run_ratio_ci([times(r) for r in a.docs], [times(r) for r in b.docs], confidence=confidence, paired=paired)
    out = ci.to_dict()
    out["confidence"] = confidence
    out["per"] = "item" if by_item else "step"
    if by_item:
        out["items_per_step"] = {"a": sorted({_items(r) for r in a.docs}), "b": sorted({_items(r) for r in b.docs})}
    tainted = not all(loss_finite(r) for r in a.docs + b.docs)
    if tainted:
        out["significant"] = False
        out["tainted"] = "the loss was not finite in a run: no verdict"
    out["verdict"] = compare_verdict(ci, tainted, labels=labels or (a.spec or "A", b.spec or "B"))
    return out


def compare_verdict(ci, tainted: bool = False, labels: tuple[str, str] = ("A", "B")) -> str:
    """The verdict, naming the two configurations (``labels``: A's, then B's)."""
    if tainted:
        return "no verdict: the loss was not finite (NaN/inf) in at least one run"
    return verdict(ci, label_a=labels[0], label_b=labels[1])


def unsteady_note(*sides: Runs) -> str:
    """What a verdict must say when some of its runs never reached a steady rate (their window
    ran out while the rate still drifted): "" when every run was steady.

    Example:
        >>> unsteady_note(Runs("a", docs=[{"steady": False}, {"steady": True}]), Runs("b", docs=[{}]))
        '; 1 of 3 runs never reached a steady rate (their figures are the mean over a drifting window)'
    """
    docs = [RunResult.from_dict(d) for r in sides for d in r.docs]
    bad = sum(d.steady is False for d in docs)
    if not bad:
        return ""
    return (
        f"; {bad} of {len(docs)} runs never reached a steady rate (their figures are the mean over a drifting window)"
    )


def step_rate_of(runs: Runs | None) -> float | None:
    """How fast the step of ``runs``' configuration goes without data wait (steps/s), from its
    measured runs; None when it has none. The ladder declares a feed candidate's base rate to the
    candidate's runs (``RunInputs.step_rate``); the A/B declares A's to B when B adds only feed
    speedups to A: ``workers`` weighs its loader rates against it.

    Example:
        >>> r = Runs("bf16"); r.docs.append({"step_s_all": [0.01, 0.01], "data_wait_frac": 0.5})
        >>> round(step_rate_of(r), 6), step_rate_of(Runs("none"))
        (200.0, None)
    """
    merged = RunResult.from_dict(merge_runs(runs) if runs is not None and runs.docs else {})
    mean = merged.step_s.mean
    if not mean:
        return None
    return 1.0 / (mean * (1.0 - min(0.99, merged.data_wait_frac or 0.0)))
