"""Batch plumbing shared by the data-pipeline speedups: move any nested batch, rebuild a
DataLoader with new settings, and prefetch to the GPU on a side stream.

Example:
    >>> import torch
    >>> b = {"x": torch.zeros(2, 3), "meta": ["a", "b"], "y": (torch.ones(2),)}
    >>> moved = map_tensors(lambda t: t + 1, b)
    >>> moved["x"].sum().item(), moved["meta"], moved["y"][0].sum().item()
    (6.0, ['a', 'b'], 4.0)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

from fastloop._torch_private import loader_auto_collation
from fastloop.errors import FastloopError

__all__ = ["CUDAPrefetcher", "first_tensor", "map_tensors", "rebuild_loader", "tensor_dataset_parts", "to_channels_last",
           "to_device"]


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], batch: Any) -> Any:
    """Apply ``fn`` to every tensor in tensors, tuples, lists, dicts and dataclasses."""
    if torch.is_tensor(batch):
        return fn(batch)
    if isinstance(batch, dict):
        return type(batch)((k, map_tensors(fn, v)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_tensors(fn, v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(fn, v) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: map_tensors(fn, getattr(batch, f.name))
                                             for f in dataclasses.fields(batch) if f.init})
    return batch


def first_tensor(batch: Any) -> torch.Tensor | None:
    found: list[torch.Tensor] = []

    def grab(t: torch.Tensor) -> torch.Tensor:
        if not found:
            found.append(t)
        return t

    map_tensors(grab, batch)
    return found[0] if found else None


def tensor_dataset_parts(dataset: Any) -> tuple[tuple[torch.Tensor, ...], list[int] | None] | None:
    """The tensors behind a ``TensorDataset``, or behind a ``Subset`` of one with its indices
    (None for any other dataset: its ``__getitem__`` may do per-sample work)."""
    if isinstance(dataset, TensorDataset):
        return tuple(dataset.tensors), None
    if isinstance(dataset, Subset) and isinstance(dataset.dataset, TensorDataset):
        return tuple(dataset.dataset.tensors), list(dataset.indices)
    return None


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    return map_tensors(lambda t: t.to(device, non_blocking=non_blocking), batch)


def to_channels_last(batch: Any) -> Any:
    """Every 4-D floating tensor of ``batch`` in channels_last memory format (images, NCHW)."""
    return map_tensors(lambda t: t.contiguous(memory_format=torch.channels_last)
                       if t.dim() == 4 and t.is_floating_point() else t, batch)


_LOADER_KEYS = ("batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
                "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context",
                "generator", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order")


def _resized_batch_sampler(batch_sampler: Any, size: int) -> Any:
    """Another batch sampler like ``batch_sampler`` that yields ``size`` indices per batch
    (as Lightning re-instantiates one: same class, its sampler and drop_last)."""
    sampler, drop_last = getattr(batch_sampler, "sampler", None), getattr(batch_sampler, "drop_last", None)
    if sampler is None or drop_last is None or not hasattr(batch_sampler, "batch_size"):
        raise FastloopError(f"the loader's batch_sampler ({type(batch_sampler).__name__}) has no sampler, batch_size "
                            f"and drop_last to rebuild it at another batch size; give it those attributes (as "
                            f"torch's BatchSampler has) or build the DataLoader from batch_size")
    try:
        return type(batch_sampler)(sampler, batch_size=size, drop_last=drop_last)
    except TypeError as err:
        raise FastloopError(f"the loader's batch_sampler ({type(batch_sampler).__name__}) cannot be rebuilt at "
                            f"batch size {size}: {type(batch_sampler).__name__}(sampler, batch_size=, drop_last=) "
                            f"raised {err}") from None


def rebuild_loader(loader: DataLoader, **overrides: Any) -> DataLoader:
    """A new DataLoader over the same dataset, sampler and collate function, with ``overrides``.

    ``loader_cls`` (an override) builds a subclass of DataLoader instead. Raises TypeError if
    ``loader`` is not a ``torch.utils.data.DataLoader``.
    """
    if not isinstance(loader, DataLoader):
        raise TypeError(f"expected a torch DataLoader, got {type(loader).__name__}")
    kw: dict[str, Any] = {}
    for key in _LOADER_KEYS:
        if hasattr(loader, key):
            kw[key] = getattr(loader, key)
    kw.pop("shuffle", None)  # the sampler already encodes it
    if loader.batch_sampler is not None and loader_auto_collation(loader) and kw.get("batch_size") is not None:
        # a default BatchSampler: pass its parts, not the object (keeps batch_size editable)
        kw.pop("batch_sampler")
        kw["sampler"] = loader.batch_sampler.sampler if hasattr(loader.batch_sampler, "sampler") else loader.sampler
    else:
        for k in ("batch_size", "drop_last", "sampler"):
            kw.pop(k, None)
        if "batch_size" in overrides and loader.batch_sampler is not None:
            # the user's own batch sampler: build another of its kind at the new size
            kw["batch_sampler"] = _resized_batch_sampler(loader.batch_sampler, overrides.pop("batch_size"))
    kw.update(overrides)
    if kw.get("num_workers", 0) == 0:
        kw.pop("prefetch_factor", None)
        kw["persistent_workers"] = False
    if "in_order" in kw and "in_order" not in DataLoader.__init__.__code__.co_varnames:
        kw.pop("in_order")
    if kw.get("pin_memory_device") in ("", None):
        kw.pop("pin_memory_device", None)
    cls = kw.pop("loader_cls", DataLoader)
    new = cls(loader.dataset, **kw)
    for attr in ("fastloop_dali",):  # recipe hooks travel with the loader (see speedups/dali.py)
        if hasattr(loader, attr):
            setattr(new, attr, getattr(loader, attr))
    return new


class CUDAPrefetcher:
    """Iterate ``loader`` with the next batch already on its way to the GPU.

    Batch ``i+1`` is copied on a side stream (``non_blocking``) while step ``i`` runs; before a
    batch is handed out the compute stream waits for its copy, and every tensor is marked with
    ``record_stream`` so the caching allocator does not reuse its memory while the compute
    stream still reads it. Copies only overlap compute when the host tensors are pinned.
    """

    def __init__(self, loader: Iterable, device: torch.device | str = "cuda") -> None:
        self.loader = loader
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError("CUDAPrefetcher needs a CUDA device")

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, attr: str) -> Any:  # batch_size, dataset, sampler... of the loader
        if attr in ("loader",):  # not set yet (unpickling): no recursion
            raise AttributeError(attr)
        return getattr(self.loader, attr)

    def __iter__(self) -> Iterator[Any]:
        stream = torch.cuda.Stream(device=self.device)
        it = iter(self.loader)

        def load() -> Any:
            try:
                host = next(it)
            except StopIteration:
                return StopIteration
            with torch.cuda.stream(stream):
                return to_device(host, self.device, non_blocking=True)

        nxt = load()
        while nxt is not StopIteration:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(stream)
            batch = map_tensors(lambda t: (t.record_stream(current), t)[1], nxt)
            nxt = load()
            yield batch
