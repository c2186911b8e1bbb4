"""The fit objective's part of a ladder's reports (``fastloop ladder --objective fit``): the fit's
predicted time plain vs pick beside the step's speedup, phase by phase, how it was predicted and
why, the fit speedups' rungs and the line to paste for the fit. Rendered from the document's
``fit`` section; a ladder aimed at the step has none, and its reports are as they were.

Example:
    >>> fit_objective_lines({"kind": "ladder"})
    []
"""

from __future__ import annotations

from fastloop.report.format import fmt_s

__all__ = ["HEADING", "fit_objective_lines", "fit_phase_rows"]

HEADING = "The whole fit (--objective fit)"
PHASES = ("startup", "compile", "train", "validation", "checkpoint", "epoch_edges", "host_syncs", "other")


def _ratio(r: dict | None) -> str:
    if not r or r.get("ratio") is None:
        return "1.00x (nothing selected)"
    ends = f" ({r['ci_low']:.2f}-{r['ci_high']:.2f}x)" if r.get("ci_low") and r.get("ci_high") else ""
    return f"{r['ratio']:.2f}x{ends}"


def fit_phase_rows(doc: dict) -> list[tuple[str, str, str]]:
    """(phase, plain, pick) for each phase the predicted fit has, then the whole fit and each further epoch."""
    p = (doc.get("fit") or {}).get("predicted")
    if not p:
        return []
    plain, pick = p["plain"], p["pick"]
    rows = [
        (k, fmt_s(plain["phases"].get(k)), fmt_s(pick["phases"].get(k)))
        for k in PHASES
        if plain["phases"].get(k) or pick["phases"].get(k)
    ]
    rows.append(("the fit", fmt_s(plain["wall_s"]), fmt_s(pick["wall_s"])))
    rows.append(("each further epoch", fmt_s(plain["epoch_s"]), fmt_s(pick["epoch_s"])))
    return rows


def _rung_line(r: dict) -> str:
    what = f"+{r['name']} ({r['phase']})"
    if r["status"] != "applied":
        return f"{what} {r['status']}: {r['reason']}"
    return f"{what}: {r.get('decision') or ''}"


def fit_objective_lines(doc: dict) -> list[str]:
    """The fit objective's lines (none for a ladder aimed at the step): the prediction beside the
    step's speedup, per further epoch, how and why, what it assumes, the fit speedups' rungs."""
    fit = doc.get("fit") if doc.get("objective") == "fit" else None
    if not fit:
        return []
    lines = []
    p = fit.get("predicted")
    if p:
        pick, measured_step = p["pick"], bool(p.get("step_speedup"))
        # the pick's interval is the step's: without a step pick there is none
        spread = f" ({fmt_s(pick['low_s'])}-{fmt_s(pick['high_s'])})" if measured_step else ""
        fit_ratio = _ratio(p["speedup"]) if measured_step else f"{p['speedup']['ratio']:.2f}x"
        lines.append(
            f"{p['for']}: predicted plain {fmt_s(p['plain']['wall_s'])}, pick {fmt_s(pick['wall_s'])}{spread}: "
            f"{fit_ratio} for the fit, against {_ratio(p['step_speedup'])} for the step; each further epoch "
            f"{fmt_s(p['plain']['epoch_s'])} vs {fmt_s(pick['epoch_s'])}"
            + (f" ({p['epoch_speedup']:.2f}x)" if p.get("epoch_speedup") else "")
        )
    else:
        lines.append("the fit's prediction is written once the step's search and the short fits have ended")
    lines.append(f"how: {fit['method']}: {fit['why']}")
    lines.append(f"assumes: {fit['assumes']}")
    for f in fit.get("fits") or []:
        lines.append(f"short fit ({f['label']}, {f['spec']}): {fmt_s(f.get('wall_s'))} on its outside clock")
    lines += [_rung_line(r) for r in fit.get("rungs") or []]
    if fit.get("callbacks_line"):
        lines.append(f"for the fit ({fit['pick_spec']}): {fit['callbacks_line']}")
    return lines
