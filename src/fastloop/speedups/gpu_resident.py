"""``gpu_resident``: the whole in-memory dataset moved to the GPU once, batches served from there.

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/gpu_resident.md``.
Semantics kept: the loader's own sampler (or batch sampler) decides the order, so shuffling
follows the loader's generator and seed exactly; ``batch_size`` and ``drop_last`` as set.
Options: ``gpu_resident:SHARE``, the largest share of free GPU memory the data may take.
Changes the data pipeline. For GPU versions of per-sample augmentations, see
:mod:`fastloop.augment`.

Example (CPU tensors standing in for the device):
    >>> import torch
    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> ds = TensorDataset(torch.arange(10).float(), torch.arange(10))
    >>> loader = DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
    >>> resident = make_resident(loader, torch.device("cpu"))
    >>> [b[1].tolist() for b in resident] == [b[1].tolist() for b in DataLoader(
    ...     ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))]
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

from fastloop._torch_private import draw_loader_base_seed
from fastloop.data import WHOLE_BATCHES, fixed_samples, materialize, sample_keys, tensor_dataset_parts, yields_whole_batches
from fastloop.errors import FastloopError
from fastloop.speedups.base import Context, Skip, Speedup, register
from fastloop.speedups.run import Run

__all__ = ["GPUResident", "GPUResidentLoader", "NotResident", "make_resident"]


class NotResident(ValueError):
    """The loader's data cannot be made GPU-resident; the message says why."""


class GPUResidentLoader:
    """Batches indexed from tensors that live on ``device``, in the order of ``loader``'s sampler.

    Iterating gives what iterating the original DataLoader gives (same batches, same order for
    the same seed), already on the device. Applied, the speedup says so in the run's
    :class:`~fastloop.speedups.base.RunInputs` (workers, pin_memory and prefetch then have nothing
    left to do).
    """

    def __init__(self, tensors: tuple[torch.Tensor, ...], loader: DataLoader, *, single: bool = False,
                 keys: tuple[str, ...] | None = None) -> None:
        self.tensors = tensors
        self.single = single
        """A sample is one tensor (or number): each batch is that tensor, as the loader yields it."""
        self.keys = keys
        """A sample is a dict with these keys: each batch is a dict of tensors, as the loader yields it."""
        self.loader = loader
        self.batch_size = loader.batch_size
        self.drop_last = loader.drop_last
        self.dataset = loader.dataset
        self.sampler = loader.sampler
        self.device = tensors[0].device

    def _to_device(self, idx: list[int]) -> torch.Tensor:
        index = torch.as_tensor(idx, dtype=torch.long)
        if self.device.type == "cuda":  # pinned: the copy does not wait for the queued step
            index = index.pin_memory()
        return index.to(self.device, non_blocking=True)

    def batch_indices(self) -> Iterator[torch.Tensor]:
        """Each batch's indices on the device: the epoch's order copied once, sliced per batch (a
        view: no copy, no kernel a batch); a batch sampler's batches copied one by one."""
        draw_loader_base_seed(self.loader)  # as the loader's own iterator does: the same order
        if self.batch_size is None:  # batch_sampler given, or automatic batching off
            yield from (self._to_device(list(b)) for b in self.loader.batch_sampler)  # type: ignore[union-attr]
            return
        order = list(iter(self.sampler))  # the loader's own sampler: its seed, its epoch
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        if stop:
            on_device = self._to_device(order[:stop])
            for i in range(0, stop, self.batch_size):
                yield on_device[i:i + self.batch_size]

    def __iter__(self) -> Iterator[Any]:
        for index in self.batch_indices():
            batch = [t.index_select(0, index) for t in self.tensors]
            yield batch[0] if self.single else dict(zip(self.keys, batch)) if self.keys else batch

    def __len__(self) -> int:
        return len(self.loader)


def _resident_parts(dataset: Any) -> tuple[Callable[[], tuple[torch.Tensor, ...]], int, bool, tuple[str, ...] | None]:
    """How to get the dataset's tensors (deferred: a dataset read sample by sample is read only
    once the size check passed), their size in bytes, whether a sample is one bare tensor or
    number (the loader then yields a tensor, not a list), and a dict sample's keys."""
    parts = tensor_dataset_parts(dataset)
    if parts is not None:
        tensors, indices = parts
        n = len(tensors[0]) if indices is None else len(indices)
        size = n * sum(t[0].numel() * t.element_size() for t in tensors) if len(tensors[0]) else 0
        if indices is None:
            return (lambda: tensors), size, False, None
        index = torch.as_tensor(indices, dtype=torch.long)
        return (lambda: tuple(t.index_select(0, index) for t in tensors)), size, False, None
    found = fixed_samples(dataset)  # a Subset or ConcatDataset: its parts decide, its own indices are read
    if isinstance(found, str):
        raise NotResident(f"the dataset is a {type(dataset).__name__}: its __getitem__ may transform each sample "
                          f"(random augmentations would be frozen), and {found}; gpu_resident takes a TensorDataset "
                          f"(or a Subset of one) or a Dataset holding its samples as tensors that gives the same "
                          f"values for the same index")
    keys = sample_keys(dataset)
    single = keys is None and not isinstance(dataset[0], (list, tuple))
    return (lambda: materialize(dataset)), found.n * found.item_bytes, single, keys


def make_resident(loader: DataLoader, device: torch.device, *, share: float = 0.5) -> GPUResidentLoader:
    """Move ``loader``'s dataset to ``device`` once; raise :class:`NotResident` with the reason
    when it cannot (not a DataLoader, per-sample transform, custom collate, too large).

    A TensorDataset's tensors move as they are. A Dataset that holds its samples in memory and
    gives the same values for the same index (:func:`fastloop.data.fixed_samples`) is read once,
    stacked as ``default_collate`` stacks a batch, and moved."""
    if not isinstance(loader, DataLoader):
        raise NotResident(f"the loader is a {type(loader).__name__}, not a torch DataLoader")
    if yields_whole_batches(loader):
        raise NotResident(WHOLE_BATCHES)
    if loader.collate_fn is not default_collate:
        raise NotResident("the loader has a custom collate_fn (it may do more than stack samples)")
    get, size, single, keys = _resident_parts(loader.dataset)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if size > share * free:
            raise NotResident(f"the dataset takes {size / 2**30:.2f} GiB, more than {share:.0%} of the "
                              f"{free / 2**30:.1f} GiB of free GPU memory")
    try:
        tensors = get()
    except (TypeError, RuntimeError, ValueError) as err:  # samples default_collate cannot stack together
        raise NotResident(f"the dataset's samples could not be stacked as default_collate stacks a batch "
                          f"({type(err).__name__}: {str(err).splitlines()[0][:200]})") from None
    return GPUResidentLoader(tuple(t.to(device) for t in tensors), loader, single=single, keys=keys)


@dataclass(frozen=True)
class ResidentOptions:
    """Options of ``gpu_resident``."""

    share: float = field(default=0.5, metadata={
        "doc": "the largest share of free GPU memory the dataset may take, in (0, 0.9]"})

    def __post_init__(self) -> None:
        if isinstance(self.share, bool) or not isinstance(self.share, (int, float)) or not 0 < self.share <= 0.9:
            raise FastloopError(f"gpu_resident: the memory share must be in (0, 0.9], got {self.share!r}")


@register
class GPUResident(Speedup):
    __doc__ = __doc__
    name = "gpu_resident"
    replaces_loader = True
    needs_in_memory_tensors = True
    stored_on_device = True
    changes = "data"
    feeds = True
    order = 9
    needs_cuda = True
    in_default_ladder = True  # tried only where the dataset is in-memory tensors (fastloop.drivers.ladder_search)
    option_help = "gpu_resident:SHARE with SHARE in (0, 0.9], the largest share of free GPU memory (default 0.5)"
    options_type = ResidentOptions


    def apply(self, run: Run) -> None:
        run.change_loader(lambda loader: self.apply_loader(loader, run.ctx))

    def apply_loader(self, loader: Iterable, ctx: Context) -> Iterable:
        try:
            resident = make_resident(loader, ctx.device, share=self.opts.share)  # type: ignore[arg-type]
        except NotResident as why:
            raise Skip(str(why)) from None
        ctx.stats["gpu_resident_bytes"] = sum(t.numel() * t.element_size() for t in resident.tensors)
        ctx.inputs.batches_on_device = self.name
        return resident
