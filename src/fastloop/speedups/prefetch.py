"""``prefetch``: the next batches built on a background thread (fetched and collated by the loader
as it is, pinned, copied to the GPU on a side stream) while this step runs.

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/prefetch.md``.
Changes the data pipeline. Handles tensors, tuples, lists, dicts and dataclasses of tensors, and
any ``collate_fn``. With ``workers`` the thread receives the worker processes' batches; without
(where the loader's probe measured the main process faster than worker processes) the thread
builds them in this process, off the step's critical path. The feed itself: :mod:`fastloop.feed`.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastloop.feed import BackgroundFeed
from fastloop.speedups.base import Context, Skip, Speedup, register
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.run import Run

__all__ = ["Prefetch", "apply_prefetch"]


def apply_prefetch(loader: Iterable, device: str = "cuda") -> BackgroundFeed:
    """Wrap ``loader`` so its next batches are built on a background thread and arrive on ``device``."""
    return BackgroundFeed(loader, device)


def _where_built(loader: Iterable) -> str:
    workers = getattr(loader, "num_workers", 0) or 0
    if workers:
        return f"received from the loader's {workers} worker processes"
    return "fetched and collated by the loader in this process (no worker processes)"


@register
class Prefetch(Speedup):
    __doc__ = __doc__
    name = "prefetch"
    ladder = LadderTraits(ablation_rank=8, feeds=True, in_default=True)
    changes = "data"
    feeds_validation = True
    order = 12
    needs_cuda = True

    def apply_loader(self, loader: Iterable, ctx: Context) -> Iterable:
        if ctx.inputs.batches_on_device:
            raise Skip(f"the data is already on the GPU ({ctx.inputs.batches_on_device})")
        feed = apply_prefetch(loader, ctx.device)
        ctx.describe(
            self.name,
            f"the next {feed.depth} batches {_where_built(loader)} on a background thread, "
            f"pinned and copied to the GPU on a side stream",
        )
        return feed

    def apply(self, run: Run) -> None:
        run.change_loader(lambda loader: self.apply_loader(loader, run.ctx))
        run.batches_arrive_on_device()
