"""The ladder's sequential searches (``fastloop ladder --sequential`` and ``--cumulative``): each
candidate in turn on top of the best configuration so far (kept only when significantly
faster), or on top of all before it (the story). The default search is
:mod:`fastloop.drivers.ladder_search`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fastloop.compare import Runs
from fastloop.drivers.ladder_gates import feed_cannot_help, model_says_no
from fastloop.drivers.ladder_report import own_record
from fastloop.drivers.pick_check import check_ladder_pick
from fastloop.speedups.base import Context, resolve  # noqa: F401  (resolve: the docstring's example)

if TYPE_CHECKING:
    from fastloop.drivers.ladder_state import LadderState

__all__ = ["run_sequential", "select_order"]


def select_order(speedups: list, recipe: set[str]) -> list:
    """The order the selecting ladder tries its default rungs in: the general compute rungs, then
    the recipe's own (fp8, fused_loss: made for the compiled step, so tried once compile is in),
    then the data rungs (feed the fast step). Within each group, the registry's order.

    Example:
        >>> [s.name for s in select_order(resolve(["workers", "bf16", "fused_loss", "compile"]), {"fused_loss"})]
        ['bf16', 'compile', 'fused_loss', 'workers']
    """
    return (
        [s for s in speedups if s.changes != "data" and s.name not in recipe]
        + [s for s in speedups if s.changes != "data" and s.name in recipe]
        + [s for s in speedups if s.changes == "data"]
    )


def run_sequential(ladder: LadderState, candidates: list) -> dict:
    """Try ``candidates`` one at a time (see the module's docstring); the ladder's document."""
    ctx = Context(torch.device(ladder.device))
    ladder.base_runs: Runs | None = None
    prev_bottleneck: str | None = None
    last_kept: tuple[dict[str, Runs], str] | None = None
    for s in candidates:
        label = f"+{s.spec}"
        reason = s.why_not(ctx) or model_says_no(ladder, s) or feed_cannot_help(ladder, s)
        if reason:
            ladder.rungs.append(ladder.rung_doc(label, ladder.spec_with([s.spec]), None, "skipped", reason))
            ladder.publish()
            continue
        base_spec = ladder.spec_with()
        cand_spec = ladder.spec_with([s.spec])
        # a feed candidate's runs learn what the step consumes (workers weighs its loader against it)
        fresh, ci, n = ladder.compare_adaptive(base_spec, cand_spec, own=s.spec, tell_rate=s.feeds)
        if ladder.base_runs is None:
            ladder.set_baseline(fresh[ladder.base_spec])
            prev_bottleneck = ladder.rungs[0].get("bottleneck", {}).get("bottleneck")
        cand, base = fresh[cand_spec], fresh[base_spec]
        if cand.failures or base.failures:  # a process died: no verdict, the ladder goes on
            why = cand.failures[-1] if cand.failures else f"its comparison base failed: {base.failures[-1]}"
            ladder.rungs.append(ladder.rung_doc(label, cand_spec, cand, "failed", why))
            ladder.publish()
            continue
        own = own_record(cand.docs[-1], s.spec)
        doc = ladder.rung_doc(label, cand_spec, cand, "applied", "")
        doc["vs_spec"] = base_spec
        doc["runs_per_side"] = n
        if own and own["status"] != "applied":
            doc["rung_status"], doc["rung_reason"] = own["status"], own["reason"]
            doc["speedup_vs_prev"] = None
            doc["decision"] = f"dropped: {own['status']} inside its process ({own['reason']})"
            ladder.rungs.append(doc)
            ladder.publish()
            continue
        doc["speedup_vs_prev"] = ci
        keep = ladder.mode == "cumulative" or bool(ci and ci["significant"] and ci["ratio"] > 1)
        if ladder.mode == "cumulative":
            doc["decision"] = "kept (cumulative ladder)"
        elif keep:
            per = " per item (throughput; its batch size differs)" if ci.get("per") == "item" else ""
            doc["decision"] = f"kept: {ci['ratio']:.2f}x faster than {base_spec}{per}"
        elif ci and n == 1:
            doc["decision"] = (
                f"dropped after one run: {ci['verdict']}, against the spread of "
                f"{len(base.docs)} runs of {base_spec} (prediction interval)"
            )
        elif ci and ci.get("futile"):
            doc["decision"] = (
                f"dropped: {ci['verdict']}; at most {ci['ci_high']:.3f}x faster "
                f"(below {ladder.min_gain}x), so no more runs after {n} a side"
            )
        else:
            doc["decision"] = "dropped: " + (ci["verdict"] if ci else "no comparison")
        if keep:
            ladder.selected.append(s.spec)
            last_kept = (fresh, base_spec)
            ladder.best_runs = {cand_spec: cand}
            now = doc.get("bottleneck", {}).get("bottleneck")
            if now and prev_bottleneck and now.split()[0] != prev_bottleneck.split()[0]:  # "(fp32)" is no move
                feed = f" ({doc['feed']})" if now == "data-bound" and doc.get("feed") else ""
                doc["bottleneck_moved"] = (
                    f"after {s.spec}: {now}: {doc['bottleneck']['evidence']}{feed} "
                    f"next: {doc['bottleneck']['recommendation']}"
                )
                prev_bottleneck = now
        ladder.rungs.append(doc)
        ladder.publish()
    if ladder.base_runs is None:  # nothing could be measured on top of it: the baseline alone
        fresh = {}
        ladder.measure_runs([ladder.base_spec], ladder.min_repeats, fresh)
        ladder.set_baseline(fresh[ladder.base_spec])
    changed = check_ladder_pick(ladder)  # before the final comparison: a pick that trains differently falls back
    if len(ladder.selected) == 1 and last_kept is not None and last_kept[1] == ladder.base_spec and not changed:
        # the one kept speedup was already measured against the baseline, interleaved
        fresh, _ = last_kept
        ladder.final_from(fresh)
    else:
        ladder.final_comparison()
    return ladder.document()
