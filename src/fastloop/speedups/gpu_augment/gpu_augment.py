"""``gpu_augment``: an in-memory image dataset whose torchvision transform draws at random, served
from the GPU with the transform run there on each whole batch, every sample with its own draw.

The card (when it helps, when it hurts, what it costs): ``docs/speedups/gpu_augment.md``.

**Finding the stored images.** The dataset's ``transform`` attribute (a torchvision v1 or v2
``Compose``, or one op) is translated op by op; with it replaced for a moment by a layout
converter (:func:`as_chw`: a PIL image or an HWC array, what torchvision's ``CIFAR10`` hands its
transform, becomes a CHW tensor of the same dtype; a tensor stays as it is) and a
``VisionDataset``'s ``transforms`` set to None, the dataset must give fixed samples
(:func:`fastloop.data.fixed_samples`: in memory, the same values for the same index). Those
samples, the images as stored (uint8 stays uint8: 4x less memory than float), are read once onto
the GPU, as ``gpu_resident`` reads a dataset; each batch is indexed there in the order of the
loader's own sampler, and the translated ops run on the batch's images (the sample's first
element). Anything else (another op, a dict sample, a ``target_transform``) is skipped with the
reason naming it.

**Recognised ops**, each with torchvision's parameters and distribution of draws: ``RandomCrop``
(size, padding: constant with its fill, ``reflect`` or ``edge``; every offset equally likely), ``RandomResizedCrop``
(size, scale, ratio, bilinear: torchvision's 10 tries per image, then one ``roi_align`` for the
batch, which averages where torchvision antialiases), ``RandomHorizontalFlip`` and
``RandomVerticalFlip`` (p), ``ToTensor`` / ``ToImage`` / ``PILToTensor`` / ``ToPureTensor`` (layout), ``ToDtype`` /
``ConvertImageDtype`` (to float, scaled to [0, 1] from uint8 where torchvision scales),
``Normalize`` (mean, std). The batched kernels are :mod:`fastloop.speedups.gpu_augment.ops`'s; crops and flips
(or one RandomResizedCrop) followed by per-pixel work run fused (:class:`Fused`): one gather (or
one ``roi_align``) and one table lookup a batch.

Example:
    >>> import torch
    >>> from torchvision.transforms import v2
    >>> ops = translate(v2.Compose([v2.RandomCrop(4, padding=1), v2.RandomHorizontalFlip(),
    ...                             v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5], [0.5])]))
    >>> [op.kind for op in ops]
    ['crop', 'flip', 'to_float', 'normalize']
    >>> run_ops(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), ops, torch.Generator()).dtype
    torch.float32
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastloop.data import fixed_samples
from fastloop.speedups.base import Context, Skip, Speedup, register
from fastloop.speedups.gpu_augment.ops import (
    BoxMaps,
    CropMaps,
    draw_boxes,
    draw_crop_maps,
    gather_crops,
    gather_resized,
    normalize,
    pixel_table,
    random_crop,
    random_flip,
    random_resized_crop,
)
from fastloop.speedups.gpu_resident.gpu_resident import GPUResidentLoader, NotResident, make_resident
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.run import Run
from fastloop.transforms import PADDING_MODES, torchvision_padding, unwrap_subsets

__all__ = ["Fused", "GPUAugment", "GPUAugmentLoader", "Op", "as_chw", "make_augmented", "run_ops", "translate"]

LAYOUT_OPS = frozenset({"ToImage", "PILToTensor", "ToPureTensor"})
FLOAT_OPS = frozenset({"ToTensor", "ToDtype", "ConvertImageDtype"})


@dataclass(frozen=True)
class Op:
    """One translated op: ``crop``, ``resized_crop``, ``flip``, ``to_float``, ``normalize`` or ``hwc_to_chw``."""

    kind: str
    params: dict = field(default_factory=dict)


def _one(t: Any) -> list[Op]:
    name = type(t).__name__
    if not type(t).__module__.startswith("torchvision.transforms"):
        raise Skip(
            f"the transform holds {name}, not a torchvision op: gpu_augment translates RandomCrop, "
            f"RandomResizedCrop, RandomHorizontalFlip, RandomVerticalFlip, ToTensor/ToImage/ToDtype and Normalize"
        )
    if name == "Compose":
        return [op for part in t.transforms for op in _one(part)]
    if name == "RandomCrop":
        mode = getattr(t, "padding_mode", "constant")
        if mode not in PADDING_MODES or getattr(t, "pad_if_needed", False):
            raise Skip(
                f"RandomCrop with padding_mode={mode!r}, pad_if_needed={t.pad_if_needed} is not translated "
                f"(padding_mode {', '.join(repr(m) for m in PADDING_MODES)} without pad_if_needed is)"
            )
        fill = t.fill if isinstance(t.fill, (int, float)) else 0 if not t.fill else None
        if fill is None:
            raise Skip(f"RandomCrop with a per-type or per-channel fill {t.fill!r} is not translated")
        return [
            Op(
                "crop",
                {"size": tuple(t.size), "padding": torchvision_padding(t), "fill": float(fill), "padding_mode": mode},
            )
        ]
    if name == "RandomResizedCrop":
        mode = getattr(getattr(t, "interpolation", None), "value", "bilinear")
        if mode != "bilinear":
            raise Skip(f"RandomResizedCrop with {mode} interpolation is not translated (bilinear is)")
        return [Op("resized_crop", {"size": tuple(t.size), "scale": tuple(t.scale), "ratio": tuple(t.ratio)})]
    if name in ("RandomHorizontalFlip", "RandomVerticalFlip"):
        return [Op("flip", {"p": float(t.p), "vertical": name == "RandomVerticalFlip"})]
    if name in LAYOUT_OPS:
        return []
    if name == "ToTensor":
        return [Op("hwc_to_chw"), Op("to_float", {"scale": True})]
    if name in FLOAT_OPS:
        dtype = getattr(t, "dtype", torch.float32)
        dtype = dtype.get(torch.Tensor, dtype.get("others")) if isinstance(dtype, dict) else dtype
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise Skip(f"{name} to {dtype} is not translated (a float dtype is)")
        return [Op("to_float", {"dtype": dtype, "scale": bool(getattr(t, "scale", True))})]
    if name == "Normalize":
        if getattr(t, "inplace", False):
            raise Skip("Normalize(inplace=True) is not translated")
        return [Op("normalize", {"mean": [float(m) for m in t.mean], "std": [float(s) for s in t.std]})]
    raise Skip(
        f"the transform holds {name}, which gpu_augment does not translate (it translates RandomCrop, "
        f"RandomResizedCrop, RandomHorizontalFlip, RandomVerticalFlip, ToTensor/ToImage/ToDtype and Normalize)"
    )


def as_chw(image: Any) -> Any:
    """A PIL image or an HWC (or HW) array as a CHW tensor of its own dtype, as torchvision's
    ``ToTensor``/``ToImage`` lay it out (without scaling); a tensor (already CHW) is returned as is."""
    if torch.is_tensor(image):
        return image
    if isinstance(image, np.ndarray) or hasattr(image, "getbands"):  # an array, or a PIL image
        image = np.array(image)  # a copy: writable, contiguous
    if isinstance(image, np.ndarray) and image.ndim in (2, 3):
        t = torch.from_numpy(image)
        return t[None] if t.dim() == 2 else t.permute(2, 0, 1).contiguous()
    return image


as_chw.fixed_output = True  # type: ignore[attr-defined]  # the same output for the same input: read once


def translate(transform: Any) -> list[Op]:
    """The ops of a torchvision transform; :class:`~fastloop.speedups.base.Skip` naming the first
    op that is not translated."""
    ops = _one(transform)
    if not any(op.kind in ("crop", "resized_crop", "flip") for op in ops):
        raise Skip("the transform draws nothing at random: gpu_resident serves such data as it is")
    return ops


GEOMETRY = frozenset({"crop", "flip"})
PIXELS = frozenset({"to_float", "normalize"})


def _pixels(x: torch.Tensor, op: Op) -> torch.Tensor:
    if op.kind == "to_float":
        scale = op.params.get("scale", True) and x.dtype == torch.uint8
        x = x.to(op.params.get("dtype", torch.float32))
        return x / 255.0 if scale else x
    return normalize(x, op.params["mean"], op.params["std"], dtype=x.dtype if x.is_floating_point() else torch.float32)


def _geometry_end(ops: list[Op]) -> int:
    """Where the leading crops, resized crops and flips of ``ops`` end (the per-pixel work begins)."""
    return next((i for i, op in enumerate(ops) if op.kind not in GEOMETRY | {"resized_crop"}), len(ops))


class Fused:
    """Crops (or one random resized crop) and flips followed by per-pixel work, fused: the crops'
    and flips' draws made for many samples at once (:func:`~fastloop.speedups.gpu_augment.ops.draw_crop_maps`,
    :func:`~fastloop.speedups.gpu_augment.ops.draw_boxes`), a batch one gather (or one ``roi_align``), and uint8
    pixels scaled and normalised by looking each value up (:func:`~fastloop.speedups.gpu_augment.ops.pixel_table`).
    The same draws and the same bits as running the ops one by one (``tests/test_gpu_augment.py``),
    in a handful of ops a batch instead of 30-40: the host, which launches them between steps, is
    what a fast step waits on."""

    def __init__(self, ops: list[Op], channels: int, dtype: torch.dtype, device: torch.device) -> None:
        cut = _geometry_end(ops)
        self.steps = [(op.kind, op.params) for op in ops[:cut]]
        self.resized = self.steps[0][1] if self.steps and self.steps[0][0] == "resized_crop" else None
        self.pixel_ops = ops[cut:]
        fills = {float(p.get("fill", 0.0)) for kind, p in self.steps if kind == "crop"}
        self.fill = fills.pop() if fills else 0.0
        self.table = pixel_table(self.pixels, channels, device) if dtype == torch.uint8 and self.pixel_ops else None

    @staticmethod
    def of(ops: list[Op], x: torch.Tensor) -> Fused | None:
        """The fused form of ``ops`` for images like ``x`` (N, C, H, W); None where the ops are not
        crops and flips, or one random resized crop and flips, followed by per-pixel work, or their
        crops pad with different fills."""
        kinds = [op.kind for op in ops]
        cut = _geometry_end(ops)
        geometry = kinds[:cut]
        fills = {float(op.params.get("fill", 0.0)) for op in ops if op.kind == "crop"}
        shape_ok = all(k in GEOMETRY for k in geometry) or (
            geometry[0] == "resized_crop" and set(geometry[1:]) <= {"flip"}
        )
        if x.dim() != 4 or not shape_ok or not all(k in PIXELS for k in kinds[cut:]) or len(fills) > 1:
            return None
        return Fused(ops, x.shape[1], x.dtype, x.device)

    def pixels(self, x: torch.Tensor) -> torch.Tensor:
        for op in self.pixel_ops:
            x = _pixels(x, op)
        return x

    def out_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) the crops make of images ``height`` x ``width``."""
        for kind, p in self.steps:
            if kind in ("crop", "resized_crop"):
                height, width = (p["size"], p["size"]) if isinstance(p["size"], int) else p["size"]
        return height, width

    def draw(
        self, k: int, height: int, width: int, generator: torch.Generator, device: torch.device
    ) -> CropMaps | BoxMaps:
        if self.resized is not None:
            flips = [(p["p"], p.get("vertical", False)) for _, p in self.steps[1:]]
            return draw_boxes(
                k,
                height,
                width,
                self.resized["scale"],
                self.resized["ratio"],
                flips,
                generator=generator,
                device=device,
            )
        return draw_crop_maps(k, height, width, self.steps, generator=generator, device=device)

    def __call__(
        self, x: torch.Tensor, maps: CropMaps | BoxMaps, *, index: torch.Tensor | None = None, start: int = 0
    ) -> torch.Tensor:
        if isinstance(maps, BoxMaps):
            out = gather_resized(x, maps, self.out_size(*x.shape[2:]), index=index, start=start, table=self.table)
        else:
            out = gather_crops(x, maps, index=index, start=start, fill=self.fill, table=self.table)
        return out if self.table is not None else self.pixels(out)


def run_ops(x: torch.Tensor, ops: list[Op], generator: torch.Generator, *, fuse: bool = True) -> torch.Tensor:
    """``ops`` on a batch of images ``x`` (N, C, H, W; N, H, W, C before a ``hwc_to_chw``), each
    sample with its own random draws from ``generator``; crops and flips followed by per-pixel work
    run fused (:class:`Fused`; ``fuse=False``: one by one), with the same draws and values."""
    while ops and ops[0].kind == "hwc_to_chw":
        x, ops = (x.permute(0, 3, 1, 2) if x.dim() == 4 else x[:, None]), ops[1:]
    fused = Fused.of(ops, x) if fuse else None
    if fused is not None:
        return fused(x, fused.draw(x.shape[0], x.shape[2], x.shape[3], generator, x.device)).contiguous()
    for op in ops:
        if op.kind == "hwc_to_chw":
            x = x.permute(0, 3, 1, 2) if x.dim() == 4 else x[:, None]
        elif op.kind == "crop":
            x = random_crop(
                x,
                op.params["size"],
                padding=op.params["padding"],
                fill=op.params["fill"],
                padding_mode=op.params.get("padding_mode", "constant"),
                generator=generator,
            )
        elif op.kind == "resized_crop":
            x = random_resized_crop(x, op.params["size"], op.params["scale"], op.params["ratio"], generator=generator)
        elif op.kind == "flip":
            x = random_flip(x, p=op.params["p"], vertical=op.params.get("vertical", False), generator=generator)
        else:
            x = _pixels(x, op)
    return x.contiguous()


class GPUAugmentLoader:
    """A :class:`~fastloop.speedups.gpu_resident.gpu_resident.GPUResidentLoader` over the stored images, with
    the translated ops run on each batch's images (its first tensor) on the device."""

    def __init__(self, resident: GPUResidentLoader, ops: list[Op], seed: int) -> None:
        self.resident, self.ops = resident, ops
        self.generator = torch.Generator(device=resident.device).manual_seed(seed)
        self.batch_size, self.drop_last = resident.batch_size, resident.drop_last
        self.dataset, self.sampler = resident.dataset, resident.sampler
        self.fused = Fused.of(ops, resident.tensors[0])
        if self.fused is not None:  # maps for ~16M output pixels a draw (16 MiB of padding mask at most); boxes: 64Ki
            h, w = self.fused.out_size(*resident.tensors[0].shape[2:])
            self.chunk = 2**16 if self.fused.resized is not None else max(1, 2**24 // (h * w))

    def __iter__(self) -> Iterator[Any]:
        if self.fused is None:  # not fusable (or set aside: the ops one by one)
            for batch in self.resident:
                images = run_ops(batch[0], self.ops, self.generator, fuse=False)
                yield [images, *batch[1:]] if isinstance(batch, list) else (images, *batch[1:])
            return
        stored, rest = self.resident.tensors[0], self.resident.tensors[1:]
        maps, used = None, 0
        for _, index in self.resident.batch_indices():
            n = index.shape[0]
            if maps is None or used + n > len(maps):  # the draws for many batches at once: a few kernels per chunk
                maps, used = (
                    self.fused.draw(
                        max(n, self.chunk), stored.shape[2], stored.shape[3], self.generator, stored.device
                    ),
                    0,
                )
            images = self.fused(stored, maps, index=index, start=used)
            used += n
            yield [images, *(t.index_select(0, index) for t in rest)]

    def __len__(self) -> int:
        return len(self.resident)


def augment_why_not(loader: Any) -> str | None:
    """Why the loader's images cannot be augmented on the GPU (None: they can), without reading
    the dataset whole: the transform's translation and a fixed dataset behind it."""
    dataset = getattr(loader, "dataset", None)
    holder = unwrap_subsets(dataset)[0]  # random_split's Subset: the transform is the dataset's inside
    transform = getattr(holder, "transform", None)
    if transform is None:
        return "the dataset has no transform to run on the GPU"
    try:
        translate(transform)
    except Skip as why:
        return why.reason
    sample = _stored_sample(dataset, holder)
    if isinstance(sample, str):
        return sample
    with _transform_as(holder, as_chw):
        found = fixed_samples(dataset)
    return (
        f"behind its transform the dataset is not fixed in-memory samples: {found}" if isinstance(found, str) else None
    )


@contextlib.contextmanager
def _transform_as(dataset: Any, transform: Any) -> Iterator[None]:
    """The dataset with its ``transform`` set to ``transform`` (and a VisionDataset's
    ``transforms`` to None)."""
    saved = {k: getattr(dataset, k) for k in ("transform", "transforms") if hasattr(dataset, k)}
    try:
        for k in saved:
            setattr(dataset, k, transform if k == "transform" else None)
        yield
    finally:
        for k, v in saved.items():
            setattr(dataset, k, v)


def _unchanged(image: Any) -> Any:
    """The transform a sample is read with to see what it stores: the image as it is."""
    return image


def _stored_sample(dataset: Any, holder: Any) -> Any:
    """The dataset's first sample read with the image left as stored (the transform set to one
    that changes nothing, not to None: a ``__getitem__`` may call ``self.transform`` without
    checking), or the reason it is not an (image, ...) tuple of a tensor, an array or a PIL image."""
    with _transform_as(holder, _unchanged):
        sample = dataset[0]
    if not isinstance(sample, (tuple, list)) or not torch.is_tensor(as_chw(sample[0])):
        given = type(sample[0] if isinstance(sample, (tuple, list)) else sample).__name__
        return (
            f"behind its transform the dataset gives {given}"
            f" samples, not (image, ...) tuples of tensors, arrays or PIL images"
        )
    return sample


def make_augmented(loader: DataLoader, device: torch.device, *, share: float = 0.5, seed: int = 0) -> GPUAugmentLoader:
    """The loader's stored images on ``device`` and its transform translated; Skip with the
    reason where it cannot be done."""
    if not isinstance(loader, DataLoader):
        raise Skip(f"the loader is a {type(loader).__name__}, not a torch DataLoader")
    dataset = loader.dataset
    holder = unwrap_subsets(dataset)[0]  # random_split's Subset: the transform is the dataset's inside
    transform = getattr(holder, "transform", None)
    if transform is None:
        raise Skip(f"the dataset ({type(holder).__name__}) has no transform attribute to run on the GPU")
    if getattr(holder, "target_transform", None) is not None:
        raise Skip(f"the dataset has a target_transform ({type(holder.target_transform).__name__}), not translated")
    ops = [op for op in translate(transform) if op.kind != "hwc_to_chw"]  # the images are read as CHW
    sample = _stored_sample(dataset, holder)
    if isinstance(sample, str):
        raise Skip(sample)
    with _transform_as(holder, as_chw):
        try:
            resident = make_resident(loader, device, share=share)
        except NotResident as why:
            raise Skip(f"the stored images behind the transform cannot be read once: {why}") from None
    with torch.random.fork_rng(devices=[]):  # the check draws nothing from the user's random state
        want = transform(
            sample[0].copy() if hasattr(sample[0], "copy") and not torch.is_tensor(sample[0]) else sample[0]
        )
    got = run_ops(as_chw(sample[0])[None].to(device), ops, torch.Generator(device=device))
    if tuple(got.shape[1:]) != tuple(want.shape) or got.dtype != want.dtype:
        raise Skip(
            f"the translated transform gives {tuple(got.shape[1:])} {got.dtype}, the dataset's "
            f"{tuple(want.shape)} {want.dtype}: not translated"
        )
    return GPUAugmentLoader(resident, ops, seed)


@register
class GPUAugment(Speedup):
    __doc__ = __doc__
    name = "gpu_augment"
    trains = "own_draws"  # the augmentation draws from its own generator on the GPU
    ladder = LadderTraits(
        replaces_loader=True,
        stored_on_device=True,
        feeds=True,
        in_default=True,  # tried where the dataset's transform translates (fastloop.drivers.ladder.search)
    )
    changes = "data"
    order = 9  # before the CPU feed, which has nothing left to do once it applies
    needs_cuda = True

    def apply(self, run: Run) -> None:
        run.change_loader(lambda loader: self.apply_loader(loader, run.ctx))

    def why_not_data(self, loader: Any) -> str | None:
        return augment_why_not(loader)

    def apply_loader(self, loader: Iterable, ctx: Context) -> Iterable:
        seed = int(torch.initial_seed() % (2**31))
        out = make_augmented(loader, ctx.device, seed=seed)  # type: ignore[arg-type]
        ctx.stats["gpu_augment_bytes"] = sum(t.numel() * t.element_size() for t in out.resident.tensors)
        ctx.stats["gpu_augment_ops"] = [op.kind for op in out.ops]
        ctx.inputs.batches_on_device = self.name
        ctx.describe(
            self.name,
            f"the stored images ({out.resident.tensors[0].dtype}, "
            f"{ctx.stats['gpu_augment_bytes'] / 2**20:.0f} MiB) on the device; on each batch: "
            + ", ".join(op.kind for op in out.ops),
        )
        return out
