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
``RandomResizedCrop`` (size, scale, ratio), ``Resize`` (an int: the shorter side), ``CenterCrop``,
``RandomHorizontalFlip`` (p), ``ToTensor`` / ``PILToTensor`` / ``ToImage`` + ``ToDtype``
(float, scaled), ``Normalize``. Anything else (another op, a custom sampler, collate, batch
sampler, a ``target_transform``, files DALI does not decode) raises :class:`NotTranslated`
naming it. DALI's resize is not PIL's: values differ by interpolation; the test measures the
mean absolute difference after normalisation on a deterministic pipeline.

Example (a CPU pipeline; on a GPU pass ``device_id``):
    ``DaliFolderLoader(loader, device_id=None)`` iterates like ``loader``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler, default_collate

__all__ = ["DaliFolderLoader", "FolderPlan", "NotTranslated", "check_folder", "plan_folder"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class NotTranslated(ValueError):
    """The loader cannot be served by DALI; the message names what."""


@dataclass
class FolderPlan:
    """The DALI pipeline's parameters, read from the user's transform."""

    crop: tuple[int, int]
    random_crop: tuple[tuple[float, float], tuple[float, float]] | None = None  # (scale, ratio)
    resize_shorter: int | None = None
    flip: float = 0.0
    scale: float = 1.0  # 1/255 where ToTensor/ToDtype(scale=True) maps to [0, 1]
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    to_float: bool = False


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


def plan_folder(transform: Any) -> FolderPlan:
    """Translate ``transform``; :class:`NotTranslated` naming the first op that is not."""
    crop: tuple[int, int] | None = None
    plan = FolderPlan(crop=(0, 0))
    for op in _ops(transform):
        name = type(op).__name__
        if name == "RandomResizedCrop":
            crop, plan.random_crop = _size(op.size), (tuple(op.scale), tuple(op.ratio))
        elif name == "Resize" and isinstance(op.size, int) or (name == "Resize" and len(list(op.size)) == 1):
            plan.resize_shorter = op.size if isinstance(op.size, int) else int(list(op.size)[0])
        elif name == "CenterCrop":
            crop = _size(op.size)
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
        else:
            raise NotTranslated(f"the transform holds {name}, which the DALI translation does not recognise "
                                f"(RandomResizedCrop, Resize, CenterCrop, RandomHorizontalFlip, ToTensor, ToDtype, Normalize)")
    if crop is None:
        raise NotTranslated("the transform neither crops nor resizes to a fixed size (RandomResizedCrop or CenterCrop)")
    if not plan.to_float:
        raise NotTranslated("the transform does not end in a float tensor (ToTensor, or ToImage + ToDtype)")
    plan.crop = crop
    return plan


def check_folder(loader: Any) -> FolderPlan:
    """The plan for ``loader`` without building a pipeline; :class:`NotTranslated` naming what does not fit."""
    ds, _ = _check_loader(loader)
    return plan_folder(ds.transform)


def _check_loader(loader: Any) -> tuple[Any, bool]:
    """The folder dataset and whether the loader shuffles; NotTranslated naming what does not fit."""
    try:
        from torchvision.datasets import DatasetFolder
    except ImportError as err:  # pragma: no cover - torchvision is a dependency
        raise NotTranslated(f"torchvision is not importable: {err}") from None
    if not isinstance(loader, DataLoader):
        raise NotTranslated(f"the loader is a {type(loader).__name__}, not a torch DataLoader")
    ds = loader.dataset
    if not isinstance(ds, DatasetFolder):
        raise NotTranslated(f"the dataset is a {type(ds).__name__}, not a torchvision ImageFolder/DatasetFolder")
    if getattr(ds, "target_transform", None) is not None:
        raise NotTranslated(f"the dataset has a target_transform ({type(ds.target_transform).__name__})")
    if loader.collate_fn is not default_collate:
        raise NotTranslated(f"the loader has a custom collate_fn ({getattr(loader.collate_fn, '__name__', '?')})")
    if loader.batch_size is None:
        raise NotTranslated("the loader has a custom batch_sampler")
    if type(loader.sampler) not in (RandomSampler, SequentialSampler):
        raise NotTranslated(f"the loader has a custom sampler ({type(loader.sampler).__name__})")
    bad = next((p for p, _ in ds.samples if not p.lower().endswith(IMAGE_SUFFIXES)), None)
    if bad is not None:
        raise NotTranslated(f"{os.path.basename(bad)} is not a JPEG or PNG file")
    if not ds.samples:
        raise NotTranslated("the folder holds no images")
    return ds, isinstance(loader.sampler, RandomSampler)


class DaliFolderLoader:
    """``loader`` (a folder dataset with a recognised transform) served by one DALI pipeline."""

    def __init__(self, loader: DataLoader, *, device_id: int | None, seed: int = 0, num_threads: int | None = None) -> None:
        ds, shuffle = _check_loader(loader)
        self.plan = plan_folder(ds.transform)
        self.batch_size, self.drop_last, self.dataset = loader.batch_size, loader.drop_last, ds
        self.n = len(ds.samples)
        files, labels = [p for p, _ in ds.samples], [int(c) for _, c in ds.samples]
        self._build(files, labels, shuffle, device_id, seed, num_threads or min(8, os.cpu_count() or 1))

    def _build(self, files: list[str], labels: list[int], shuffle: bool, device_id: int | None, seed: int,
               threads: int) -> None:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        p, gpu = self.plan, device_id is not None
        dec = {"device": "mixed" if gpu else "cpu", "output_type": types.RGB}

        @pipeline_def
        def pipe():
            data, lab = fn.readers.file(files=files, labels=labels, shuffle_after_epoch=shuffle, seed=seed, name="Reader")
            if p.random_crop is not None:
                scale, ratio = p.random_crop
                images = fn.decoders.image_random_crop(data, random_area=list(scale), random_aspect_ratio=list(ratio),
                                                       num_attempts=10, **dec)
                images = fn.resize(images, resize_x=p.crop[1], resize_y=p.crop[0])
            else:
                images = fn.decoders.image(data, **dec)
                if p.resize_shorter:
                    images = fn.resize(images, resize_shorter=p.resize_shorter)
            mirror = fn.random.coin_flip(probability=p.flip) if p.flip > 0 else 0
            mean = [m / p.scale for m in p.mean]
            std = [s / p.scale for s in p.std]
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", crop=p.crop,
                                              mean=mean, std=std, mirror=mirror)
            return images, (lab.gpu() if gpu else lab)

        self.pipe = pipe(batch_size=self.batch_size, num_threads=threads, device_id=device_id, seed=seed)
        self.pipe.build()
        self.it = DALIGenericIterator([self.pipe], ["images", "labels"], reader_name="Reader", auto_reset=True,
                                      last_batch_policy=LastBatchPolicy.DROP if self.drop_last else LastBatchPolicy.PARTIAL)

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[list[torch.Tensor]]:
        for out in self.it:
            d = out[0]
            yield [d["images"], d["labels"].reshape(-1).long()]
