"""Streams (an ``IterableDataset`` behind a DataLoader): whether worker processes would split the
stream or each repeat all of it (:func:`splits_between_workers`, the ``workers`` speedup's check)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from fastloop.data import rebuild_loader, same_value

__all__ = ["splits_between_workers"]


def _calls_get_worker_info(cls: type) -> bool:
    """Whether a method of ``cls`` (or a base class outside torch) names ``get_worker_info``."""

    def names(code: Any) -> set:
        out = set(code.co_names)
        for const in code.co_consts:
            if hasattr(const, "co_names"):
                out |= names(const)
        return out

    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] in ("torch", "builtins", "typing"):
            continue
        for attr in vars(klass).values():
            fn = getattr(attr, "__func__", getattr(attr, "fget", attr))
            if hasattr(fn, "__code__") and "get_worker_info" in names(fn.__code__):
                return True
    return False


def splits_between_workers(loader: DataLoader) -> str | None:
    """None when ``loader`` can take worker processes without repeating samples; otherwise why not.

    A map-style dataset always can (the sampler deals indices out). An IterableDataset can when
    the loader has a ``worker_init_fn`` or the dataset's class calls
    ``torch.utils.data.get_worker_info`` (the two idioms of torch's docs); otherwise two workers
    are started and their first batches compared: the same batch twice means each of N workers
    would yield the whole stream, every sample N times.

    Example:
        >>> class Stream(torch.utils.data.IterableDataset):
        ...     def __iter__(self):
        ...         return iter(range(8))
        >>> splits_between_workers(DataLoader(Stream(), batch_size=2))[:61]
        'the dataset is an IterableDataset (Stream) that does not spli'
        >>> splits_between_workers(DataLoader(list(range(8)))) is None
        True
    """
    dataset = loader.dataset
    if (
        not isinstance(dataset, torch.utils.data.IterableDataset)
        or loader.worker_init_fn is not None
        or _calls_get_worker_info(type(dataset))
    ):
        return None
    probe = rebuild_loader(loader, num_workers=2, persistent_workers=False, prefetch_factor=1)
    batches = iter(probe)
    try:
        first, second = next(batches), next(batches)
    except StopIteration:  # fewer than two batches: nothing to repeat
        return None
    finally:
        del batches
    if not same_value(first, second):
        return None
    name = type(dataset).__name__
    return (
        f"the dataset is an IterableDataset ({name}) that does not split its stream between workers "
        f"(two workers gave the same first batch; its class never calls torch.utils.data.get_worker_info "
        f"and the loader has no worker_init_fn): each of N workers would yield the whole stream, every "
        f"sample N times. Split the stream by worker in {name}.__iter__ (torch.utils.data.IterableDataset's "
        f"docs show how) to use workers"
    )
