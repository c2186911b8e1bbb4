"""Shared formatting of measured configurations (used by Markdown, HTML and the terminal)."""

from __future__ import annotations

import re

from fastloop.measure.stats import MIN_EFFECT

__all__ = [
    "check_lines",
    "compile_cell",
    "config_label",
    "fmt_ratio",
    "fmt_s",
    "rows",
    "selected_line",
    "warning_lines",
]


def fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.2f} ms" if x < 1 else f"{x:.2f} s"


def compile_cell(conf: dict) -> str:
    """A configuration's compile seconds, with what the compile cache did where it did something.

    Example:
        >>> compile_cell({"compile_s": 12.5, "extra": {"compile_cache": {"state": "warm"}}})
        '12.50 s (warm cache)'
    """
    text = fmt_s(conf.get("compile_s"))
    state = ((conf.get("extra") or {}).get("compile_cache") or {}).get("state")
    return f"{text} ({state} cache)" if text != "-" and state in ("cold", "warm", "partly warm") else text


def fmt_ratio(r: dict | None) -> str:
    if not r:
        return "-"
    if r.get("too_few"):
        return f"{r['ratio']:.2f}x (too few runs to tell)"
    if r.get("ci_high") is None:
        return f"{r['ratio']:.2f}x (no interval)"
    mark = "" if r["significant"] else f" (under {100 * MIN_EFFECT:g}%)" if r.get("negligible") else " (n.s.)"
    return f"{r['ratio']:.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}]{mark}"


def selected_line(doc: dict) -> str | None:
    """The ladder's answer in one line: the selected set and what it measured against the baseline."""
    if doc.get("kind") != "ladder" or "selected" not in doc:
        return None
    final = next((r for r in doc.get("rungs", []) if r.get("final")), None)
    vs = fmt_ratio(final.get("speedup_vs_baseline")) if final else "not measured yet"
    tp = (final or {}).get("throughput") or {}
    rate = f", {tp['value']:,.0f} {tp['unit']}" if tp.get("value") else ""
    base = f" ({','.join(doc['base'])})" if doc.get("base") else ""
    return f"selected: {doc.get('selected_spec') or 'none'} ({vs} vs baseline{base}{rate})"


def _deviation(dev: float | None) -> str:
    """A loss deviation of the check of a pick; null where one side's loss was not finite.

    Example:
        >>> _deviation(0.0123), _deviation(None)
        ('0.0123 of the loss', 'a step where only one side had a finite loss')
    """
    return f"{dev:.3g} of the loss" if isinstance(dev, (int, float)) else "a step where only one side had a finite loss"


def check_lines(doc: dict) -> list[str]:
    """The check of a pick against its baseline (a ladder's, or ``ab --check``'s), as lines: its
    verdict, its tolerance and where it comes from, its steps and what it cost; where the losses
    parted, each configuration the search for the cause ran.

    Example:
        >>> check = {"passed": True, "verdict": "passed: x", "steps": 50, "seconds": 6.2, "predicted_s": 5.0,
        ...          "tolerance": {"rel": 0.0, "basis": "exact"}, "runs": [{}, {}]}
        >>> print(check_lines({"check": check})[1])  # doctest: +NORMALIZE_WHITESPACE
        tolerance: 0 of the loss per step (exact); 50 steps a side, seeded, from the same weights;
        2 runs, 6.2 s (5.0 s reserved)
    """
    check = doc.get("check")
    if not check:
        return []
    out = [str(check.get("verdict") or "")]
    tol = check.get("tolerance")
    if tol and check.get("passed") is not None:
        cost = f"; {len(check.get('runs') or [])} runs, {check.get('seconds', 0):.1f} s" if check.get("runs") else ""
        reserved = f" ({check['predicted_s']:.1f} s reserved)" if check.get("predicted_s") is not None else ""
        out.append(
            f"tolerance: {tol['rel']:.3g} of the loss per step ({tol['basis']}); {check.get('steps')} steps a side, "
            f"seeded, from the same weights{cost}{reserved}"
        )
    for both in check.get("on_both_sides") or []:
        out.append(f"on both sides: {both['spec']} ({both['why']})")
    floor = check.get("floor") or {}
    if floor.get("measured"):
        out.append(
            "the baseline run again reproduced itself bit for bit"
            if floor.get("reproducible")
            else f"the baseline run again differed from itself by up to {_deviation(floor.get('max_deviation'))}"
        )
    for step in check.get("bisect") or []:
        part = (
            f"failed: {step['failed']}"
            if step.get("failed")
            else "agrees with the baseline"
            if step.get("passed")
            else f"parts at step {step.get('first_parting_step')} (up to {_deviation(step.get('max_deviation'))})"
        )
        out.append(f"without {step['removed']} ({step['spec']}): {part}")
    return out


def config_label(cfg: dict) -> str:
    applied = [s["name"] for s in cfg.get("speedups", []) if s["status"] == "applied"]
    return "+".join(applied) or "baseline"


def rows(doc: dict) -> list[dict]:
    """One row per measured configuration in a run, ladder or A/B document."""
    kind = doc.get("kind")
    if kind == "ladder":
        items = [(r["rung"], r) for r in doc["rungs"]]
    elif kind == "ab":
        items = [("A: " + doc["a_spec"], doc["a"]), ("B: " + doc["b_spec"], doc["b"])]
    else:
        items = [(config_label(doc), doc)]
    out = []
    for name, c in items:
        tp = c.get("throughput") or {}
        status = c.get("rung_status", "")
        if c.get("failed"):
            status = "failed"
        out.append(
            {
                "name": name,
                "status": status,
                "reason": c.get("rung_reason", ""),
                "step": fmt_s((c.get("step_s") or {}).get("median")),
                "spread": (
                    f"{fmt_s((c.get('step_s') or {}).get('p25'))} - {fmt_s((c.get('step_s') or {}).get('p75'))}"
                    if (c.get("step_s") or {}).get("p25") is not None
                    else "-"
                ),
                "throughput": f"{tp['value']:,.0f} {tp['unit']}" if tp.get("value") else "-",
                "wait": f"{100 * c['data_wait_frac']:.0f}%" if c.get("data_wait_frac") is not None else "-",
                "mem": f"{c['peak_mem_bytes'] / 2**30:.2f} GiB" if c.get("peak_mem_bytes") else "-",
                "compile": compile_cell(c),
                "mfu": f"{100 * c['mfu']:.1f}%" if c.get("mfu") is not None else "-",
                "vs_prev": fmt_ratio(c.get("speedup_vs_prev")),
                "vs_base": fmt_ratio(c.get("speedup_vs_baseline")),
                "decision": c.get("decision")
                or (c.get("rung_reason") if status in ("skipped", "failed", "fallback") else ""),
                "bottleneck": (c.get("bottleneck") or {}).get("bottleneck", ""),
            }
        )
    return out


def ranks_lines(doc: dict) -> list[str]:
    """For a multi-rank run: each rank's figures, the slowest rank, and the scaling efficiency."""
    if not doc.get("ranks"):
        return []
    unit = (doc.get("throughput") or {}).get("unit", "")
    out = [
        f"{doc['world_size']} ranks ({doc.get('strategy', 'ddp')}), slowest rank {doc['slowest_rank']}; "
        f"speedups {'identical on every rank' if doc.get('speedups_agree_across_ranks') else 'DIFFER between ranks'}"
    ]
    for r in doc["ranks"]:
        wait = r.get("data_wait_frac")
        out.append(
            f"rank {r['rank']}: median step {fmt_s(r['step_s']['median'])}, "
            f"{(r.get('throughput') or 0):,.0f} {unit}, data wait {'-' if wait is None else f'{100 * wait:.0f}%'}"
        )
    sc = doc.get("scaling")
    if sc and sc.get("efficiency") is not None:
        out.append(
            f"scaling: 1 device {sc['throughput_1']:,.0f} {unit}, {sc['devices']} devices "
            f"{sc['throughput_n']:,.0f} {unit}: {sc['speedup']:.2f}x, efficiency {100 * sc['efficiency']:.0f}%"
        )
    return out


def warning_lines(doc: dict) -> list[str]:
    """Each warning once, with the configurations it concerns: warnings that differ only in
    their figures count as one (the first one's text is shown). The JSON keeps every occurrence
    per run; this is what the terminal, report.md and report.html print.

    Example:
        >>> doc = {"kind": "ladder", "rungs": [{"rung": "baseline", "warnings": ["x took 1.2 s"]},
        ...                                    {"rung": "+bf16", "warnings": ["x took 1.4 s", "y"]}]}
        >>> warning_lines(doc)
        ['x took 1.2 s (baseline, +bf16)', 'y (+bf16)']
    """
    if doc.get("kind") == "ab":
        configs = [("A", doc.get("a")), ("B", doc.get("b"))]
    elif doc.get("rungs"):
        configs = [(r.get("rung", "run"), r) for r in doc["rungs"]]
    else:
        configs = [("run", doc)]
    groups: dict[str, tuple[str, list[str]]] = {}
    for label, cfg in configs:
        for w in (cfg or {}).get("warnings", []):
            text, where = groups.setdefault(re.sub(r"\d[\d,.]*", "#", w), (w, []))
            if label not in where:
                where.append(label)
    several = len([c for c in configs if c[1]]) > 1
    return [f"{text} ({', '.join(where)})" if several else text for text, where in groups.values()]
