"""``pin_memory``: page-locked host batches, pinned by the loader's own pin thread.

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/pin_memory.md``.
Changes the data pipeline.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch.utils.data import DataLoader

from fastloop.data import rebuild_loader
from fastloop.speedups.base import Context, Fallback, Skip, Speedup, register
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.run import Run

__all__ = ["PinMemory", "apply_pin_memory"]


def apply_pin_memory(loader: DataLoader) -> DataLoader:
    """The same loader with ``pin_memory=True``."""
    return loader if loader.pin_memory else rebuild_loader(loader, pin_memory=True)


@register
class PinMemory(Speedup):
    __doc__ = __doc__
    name = "pin_memory"
    advice_pattern = r"pin_memory|pinned memory"
    changes = "data"
    ladder = LadderTraits(feeds=True, feeds_copy_only=True, in_default=True)
    feeds_validation = True
    order = 11
    needs_cuda = True

    def apply(self, run: Run) -> None:
        run.change_loader(lambda loader: self.apply_loader(loader, run.ctx))

    def apply_loader(self, loader: Iterable, ctx: Context) -> Iterable:
        if ctx.inputs.batches_on_device:
            raise Skip(f"the data is already on the GPU ({ctx.inputs.batches_on_device})")
        if not isinstance(loader, DataLoader):
            raise Fallback(f"loader is a {type(loader).__name__}, not a torch DataLoader")
        if loader.pin_memory:
            raise Skip("the loader already pins memory (pin_memory=True)")
        return apply_pin_memory(loader)
