"""The ladder: the baseline, then speedups added one at a time, each rung measured.

Each rung runs in a fresh process (by default) and is repeated ``repeats`` times, rung order
interleaved per repeat so slow drift hits every rung alike. Speedup vs the previous rung and vs
the baseline come with bootstrap CIs over repeats and steps.

Example:
    >>> default_rungs("cpu")[:3]
    ['workers', 'bf16', 'fused_optimizer']
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fastloop.measure.stats import bootstrap_ratio_ci, summarize
from fastloop.speedups.base import Context, resolve

__all__ = ["DEFAULT_RUNGS", "default_rungs", "helpful_speedups", "run_ladder"]

DEFAULT_RUNGS = ["workers", "pin_memory", "prefetch", "tf32", "bf16", "fused_optimizer", "channels_last",
                 "compile", "cuda_graph"]


def default_rungs(device: str, target: str | None = None) -> list[str]:
    """The default ladder for a device (and recipe): rungs that cannot apply there are left out."""
    from fastloop.targets import RECIPE_RUNGS

    ctx = Context(torch.device(device))
    names = DEFAULT_RUNGS + RECIPE_RUNGS.get(target or "", [])
    return [s.name for s in resolve(names) if s.why_not(ctx) is None]


def _ratio(a: dict, b: dict) -> dict:
    # mean step time = 1 / throughput: the honest basis for "how much faster" (see stats)
    return bootstrap_ratio_ci([], [], groups_a=a["_groups"], groups_b=b["_groups"], statistic="mean").to_dict()


def helpful_speedups(doc: dict) -> list[str]:
    """Speedups whose rung was applied and significantly faster than the rung before."""
    out = []
    for r in doc["rungs"][1:]:
        v = r.get("speedup_vs_prev")
        if r.get("rung_status") == "applied" and v and v["significant"] and v["ratio"] > 1:
            out.append(r["rung"].lstrip("+"))
    return out


def run_ladder(target: str, rungs: list[str] | None = None, *, steps: int = 30, warmup: int = 5, repeats: int = 2,
               device: str = "cpu", measure: Callable[..., dict] | None = None,
               progress: Callable[[str], None] | None = None) -> dict:
    """Measure baseline + cumulative rungs; returns the ladder document (without env stamp)."""
    from fastloop.subproc import run_in_subprocess

    measure = measure or run_in_subprocess
    chosen = resolve(rungs if rungs is not None else default_rungs(device, target))
    ctx = Context(torch.device(device))
    plan: list[tuple[str, str, str, str]] = [("baseline", "none", "applied", "")]
    active: list[str] = []
    for s in chosen:
        reason = s.why_not(ctx)
        if reason:
            plan.append((f"+{s.spec}", ",".join(active) or "none", "skipped", reason))
            continue
        active.append(s.spec)
        plan.append((f"+{s.spec}", ",".join(active), "applied", ""))
    results: dict[str, list[dict]] = {spec: [] for _, spec, st, _ in plan if st == "applied"}
    for rep in range(repeats):
        for label, spec, status, _ in plan:
            if status != "applied":
                continue
            if progress:
                progress(f"repeat {rep + 1}/{repeats}: {label}")
            results[spec].append(measure(target, spec, steps=steps, warmup=warmup, device=device))
    rung_docs = []
    for label, spec, status, reason in plan:
        runs = results[spec]  # a skipped rung re-uses the measurement of the configuration it left unchanged
        doc = dict(runs[-1])
        doc.update(rung=label, spec=spec, rung_status=status, rung_reason=reason, repeats=len(runs))
        doc["_groups"] = [r["step_s_all"] for r in runs]
        steps_all = [x for r in runs for x in r["step_s_all"]]
        doc["step_s"] = summarize(steps_all)
        if doc["throughput"]["value"]:
            doc["throughput"] = {"value": doc["items_per_step"] / doc["step_s"]["mean"], "unit": doc["throughput"]["unit"]}
        doc["data_wait_frac"] = sum(r["data_wait_frac"] for r in runs) / len(runs)
        doc["warnings"] = sorted({w for r in runs for w in r.get("warnings", [])})
        # the newest speedup's own record (a rung can apply but its speedup still be skipped inside)
        own = next((s for s in doc["speedups"] if "+" + s["name"] == label.split(":")[0]), None)
        if own and own["status"] != "applied" and status == "applied":
            doc["rung_status"], doc["rung_reason"] = own["status"], own["reason"]
        rung_docs.append(doc)
    for i, doc in enumerate(rung_docs):
        doc["speedup_vs_prev"] = _ratio(rung_docs[i - 1], doc) if i else None
        doc["speedup_vs_baseline"] = _ratio(rung_docs[0], doc) if i else None
    for doc in rung_docs:
        doc.pop("_groups")
    out = {"kind": "ladder", "rungs": rung_docs, "repeats": repeats}
    out["helpful"] = helpful_speedups(out)
    out["callbacks_line"] = (f'Trainer(..., callbacks=fastloop.lightning.callbacks("{",".join(out["helpful"])}"))'
                             if out["helpful"] else "# no speedup helped measurably on this model and machine")
    return out
