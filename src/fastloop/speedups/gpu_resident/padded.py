"""``gpu_resident`` for a loader whose ``collate_fn`` pads (text padded to the batch's longest row,
raw audio padded to the longest clip, an attention mask made beside the ids): the samples stored
on the GPU once, each padded to the longest of the dataset, and every batch cut from there as the
collate would build it (the rows of its indices, cut at the batch's longest row). The collate is
learnt by example, never parsed: each sample through the collate alone gives its own rows (a
batch of one, padded to itself), and the pad value and side are read from the collate's batches
(:func:`~fastloop.speedups.pad_buckets.pad_buckets.find_padding`, as ``pad_buckets`` reads them). The result
is accepted only when its batches equal the collate's (structure, dtypes, values) on sampled
batches; otherwise it is refused with the first difference, and a collate it does not understand
keeps gpu_resident's refusal, said by ``why_not_data`` before the rung is run.

Example (a CPU stands in for the device):
    >>> import torch
    >>> from torch.utils.data import DataLoader
    >>> rows = [torch.arange(1, 1 + n) for n in (2, 5, 3, 4)]
    >>> def collate(samples):
    ...     ids = torch.zeros(len(samples), max(len(s) for s in samples), dtype=torch.long)
    ...     for i, s in enumerate(samples):
    ...         ids[i, :len(s)] = s
    ...     return {"ids": ids, "mask": ids != 0}
    >>> loader = DataLoader(rows, batch_size=2, collate_fn=collate)
    >>> store = learn_padded(loader)
    >>> [b["ids"].shape[1] for b in PaddedResidentLoader(store.to(torch.device("cpu")), loader)]
    [5, 4]
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastloop._torch_private import draw_loader_base_seed
from fastloop.data import FIXED_MAX_S, fixed_samples, map_tensors, same_value, tensor_dataset_parts
from fastloop.speedups.pad_buckets.check import tensor_names, tensors_of

__all__ = [
    "CHECK_BATCHES",
    "HOST_SHARE",
    "NotPadded",
    "PaddedResidentLoader",
    "PaddedSamples",
    "batch_indices",
    "first_difference",
    "host_available_bytes",
    "host_parts",
    "learn_padded",
    "size_text",
    "why_not_padded",
]

CHECK_BATCHES = 8
"""Batches (the loader's first, in its order) from which the padding is read; before a run
(:func:`why_not_padded`) the cut batches are compared with the collate's on these only, when it
applies (:func:`learn_padded`) on every batch of one epoch."""
HOST_SHARE = 0.5
"""The largest share of the host's available memory the padded samples may take: they are built
there (and on a CPU they stay there)."""


class NotPadded(ValueError):
    """The loader's collate is not one gpu_resident reproduces; the message says why."""


class TooLarge(NotPadded):
    """The samples padded to their longest would not fit; the message gives the figures."""


def first_difference(want: Any, got: Any, where: str = "batch") -> str | None:
    """Where ``got`` first differs from ``want`` (structure, dtype, shape, value), or None."""
    if torch.is_tensor(want) or torch.is_tensor(got):
        if not (torch.is_tensor(want) and torch.is_tensor(got)):
            return f"{where}: {type(want).__name__} vs {type(got).__name__}"
        if want.dtype != got.dtype:
            return f"{where}: dtype {want.dtype} vs {got.dtype}"
        if want.shape != got.shape:
            return f"{where}: shape {tuple(want.shape)} vs {tuple(got.shape)}"
        return None if torch.equal(want, got.to(want.device)) else f"{where}: different values"
    if type(want) is not type(got):
        return f"{where}: {type(want).__name__} vs {type(got).__name__}"
    if isinstance(want, dict) or hasattr(want, "keys"):
        if list(want.keys()) != list(got.keys()):
            return f"{where}: keys {list(want.keys())} vs {list(got.keys())}"
        return next((d for k in want.keys() if (d := first_difference(want[k], got[k], f"{where}[{k!r}]"))), None)
    if isinstance(want, (list, tuple)):
        if len(want) != len(got):
            return f"{where}: {len(want)} items vs {len(got)}"
        return next(
            (d for i, (a, b) in enumerate(zip(want, got)) if (d := first_difference(a, b, f"{where}[{i}]"))), None
        )
    return None if same_value(want, got) else f"{where}: {want!r} vs {got!r}"


def host_parts(batch: Any, path: tuple = ()) -> dict[tuple, Any]:
    """The parts of ``batch`` that hold no tensor (a list of strings, a number, None), each the
    largest such part, by its path of keys, indices and field names.

    Example:
        >>> host_parts({"ids": torch.zeros(2, 3), "text": ["a", "b"], "meta": {"n": 2, "x": torch.ones(2)}})
        {('text',): ['a', 'b'], ('meta', 'n'): 2}
    """
    if torch.is_tensor(batch):
        return {}
    if not tensors_of(batch):
        return {path: batch}
    if isinstance(batch, Mapping):
        items: Iterable = batch.items()
    elif isinstance(batch, (list, tuple)):
        items = enumerate(batch)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        items = ((f.name, getattr(batch, f.name)) for f in dataclasses.fields(batch) if f.init)
    else:  # holds tensors in a way map_tensors does not walk: nothing it rebuilds
        return {}
    found: dict[tuple, Any] = {}
    for key, value in items:
        found.update(host_parts(value, (*path, key)))
    return found


def _put(batch: Any, path: tuple, value: Any) -> Any:
    """``batch`` with the part at ``path`` replaced by ``value`` (containers rebuilt as
    :func:`~fastloop.data.map_tensors` rebuilds them)."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(batch, Mapping):
        out = {k: (_put(v, rest, value) if k == key else v) for k, v in batch.items()}
        try:
            return type(batch)(out)
        except Exception:  # noqa: BLE001 - a mapping that cannot be built from a dict: a dict, as map_tensors
            return out
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_put(v, rest, value) if i == key else v for i, v in enumerate(batch)))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_put(v, rest, value) if i == key else v for i, v in enumerate(batch))
    return dataclasses.replace(batch, **{key: _put(getattr(batch, key), rest, value)})


def _where(path: tuple) -> str:
    return "batch" + "".join(f"[{k!r}]" for k in path)


@dataclass
class PaddedSamples:
    """What :func:`learn_padded` found: one collate output as the structure of every batch, each
    of its tensors for all samples (dim 0; a varying one padded to the dataset's longest), for
    each varying tensor its dimension, the padded side and every sample's length, and the parts
    of the batch that hold no tensor (:func:`host_parts`): one value per sample, gathered for each
    batch, or one value for every batch."""

    template: Any
    stored: list[torch.Tensor]
    varying: dict[int, tuple[int, str, np.ndarray]]
    pads: dict[int, Any]
    """The pad value of each varying tensor."""
    per_sample: dict[tuple, tuple[type, list]] = field(default_factory=dict)
    """A part that is a list (or tuple) of one value per sample: its type and every sample's value."""
    same: dict[tuple, Any] = field(default_factory=dict)
    """A part that is the same in every batch (and for every sample alone): that value."""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.stored)

    def to(self, device: torch.device) -> PaddedSamples:
        return dataclasses.replace(self, stored=[t.to(device) for t in self.stored])

    def cut(self, host: np.ndarray, index: torch.Tensor, bucket: Callable[[int], int | None] | None = None) -> Any:
        """The batch of samples ``host`` (their indices on the stored tensors' device: ``index``):
        each varying tensor cut at the batch's longest length (or its ``bucket``), each part that
        holds no tensor built for these samples."""
        out = []
        for k, t in enumerate(self.stored):
            if k in self.varying:
                dim, side, lengths = self.varying[k]
                n = int(lengths[host].max())
                n = min((bucket(n) if bucket else None) or n, t.shape[dim])
                t = t.narrow(dim, 0 if side == "tail" else t.shape[dim] - n, n)
            out.append(t.index_select(0, index))
        it = iter(out)
        batch = map_tensors(lambda _: next(it), self.template)
        for path, (kind, values) in self.per_sample.items():
            batch = _put(batch, path, kind(values[i] for i in host.tolist()))
        for path, value in self.same.items():
            batch = _put(batch, path, value)
        return batch


def _sample_batches(loader: DataLoader, n: int | None) -> list[list[int]]:
    """The first ``n`` batches of indices in the loader's order (None: every batch of one epoch),
    its random state put back."""
    gen = loader.generator.get_state() if getattr(loader, "generator", None) is not None else None
    out: list[list[int]] = []
    with torch.random.fork_rng(devices=[]):
        sampler = loader.batch_sampler if loader.batch_sampler is not None else None
        for b in sampler if sampler is not None else []:
            out.append(list(b))
            if n is not None and len(out) >= n:
                break
    if gen is not None:
        loader.generator.set_state(gen)
    return out


def why_not_padded(loader: DataLoader, check: int = CHECK_BATCHES) -> str | None:
    """Why gpu_resident cannot reproduce ``loader``'s collate (the cheap half of
    :func:`learn_padded`: its samples are fixed, and on ``check`` sampled batches, and batches of
    their longest, shortest and middling samples, the collate's output is rebuilt from its samples
    one by one), or None where it may."""
    try:
        _learn(loader, check, all_samples=False)
    except NotPadded as why:
        return _said(why)
    return None


def learn_padded(
    loader: DataLoader, check: int = CHECK_BATCHES, fits: Callable[[int, str], None] | None = None
) -> PaddedSamples:
    """Every sample of ``loader``'s dataset through its collate, stored as :class:`PaddedSamples`
    on the CPU; raises :class:`NotPadded` with the reason where the cut batches would not be the
    collate's (the padding read from ``check`` of the loader's batches; every batch of one epoch,
    and batches of the dataset's longest, shortest and middling samples compared). ``fits(nbytes,
    what)`` is called with the padded samples' size (and what makes it up) before they are built:
    it raises to refuse (the host's memory is checked here, :data:`HOST_SHARE`)."""
    try:
        return _learn(loader, check, all_samples=True, fits=fits)
    except NotPadded as why:
        raise NotPadded(_said(why)) from None


def _said(why: NotPadded) -> str:
    text = str(why)
    return (
        text
        if isinstance(why, TooLarge) or text.startswith("the loader has a custom collate_fn")
        else (f"the loader has a custom collate_fn that gpu_resident does not reproduce: {text}")
    )


def _own_outputs(dataset: Any, collate: Callable, ids: Iterable[int], timed: bool) -> dict[int, Any]:
    """Each sample's collate output alone (a batch of one, padded to itself); where ``timed``,
    refused early when storing and checking every sample (two collates each) would take too long."""
    t0 = time.perf_counter()
    ones: dict[int, Any] = {}
    for i in ids:
        ones[i] = collate([dataset[i]])
        if timed and len(ones) == 64 and 2 * (time.perf_counter() - t0) / 64 * len(dataset) > FIXED_MAX_S:
            raise NotPadded(
                f"the collate_fn takes {1e6 * (time.perf_counter() - t0) / 64:.0f} us a sample: storing and "
                f"checking the {len(dataset):,} samples would take more than {FIXED_MAX_S:.0f} s"
            )
    return ones


def _learn(loader: DataLoader, check: int, *, all_samples: bool, fits: Callable | None = None) -> PaddedSamples:
    dataset, collate = loader.dataset, loader.collate_fn
    if tensor_dataset_parts(dataset) is None and not isinstance(dataset, (list, tuple)):  # a list is its samples
        found = fixed_samples(dataset)
        if isinstance(found, str):
            raise NotPadded(f"the loader has a custom collate_fn and {found}")
    batches = _sample_batches(loader, check)
    if len(batches) < 2:
        raise NotPadded("the loader has a custom collate_fn and fewer than 2 batches to learn it from")
    theirs = [collate([dataset[i] for i in b]) for b in batches]
    if any(not tensors_of(t) for t in theirs):
        raise NotPadded("the loader's custom collate_fn returns no tensors")
    ids = range(len(dataset)) if all_samples else sorted({i for b in batches for i in b})
    outputs = _own_outputs(dataset, collate, ids, timed=all_samples)
    ones = {i: tensors_of(out) for i, out in outputs.items()}
    pads = _read_pads(ones, batches, theirs)
    per_sample, same = _plan_host_parts(outputs, batches, theirs)
    if all_samples:  # what the store takes, from the shapes alone, before it is built
        nbytes, what = _padded_size(ones, pads, tensor_names(theirs[0]))
        _fits_host(nbytes, what)
        if fits is not None:
            fits(nbytes, what)
    store = _store(ones, pads, theirs[0], per_sample, same)
    local = {i: k for k, i in enumerate(ones)}
    known = {tuple(b): out for b, out in zip(batches, theirs)}  # collated already
    epoch = _sample_batches(loader, None) if all_samples else batches
    checks = [(f"batch {n}", b) for n, b in enumerate(epoch)]
    for label, b in checks + _by_length(ones, pads, len(batches[0]), tensor_names(theirs[0])):
        want = known[tuple(b)] if tuple(b) in known else collate([dataset[i] for i in b])
        host = np.asarray([local[i] for i in b])
        diff = first_difference(want, store.cut(host, torch.as_tensor(host, dtype=torch.long)))
        if diff:
            raise NotPadded(
                f"the custom collate_fn's batches are not the samples' own rows padded to the batch's "
                f"longest: {label}, {diff} (collate_fn vs cut from the padded samples)"
            )
    return store


def _by_length(ones: dict[int, list[torch.Tensor]], pads: dict[int, tuple], width: int, names: list[str]) -> list:
    """Batches of ``width`` samples chosen by the length of each varying tensor, where a collate
    that truncates or crops shows it and an epoch's batches may not: the longest rows, the longest
    row among the shortest (the most padding), the shortest, and middling ones; (label, indices) each."""
    out: list[tuple[str, list[int]]] = []
    seen: set[tuple[int, ...]] = set()
    for k, (dim, _, _) in pads.items():
        order = sorted(ones, key=lambda i: ones[i][k].shape[dim])
        mid = max(0, len(order) // 2 - width // 2)
        for what, b in (
            ("longest", order[-width:]),
            ("longest beside the shortest", [order[-1], *order[: width - 1]]),
            ("shortest", order[:width]),
            ("middling", order[mid : mid + width]),
        ):
            if tuple(b) not in seen:
                seen.add(tuple(b))
                out.append((f"a batch of the {what} {names[k]} rows", b))
    return out


_MISSING = object()


def _plan_host_parts(outputs: dict[int, Any], batches: list[list[int]], theirs: list[Any]) -> tuple[dict, dict]:
    """How each part of the batch that holds no tensor (:func:`host_parts`) is built without the
    collate: a list (or tuple) of one value per sample, gathered for each batch; or one value for
    every sample alone and every batch, kept. Anything else raises :class:`NotPadded`: it would be
    copied from one batch to all."""
    own = {i: host_parts(out) for i, out in outputs.items()}
    paths = host_parts(theirs[0])
    per_sample: dict[tuple, tuple[type, list]] = {}
    same: dict[tuple, Any] = {}
    for path, first in paths.items():
        values = [own[i].get(path, _MISSING) for i in outputs]
        kind = type(first)
        if kind in (list, tuple) and all(type(v) is kind and len(v) == 1 for v in values):
            gathered = [v[0] for v in values]
            local = {i: k for k, i in enumerate(outputs)}
            if all(
                same_value(host_parts(t).get(path), kind(gathered[local[i]] for i in b))
                for b, t in zip(batches, theirs)
            ):
                per_sample[path] = (kind, gathered)
                continue
        if all(same_value(v, first) for v in values) and all(
            same_value(host_parts(t).get(path), first) for t in theirs
        ):
            same[path] = first
            continue
        raise NotPadded(
            f"the collate_fn's output holds {_where(path)} ({type(first).__name__}), which is neither one value "
            f"per sample nor the same in every batch: gpu_resident would copy one batch's to all"
        )
    if any(set(host_parts(t)) != set(paths) for t in theirs):
        raise NotPadded("the collate_fn's batches do not hold the same parts without tensors each time")
    return per_sample, same


def host_available_bytes() -> int | None:
    """The host memory available to a new allocation (Linux's ``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def size_text(nbytes: float) -> str:
    """Bytes for a reason a person reads.

    >>> size_text(3 * 2**30), size_text(334_400)
    ('3.00 GiB', '0.32 MiB')
    """
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.2f} MiB"


def _fits_host(nbytes: int, what: str) -> None:
    available = host_available_bytes()
    if available is not None and nbytes > HOST_SHARE * available:
        raise TooLarge(
            f"the samples padded to their longest take {size_text(nbytes)} ({what}), more than "
            f"{HOST_SHARE:.0%} of the {size_text(available)} of available host memory, where they are built"
        )


def _padded_size(ones: dict[int, list[torch.Tensor]], pads: dict[int, tuple], names: list[str]) -> tuple[int, str]:
    """The bytes of every sample's tensors stacked, each varying one padded to the longest (what
    :func:`_store` would allocate), computed from the shapes alone; and what makes it up."""
    rows = list(ones.values())
    total, parts = 0, []
    for k in range(len(rows[0])):
        ts = [r[k] for r in rows]
        size = ts[0].element_size()
        if k in pads:
            dim = pads[k][0]
            longest = max(t.shape[dim] for t in ts)
            row = int(np.prod([longest if d == dim else n for d, n in enumerate(ts[0].shape[1:], 1)]))
            total += len(ts) * row * size
            parts.append(f"{names[k]} {longest:,} long, {str(ts[0].dtype).removeprefix('torch.')}")
        else:
            total += sum(t.numel() for t in ts) * size
    return total, f"{len(rows):,} samples; " + ", ".join(parts)


def _varying(ones: dict[int, list[torch.Tensor]], k: int) -> int | None:
    """The one dimension along which tensor ``k`` of the samples' own outputs changes length (None:
    it keeps one shape); NotPadded where it changes in more than one."""
    ts = [r[k] for r in ones.values()]
    if len({t.dim() for t in ts}) != 1 or any(t.dim() == 0 or t.shape[0] != 1 for t in ts):
        raise NotPadded(f"tensor {k} of the collate_fn's output is not one row per sample (dim 0)")
    dims = [d for d in range(1, ts[0].dim()) if len({t.shape[d] for t in ts}) > 1]
    if len(dims) > 1:
        raise NotPadded(f"tensor {k} of the collate_fn's output changes length in more than one dimension")
    return dims[0] if dims else None


def _read_pads(ones: dict[int, list[torch.Tensor]], batches: list[list[int]], theirs: list[Any]) -> dict[int, tuple]:
    """For each tensor whose length changes from sample to sample: (dim, side, value) as the
    collate's own batches show it, from each row shorter than its batch: the sample's own row at
    the tail or the head, the rest one value; the commonest reading wins."""
    first = next(iter(ones.values()))
    leaves = [tensors_of(t) for t in theirs]
    if any(len(lv) != len(first) for lv in leaves):
        raise NotPadded("the collate_fn's output holds a different number of tensors for one sample than for a batch")
    pads: dict[int, tuple] = {}
    for k in range(len(first)):
        dim = _varying(ones, k)
        if dim is None:
            continue
        votes: Counter = Counter()
        for b, lv in zip(batches, leaves):
            t = lv[k]
            if t.dim() != first[k].dim() or t.shape[0] != len(b):
                raise NotPadded(f"tensor {k} of the collate_fn's output is not one row per sample (dim 0)")
            full = t.shape[dim]
            for r, i in enumerate(b):
                own, row = ones[i][k][0], t[r]
                n = own.shape[dim - 1]
                if n >= full:
                    continue
                for side, start, rest in (("tail", 0, n), ("head", full - n, 0)):
                    pad = row.narrow(dim - 1, rest, full - n)
                    if torch.equal(row.narrow(dim - 1, start, n), own) and bool((pad == pad.flatten()[0]).all()):
                        votes[(side, pad.flatten()[0].item())] += 1
        if not votes:
            raise NotPadded(
                f"the loader has a custom collate_fn, and tensor {k} of its output changes length but no "
                f"row of the sampled batches is the sample's own row padded with one value"
            )
        (side, value), _ = votes.most_common(1)[0]
        pads[k] = (dim, side, value)
    if not pads:
        raise NotPadded(
            "the loader has a custom collate_fn, and it is not one that pads (no tensor of its output "
            "changes length from sample to sample)"
        )
    return pads


def _store(
    ones: dict[int, list[torch.Tensor]], pads: dict[int, tuple], template: Any, per_sample: dict, same: dict
) -> PaddedSamples:
    """Every sample's own tensors (``ones``: the collate of that sample alone) stacked along dim 0,
    a varying one padded to the longest with its value at its side (``pads``: :func:`_read_pads`)."""
    rows = list(ones.values())
    stored, varying, values = [], {}, {}
    for k in range(len(rows[0])):
        ts = [r[k] for r in rows]
        if k not in pads:
            stored.append(torch.cat(ts))
            continue
        dim, side, value = pads[k]
        longest = max(t.shape[dim] for t in ts)
        shape = list(ts[0].shape)
        shape[0], shape[dim] = len(ts), longest
        out = torch.full(shape, value, dtype=ts[0].dtype)
        lengths = np.asarray([t.shape[dim] for t in ts])
        for i, t in enumerate(ts):
            n = t.shape[dim]
            out[i : i + 1].narrow(dim, 0 if side == "tail" else longest - n, n).copy_(t)
        stored.append(out)
        varying[k], values[k] = (dim, side, lengths), value
    return PaddedSamples(template, stored, varying, values, per_sample, same)


def _to_device(idx: list[int], device: torch.device) -> torch.Tensor:
    index = torch.as_tensor(idx, dtype=torch.long)
    if device.type == "cuda":  # pinned: the copy does not wait for the queued step
        index = index.pin_memory()
    return index.to(device, non_blocking=True)


def batch_indices(loader: DataLoader, device: torch.device) -> Iterator[tuple[list[int], torch.Tensor]]:
    """Each of ``loader``'s batches of indices, on the host and on ``device``, in its order (its
    sampler, seed and epoch, drawn as its own iterator draws them): the epoch's order copied
    once, sliced per batch (a view: no copy, no kernel a batch); a batch sampler's batches copied
    one by one."""
    draw_loader_base_seed(loader)  # as the loader's own iterator does: the same order
    if loader.batch_size is None:  # batch_sampler given, or automatic batching off
        for b in loader.batch_sampler:  # type: ignore[union-attr]
            yield list(b), _to_device(list(b), device)
        return
    order = list(iter(loader.sampler))  # the loader's own sampler: its seed, its epoch
    stop = len(order) - len(order) % loader.batch_size if loader.drop_last else len(order)
    if stop:
        on_device = _to_device(order[:stop], device)
        for i in range(0, stop, loader.batch_size):
            yield order[i : i + loader.batch_size], on_device[i : i + loader.batch_size]


class PaddedResidentLoader:
    """Batches cut from :class:`PaddedSamples` on the device, in ``loader``'s order (its sampler,
    seed and epoch), as its collate would build them. ``bucket`` (set by ``pad_buckets``) cuts each
    varying tensor at its bucket length instead of the batch's longest."""

    pads_on_device = True

    def __init__(self, store: PaddedSamples, loader: DataLoader) -> None:
        self.store, self.loader = store, loader
        self.bucket: Callable[[int], int | None] | None = None
        self.batch_size, self.drop_last = loader.batch_size, loader.drop_last
        self.dataset, self.sampler = loader.dataset, loader.sampler
        self.device = store.stored[0].device

    def __iter__(self) -> Iterator[Any]:
        for host, index in batch_indices(self.loader, self.device):
            yield self.store.cut(np.asarray(host), index, self.bucket)

    def __len__(self) -> int:
        return len(self.loader)

    def sample(self, n: int) -> list[Any]:
        """The first ``n`` batches (the loader's random state put back), for ``pad_buckets``' plan."""
        out = []
        for b in _sample_batches(self.loader, n):
            host = np.asarray(b)
            out.append(self.store.cut(host, torch.as_tensor(host, dtype=torch.long, device=self.device), self.bucket))
        return out
