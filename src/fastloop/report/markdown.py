"""Markdown: a table a user can paste into a pull request."""

from __future__ import annotations

from fastloop.compare import loss_line
from fastloop.measure.stats import MIN_EFFECT
from fastloop.report.fit import fit_share_lines
from fastloop.report.format import check_lines, ranks_lines, rows, selected_line, warning_lines
from fastloop.report.ladder_fit import HEADING, fit_objective_lines, fit_phase_rows

__all__ = ["applied_changes", "render_markdown"]


def search_story(doc: dict) -> list[str]:
    """The staged search as a list: each stage with the bottleneck then and what it tried, what
    the ablation removed, and what the budget left untried."""
    out: list[str] = []
    if doc.get("stages"):
        out += ["", "**The search:**"]
        for st in doc["stages"]:
            out.append(
                f"1. *{st['stage']}* on `{st['configuration']}`: {st.get('bottleneck') or 'bottleneck unknown'}"
                f" — {st['action']}"
            )
    removed = [r["decision"] for r in doc.get("rungs", []) if r.get("ablation")]
    if removed:
        out += ["", "**Ablation** (each member taken out in turn):"] + [f"- {d}" for d in removed]
    if doc.get("not_tried"):
        out += [
            "",
            "**Not tried:** "
            + "; ".join(f"{t['name']} ({t['why']}{_plan(t)}, at {t['stage']})" for t in doc["not_tried"]),
        ]
    windows = [e["measured_s"] for e in doc.get("run_log") or [] if e.get("measured_s") is not None]
    if windows:
        asked = f" (asked: {doc['measure_s']:g} s of steady steps)" if doc.get("measure_s") else ""
        out += [
            "",
            f"**Measured windows:** {len(windows)} runs measured {min(windows):.2f}-{max(windows):.2f} s each"
            f"{asked}; each run's seconds are in the JSON's `run_log`.",
        ]
    if doc.get("cut_short"):
        out += [
            "",
            "**Cut short by the budget** (measured, the interval still too wide to call): "
            + "; ".join(f"{t['name']} ({t['runs']} run(s), at {t['stage']})" for t in doc["cut_short"]),
        ]
    if doc.get("ties"):
        out += [
            "",
            "**Ties within the noise** (the simpler kept): "
            + "; ".join(
                f"`{t['kept']}` over `{t['other']}` ({t['ratio']:.2f}x [{t['ci_low']:.2f}, {t['ci_high']:.2f}]"
                f"{f', apart by under {100 * MIN_EFFECT:g}%' if t.get('negligible') else ''})"
                for t in doc["ties"]
                if t.get("ci_low") is not None and t.get("ci_high") is not None
            ),
        ]
    return out


def _measured_steps(doc: dict) -> list[str]:
    """The line that says how many steps each configuration measured (and why some measured fewer)."""
    lines: list[str] = []
    if doc.get("kind") == "ladder":
        configs = [(r.get("rung"), r) for r in doc.get("rungs", [])]
    elif doc.get("kind") == "ab":
        configs = [("A", doc.get("a") or {}), ("B", doc.get("b") or {})]
    else:
        configs = [("run", doc)]
    steps = sorted({(c.get("steps"), c.get("warmup_steps")) for _, c in configs if c.get("steps")})
    cut = sorted(
        {
            (c["steps_planned"], c.get("measure_s"))
            for _, c in configs
            if c.get("steps") and c.get("steps_planned") and c["steps"] < c["steps_planned"]
        }
    )
    if steps:
        by_warmup: dict = {}
        for n, w in steps:
            by_warmup.setdefault(w, []).append(n)
        lines.append(
            "Measured "
            + "; ".join(
                f"{min(ns)}{'-' + str(max(ns)) if len(ns) > 1 else ''} steps after {w} warm-up"
                for w, ns in by_warmup.items()
            )
            + "."
            + "".join(
                f" Runs whose {planned} steps would have taken over {limit:g} s measured fewer (--measure-s)."
                for planned, limit in cut
                if limit
            )
            + "".join(
                f" {name}: {c['warmup_drain_steps']} of its warm-up steps drained the loader's prefetch buffer."
                for name, c in configs
                if c.get("warmup_drain_steps")
            )
        )
    return lines


def render_markdown(doc: dict) -> str:
    env = doc.get("env", {})
    lines = [
        "<!-- fastloop-report -->",
        f"# fastloop {doc.get('kind', 'run')}: `{doc.get('target')}`",
        "",
        f"{env.get('gpu') or 'CPU'} | torch {env.get('torch')} | {env.get('lightning')} | "
        f"fastloop {doc.get('fastloop_version')} ({env.get('commit') or 'no commit'}) | {env.get('date')}",
        "",
    ]
    ladder = doc.get("kind") == "ladder"
    if doc.get("interrupted") or doc.get("partial"):
        lines += [
            "**"
            + ("Interrupted" if doc.get("interrupted") else "In progress")
            + ":** this report holds the configurations finished so far.",
            "",
        ]
    sel = selected_line(doc)
    if sel:
        lines += [f"**{sel}**", ""]
        if doc.get("callbacks_line"):
            lines += (
                ["```python", doc["callbacks_line"]]
                + ([doc["loop_line"]] if doc.get("loop_line") else [])
                + ["```", ""]
            )
    head = ["configuration", "median step", "IQR", "throughput", "data wait", "peak mem", "compile", "MFU"]
    if ladder:
        head += ["vs previous", "vs baseline", "bottleneck", "decision"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for r in rows(doc):
        if r["status"] in ("skipped", "failed"):  # a ladder's decision column holds the reason
            name = r["name"] + (f" ({r['status']})" if ladder else f" ({r['status']}: {r['reason']})")
        else:
            name = r["name"]
        cells = [name, r["step"], r["spread"], r["throughput"], r["wait"], r["mem"], r["compile"], r["mfu"]]
        if ladder:
            cells += [r["vs_prev"], r["vs_base"], r["bottleneck"], r["decision"].replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += _measured_steps(doc)
    lines.append(
        "Throughput and ratios use the mean step time (total time / steps: a bursty loader makes the median lie); "
        "ratio = before / after; (n.s.) = not significant. "
        + (f"Method: {doc['method']}." if doc.get("method") else "95% bootstrap CI over the steps of one run.")
    )
    if ladder and doc.get("runs"):
        lines.append(
            f"The ladder ran {doc['runs']} configuration runs (each a fresh process, {doc['run_s_mean']:.1f} s on "
            f"average) in {doc.get('wall_s', 0):.0f} s."
        )
    lines += search_story(doc) + _whole_fit(doc)
    checked = check_lines(doc)
    if checked:
        lines += ["", f"**Check** (does the pick train as the baseline?): {checked[0]}"] + [
            f"- {c}" for c in checked[1:]
        ]
    for move in doc.get("moves", []):
        lines += ["", f"**Bottleneck moved** {move}"]
    if doc.get("kind") == "ab":
        lines += ["", f"**Verdict:** {doc['verdict']}"]
        if loss_line(doc.get("loss_agreement")):
            lines += ["", f"**Loss:** {loss_line(doc.get('loss_agreement'))}"]
    if doc.get("diagnosis"):
        d = doc["diagnosis"]
        lines += ["", f"**Diagnosis:** {d['bottleneck']} — {d['evidence']} Next: {d['recommendation']}"]
    if ranks_lines(doc):
        lines += [""] + [f"- {line}" for line in ranks_lines(doc)]
    warns = [f"- {line}" for line in warning_lines(doc)]
    if warns:
        lines += ["", "Warnings:"] + warns
    skipped = [
        s
        for c in ([doc] if doc.get("speedups") else doc.get("rungs", []))
        for s in c.get("speedups", [])
        if s["status"] != "applied"
    ]
    if skipped:
        lines += ["", "Not applied:"] + sorted({f"- `{s['name']}` {s['status']}: {s['reason']}" for s in skipped})
    changed = applied_changes(doc)
    if changed:
        lines += ["", "What the applied speedups changed:"] + [f"- `{n}`: {d}" for n, d in sorted(changed.items())]
    return "\n".join(lines) + "\n"


def _whole_fit(doc: dict) -> list[str]:
    """What the report says of the whole fit: the share of it the step figures cover, and a ladder's
    fit objective (:func:`fit_objective_markdown`)."""
    return [f"\n**The whole fit:** {note}" for note in fit_share_lines(doc)] + fit_objective_markdown(doc)


def fit_objective_markdown(doc: dict) -> list[str]:
    """A ladder aimed at the fit: its section (the phases plain vs pick, then its lines); [] otherwise."""
    lines = fit_objective_lines(doc)
    if not lines:
        return []
    out = ["", f"**{HEADING}**", ""]
    if fit_phase_rows(doc):
        out += ["| phase | plain (predicted) | pick (predicted) |", "|---|---|---|"]
        out += [f"| {a} | {b} | {c} |" for a, b, c in fit_phase_rows(doc)] + [""]
    return out + [f"- {line}" for line in lines]


def applied_changes(doc: dict) -> dict[str, str]:
    """Speedup -> what it changed, one line a speedup: a run's own records; a ladder's selected
    set's (its ``selected: ...`` rung), not a rung measured and then dropped (a report that listed
    ``workers: 8 worker processes`` under a pick without workers misled); without a selected rung
    (interrupted), the latest configuration's line of each speedup.

    Example:
        >>> def rung(label, *names):
        ...     return {"rung": label, "speedups": [{"name": n, "status": "applied", "detail": n + "!"} for n in names]}
        >>> applied_changes({"rungs": [rung("+workers", "workers", "bf16"), rung("selected: bf16", "bf16")]})
        {'bf16': 'bf16!'}
        >>> applied_changes({"rungs": [rung("+workers", "workers")]})
        {'workers': 'workers!'}
    """
    configs = [doc] if doc.get("speedups") else doc.get("rungs", [])
    selected = [c for c in configs if str(c.get("rung", "")).startswith("selected: ")]
    changed: dict[str, str] = {}
    for c in selected[-1:] or configs:
        changed.update(
            {s["name"]: s["detail"] for s in c.get("speedups", []) if s["status"] == "applied" and s.get("detail")}
        )
    return changed


def _plan(entry: dict) -> str:
    """A budget entry's arithmetic: 'predicted 9.1 s + 18.0 s reserve > 12.3 s left'."""
    if entry.get("predicted_s") is None or entry.get("left_s") is None:
        return ""
    cold = (
        f" (with a new compiled graph's cold compile, {entry['cold_compile_s']:g} s)"
        if entry.get("cold_compile_s")
        else ""
    )
    return (
        f": predicted {entry['predicted_s']:g} s{cold} + {entry.get('reserve_s') or 0:g} s reserve > "
        f"{entry['left_s']:g} s left"
    )
