"""``workers``: DataLoader worker processes sized from the CPU count.

Card:
- Helps: any loader whose per-batch work (decode, augment, collate) is CPU-heavy; the GPU
  stops waiting once enough workers run in parallel.
- Hurts: tiny in-memory datasets (worker start-up and IPC cost more than they save); memory
  grows with workers x prefetch_factor batches.
- Costs: start-up of the worker processes (kept alive across epochs: persistent_workers).
Changes the data pipeline; the dataset, sampler and collate function are kept as they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from torch.utils.data import DataLoader

from fastloop.data import rebuild_loader
from fastloop.errors import FastloopError
from fastloop.speedups.base import Context, Speedup, register

__all__ = ["Workers", "apply_workers", "default_num_workers"]


def default_num_workers() -> int:
    """One worker per available core, leaving one for the main process (at least 1, at most 16)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        n = os.cpu_count() or 1
    return max(1, min(16, n - 1))


def apply_workers(loader: DataLoader, num_workers: int | None = None, prefetch_factor: int = 2) -> DataLoader:
    """The same loader with ``num_workers`` workers (default: from the CPU count), persistent."""
    n = default_num_workers() if num_workers is None else num_workers
    if n < 1:
        raise ValueError(f"num_workers must be >= 1, got {n}")
    return rebuild_loader(loader, num_workers=n, persistent_workers=True, prefetch_factor=prefetch_factor)


@register
class Workers(Speedup):
    __doc__ = __doc__
    name = "workers"
    changes = "data"
    order = 10

    option_help = "workers:N with N an integer from 1 to 256 (default: one per core, leaving one)"

    @classmethod
    def parse_option(cls, text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise FastloopError(f"workers:{text}: the worker count must be an integer from 1 to 256") from None
        if not 1 <= n <= 256:
            raise FastloopError(f"workers:{text}: the worker count must be from 1 to 256")
        return n

    def apply_loader(self, loader: Iterable, ctx: Context) -> Iterable:
        if not isinstance(loader, DataLoader):
            ctx.record(self.name, "fallback", f"loader is a {type(loader).__name__}, not a torch DataLoader")
            return loader
        if loader.num_workers >= default_num_workers():
            ctx.record(self.name, "skipped", f"loader already has {loader.num_workers} workers")
            return loader
        n = int(self.options.get("mode") or default_num_workers())
        ctx.stats["num_workers"] = n
        return apply_workers(loader, n)
