"""What the ladder does not measure, and why: a rung the model rules out, and a feed speedup on a
step that hardly waits for its data (``FEED_BUSY``, ``FEED_WAIT``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastloop.compare import merge_runs
from fastloop.speedups.base import REGISTRY, name_of

if TYPE_CHECKING:
    from fastloop.drivers.ladder_state import LadderState

__all__ = [
    "ABLATION_LOSS",
    "FEED_BUSY",
    "FEED_WAIT",
    "ablation_order",
    "feed_cannot_help",
    "model_says_no",
    "replaces_loader",
    "spec_names",
    "split_groups",
]

FEED_BUSY = 0.95
FEED_WAIT = 0.02
"""A data speedup is not measured when the best configuration's GPU is busy at least FEED_BUSY of
the step (its profile, CUDA only) and it waits for data at most FEED_WAIT, or when both its data
wait and its host's share of the step getting batches are at most FEED_WAIT."""


ABLATION_LOSS = 0.02
"""A member is kept when the configuration without it is this much slower at the point estimate,
even where the interval is too wide to call it significant."""


def model_says_no(ladder: LadderState, s: Any, shapes_fixed: bool = False) -> str | None:
    """A rung the model rules out (no convolution for channels_last, no fused-loss hook, ...),
    known from a run that already built it: not measured. ``shapes_fixed``: the configuration
    pads its batches to a few shapes, so what the baseline's batch shapes ruled out
    (``data_checks``: cuda_graph) is measured after all."""
    runs = ladder.base_runs
    if runs is None or not runs.docs:
        return None
    doc = runs.docs[-1]
    if shapes_fixed and s.name in (doc.get("data_checks") or {}) and s.name not in (doc.get("built_checks") or {}):
        return None
    reason = (doc.get("model_checks") or {}).get(s.name)
    return f"not measured: {reason}" if reason else None


def feed_cannot_help(ladder: LadderState, s: Any) -> str | None:
    """A feed speedup (``Speedup.feeds``) can only give back the time the GPU does not work: when the best
    configuration so far keeps the GPU busy (its profile) and hardly waits for data, the
    most a faster feed could gain is below what the ladder can detect, so it is not measured."""
    if not s.feeds:  # batch_size also changes the loader, but it changes the step's work too
        return None
    best = ladder.best_runs.get(ladder.spec_with())
    if best is None or not best.docs:
        return None
    doc = merge_runs(best)
    busy = (doc.get("gpu_profile") or {}).get("gpu_busy_frac")
    wait = doc.get("data_wait_frac")
    host = doc.get("host_wait_frac")
    if wait is None:
        return None
    fetch, copy = doc.get("host_fetch_s"), doc.get("host_copy_s")
    part = "getting batches (loader + copy)"
    if s.feeds_copy_only and host is not None and fetch and copy is not None:
        # pinned or early copies leave the loader's own work where it is: only the copy's share counts
        host, part = host * min(1.0, copy / fetch), "copying batches to the device"
    if busy is not None and busy >= FEED_BUSY and wait <= FEED_WAIT:
        bound = 1 / max(1e-9, 1 - max(wait, 1 - busy))
        return (
            f"not measured: the best configuration so far ({ladder.spec_with()}) keeps the GPU busy {100 * busy:.0f}% "
            f"of its step and waits for data {100 * wait:.1f}%; a faster feed could gain at most {bound:.3f}x"
        )
    if host is not None and max(wait, host) <= FEED_WAIT:
        # a GPU-bound step can gain at most the GPU's idle time while the batch comes (wait), a
        # host-bound one at most the host's time getting it (host): the larger bounds both
        bound = 1 / max(1e-9, 1 - max(wait, host))
        return (
            f"not measured: the best configuration so far ({ladder.spec_with()}) spends {100 * host:.1f}% of its "
            f"step's host time {part} and the step waits for them {100 * wait:.1f}%; "
            f"{'a faster copy' if s.feeds_copy_only else 'a faster feed'} could gain at most {bound:.3f}x"
        )
    return None


def ablation_order(members: list[str]) -> list[str]:
    """The members (specs) an ablation takes out, costliest first (:attr:`Speedup.ablation_rank`:
    compile time, capture and memory, precision, layout, processes); members that cost nothing
    when they do not help are left out.

    Example:
        >>> ablation_order(["tf32", "bf16", "compile", "workers:4"])
        ['compile', 'bf16', 'workers:4']
    """
    ranked = [(REGISTRY[n].ablation_rank, i, m) for i, m in enumerate(members) if (n := name_of(m)) in REGISTRY]
    return [m for rank, _, m in sorted((r, i, m) for r, i, m in ranked if r is not None)]


def compute_feed_note(best: Any, selected: list[str], feed_first_wait: float) -> str:
    """What the compute rungs are measured on, for the report: the feed fixed first (a data-bound
    baseline), or the user's feed, and how much of the best step waits for it."""
    wait = (merge_runs(best).get("data_wait_frac") or 0.0) if best else 0.0
    feeds = [n for n in map(name_of, selected) if n in REGISTRY and REGISTRY[n].feeds]
    if feeds and wait < feed_first_wait:
        return f"; measured on the feed fixed first ({','.join(feeds)}; the step waits {wait:.0%} for data)"
    if feeds:
        return (
            f"; measured on the feed chosen first ({','.join(feeds)}), which still leaves the step waiting "
            f"{wait:.0%} for data, so a faster step may not show"
        )
    if wait >= feed_first_wait:
        return (
            f"; measured on the user's feed, which no feed rung improved: the step waits {wait:.0%} for data, "
            f"so a faster step may not show"
        )
    return ""


def split_groups(speedups: list) -> tuple[list, list, list]:
    """(feed, compute, the rest): the data pipeline, everything that changes the step, and the
    speedups that change the workload itself (``batch_size``). A speedup that pads batches to a
    few shapes (``fixes_shapes``) changes the data but goes with the compute stack: compile and
    CUDA graphs pay only with it (it is ruled out where the baseline's batches keep one shape)."""
    feed = [s for s in speedups if s.changes == "data" and not s.changes_workload and not s.fixes_shapes]
    compute = [s for s in speedups if (s.changes != "data" or s.fixes_shapes) and not s.changes_workload]
    rest = [s for s in speedups if s.changes_workload]
    return feed, compute, rest


def spec_names(specs: list[str]) -> set[str]:
    """The speedup names of ``specs`` (``compile:max-autotune`` -> ``compile``)."""
    return {n for n in map(name_of, specs) if n is not None}


def replaces_loader(names: set[str]) -> bool:
    """Does one of ``names`` replace the training loader (a GPU pipeline such as dali)?"""
    return any(REGISTRY[n].replaces_loader for n in names if n in REGISTRY)
