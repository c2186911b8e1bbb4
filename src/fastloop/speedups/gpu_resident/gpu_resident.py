"""``gpu_resident``: the whole in-memory dataset moved to the GPU once, batches served from there.

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/gpu_resident.md``.
Semantics kept: the loader's own sampler (or batch sampler) decides the order, so shuffling
follows the loader's generator and seed exactly, and under DDP or FSDP each rank serves its
``DistributedSampler``'s share (the Lightning callbacks hand over the loader as Lightning prepares
it); ``batch_size`` and ``drop_last`` as set.
Options: ``gpu_resident:SHARE``, the largest share of free GPU memory the data may take.
Changes the data pipeline. For GPU versions of per-sample augmentations, see
:mod:`fastloop.speedups.gpu_augment.ops`.

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
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

from fastloop.data import (
    WHOLE_BATCHES,
    fixed_samples,
    materialize,
    sample_keys,
    tensor_dataset_parts,
    yields_whole_batches,
)
from fastloop.speedups.base import Context, Skip, Speedup, register
from fastloop.speedups.gpu_resident.padded import (
    HOST_SHARE,
    NotPadded,
    PaddedResidentLoader,
    batch_indices,
    host_available_bytes,
    learn_padded,
    size_text,
    why_not_padded,
)
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.options import Options, option
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

    def __init__(
        self,
        tensors: tuple[torch.Tensor, ...],
        loader: DataLoader,
        *,
        single: bool = False,
        keys: tuple[str, ...] | None = None,
    ) -> None:
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

    def batch_indices(self) -> Iterator[tuple[list[int], torch.Tensor]]:
        """Each batch's indices on the host and on the device
        (:func:`~fastloop.speedups.gpu_resident.padded.batch_indices`)."""
        return batch_indices(self.loader, self.device)

    def __iter__(self) -> Iterator[Any]:
        for _, index in self.batch_indices():
            batch = [t.index_select(0, index) for t in self.tensors]
            yield batch[0] if self.single else dict(zip(self.keys, batch)) if self.keys else batch

    def __len__(self) -> int:
        return len(self.loader)


def _resident_parts(
    dataset: Any,
) -> tuple[Callable[[], tuple[torch.Tensor, ...]], int, bool, tuple[str, ...] | None, bool]:
    """How to get the dataset's tensors (deferred: a dataset read sample by sample is read only
    once the size check passed), their size in bytes, whether a sample is one bare tensor or
    number (the loader then yields a tensor, not a list), a dict sample's keys, and whether
    getting them builds a copy on the host (all but a whole TensorDataset's own tensors)."""
    parts = tensor_dataset_parts(dataset)
    if parts is not None:
        tensors, indices = parts
        n = len(tensors[0]) if indices is None else len(indices)
        size = n * sum(t[0].numel() * t.element_size() for t in tensors) if len(tensors[0]) else 0
        if indices is None:
            return (lambda: tensors), size, False, None, False
        index = torch.as_tensor(indices, dtype=torch.long)
        return (lambda: tuple(t.index_select(0, index) for t in tensors)), size, False, None, True
    found = fixed_samples(dataset)  # a Subset or ConcatDataset: its parts decide, its own indices are read
    if isinstance(found, str):
        raise NotResident(
            f"the dataset is a {type(dataset).__name__}: its __getitem__ may transform each sample "
            f"(random augmentations would be frozen), and {found}; gpu_resident takes a TensorDataset "
            f"(or a Subset of one) or a Dataset holding its samples as tensors that gives the same "
            f"values for the same index"
        )
    keys = sample_keys(dataset)
    single = keys is None and not isinstance(dataset[0], (list, tuple))
    return (lambda: materialize(dataset)), found.n * found.item_bytes, single, keys, True


def make_resident(
    loader: DataLoader, device: torch.device, *, share: float = 0.5
) -> GPUResidentLoader | PaddedResidentLoader:
    """Move ``loader``'s dataset to ``device`` once; raise :class:`NotResident` with the reason
    when it cannot (not a DataLoader, per-sample transform, a collate it does not reproduce, too
    large). A loader with its own collate that pads is served by :class:`PaddedResidentLoader`.

    A TensorDataset's tensors move as they are. A Dataset that holds its samples in memory and
    gives the same values for the same index (:func:`fastloop.data.fixed_samples`) is read once,
    stacked as ``default_collate`` stacks a batch, and moved."""
    if not isinstance(loader, DataLoader):
        raise NotResident(f"the loader is a {type(loader).__name__}, not a torch DataLoader")
    if yields_whole_batches(loader):
        raise NotResident(WHOLE_BATCHES)
    if loader.collate_fn is not default_collate:
        return _padded(loader, device, share)
    get, size, single, keys, on_host = _resident_parts(loader.dataset)
    _fits(size, device, share, on_host=on_host)
    try:
        tensors = get()
    except (TypeError, RuntimeError, ValueError) as err:  # samples default_collate cannot stack together
        raise NotResident(
            f"the dataset's samples could not be stacked as default_collate stacks a batch "
            f"({type(err).__name__}: {str(err).splitlines()[0][:200]})"
        ) from None
    return GPUResidentLoader(tuple(t.to(device) for t in tensors), loader, single=single, keys=keys)


def _fits(size: int, device: torch.device, share: float, what: str = "the dataset takes", *, on_host: bool) -> None:
    """Refuse (:class:`NotResident`, with the figures) ``size`` bytes that would take more than
    ``share`` of the free GPU memory, or, where they are built on the host first (``on_host``),
    more than :data:`~fastloop.speedups.gpu_resident.padded.HOST_SHARE` of its available memory."""
    available = host_available_bytes() if on_host else None
    if available is not None and size > HOST_SHARE * available:
        raise NotResident(
            f"{what} {size_text(size)}, more than {HOST_SHARE:.0%} of the {size_text(available)} "
            f"of available host memory, where it is built first"
        )
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if size > share * free:
            raise NotResident(
                f"{what} {size_text(size)}, more than {share:.0%} of the {size_text(free)} of free GPU memory"
            )


def _padded(loader: DataLoader, device: torch.device, share: float) -> PaddedResidentLoader:
    """A loader with its own collate: the samples stored padded and every batch cut as the collate
    builds it, where the cut batches equal the collate's (:mod:`fastloop.speedups.gpu_resident.padded`);
    the padded size is checked against the host's and the device's memory before it is built."""

    def fits(nbytes: int, what: str) -> None:
        _fits(nbytes, device, share, f"the samples padded to their longest ({what}) take", on_host=False)

    try:
        store = learn_padded(loader, fits=fits)
    except NotPadded as why:
        raise NotResident(str(why)) from None
    return PaddedResidentLoader(store.to(device), loader)


@dataclass(frozen=True, kw_only=True)
class ResidentOptions(Options):
    """Options of ``gpu_resident``."""

    speedup = "gpu_resident"
    share: float = option(
        0.5, "the largest share of free GPU memory the dataset may take", low=0, high=0.9, low_open=True
    )


@register
class GPUResident(Speedup):
    __doc__ = __doc__
    name = "gpu_resident"
    ladder = LadderTraits(
        replaces_loader=True,
        needs_in_memory_tensors=True,
        stored_on_device=True,
        feeds=True,
        in_default=True,  # tried only where the dataset is in-memory tensors (fastloop.drivers.ladder.search)
    )
    changes = "data"
    feeds_validation = True
    order = 9
    needs_cuda = True
    options_type = ResidentOptions

    def apply(self, run: Run) -> None:
        run.change_loader(lambda loader: self.apply_loader(loader, run.ctx))

    def why_not_data(self, loader: Any) -> str | None:
        """What rules the loader out before a run (the ladder skips the rung): not a DataLoader,
        whole batches from the dataset, samples not fixed in memory, a collate it does not
        reproduce (on a few sampled batches: the whole check runs when it applies)."""
        if not isinstance(loader, DataLoader):
            return f"the loader is a {type(loader).__name__}, not a torch DataLoader"
        if yields_whole_batches(loader):
            return WHOLE_BATCHES
        if loader.collate_fn is not default_collate:
            return why_not_padded(loader)
        found = fixed_samples(loader.dataset) if tensor_dataset_parts(loader.dataset) is None else None
        return found if isinstance(found, str) else None

    def apply_loader(self, loader: Iterable, ctx: Context) -> Iterable:
        try:
            resident = make_resident(loader, ctx.device, share=self.opts.share)  # type: ignore[arg-type]
        except NotResident as why:
            raise Skip(str(why)) from None
        if isinstance(resident, PaddedResidentLoader):
            ctx.stats["gpu_resident_bytes"] = resident.store.nbytes
            ctx.describe(
                self.name,
                f"{len(loader.dataset):,} samples stored padded to their longest on the GPU "
                f"({resident.store.nbytes / 2**20:,.1f} MiB); each batch cut as your collate_fn "
                f"builds it (equal on every batch of an epoch and on batches of the longest and shortest rows)",
            )
        else:
            ctx.stats["gpu_resident_bytes"] = sum(t.numel() * t.element_size() for t in resident.tensors)
        ctx.inputs.batches_on_device = self.name
        return resident
