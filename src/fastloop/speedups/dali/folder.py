"""A user's own image folder through NVIDIA DALI: a ``torchvision.datasets.ImageFolder`` (or any
``DatasetFolder`` of JPEG/PNG files) whose transform is a torchvision pipeline of recognised ops,
translated into one DALI pipeline (file reader -> decode, on the GPU's "mixed" decoder where
there is one -> crop/resize -> ``crop_mirror_normalize``), as NVIDIA's ResNet-50 example builds it.

What is kept of the user's loader: the same files and labels (the dataset's own ``samples``, so
labels agree with ``class_to_idx`` by construction), its batch size, ``drop_last`` and so
``len(loader)`` and the epoch's length (schedulers size themselves from it), shuffling when its
sampler shuffles (the whole list permuted each epoch from a seed: the same seed, the same order),
and the batch structure it yields (``[images, labels]``: float32 NCHW in the transform's value
range, int64 labels). Recognised ops, with the parameters read from the user's objects:
``RandomResizedCrop`` (size, scale, ratio), ``Resize`` (an int: torchvision's own output size;
or ``(h, w)``), each with its interpolation (bilinear, bicubic or nearest), ``CenterCrop``,
``RandomCrop`` (size, padding, a constant fill: its place drawn per image as torchvision draws
it), ``RandomHorizontalFlip`` (p), ``ToTensor`` / ``PILToTensor`` / ``ToImage`` + ``ToDtype``
(float, scaled), ``Normalize``. Anything else (another op, another interpolation, a ``Resize``
before ``RandomResizedCrop``, a padding mode or ``pad_if_needed`` DALI's constant padding cannot
copy, a custom sampler, collate, batch sampler, a ``target_transform``, files DALI does not
decode) raises :class:`NotTranslated` naming it. DALI's resize is not PIL's: values differ by
interpolation; the test measures the mean absolute difference after normalisation on a
deterministic pipeline.

Example (a CPU pipeline; on a GPU pass ``device_id``):
    ``DaliFolderLoader(loader, device_id=None)`` iterates like ``loader``.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler, default_collate

from fastloop.cuda_env import cuda_queues_note
from fastloop.errors import FastloopError
from fastloop.transforms import torchvision_padding, unwrap_subsets

__all__ = [
    "DaliFolderLoader",
    "DaliPipeline",
    "DaliSettings",
    "FolderPlan",
    "NotTranslated",
    "ReaderShard",
    "check_folder",
    "default_hw_decoder_load",
    "plan_folder",
    "rank_world",
    "reader_shard",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class NotTranslated(ValueError):
    """The loader cannot be served by DALI; the message names what."""


@dataclass
class FolderPlan:
    """The DALI pipeline's parameters, read from the user's transform."""

    crop: tuple[int, int]
    random_crop: tuple[tuple[float, float], tuple[float, float]] | None = None  # (scale, ratio)
    resize_shorter: int | None = None
    resize_hw: tuple[int, int] | None = None  # Resize((h, w)): that exact size
    pad_crop: tuple[int, int, int, int] | None = None
    """RandomCrop: its padding (left, top, right, bottom); the crop's place is drawn per image."""
    fill: tuple[float, ...] = (0.0,)
    flip: float = 0.0
    scale: float = 1.0  # 1/255 where ToTensor/ToDtype(scale=True) maps to [0, 1]
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    to_float: bool = False
    interp: str = "INTERP_LINEAR"
    """DALI's interpolation for the resize: the user's Resize/RandomResizedCrop interpolation."""


INTERPOLATIONS = {"bilinear": "INTERP_LINEAR", "bicubic": "INTERP_CUBIC", "nearest": "INTERP_NN"}
"""torchvision's interpolation modes that DALI's resize has, by DALI's name."""
_PIL_MODES = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # an int interpolation: PIL's constants


def _interpolation(op: Any, name: str) -> str:
    """DALI's name for ``op``'s interpolation; NotTranslated naming one DALI's resize lacks.

    Example:
        >>> import torchvision.transforms as T
        >>> _interpolation(T.Resize(256, interpolation=T.InterpolationMode.BICUBIC), "Resize")
        'INTERP_CUBIC'
    """
    mode = getattr(op, "interpolation", "bilinear")
    mode = _PIL_MODES.get(mode, str(mode)) if isinstance(mode, int) else getattr(mode, "value", str(mode))
    if mode not in INTERPOLATIONS:
        raise NotTranslated(
            f"{name} uses {mode} interpolation, which the DALI translation does not have "
            f"({', '.join(INTERPOLATIONS)} are translated)"
        )
    return INTERPOLATIONS[mode]


def _size(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    v = list(value)
    return (int(v[0]), int(v[0])) if len(v) == 1 else (int(v[0]), int(v[1]))


def _ops(transform: Any) -> list[Any]:
    name = type(transform).__name__
    if name == "Compose":
        return [op for t in transform.transforms for op in _ops(t)]
    if not type(transform).__module__.startswith("torchvision.transforms"):
        raise NotTranslated(f"the transform holds {name}, not a torchvision op")
    return [transform]


def _random_crop(op: Any, plan: FolderPlan, normalized: bool) -> None:
    if op.pad_if_needed or op.padding_mode != "constant":
        raise NotTranslated(
            f"RandomCrop pads with pad_if_needed={op.pad_if_needed}, padding_mode={op.padding_mode!r} "
            f"(the DALI translation pads with a constant, pad_if_needed=False)"
        )
    if normalized and op.padding is not None:
        raise NotTranslated("RandomCrop pads after Normalize (the DALI translation pads the decoded image)")
    if not isinstance(op.fill, (int, float, tuple, list)):
        raise NotTranslated(f"RandomCrop's fill {op.fill!r} is not a number or one per channel")
    plan.pad_crop = torchvision_padding(op)
    fill = tuple(float(f) for f in op.fill) if isinstance(op.fill, (tuple, list)) else (float(op.fill),)
    plan.fill = tuple(f / plan.scale for f in fill) if plan.to_float else fill  # a float image's fill, in bytes


def plan_folder(transform: Any) -> FolderPlan:
    """Translate ``transform``; :class:`NotTranslated` naming the first op that is not."""
    crop: tuple[int, int] | None = None
    plan = FolderPlan(crop=(0, 0))
    normalized = False
    for op in _ops(transform):
        name = type(op).__name__
        if name in ("RandomResizedCrop", "CenterCrop", "RandomCrop", "Resize") and crop is not None:
            raise NotTranslated(f"the transform holds {name} after a crop (the DALI translation crops once, last)")
        if name in ("RandomResizedCrop", "Resize"):
            plan.interp = _interpolation(op, name)
        if name == "RandomResizedCrop":
            if plan.resize_shorter or plan.resize_hw:
                raise NotTranslated(
                    "the transform holds Resize before RandomResizedCrop (the DALI translation "
                    "decodes the random crop straight from the file)"
                )
            crop, plan.random_crop = _size(op.size), (tuple(op.scale), tuple(op.ratio))
        elif name == "Resize":
            if getattr(op, "max_size", None) is not None:
                raise NotTranslated(f"Resize has max_size={op.max_size} (the DALI translation resizes without it)")
            size = [op.size] if isinstance(op.size, int) else [int(v) for v in op.size]
            if len(size) == 1:
                plan.resize_shorter = int(size[0])
            else:
                plan.resize_hw = (size[0], size[1])
        elif name == "CenterCrop":
            crop = _size(op.size)
        elif name == "RandomCrop":
            crop = _size(op.size)
            _random_crop(op, plan, normalized)
        elif name == "RandomHorizontalFlip":
            plan.flip = float(op.p)
        elif name in ("ToTensor",):
            plan.to_float, plan.scale = True, 1 / 255
        elif name in ("PILToTensor", "ToImage", "ToPureTensor"):
            continue
        elif name in ("ToDtype", "ConvertImageDtype"):
            plan.to_float = True
            plan.scale = 1 / 255 if getattr(op, "scale", True) else 1.0
        elif name == "Normalize":
            plan.mean, plan.std = tuple(float(m) for m in op.mean), tuple(float(s) for s in op.std)
            normalized = True
        else:
            raise NotTranslated(
                f"the transform holds {name}, which the DALI translation does not recognise "
                f"(RandomResizedCrop, Resize, CenterCrop, RandomCrop, RandomHorizontalFlip, ToTensor, "
                f"ToDtype, Normalize)"
            )
    if crop is None and plan.resize_hw is not None:
        crop = plan.resize_hw
    if crop is None:
        raise NotTranslated(
            "the transform neither crops nor resizes to a fixed size "
            "(RandomResizedCrop, CenterCrop, RandomCrop or Resize((h, w)))"
        )
    if not plan.to_float:
        raise NotTranslated("the transform does not end in a float tensor (ToTensor, or ToImage + ToDtype)")
    plan.crop = crop
    return plan


@dataclass(frozen=True)
class ReaderShard:
    """Which files of the list this rank's DALI reader reads: what the loader's sampler says
    (:func:`reader_shard`)."""

    shard_id: int
    num_shards: int
    shuffle: bool


def reader_shard(sampler: Any) -> ReaderShard:
    """The DALI reader's share for a loader with ``sampler``: a ``DistributedSampler`` (Lightning
    gives a training loader one under DDP and FSDP; a plain loop's own) reads its rank's shard of
    the list, shuffled each epoch when the sampler shuffles (DALI's reader permutes the whole list
    from one seed of its own, the same on every rank, so the shards of an epoch are disjoint); a
    ``RandomSampler`` or ``SequentialSampler`` reads every file, as the loader does; anything else
    (a wrapper around a sampler of one's own included) raises :class:`NotTranslated` naming it.
    DALI's shards are contiguous slices of the list, a ``DistributedSampler``'s every k-th index:
    both disjoint, together the whole list.

    Example:
        >>> from torch.utils.data.distributed import DistributedSampler
        >>> reader_shard(DistributedSampler(range(10), num_replicas=4, rank=3, seed=5))
        ReaderShard(shard_id=3, num_shards=4, shuffle=True)
        >>> reader_shard(SequentialSampler(range(10)))
        ReaderShard(shard_id=0, num_shards=1, shuffle=False)
    """
    from torch.utils.data.distributed import DistributedSampler

    if type(sampler) is DistributedSampler:
        return ReaderShard(int(sampler.rank), int(sampler.num_replicas), bool(sampler.shuffle))
    if type(sampler) in (RandomSampler, SequentialSampler):
        return ReaderShard(0, 1, type(sampler) is RandomSampler)
    raise NotTranslated(f"the loader has a custom sampler ({type(sampler).__name__})")


def check_folder(loader: Any) -> FolderPlan:
    """The plan for ``loader`` without building a pipeline; :class:`NotTranslated` naming what does not fit."""
    ds, _, _ = _check_loader(loader)
    return plan_folder(ds.transform)


def _check_loader(loader: Any) -> tuple[Any, list[tuple[str, int]], ReaderShard]:
    """The folder dataset (inside ``Subset`` wrappers: ``random_split``'s), the (file, label) pairs
    the loader reads and this rank's share of them (:func:`reader_shard`); NotTranslated naming
    what does not fit."""
    try:
        from torchvision.datasets import DatasetFolder
    except ImportError as err:  # pragma: no cover - torchvision is a dependency
        raise NotTranslated(f"torchvision is not importable: {err}") from None
    if not isinstance(loader, DataLoader):
        raise NotTranslated(f"the loader is a {type(loader).__name__}, not a torch DataLoader")
    ds, indices = unwrap_subsets(loader.dataset)
    if not isinstance(ds, DatasetFolder):
        raise NotTranslated(f"the dataset is a {type(ds).__name__}, not a torchvision ImageFolder/DatasetFolder")
    if getattr(ds, "target_transform", None) is not None:
        raise NotTranslated(f"the dataset has a target_transform ({type(ds.target_transform).__name__})")
    from torchvision.datasets import folder

    reads = getattr(ds, "loader", folder.default_loader)
    if reads not in (folder.default_loader, folder.pil_loader):  # DALI decodes to RGB as PIL's convert("RGB")
        raise NotTranslated(
            f"the dataset reads its files with {getattr(reads, '__name__', type(reads).__name__)}, "
            f"not torchvision's default loader (DALI decodes each file to RGB itself)"
        )
    if loader.collate_fn is not default_collate:
        raise NotTranslated(f"the loader has a custom collate_fn ({getattr(loader.collate_fn, '__name__', '?')})")
    if loader.batch_size is None:
        raise NotTranslated("the loader has a custom batch_sampler")
    shard = reader_shard(loader.sampler)
    samples = list(ds.samples) if indices is None else [ds.samples[i] for i in indices]
    bad = next((p for p, _ in samples if not p.lower().endswith(IMAGE_SUFFIXES)), None)
    if bad is not None:
        raise NotTranslated(f"{os.path.basename(bad)} is not a JPEG or PNG file")
    if not samples:
        raise NotTranslated("the folder holds no images")
    return ds, samples, shard


def default_hw_decoder_load(device_id: int | None) -> float:
    """Share of JPEGs for the GPU's hardware decoder (NVJPG engines) rather than CUDA kernels.

    DALI's default, 0.65, was tuned on the A100. Hopper has more NVJPG engines: on our H200
    0.99 decoded 22.5k img/s alone vs 20.7k at 0.65, and DALI's own kernels took 1.4 instead of
    2.1 ms of GPU time per ResNet-50 step (the DALI settings table of
    `git show d4c3d80:benchmarks/HISTORY.md`). Other GPUs keep DALI's default.
    """
    if device_id is None or not torch.cuda.is_available():
        return 0.65
    return 0.99 if torch.cuda.get_device_capability(device_id)[0] == 9 else 0.65


def rank_world() -> tuple[int, int]:
    """(this process's rank, the number of ranks): each rank reads its own shard of the files."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


@dataclass(frozen=True)
class DaliSettings:
    """How the pipeline runs, not what it computes (the :class:`FolderPlan` says that).

    Args:
        num_threads: DALI's CPU threads (file reading, JPEG parsing); default min(8, cores).
        channels_last: emit NHWC, handed out as NCHW tensors in channels_last memory format.
        dtype: torch.float32 or torch.float16 images.
        hw_decoder_load: share of JPEGs for the hardware decoder (NVJPG); default
            :func:`default_hw_decoder_load` (0.99 on Hopper, DALI's 0.65 elsewhere).
        prefetch_queue_depth: batches DALI prepares ahead.
        gpu_labels: hand out labels on the GPU (otherwise on the CPU, copied by the training step).
        affine: pin DALI's decoder threads to CPU cores.
        antialias: DALI's antialiasing filter when the random crop is scaled down (DALI's
            default, True); NVIDIA's ResNet-50 example turns it off (cheaper on the GPU).
        exec_dynamic: DALI's executor: None or True for DALI 2's dynamic executor, False for the
            older executor.
    """

    num_threads: int | None = None
    channels_last: bool = False
    dtype: torch.dtype = torch.float32
    hw_decoder_load: float | None = None
    prefetch_queue_depth: int = 2
    gpu_labels: bool = True
    affine: bool = True
    antialias: bool = True
    exec_dynamic: bool | None = None

    def __post_init__(self) -> None:
        if self.dtype not in (torch.float32, torch.float16):
            raise FastloopError(f"DALI images can be float32 or float16, got {self.dtype}")
        if self.hw_decoder_load is not None and not 0.0 <= self.hw_decoder_load <= 1.0:
            raise FastloopError(f"hw_decoder_load is a fraction in [0, 1], got {self.hw_decoder_load}")


def _fixed_geometry(data: Any, images: Any, plan: FolderPlan, antialias: bool) -> Any:
    """Resize and crop as the plan says, in DALI's graph: ``Resize(int)`` to torchvision's own output
    size (the shorter side to ``size``, the longer ``int(size * long / short)``), ``Resize((h, w))``
    to that size, and RandomCrop's place drawn per image as torchvision draws it (an integer
    offset uniform over the padded image's places; the padding filled with ``fill``)."""
    import nvidia.dali.math as dmath
    from nvidia.dali import fn, types

    shape = fn.peek_image_shape(data, dtype=types.FLOAT)  # from the encoded file: H, W, C
    h, w = fn.slice(shape, 0, 1, axes=[0]), fn.slice(shape, 1, 1, axes=[0])
    if plan.resize_shorter:
        size = float(plan.resize_shorter)
        long = dmath.floor(size * dmath.max(h, w) / dmath.min(h, w) + 1e-3)
        wide = fn.cast(w > h, dtype=types.FLOAT)  # the height is the shorter side
        h, w = wide * size + (1.0 - wide) * long, wide * long + (1.0 - wide) * size
        images = fn.resize(images, size=fn.cat(h, w), antialias=antialias, interp_type=getattr(types, plan.interp))
    elif plan.resize_hw:
        images = fn.resize(
            images,
            size=[float(v) for v in plan.resize_hw],
            antialias=antialias,
            interp_type=getattr(types, plan.interp),
        )
        h, w = float(plan.resize_hw[0]), float(plan.resize_hw[1])
    if plan.pad_crop is None:
        return images
    left, top, right, bottom = plan.pad_crop
    (ch, cw), place = plan.crop, []
    for extent, before, after, crop in ((h, top, bottom, ch), (w, left, right, cw)):
        last = extent + float(before + after - crop)  # the last place in the padded image
        draw = dmath.floor(fn.random.uniform(range=[0.0, 1.0]) * (last + 1.0))
        place.append(fn.reshape(dmath.min(draw, last) - float(before), shape=[1]))
    return fn.slice(
        images,
        start=fn.cast(fn.cat(*place), dtype=types.INT32),
        shape=[ch, cw],
        axis_names="HW",
        out_of_bounds_policy="pad",
        fill_values=list(plan.fill),
    )


def _last_batch(drop_last: bool, shards: int) -> str:
    """DALI's policy for an epoch's last batch: dropped with ``drop_last``; with several shards
    (ranks) filled with repeats of the shard's last files, since DALI pads a shorter shard to the
    longest one's batches and every rank must take the same number of steps (DDP's collectives
    pair them; a ``DistributedSampler`` pads its shares with repeats alike); else partial, as the
    DataLoader's."""
    return "DROP" if drop_last else "FILL" if shards > 1 else "PARTIAL"


class DaliPipeline:
    """One DALI pipeline: ``files`` with ``labels`` read (this rank's shard; the whole list permuted
    each epoch when ``shuffle``), decoded (on the GPU's "mixed" decoder with ``device_id``, else on
    the CPU), cropped, resized, flipped and normalised as ``plan`` says; iterated as
    ``[images, labels]`` batches. The one builder behind the ``dali`` speedup
    (:class:`DaliFolderLoader`) and the ImageNet recipe's loader."""

    def __init__(
        self,
        files: list[str],
        labels: list[int],
        plan: FolderPlan,
        batch_size: int,
        *,
        device_id: int | None,
        shuffle: bool,
        drop_last: bool,
        seed: int = 0,
        settings: DaliSettings | None = None,
        share: ReaderShard | None = None,
    ) -> None:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        st = settings or DaliSettings()
        self.plan, self.batch_size, self.drop_last, self.n = plan, batch_size, drop_last, len(files)
        self.shard, self.num_shards = (share.shard_id, share.num_shards) if share is not None else rank_world()
        self.channels_last = st.channels_last
        gpu = device_id is not None
        if gpu and (note := cuda_queues_note()):
            warnings.warn(note, stacklevel=3)
        load = st.hw_decoder_load if st.hw_decoder_load is not None else default_hw_decoder_load(device_id)
        # nvJPEG settings from NVIDIA's ResNet-50 example: pad the decoder's buffers so that a
        # large image does not trigger a reallocation mid-epoch, and size the hardware decoder's
        dec = (
            dict(
                device="mixed",
                hw_decoder_load=load,
                affine=st.affine,
                device_memory_padding=211025920,
                host_memory_padding=140544512,
                preallocate_width_hint=5980,
                preallocate_height_hint=6430,
                output_type=types.RGB,
            )
            if gpu
            else dict(device="cpu", output_type=types.RGB)
        )
        layout = "HWC" if st.channels_last else "CHW"
        out_type = types.FLOAT if st.dtype == torch.float32 else types.FLOAT16
        shard, shards = self.shard, self.num_shards
        antialias = st.antialias and plan.interp != "INTERP_NN"  # DALI: nearest has no antialiasing (nor PIL's)

        @pipeline_def
        def pipe():
            data, lab = fn.readers.file(
                files=files,
                labels=labels,
                shuffle_after_epoch=shuffle,
                seed=seed,
                shard_id=shard,
                num_shards=shards,
                stick_to_shard=not shuffle,  # as a DistributedSampler: the same files each epoch (DALI moves on)
                pad_last_batch=not drop_last,
                name="Reader",
            )
            if plan.random_crop is not None:
                scale, ratio = plan.random_crop
                images = fn.decoders.image_random_crop(
                    data, random_area=list(scale), random_aspect_ratio=list(ratio), num_attempts=10, **dec
                )  # torchvision's RandomResizedCrop tries 10
                images = fn.resize(
                    images,
                    resize_x=plan.crop[1],
                    resize_y=plan.crop[0],
                    antialias=antialias,
                    interp_type=getattr(types, plan.interp),
                )
            else:
                images = _fixed_geometry(data, fn.decoders.image(data, **dec), plan, antialias)
            mirror = fn.random.coin_flip(probability=plan.flip) if plan.flip > 0 else 0
            images = fn.crop_mirror_normalize(
                images,
                dtype=out_type,
                output_layout=layout,
                crop=plan.crop,
                mean=[m / plan.scale for m in plan.mean],
                std=[s / plan.scale for s in plan.std],
                mirror=mirror,
            )
            return images, (lab.gpu() if gpu and st.gpu_labels else lab)

        self.pipe = pipe(
            batch_size=batch_size,
            num_threads=st.num_threads or min(8, os.cpu_count() or 1),
            device_id=device_id,
            seed=seed,
            prefetch_queue_depth=st.prefetch_queue_depth,
            exec_dynamic=st.exec_dynamic,
        )
        self.pipe.build()
        self.it = DALIGenericIterator(
            [self.pipe],
            ["images", "labels"],
            reader_name="Reader",
            auto_reset=True,
            last_batch_policy=getattr(LastBatchPolicy, _last_batch(drop_last, shards)),
        )

    def __len__(self) -> int:
        # DALI's reader gives shard i the files [n*i//k, n*(i+1)//k); without drop_last, several
        # shards are each filled to the longest one's batches (_last_batch)
        if self.num_shards > 1 and not self.drop_last:
            return math.ceil(math.ceil(self.n / self.num_shards) / self.batch_size)
        per_shard = self.n * (self.shard + 1) // self.num_shards - self.n * self.shard // self.num_shards
        return per_shard // self.batch_size if self.drop_last else -(-per_shard // self.batch_size)

    def __iter__(self) -> Iterator[list[torch.Tensor]]:
        for out in self.it:
            d = out[0]
            images = d["images"]
            if images.shape[0] == 0:  # a shorter shard's end: DALI pads shards alike, PARTIAL trims the padding
                continue
            if self.channels_last:  # HWC from DALI, viewed as NCHW in channels_last memory format
                images = images.permute(0, 3, 1, 2)
            yield [images, d["labels"].reshape(-1).long()]


class DaliFolderLoader(DaliPipeline):
    """``loader`` (a folder dataset with a recognised transform) served by one DALI pipeline."""

    def __init__(
        self, loader: DataLoader, *, device_id: int | None, seed: int = 0, settings: DaliSettings | None = None
    ) -> None:
        ds, samples, share = _check_loader(loader)
        self.dataset = loader.dataset
        super().__init__(
            [p for p, _ in samples],
            [int(c) for _, c in samples],
            plan_folder(ds.transform),
            int(loader.batch_size),
            device_id=device_id,
            shuffle=share.shuffle,
            drop_last=loader.drop_last,
            seed=seed,
            settings=settings,
            share=share,
        )
