"""What a run reads off its loader and batches: the prefetch buffer a worker-backed loader holds
ready, and the samples in a step's batch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch.utils.data import DataLoader

from fastloop._compat import Trainer
from fastloop.data import first_tensor

__all__ = ["batch_items", "prefetch_buffer"]


def prefetch_buffer(loader: Any) -> int:
    """Batches a worker-backed DataLoader can hold ready (``num_workers x prefetch_factor``);
    0 for loaders without workers. Wrappers that keep the loader as ``.loader`` are looked into."""
    for _ in range(4):
        if isinstance(loader, DataLoader):
            return loader.num_workers * (loader.prefetch_factor or 2) if loader.num_workers > 0 else 0
        loader = getattr(loader, "loader", None)
    return 0


def batch_items(batch: Any, trainer: Trainer) -> int:
    """Samples in a step's batch: the leading size of its first tensor, summed over the loaders
    when the Trainer combines several (``train_dataloader`` returned a dict or list of them)."""

    def first(b: Any) -> int:
        t = first_tensor(b)
        return int(t.shape[0]) if t is not None and t.dim() else 1

    loaders = getattr(trainer, "train_dataloader", None)  # the dict or list itself in Lightning 2
    several = loaders if isinstance(loaders, (dict, list, tuple)) else getattr(loaders, "iterables", None)
    if (
        isinstance(several, (dict, list, tuple))
        and len(several) > 1
        and isinstance(batch, (dict, list, tuple))
        and len(batch) == len(several)
    ):
        return sum(first(b) for b in (batch.values() if isinstance(batch, Mapping) else batch))
    return first(batch)
