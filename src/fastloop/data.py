"""Batch plumbing shared by the data-pipeline speedups: move any nested batch, rebuild a
DataLoader with new settings (the background feed is :mod:`fastloop.feed`).

Example:
    >>> import torch
    >>> b = {"x": torch.zeros(2, 3), "meta": ["a", "b"], "y": (torch.ones(2),)}
    >>> moved = map_tensors(lambda t: t + 1, b)
    >>> moved["x"].sum().item(), moved["meta"], moved["y"][0].sum().item()
    (6.0, ['a', 'b'], 4.0)
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import ConcatDataset, DataLoader, Subset, TensorDataset

from fastloop._torch_private import loader_auto_collation
from fastloop.errors import FastloopError

__all__ = [
    "WHOLE_BATCHES",
    "dataset_reads",
    "first_tensor",
    "fixed_samples",
    "map_tensors",
    "materialize",
    "sample_keys",
    "rebuild_loader",
    "set_sampler_epoch",
    "tensor_dataset_parts",
    "to_channels_last",
    "to_device",
    "yields_whole_batches",
]


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], batch: Any) -> Any:
    """Apply ``fn`` to every tensor in tensors, tuples, lists, mappings (BatchEncoding too) and dataclasses."""
    if torch.is_tensor(batch):
        return fn(batch)
    if isinstance(batch, Mapping):  # dicts, and UserDicts such as Hugging Face's BatchEncoding
        out = {k: map_tensors(fn, v) for k, v in batch.items()}
        with contextlib.suppress(Exception):  # its own type, where it can be built from a dict
            return type(batch)(out)
        return out
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_tensors(fn, v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(fn, v) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(
            batch, **{f.name: map_tensors(fn, getattr(batch, f.name)) for f in dataclasses.fields(batch) if f.init}
        )
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


FIXED_PROBES = 64
"""How many indices :func:`fixed_samples` reads three times each."""
FIXED_MAX_S = 30.0
"""The longest :func:`materialize` may take, estimated from the probe's reads."""
_RNG_TYPES: tuple[type, ...] = (torch.Generator, random.Random, np.random.Generator, np.random.RandomState)


FIXED_TRANSFORMS = frozenset(
    {
        "ToTensor",
        "PILToTensor",
        "ToImage",
        "ToDtype",
        "ToPureTensor",
        "ConvertImageDtype",
        "Normalize",
        "Resize",
        "CenterCrop",
        "Grayscale",
        "Pad",
    }
)
"""torchvision transforms giving the same output for the same input (a Compose of them too)."""


def _random_part(transform: Any) -> str | None:
    """None for a transform in :data:`FIXED_TRANSFORMS` (or a Compose of them); else the part that may draw anew."""
    cls = type(transform)
    if getattr(transform, "fixed_output", False) is True:  # declared so: gpu_augment's layout converter
        return None
    if not cls.__module__.startswith("torchvision.transforms"):
        return getattr(transform, "__name__", None) or cls.__name__
    if cls.__name__ == "Compose":
        return next((part for t in transform.transforms if (part := _random_part(t))), None)
    return None if cls.__name__ in FIXED_TRANSFORMS else cls.__name__


@dataclasses.dataclass(frozen=True)
class FixedSamples:
    """A map-style dataset whose samples are fixed: what :func:`fixed_samples` found."""

    n: int
    item_bytes: int
    read_s: float
    """Seconds per ``dataset[i]`` in the probe."""


def same_value(a: Any, b: Any) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (
            torch.is_tensor(a)
            and torch.is_tensor(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    if isinstance(a, (np.ndarray, np.generic)) or isinstance(b, (np.ndarray, np.generic)):
        return type(a) is type(b) and a.dtype == b.dtype and bool(np.array_equal(a, b))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _leaves_ok(item: Any) -> bool:
    """A sample default_collate stacks into tensors only: a tensor, an array, a number, or a
    tuple/list or a dict (string keys) of those (not strings or None, nothing nested)."""
    if torch.is_tensor(item) or isinstance(item, (bool, int, float)):
        return True
    if isinstance(item, (np.ndarray, np.generic)):  # arrays and numpy scalars (a label read from an array)
        return item.dtype.kind in "biuf"
    if isinstance(item, (list, tuple)) and not hasattr(item, "_fields"):
        return len(item) > 0 and all(_leaves_ok(x) and not isinstance(x, (list, tuple, dict)) for x in item)
    if type(item) is dict:
        return len(item) > 0 and all(
            isinstance(k, str) and _leaves_ok(v) and not isinstance(v, (list, tuple, dict)) for k, v in item.items()
        )
    return False


def _item_bytes(item: Any) -> int:
    if torch.is_tensor(item):
        return item.numel() * item.element_size()
    if isinstance(item, (np.ndarray, np.generic)):
        return int(item.nbytes)
    if isinstance(item, (list, tuple)):
        return sum(_item_bytes(x) for x in item)
    if isinstance(item, dict):
        return sum(_item_bytes(x) for x in item.values())
    return 8


def _holds_samples(value: Any, n: int) -> bool:
    """A tensor or array of ``n`` rows; a list/tuple of ``n`` tensors, arrays, tuples of them, or
    sequences of numbers (token ids); or a dict of such (a tokenizer's encodings)."""
    if torch.is_tensor(value) or isinstance(value, np.ndarray):
        return value.ndim > 0 and value.shape[0] == n
    if isinstance(value, dict) and not torch.is_tensor(value):
        return any(_holds_samples(v, n) for v in list(value.values())[:16])
    if isinstance(value, (list, tuple)) and len(value) == n:
        first = value[0]
        if isinstance(first, (list, tuple)) and first:
            return all(torch.is_tensor(x) or isinstance(x, np.ndarray) for x in first) or all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in first
            )
        return torch.is_tensor(first) or isinstance(first, np.ndarray)
    return False


def _why_not_held(dataset: Any, name: str, n: int) -> str | None:
    """Why ``dataset``'s attributes say its samples are not fixed in memory (None: they may be;
    the probe reads decide). torch's Subset and ConcatDataset read their parts: the parts decide."""
    if isinstance(dataset, (ConcatDataset, Subset)):
        for part in dataset.datasets if isinstance(dataset, ConcatDataset) else [dataset.dataset]:
            if not isinstance(part, TensorDataset) and isinstance(why := fixed_samples(part), str):
                return why
        return None
    attrs = vars(dataset) if hasattr(dataset, "__dict__") else {}
    if not any(_holds_samples(v, n) for v in attrs.values()):
        return (
            f"the dataset ({name}) holds no tensor, array or list of tensors of its length ({n}): its samples "
            f"are not in memory"
        )
    rngs = [k for k, v in attrs.items() if isinstance(v, _RNG_TYPES)]
    if rngs:
        return f"the dataset ({name}) owns a random generator ({', '.join(rngs)}): its samples may be drawn anew"
    transforms = [
        f"{k} ({_random_part(v)})"
        for k, v in attrs.items()
        if "transform" in k.lower() and v is not None and _random_part(v)
    ]
    if transforms:
        return (
            f"the dataset ({name}) passes its samples through {', '.join(transforms)}, which may be random "
            f"(fixed: torchvision's {', '.join(sorted(FIXED_TRANSFORMS))} and a Compose of them)"
        )
    return None


def fixed_samples(dataset: Any) -> FixedSamples | str:
    """Whether ``dataset`` (map-style, not a TensorDataset) holds its samples in memory and gives
    the same values for the same index every time, so that reading it once and keeping the result
    changes nothing: a :class:`FixedSamples`, or why not (a string).

    The test: the dataset holds a tensor or array as long as itself (or a list of that many tensors,
    arrays or tuples of them), owns no random generator and no ``transform`` attribute but a fixed
    one (:data:`FIXED_TRANSFORMS`: ToTensor, Normalize, ...); :data:`FIXED_PROBES` indices read
    three times each give equal samples (a random augmentation applied with probability 0.05
    differs in one of them with probability above 0.9999); every sample is tensors and numbers.
    The global random states (torch, numpy, random) are put back afterwards, so probing changes
    nothing the training draws.

    Example:
        >>> class Pairs(torch.utils.data.Dataset):
        ...     def __init__(self):
        ...         self.x, self.y = torch.arange(8.0).view(4, 2), torch.arange(4)
        ...     def __len__(self):
        ...         return 4
        ...     def __getitem__(self, i):
        ...         return self.x[i] * 2, self.y[i]
        >>> fixed_samples(Pairs()).n
        4
        >>> class Noisy(Pairs):
        ...     def __getitem__(self, i):
        ...         return self.x[i] + torch.rand(2), self.y[i]
        >>> fixed_samples(Noisy())
        'Noisy[i] gave different values when read again (random per-sample work)'
    """
    name = type(dataset).__name__
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return f"the dataset is an IterableDataset ({name}): it has no index to read samples by"
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        return f"the dataset ({name}) has no __getitem__ and __len__"
    try:
        n = len(dataset)
    except Exception as err:  # noqa: BLE001 - a dataset's __len__ may raise anything
        return f"len() of the dataset ({name}) raised {type(err).__name__}"
    if n <= 0:
        return f"the dataset ({name}) is empty"
    why_not = _why_not_held(dataset, name, n)
    if why_not:
        return why_not
    probes = sorted({0, n - 1, *np.linspace(0, n - 1, min(n, FIXED_PROBES)).astype(int).tolist()})
    states = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    t0 = time.perf_counter()
    try:
        for i in probes:
            first = dataset[i]
            if not _leaves_ok(first):
                return (
                    f"{name}[{i}] is a {type(first).__name__} that default_collate does not stack into tensors "
                    f"alone; gpu_resident serves a tensor, a list or a dict of tensors (from samples of tensors "
                    f"and numbers, nothing nested)"
                )
            if not (same_value(first, dataset[i]) and same_value(first, dataset[i])):
                return f"{name}[i] gave different values when read again (random per-sample work)"
            if i == probes[0] and (time.perf_counter() - t0) / 3 * n > FIXED_MAX_S:
                break  # too slow to read once: said below, without reading the other probes
    except Exception as err:  # noqa: BLE001 - the user's __getitem__ may raise anything
        return f"reading {name}[i] raised {type(err).__name__}: {err}"
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])
    read_s = (time.perf_counter() - t0) / (3 * (probes.index(i) + 1))
    if read_s * n > FIXED_MAX_S:
        return (
            f"reading the {n:,} samples of {name} once would take about {read_s * n:.0f} s "
            f"(more than {FIXED_MAX_S:.0f} s)"
        )
    return FixedSamples(n=n, item_bytes=_item_bytes(dataset[0]), read_s=read_s)


def _seed_globals(seed: int) -> None:
    torch.default_generator.manual_seed(seed)  # the CPU's: a sample is drawn on the host (CUDA's left alone)
    np.random.seed(seed)
    random.seed(seed)


def dataset_reads(dataset: Any, probes: int = 2) -> str | None:
    """How a map-style dataset's reads vary: ``"fixed"`` (the same sample every time),
    ``"global_draws"`` (random per-sample work drawn from the global generators: torch, numpy,
    random; worker processes, each seeded apart, draw other numbers) or ``"own_state"`` (reads
    change with a state the dataset holds: a cursor that ignores the index, a generator of its
    own; worker processes each copy it). None: not read by index, or a read raised.

    Each of ``probes`` indices is read three times: twice from the same global random state
    (equal unless the dataset holds a state of its own), once from another. The global random
    states are put back afterwards, so probing changes nothing the training draws.

    Example:
        >>> class Noisy(torch.utils.data.Dataset):
        ...     def __len__(self):
        ...         return 4
        ...     def __getitem__(self, i):
        ...         return torch.rand(2) + i
        >>> dataset_reads(Noisy()), dataset_reads(TensorDataset(torch.arange(4.0)))
        ('global_draws', 'fixed')
    """
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__getitem__"):
        return None
    states = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    found = "fixed"
    try:
        n = len(dataset)
        for i in sorted({0, n - 1})[:probes] if n > 0 else []:
            _seed_globals(0)
            first = dataset[i]
            _seed_globals(0)
            if not same_value(first, dataset[i]):
                return "own_state"
            _seed_globals(1)
            if not same_value(first, dataset[i]):
                found = "global_draws"
    except Exception:  # noqa: BLE001 - the user's __getitem__ may raise anything: unknown, not an error here
        return None
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])
    return found


def materialize(dataset: Any) -> tuple[torch.Tensor, ...]:
    """Every sample of a dataset :func:`fixed_samples` accepted, read once and stacked as the
    DataLoader's ``default_collate`` stacks a batch: indexing the result by a batch's indices gives
    that batch exactly (values, dtypes; a dict sample's tensors in its key order, see
    :func:`sample_keys`)."""
    from torch.utils.data import default_collate

    stacked = default_collate([dataset[i] for i in range(len(dataset))])
    if isinstance(stacked, dict):  # in the sample's key order (sample_keys gives the keys)
        return tuple(stacked.values())
    return (stacked,) if torch.is_tensor(stacked) else tuple(stacked)


def sample_keys(dataset: Any) -> tuple[str, ...] | None:
    """The keys of a dataset's dict samples, in order (None when a sample is not a dict)."""
    first = dataset[0]
    return tuple(first) if isinstance(first, dict) else None


def set_sampler_epoch(loader: Any, epoch: int) -> None:
    """Tell ``loader``'s sampler (and its batch sampler's) which epoch begins, where it has
    ``set_epoch`` (a ``DistributedSampler`` reshuffles from its seed and the epoch; without the
    call every epoch repeats the first one's order), as Lightning's fit loop does at each epoch's
    start. Feeds that wrap a loader expose its ``sampler``.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> from torch.utils.data.distributed import DistributedSampler
        >>> ds = list(range(8))
        >>> loader = DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, num_replicas=2, rank=0))
        >>> set_sampler_epoch(loader, 3)
        >>> loader.sampler.epoch
        3
    """
    found: dict[int, Any] = {}  # by id: a sampler may be unhashable
    for sampler in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if sampler is not None:
            found[id(sampler)] = sampler
    for sampler in found.values():
        if callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(epoch)


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    return map_tensors(lambda t: t.to(device, non_blocking=non_blocking), batch)


def to_channels_last(batch: Any) -> Any:
    """Every 4-D floating tensor of ``batch`` in channels_last memory format (images, NCHW)."""
    return map_tensors(
        lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 and t.is_floating_point() else t,
        batch,
    )


_LOADER_KEYS = (
    "batch_size",
    "shuffle",
    "sampler",
    "batch_sampler",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def _resized_batch_sampler(batch_sampler: Any, size: int) -> Any:
    """Another batch sampler like ``batch_sampler`` that yields ``size`` indices per batch
    (as Lightning re-instantiates one: same class, its sampler and drop_last)."""
    sampler, drop_last = getattr(batch_sampler, "sampler", None), getattr(batch_sampler, "drop_last", None)
    if sampler is None or drop_last is None or not hasattr(batch_sampler, "batch_size"):
        raise FastloopError(
            f"the loader's batch_sampler ({type(batch_sampler).__name__}) has no sampler, batch_size "
            f"and drop_last to rebuild it at another batch size; give it those attributes (as "
            f"torch's BatchSampler has) or build the DataLoader from batch_size"
        )
    try:
        return type(batch_sampler)(sampler, batch_size=size, drop_last=drop_last)
    except TypeError as err:
        raise FastloopError(
            f"the loader's batch_sampler ({type(batch_sampler).__name__}) cannot be rebuilt at "
            f"batch size {size}: {type(batch_sampler).__name__}(sampler, batch_size=, drop_last=) "
            f"raised {err}"
        ) from None


WHOLE_BATCHES = "the loader does not batch (batch_size=None: its dataset yields whole batches)"
"""Why a loader's batch size (and gpu_resident the loader) is left alone: :func:`yields_whole_batches`."""


def yields_whole_batches(loader: DataLoader) -> bool:
    """A loader made with ``batch_size=None``: each item of its dataset is a whole batch."""
    return loader.batch_sampler is None and loader.batch_size is None


def rebuild_loader(loader: DataLoader, **overrides: Any) -> DataLoader:
    """A new DataLoader over the same dataset, sampler and collate function, with ``overrides``.

    The rebuilt loader is of ``loader``'s class where that class takes DataLoader's arguments
    (:func:`_rebuildable_class`); ``loader_cls`` (an override) builds another. Raises TypeError if
    ``loader`` is not a ``torch.utils.data.DataLoader``.
    """
    if not isinstance(loader, DataLoader):
        raise TypeError(f"expected a torch DataLoader, got {type(loader).__name__}")
    kw: dict[str, Any] = {}
    for key in _LOADER_KEYS:
        if hasattr(loader, key):
            kw[key] = getattr(loader, key)
    kw.pop("shuffle", None)  # the sampler already encodes it
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        # its sampler is DataLoader's own stand-in, which DataLoader refuses to be given back
        kw.pop("sampler", None)
        kw.pop("batch_sampler", None)
    elif yields_whole_batches(loader):  # its sampler deals the dataset's whole batches out
        kw.pop("batch_sampler", None)
        kw.pop("drop_last", None)
        if "batch_size" in overrides:
            raise FastloopError(
                f"{WHOLE_BATCHES}, so fastloop cannot set its batch size; make the batches in the "
                f"DataLoader (batch_size=N) or leave batch_size out"
            )
    elif loader.batch_sampler is not None and loader_auto_collation(loader) and kw.get("batch_size") is not None:
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
    cls = kw.pop("loader_cls", None) or _rebuildable_class(loader)
    return cls(loader.dataset, **kw)


def _rebuildable_class(loader: DataLoader) -> type[DataLoader]:
    """The class a rebuilt loader keeps: the loader's own where it takes DataLoader's arguments
    (a subclass that does not override ``__init__``, such as ``workers``' loader, which keeps
    the RNG stream of a loader without workers), else DataLoader."""
    cls = type(loader)
    return cls if cls.__init__ is DataLoader.__init__ else DataLoader
