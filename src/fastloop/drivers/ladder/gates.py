"""What the ladder does not measure, and why: a rung the model rules out, and a feed speedup on a
step that hardly waits for its data (``FEED_BUSY``, ``FEED_WAIT``). Each gate reads runs already
measured and returns the reason (:mod:`~fastloop.drivers.ladder.wording` words it), or None.

Example:
    >>> from fastloop.compare import Runs
    >>> from fastloop.speedups import REGISTRY
    >>> base = Runs("none", docs=[{"model_checks": {"channels_last": "model has no Conv2d layers"}}])
    >>> model_says_no(base, REGISTRY["channels_last"]())
    'not measured: model has no Conv2d layers'
"""

from __future__ import annotations

from fastloop.compare import Runs, merge_runs
from fastloop.drivers.ladder.wording import feed_busy_gpu, feed_host_bound, model_rules_out
from fastloop.measure.run_result import RunResult
from fastloop.speedups.base import Speedup

__all__ = ["FEED_BUSY", "FEED_WAIT", "feed_cannot_help", "model_says_no"]

FEED_BUSY = 0.95
FEED_WAIT = 0.02
"""A data speedup is not measured when the best configuration's GPU is busy at least FEED_BUSY of
the step (its profile, CUDA only) and it waits for data at most FEED_WAIT, or when both its data
wait and its host's share of the step getting batches are at most FEED_WAIT."""


def model_says_no(base_runs: Runs | None, s: Speedup, shapes_fixed: bool = False) -> str | None:
    """A rung the model rules out (no convolution for channels_last, no fused-loss hook, ...),
    known from the baseline's runs (``base_runs``), which built it: not measured. ``shapes_fixed``:
    the configuration pads its batches to a few shapes, so what the baseline's batch shapes ruled
    out (``data_checks``: cuda_graph) is measured after all."""
    if base_runs is None or not base_runs.docs:
        return None
    run = RunResult.from_dict(base_runs.docs[-1])
    if shapes_fixed and s.name in (run.data_checks or {}) and s.name not in (run.built_checks or {}):
        return None
    reason = (run.model_checks or {}).get(s.name)
    return model_rules_out(reason) if reason else None


def feed_cannot_help(best: Runs | None, best_spec: str, s: Speedup) -> str | None:
    """A feed speedup (``LadderTraits.feeds``) can only give back the time the GPU does not work: when the
    best configuration so far (``best``, its runs; ``best_spec``) keeps the GPU busy (its profile)
    and hardly waits for data, the most a faster feed could gain is below what the ladder can
    detect, so it is not measured."""
    if not s.ladder.feeds:  # batch_size also changes the loader, but it changes the step's work too
        return None
    if best is None or not best.docs:
        return None
    merged = RunResult.from_dict(merge_runs(best))
    busy = (merged.gpu_profile or {}).get("gpu_busy_frac")
    wait, host = merged.data_wait_frac, merged.host_wait_frac
    if wait is None:
        return None
    fetch, copy = merged.host_fetch_s, merged.host_copy_s
    copy_only = False
    if s.ladder.feeds_copy_only and host is not None and fetch and copy is not None:
        # pinned or early copies leave the loader's own work where it is: only the copy's share counts
        host, copy_only = host * min(1.0, copy / fetch), True
    if busy is not None and busy >= FEED_BUSY and wait <= FEED_WAIT:
        return feed_busy_gpu(best_spec, busy, wait, 1 / max(1e-9, 1 - max(wait, 1 - busy)))
    if host is not None and max(wait, host) <= FEED_WAIT:
        # a GPU-bound step can gain at most the GPU's idle time while the batch comes (wait), a
        # host-bound one at most the host's time getting it (host): the larger bounds both
        bound = 1 / max(1e-9, 1 - max(wait, host))
        return feed_host_bound(
            best_spec, host, wait, bound, copy_share=copy_only, copy_speedup=s.ladder.feeds_copy_only
        )
    return None
