"""ImageNet-style data behind one interface, three loaders.

- ``torchvision``: ``ImageFolder`` + RandomResizedCrop/flip, JPEGs decoded by PIL in loader
  workers (the usual baseline; CPU-bound).
- ``dali``: NVIDIA DALI: file reader -> "mixed" (GPU) JPEG decode with random crop -> resize ->
  crop-mirror-normalize, batches arrive on the GPU. Without a GPU the same pipeline runs on
  the CPU (``device_id=None``). Shards per rank under DDP.
- ``synthetic``: random tensors already on the device: the compute-only ceiling.

Every loader first checks the files (:func:`scan_images`): an empty or missing folder is an
error; a corrupt or non-JPEG file is an error naming it, or skipped with a warning
(``on_bad="skip"``) — never a hang inside a decoder thread.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from fastloop._compat import LightningDataModule
from fastloop.errors import FastloopError
from fastloop.speedups.dali.folder import DaliPipeline, DaliSettings, FolderPlan, default_hw_decoder_load

__all__ = [
    "DaliLoader",
    "ImageData",
    "SyntheticLoader",
    "check_dali_options",
    "dali_available",
    "default_hw_decoder_load",
    "scan_images",
]

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
_EXT = (".jpg", ".jpeg", ".JPEG", ".JPG")


def _looks_like_jpeg(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(3)
            f.seek(-2, os.SEEK_END)
            tail = f.read(2)
    except OSError:
        return False
    # SOI + a marker at the start; EOI at the end (truncated files lose it)
    return head[:2] == b"\xff\xd8" and head[2:3] == b"\xff" and tail == b"\xff\xd9"


def scan_images(root: str | os.PathLike, on_bad: str = "error") -> tuple[list[str], list[int], list[str]]:
    """Files, labels and class names of an ImageFolder tree, with every file checked.

    Args:
        on_bad: ``"error"`` (FastloopError naming the first bad file) or ``"skip"`` (warn, leave out).
    """
    if on_bad not in ("error", "skip"):
        raise FastloopError(f"on_bad must be 'error' or 'skip', got {on_bad!r}")
    root = Path(root)
    if not root.is_dir():
        raise FastloopError(f"image folder not found: {root}")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    if not classes:
        raise FastloopError(f"{root} has no class folders (expected ImageFolder layout: {root}/<class>/<image>.jpg)")
    files, labels, bad = [], [], []
    for i, c in enumerate(classes):
        for dirpath, _, names in os.walk(root / c):
            for n in sorted(names):
                p = os.path.join(dirpath, n)
                if not n.endswith(_EXT):
                    bad.append(p)
                elif _looks_like_jpeg(p):
                    files.append(p)
                    labels.append(i)
                else:
                    bad.append(p)
    if bad and on_bad == "error":
        raise FastloopError(
            f"{bad[0]} is not a valid JPEG file ({len(bad)} bad file(s) in {root}; remove them or pass on_bad='skip')"
        )
    if bad:
        warnings.warn(f"skipping {len(bad)} file(s) that are not valid JPEGs, e.g. {bad[0]}", stacklevel=2)
    if not files:
        raise FastloopError(f"{root} holds no JPEG images")
    return files, labels, classes


def dali_available() -> str | None:
    """None if DALI imports, else the reason."""
    try:
        import nvidia.dali  # noqa: F401
        import nvidia.dali.plugin.pytorch  # noqa: F401
    except ImportError as err:
        return f"NVIDIA DALI is not installed (pip install 'fastloop[dali]'): {err}"
    return None


class DaliLoader(DaliPipeline):
    """The recipe's ImageNet pipeline as a Lightning-friendly iterable of ``[images, labels]``
    tensors, built by fastloop's one DALI builder (:class:`fastloop.speedups.dali.folder.DaliPipeline`,
    which the ``dali`` speedup also uses): training draws a random-resized crop (scale 0.08-1,
    ratio 3/4-4/3) and a flip at p=0.5, validation resizes the shorter side to crop/0.875 and
    center-crops; both normalise with ImageNet's mean and std.

    ``len()`` is the number of batches per epoch for this rank; the last partial batch is
    dropped in training (static shapes for compile and CUDA graphs) and kept in validation.

    Args:
        device_id: the GPU to decode on ("mixed" nvJPEG decoding); None runs the same pipeline
            on the CPU.
        the rest: :class:`fastloop.speedups.dali.folder.DaliSettings` (threads, channels_last, dtype,
            hw_decoder_load, prefetch_queue_depth, gpu_labels, affine, antialias, exec_dynamic).
    """

    def __init__(
        self,
        files: list[str],
        labels: list[int],
        batch_size: int,
        *,
        train: bool = True,
        crop: int = 224,
        device_id: int | None = None,
        num_threads: int | None = None,
        seed: int = 0,
        channels_last: bool = False,
        dtype: torch.dtype = torch.float32,
        hw_decoder_load: float | None = None,
        prefetch_queue_depth: int = 2,
        gpu_labels: bool = True,
        affine: bool = True,
        antialias: bool = True,
        exec_dynamic: bool | None = None,
    ) -> None:
        reason = dali_available()
        if reason:
            raise FastloopError(reason)
        settings = DaliSettings(
            num_threads=num_threads,
            channels_last=channels_last,
            dtype=dtype,
            hw_decoder_load=hw_decoder_load,
            prefetch_queue_depth=prefetch_queue_depth,
            gpu_labels=gpu_labels,
            affine=affine,
            antialias=antialias,
            exec_dynamic=exec_dynamic,
        )
        common = dict(crop=(crop, crop), scale=1 / 255, mean=tuple(MEAN), std=tuple(STD), to_float=True)
        plan = (
            FolderPlan(random_crop=((0.08, 1.0), (3 / 4, 4 / 3)), flip=0.5, **common)
            if train
            else FolderPlan(resize_shorter=int(crop / 0.875), **common)
        )
        self.train = train
        super().__init__(
            files,
            labels,
            plan,
            batch_size,
            device_id=device_id,
            shuffle=train,
            drop_last=train,
            seed=seed,
            settings=settings,
        )


def check_dali_options(options: dict) -> dict:
    """``options`` if every key is a tunable :class:`DaliLoader` argument, else a clear error."""
    fixed = {"self", "files", "labels", "batch_size", "train", "crop", "device_id", "seed"}  # set by ImageData
    tunable = [p for p in inspect.signature(DaliLoader.__init__).parameters if p not in fixed]
    unknown = sorted(set(options) - set(tunable))
    if unknown:
        raise FastloopError(f"unknown DALI option(s) {', '.join(unknown)}; valid: {', '.join(tunable)}")
    return dict(options)


class SyntheticLoader:
    """``steps`` batches of the same random images already on ``device`` (no input pipeline)."""

    def __init__(
        self, batch_size: int, num_classes: int, steps: int = 1000, crop: int = 224, device: str | torch.device = "cpu"
    ) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randn(batch_size, 3, crop, crop, generator=g).to(device)
        self.labels = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)
        self.steps, self.batch_size = steps, batch_size

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.steps):
            yield self.images, self.labels


class ImageData(LightningDataModule):
    """ImageFolder data (``root/train``, ``root/val``) through one of the three loaders.

    Args:
        root: folder with ``train/`` and ``val/`` (default: the generated dataset).
        loader: ``torchvision``, ``dali`` or ``synthetic``.
        on_bad: what to do with corrupt files: ``error`` or ``skip``.
        dali_options: extra keyword arguments for :class:`DaliLoader` (threads, hw_decoder_load, ...).
    """

    def __init__(
        self,
        root: str | None = None,
        loader: str = "torchvision",
        batch_size: int = 64,
        crop: int = 224,
        num_workers: int = 0,
        on_bad: str = "error",
        seed: int = 0,
        dali_options: dict | None = None,
    ) -> None:
        super().__init__()
        if loader not in ("torchvision", "dali", "synthetic"):
            raise FastloopError(f"unknown loader {loader!r}; valid: torchvision, dali, synthetic")
        if root is None:
            from fastloop.recipes.imagenet.generate import default_dataset

            root = str(default_dataset())
        self.root, self.loader, self.batch_size, self.crop = Path(root), loader, batch_size, crop
        self.num_workers, self.on_bad, self.seed = num_workers, on_bad, seed
        self.dali_options = check_dali_options(dali_options or {})
        self.files, self.labels, self.classes = scan_images(self.root / "train", on_bad)
        self.num_classes = len(self.classes)

    def _device_id(self) -> int | None:
        trainer = self.trainer
        if trainer is not None and trainer.strategy.root_device.type == "cuda":
            return trainer.strategy.root_device.index or 0
        return torch.cuda.current_device() if torch.cuda.is_available() and trainer is None else None

    def dali_loader(self, train: bool = True) -> DaliLoader:
        if train:
            files, labels = self.files, self.labels
        else:
            files, labels, _ = scan_images(self.root / "val", self.on_bad)
        return DaliLoader(
            files,
            labels,
            self.batch_size,
            train=train,
            crop=self.crop,
            device_id=self._device_id(),
            seed=self.seed,
            **self.dali_options,
        )

    def torchvision_loader(self, train: bool = True) -> DataLoader:
        from torchvision import datasets, transforms

        norm = transforms.Normalize(MEAN, STD)
        if train:
            tf = transforms.Compose(
                [
                    transforms.RandomResizedCrop(self.crop),
                    transforms.RandomHorizontalFlip(),
                    transforms.ToTensor(),
                    norm,
                ]
            )
        else:
            tf = transforms.Compose(
                [
                    transforms.Resize(int(self.crop / 0.875)),
                    transforms.CenterCrop(self.crop),
                    transforms.ToTensor(),
                    norm,
                ]
            )
        split = "train" if train else "val"
        ok = set(self.files) if train else set(scan_images(self.root / split, self.on_bad)[0])
        ds = datasets.ImageFolder(str(self.root / split), transform=tf, is_valid_file=lambda p: p in ok)
        loader = DataLoader(
            ds,
            batch_size=self.batch_size,
            shuffle=train,
            drop_last=train,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            generator=torch.Generator().manual_seed(self.seed),
        )
        return loader  # an ImageFolder with the standard transforms: the `dali` speedup translates it

    def train_dataloader(self):
        if self.loader == "dali":
            return self.dali_loader(True)
        if self.loader == "synthetic":
            dev = self.trainer.strategy.root_device if self.trainer is not None else "cpu"
            return SyntheticLoader(self.batch_size, self.num_classes, crop=self.crop, device=dev)
        return self.torchvision_loader(True)

    def val_dataloader(self):
        if not (self.root / "val").is_dir():
            return []
        return self.dali_loader(False) if self.loader == "dali" else self.torchvision_loader(False)
