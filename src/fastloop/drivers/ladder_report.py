"""The ladder's document helpers: where a rung's step goes, the feed line, and the advice filter
(no advice recommends a speedup the same ladder measured as not faster).

Example:
    >>> join_specs([]), join_specs(["bf16", "compile"])
    ('none', 'bf16,compile')
"""

from __future__ import annotations

from fastloop.compare import VERDICT_CONFIDENCE, Runs, compare, merge_runs, unsteady_note
from fastloop.drivers.doctor import diagnose, without_measured
from fastloop.errors import ConfigurationFailed, FastloopError, UserCodeError
from fastloop.measure.stats import MIN_EFFECT
from fastloop.speedups.base import name_of

__all__ = [
    "_breakdown",
    "_feed_line",
    "filter_advice",
    "join_specs",
    "_measured_not_faster",
    "own_record",
    "baseline_failed",
    "note_run_order",
    "rung_doc",
]


def own_record(doc: dict, spec: str) -> dict | None:
    name = name_of(spec)
    return next((s for s in doc.get("speedups", []) if s["name"] == name), None)


def join_specs(specs: list[str]) -> str:
    return ",".join(specs) or "none"


def _breakdown(doc: dict) -> dict:
    """Where a rung's mean step goes: waiting for data, and the rest (host + GPU work); on CUDA,
    with the run's GPU profile, the rest splits into GPU busy and GPU idle while the host works."""
    mean = (doc.get("step_s") or {}).get("mean")
    wait = doc.get("data_wait_frac")
    if not mean or wait is None:
        return {}
    out = {"step_s": mean, "data_wait_s": mean * wait, "compute_s": mean * (1 - wait), "data_wait_frac": wait}
    busy = (doc.get("gpu_profile") or {}).get("gpu_busy_frac")
    if busy is not None:  # CUDA: the rest of the step splits into GPU busy and GPU idle while the host works
        out["gpu_busy_s"] = mean * busy
        out["host_idle_s"] = max(0.0, mean * (1 - busy - wait))
        out["gpu_busy_frac"] = busy
    return out


def _feed_line(doc: dict) -> str:
    """The loader's rate against the step's demand, from one rung's measurement, and the host's
    time getting each batch where it was timed apart (``host_fetch_s``)."""
    mean = (doc.get("step_s") or {}).get("mean")
    wait = doc.get("data_wait_frac") or 0.0
    items = doc.get("items_per_step")
    if not (mean and items):
        return ""
    demand = items / (mean * (1 - wait)) if wait < 1 else float("inf")
    line = f"the loader delivers ~{items / mean:,.0f} items/s and the step alone would consume ~{demand:,.0f}/s"
    return line + _fetch_clause(doc)


def _fetch_clause(doc: dict) -> str:
    """'; getting a batch takes X ms of the host's time (copy Y ms)' where the feed clock timed it."""
    fetch, copy = doc.get("host_fetch_s"), doc.get("host_copy_s")
    if not fetch:
        return ""
    return f"; getting a batch takes {1e3 * fetch:.2f} ms of the host's time" + (
        f" (the copy to the device {1e3 * copy:.2f} ms of it)" if copy else ""
    )


def _measured_not_faster(rungs: list[dict]) -> dict[str, str]:
    """Speedups this ladder measured and found not faster (a rung of one speedup dropped, or a
    member the ablation found not missed): name -> what was measured."""
    out: dict[str, str] = {}
    for r in rungs:
        ci = r.get("speedup_vs_prev")
        names = r.get("measured_not_faster")
        if (
            names is None
            and str(r.get("rung", "")).startswith("+")
            and str(r.get("decision", "")).startswith("dropped")
        ):
            names = [name_of(r["rung"][1:].partition(" (")[0])] if "," not in r["rung"] else []
        if not names or not ci or ci.get("ratio") is None:
            continue
        span = (
            f" [{ci['ci_low']:.2f}, {ci['ci_high']:.2f}]"
            if ci.get("ci_low") is not None and ci.get("ci_high") is not None
            else ""
        )
        what = "without it " if r.get("ablation") else ""
        sig = (
            ("slower" if ci["ratio"] < 1 else "faster")
            if ci.get("significant")
            else f"less than {100 * MIN_EFFECT:g}%, no meaningful difference"
            if ci.get("negligible")
            else "no significant difference"
        )
        for name in names:
            out[name] = f"{what}{ci['ratio']:.2f}x{span}, {sig}"
    return out


def answer_lines(spec: str, selected: bool, measured: bool, not_tried: int) -> dict[str, str]:
    """The ladder's answer as the lines a user pastes: the callbacks and the plain-loop line for a
    set measured against the baseline, else a comment that says why there is none.

    Example:
        >>> answer_lines("", False, False, 3)["callbacks_line"][:47]
        '# no speedup helped measurably in the budget; 3'
    """
    if selected and measured:
        return {
            "callbacks_line": f'Trainer(..., callbacks=fastloop.lightning.callbacks("{spec}"))',
            "loop_line": f'FastLoop(model, optimizer, loader, loss_fn=..., speedups="{spec}")',
        }
    if selected:
        return {"callbacks_line": "# the selected set was not measured against the baseline (interrupted or failed)"}
    if not_tried:
        return {
            "callbacks_line": f"# no speedup helped measurably in the budget; {not_tried} not tried or not finished "
            f"(see 'Not tried'; a larger --budget measures them)"
        }
    return {"callbacks_line": "# no speedup helped measurably on this model and machine"}


def filter_advice(rungs: list[dict]) -> None:
    """No rung's advice recommends a speedup that this ladder measured as not faster."""
    measured = _measured_not_faster(rungs)
    if not measured:
        return
    for r in rungs:
        if r.get("bottleneck"):
            before = r["bottleneck"].get("recommendation")
            r["bottleneck"] = without_measured(r["bottleneck"], measured)
            moved = r.get("bottleneck_moved")
            if moved and before != r["bottleneck"]["recommendation"] and " next: " in moved:
                r["bottleneck_moved"] = moved.split(" next: ")[0] + " next: " + r["bottleneck"]["recommendation"]


def rung_doc(label: str, spec: str, runs: Runs | None, status: str, reason: str) -> dict:
    """A rung's document: its runs merged, with its bottleneck, step breakdown and feed line."""
    doc = merge_runs(runs) if runs is not None else {"speedups": [], "repeats": 0}
    doc.update(rung=label, spec=spec, rung_status=status, rung_reason=reason)
    if runs is not None and runs.docs:
        doc["bottleneck"] = diagnose(doc)
        doc["breakdown"] = _breakdown(doc)
        feed = _feed_line(doc)
        if feed:
            doc["feed"] = feed
    doc.pop("step_s_all", None)
    doc.pop("wait_s_all", None)
    return doc


def baseline_failed(runs: Runs) -> Exception:
    """The error a failed baseline ends the ladder with: bad input (2), the user's code (1), or the process."""
    rc = runs.returncodes[-1] if runs.returncodes else None
    message = runs.failures[-1] if runs.failures else "the baseline did not run"
    if rc == 2:
        return FastloopError(message.split("failed in its process: ", 1)[-1])
    if rc == 1:
        return UserCodeError(
            f"the baseline configuration failed, so there is nothing to compare against:\n"
            f"{runs.details[-1].strip() if runs.details else message}"
        )
    return ConfigurationFailed(message, rc)


def pooled_final(ci: dict | None, base: Runs, earlier: list[Runs], fresh_base: Runs, fresh_sel: Runs) -> dict | None:
    """The final comparison's interval when the budget cut it before it could call the selected set
    against the baseline: every run of both configurations in the ladder pooled (``base``: the
    baseline's earlier runs; ``earlier``: the selected set's from its own comparisons), a Welch interval (those
    runs were not all interleaved with each other), the cut interleaved one kept beside it. Else
    ``ci`` as it is.

    Example:
        >>> run = lambda s: {"step_s_all": [s] * 30}
        >>> few = lambda *xs: Runs("x", docs=[run(x) for x in xs])
        >>> cut = {"ratio": 1.8, "significant": False, "budget": True, "verdict": "no significant difference"}
        >>> out = pooled_final(cut, few(.040, .050, .045, .056), [few(.027, .028, .027)], few(.049, .042), few(.027, .028))
        >>> out["significant"], out["pooled_runs"], out["interleaved"]["ratio"]
        (True, {'baseline': 6, 'selected': 5}, 1.8)
    """
    if ci is None or not ci.get("budget") or ci.get("significant"):
        return ci
    pooled_base = Runs(fresh_base.spec, docs=([] if base is fresh_base else base.docs) + fresh_base.docs)
    pooled_sel = Runs(fresh_sel.spec, docs=[d for r in earlier if r is not fresh_sel for d in r.docs] + fresh_sel.docs)
    pooled = compare(pooled_base, pooled_sel, confidence=ci.get("confidence") or VERDICT_CONFIDENCE, paired=False)
    if pooled is None or pooled.get("too_few"):
        return ci
    pooled["verdict"] += (
        f" (every run of both in the ladder, Welch: the interleaved final comparison was cut by the "
        f"budget at {ci.get('ratio', 0):.2f}x, not significant)"
    )
    return {
        **pooled,
        "pooled_runs": {"baseline": len(pooled_base.docs), "selected": len(pooled_sel.docs)},
        "interleaved": ci,
        "budget": True,
    }


def note_run_order(ci: dict | None, order: list[str], base: str, reused: int, base_runs: Runs, cand_runs: Runs) -> None:
    """Into a comparison's ``ci``: the order its runs ran in (``run_order``: A its base, B the
    candidate; counterbalanced pairs), how many of the base's runs came from earlier comparisons,
    and in the verdict the runs that never reached a steady rate."""
    if ci is None:
        return
    ci["run_order"] = ["A" if spec == base else "B" for spec in order]
    ci["base_runs_reused"] = reused
    ci["verdict"] = ci.get("verdict", "") + unsteady_note(base_runs, cand_runs)
