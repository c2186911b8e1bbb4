"""A/B: two configurations interleaved (A B A B ...), each run a fresh process; the ratio of
mean step times (1 / throughput) with a bootstrap CI over repeats and steps, and an honest verdict.

Example:
    >>> fake = lambda t, s, **k: {"step_s_all": [0.010 if s == "none" else 0.005] * 5, "speedups": []}
    >>> doc = run_ab("x", "none", "bf16", repeats=3, measure=fake)
    >>> doc["verdict"]
    'B is 2.00x faster (95% CI 2.000-2.000)'
"""

from __future__ import annotations

from collections.abc import Callable

from fastloop.errors import FastloopError
from fastloop.measure.stats import bootstrap_ratio_ci, summarize, verdict
from fastloop.speedups.base import resolve

__all__ = ["run_ab"]


def run_ab(target: str, a: str, b: str, *, repeats: int = 3, steps: int = 30, warmup: int = 5,
           device: str = "cpu", measure: Callable[..., dict] | None = None,
           progress: Callable[[str], None] | None = None) -> dict:
    from fastloop.subproc import run_in_subprocess

    if repeats < 1:
        raise FastloopError(f"--repeats must be >= 1, got {repeats}")
    resolve(a)
    resolve(b)  # validate both before spending time
    measure = measure or run_in_subprocess
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    for rep in range(repeats):
        for side, spec in (("a", a), ("b", b)):
            if progress:
                progress(f"repeat {rep + 1}/{repeats}: {side.upper()} = {spec}")
            runs[side].append(measure(target, spec, steps=steps, warmup=warmup, device=device))
    ci = bootstrap_ratio_ci([], [], groups_a=[r["step_s_all"] for r in runs["a"]],
                            groups_b=[r["step_s_all"] for r in runs["b"]], statistic="mean")
    sides = {}
    for side in ("a", "b"):
        doc = dict(runs[side][-1])
        doc["step_s"] = summarize([x for r in runs[side] for x in r["step_s_all"]])
        if doc.get("throughput", {}).get("value"):
            doc["throughput"] = {"value": doc["items_per_step"] / doc["step_s"]["mean"], "unit": doc["throughput"]["unit"]}
        doc["repeats"] = len(runs[side])
        sides[side] = doc
    return {"kind": "ab", "a_spec": a, "b_spec": b, "a": sides["a"], "b": sides["b"], "repeats": repeats,
            "speedup": ci.to_dict(), "verdict": verdict(ci)}
