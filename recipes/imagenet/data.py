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

__all__ = ["DaliLoader", "ImageData", "SyntheticLoader", "check_dali_options", "dali_available", "default_hw_decoder_load",
           "scan_images"]

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
        raise FastloopError(f"{bad[0]} is not a valid JPEG file ({len(bad)} bad file(s) in {root}; "
                            f"remove them or pass on_bad='skip')")
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


def default_hw_decoder_load(device_id: int | None) -> float:
    """Share of JPEGs for the GPU's hardware decoder (NVJPG engines) rather than CUDA kernels.

    DALI's default, 0.65, was tuned on the A100. Hopper has more NVJPG engines: on our H200
    0.99 decoded 22.5k img/s alone vs 20.7k at 0.65, and DALI's own kernels took 1.4 instead of
    2.1 ms of GPU time per ResNet-50 step (benchmarks/HISTORY.md, round 12). Other GPUs keep DALI's default.
    """
    if device_id is None or not torch.cuda.is_available():
        return 0.65
    return 0.99 if torch.cuda.get_device_capability(device_id)[0] == 9 else 0.65


def _rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class DaliLoader:
    """A DALI pipeline as a Lightning-friendly iterable of ``(images, labels)`` torch tensors.

    ``len()`` is the number of batches per epoch for this rank; the last partial batch is
    dropped in training (static shapes for compile and CUDA graphs) and kept in validation.

    Args:
        device_id: the GPU to decode on ("mixed" nvJPEG decoding); None runs the same pipeline
            on the CPU.
        num_threads: DALI's CPU threads (file reading, JPEG parsing); default min(8, cores).
        channels_last: emit NHWC, handed out as NCHW tensors in channels_last memory format.
        dtype: torch.float32 or torch.float16 images.
        hw_decoder_load: share of JPEGs for the hardware decoder (NVJPG); default
            :func:`default_hw_decoder_load` (0.99 on Hopper, DALI's 0.65 elsewhere).
        prefetch_queue_depth: batches DALI prepares ahead.
        gpu_labels: hand out labels on the GPU (otherwise on the CPU, copied by the training step).
        affine: pin DALI's decoder threads to CPU cores.
        antialias: DALI's antialiasing filter when the random crop is scaled down (DALI's
            default, True). NVIDIA's ResNet-50 example turns it off (plain linear
            interpolation), which is cheaper on the GPU.
        exec_dynamic: DALI's executor: None or True for DALI 2's dynamic executor (batches
            handed over through DLPack without a copy), False for the older executor (fixed
            output buffers, copied into torch tensors on torch's stream).
    """

    def __init__(self, files: list[str], labels: list[int], batch_size: int, *, train: bool = True, crop: int = 224,
                 device_id: int | None = None, num_threads: int | None = None, seed: int = 0,
                 channels_last: bool = False, dtype: torch.dtype = torch.float32, hw_decoder_load: float | None = None,
                 prefetch_queue_depth: int = 2, gpu_labels: bool = True, affine: bool = True,
                 antialias: bool = True, exec_dynamic: bool | None = None) -> None:
        reason = dali_available()
        if reason:
            raise FastloopError(reason)
        from nvidia.dali import fn, pipeline_def, types

        self.shard, self.num_shards = _rank_world()
        self.batch_size, self.train, self.n = batch_size, train, len(files)
        if dtype not in (torch.float32, torch.float16):
            raise FastloopError(f"DALI images can be float32 or float16, got {dtype}")
        if hw_decoder_load is None:
            hw_decoder_load = default_hw_decoder_load(device_id)
        if not 0.0 <= hw_decoder_load <= 1.0:
            raise FastloopError(f"hw_decoder_load is a fraction in [0, 1], got {hw_decoder_load}")
        gpu = device_id is not None
        if gpu:
            from fastloop.cuda_env import cuda_queues_note

            note = cuda_queues_note()
            if note:
                warnings.warn(note, stacklevel=2)
        layout = "HWC" if channels_last else "CHW"
        out_type = types.FLOAT if dtype == torch.float32 else types.FLOAT16
        # nvJPEG settings from NVIDIA's ResNet-50 example: pad the decoder's buffers so that a
        # large image does not trigger a reallocation mid-epoch, and size the hardware decoder's.
        dec = dict(device="mixed", hw_decoder_load=hw_decoder_load, affine=affine,
                   device_memory_padding=211025920, host_memory_padding=140544512,
                   preallocate_width_hint=5980, preallocate_height_hint=6430) if gpu else dict(device="cpu")

        @pipeline_def
        def pipe():
            jpegs, lab = fn.readers.file(files=files, labels=labels, random_shuffle=train, shard_id=self.shard,
                                         num_shards=self.num_shards, pad_last_batch=not train, name="Reader", seed=seed)
            if train:
                images = fn.decoders.image_random_crop(jpegs, output_type=types.RGB, random_aspect_ratio=[0.75, 4 / 3],
                                                       random_area=[0.08, 1.0], num_attempts=100, **dec)
                images = fn.resize(images, resize_x=crop, resize_y=crop, antialias=antialias)
                mirror = fn.random.coin_flip(probability=0.5)
            else:
                images = fn.decoders.image(jpegs, output_type=types.RGB, **dec)
                images = fn.resize(images, resize_shorter=int(crop / 0.875), antialias=antialias)
                mirror = 0
            images = fn.crop_mirror_normalize(images, dtype=out_type, output_layout=layout, crop=(crop, crop),
                                              mean=[255 * m for m in MEAN], std=[255 * s for s in STD], mirror=mirror)
            # labels on the GPU too, so no step copies from pageable host memory (on our H200
            # this made no measurable difference to throughput; see benchmarks/HISTORY.md)
            return images, (lab.gpu() if gpu and gpu_labels else lab)

        self.pipe = pipe(batch_size=batch_size, num_threads=num_threads or min(8, os.cpu_count() or 1),
                         device_id=device_id, seed=seed, prefetch_queue_depth=prefetch_queue_depth,
                         exec_dynamic=exec_dynamic)
        self.pipe.build()
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        self.it = DALIGenericIterator([self.pipe], ["images", "labels"], reader_name="Reader", auto_reset=True,
                                      last_batch_policy=LastBatchPolicy.DROP if train else LastBatchPolicy.PARTIAL)
        self.channels_last = channels_last

    def __len__(self) -> int:
        per_shard = -(-self.n // self.num_shards)
        return per_shard // self.batch_size if self.train else -(-per_shard // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for out in self.it:
            d = out[0]
            images = d["images"]
            if self.channels_last:  # HWC from DALI, viewed as NCHW in channels_last memory format
                images = images.permute(0, 3, 1, 2)
            yield images, d["labels"].squeeze(-1).long()


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

    def __init__(self, batch_size: int, num_classes: int, steps: int = 1000, crop: int = 224,
                 device: str | torch.device = "cpu") -> None:
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

    def __init__(self, root: str | None = None, loader: str = "torchvision", batch_size: int = 64, crop: int = 224,
                 num_workers: int = 0, on_bad: str = "error", seed: int = 0, dali_options: dict | None = None) -> None:
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
        return DaliLoader(files, labels, self.batch_size, train=train, crop=self.crop, device_id=self._device_id(),
                          seed=self.seed, **self.dali_options)

    def torchvision_loader(self, train: bool = True) -> DataLoader:
        from torchvision import datasets, transforms

        norm = transforms.Normalize(MEAN, STD)
        if train:
            tf = transforms.Compose([transforms.RandomResizedCrop(self.crop), transforms.RandomHorizontalFlip(),
                                     transforms.ToTensor(), norm])
        else:
            tf = transforms.Compose([transforms.Resize(int(self.crop / 0.875)), transforms.CenterCrop(self.crop),
                                     transforms.ToTensor(), norm])
        split = "train" if train else "val"
        ok = set(self.files) if train else set(scan_images(self.root / split, self.on_bad)[0])
        ds = datasets.ImageFolder(str(self.root / split), transform=tf, is_valid_file=lambda p: p in ok)
        loader = DataLoader(ds, batch_size=self.batch_size, shuffle=train, drop_last=train,
                            num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                            generator=torch.Generator().manual_seed(self.seed))
        if train:
            loader.fastloop_dali = lambda: self.dali_loader(train=True)  # what the `dali` speedup switches to
        return loader

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
