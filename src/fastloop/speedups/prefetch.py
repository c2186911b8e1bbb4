"""``prefetch``: the next batch copied to the GPU on a side stream while this step runs.

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/prefetch.md``.
Changes the data pipeline. Handles tensors, tuples, lists, dicts and dataclasses of tensors.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastloop.data import CUDAPrefetcher
from fastloop.speedups.base import Context, Skip, Speedup, register
from fastloop.speedups.run import Run

__all__ = ["Prefetch", "apply_prefetch"]


def apply_prefetch(loader: Iterable, device: str = "cuda") -> CUDAPrefetcher:
    """Wrap ``loader`` so each batch arrives on ``device``, copied one step ahead."""
    return CUDAPrefetcher(loader, device)


@register
class Prefetch(Speedup):
    __doc__ = __doc__
    name = "prefetch"
    ablation_rank = 8
    changes = "data"
    feeds = True
    feeds_copy_only = True
    order = 12
    in_default_ladder = True
    needs_cuda = True

    def apply_loader(self, loader: Iterable, ctx: Context) -> Iterable:
        if ctx.inputs.batches_on_device:
            raise Skip(f"the data is already on the GPU ({ctx.inputs.batches_on_device})")
        return apply_prefetch(loader, ctx.device)

    def apply(self, run: Run) -> None:
        run.change_loader(lambda loader: self.apply_loader(loader, run.ctx))
        run.batches_arrive_on_device()
