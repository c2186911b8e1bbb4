"""``dali``: decode and augment JPEGs on the GPU with NVIDIA DALI.

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/dali.md``.
Changes the data pipeline. Applies to a user's own ``ImageFolder``/``DatasetFolder`` of JPEG or
PNG files whose transform is a recognised torchvision pipeline (:mod:`fastloop.speedups.dali.folder`:
the same files, labels, batch size, ``drop_last`` and epoch length, mixed decode on the GPU, each
op with the user's parameters, each rank its shard under DDP); the ImageNet recipe's torchvision
loader is such a loader, and its own ``loader="dali"`` is built by the same pipeline builder
(:class:`fastloop.speedups.dali.folder.DaliPipeline`). Others are skipped with the reason naming what is
not translated. Without a GPU the same DALI pipeline runs on the CPU.

Needs ``CUDA_DEVICE_MAX_CONNECTIONS`` >= 16 (fastloop's command line, its runner and asking for
``dali`` before CUDA starts set 32, unless you set it): with CUDA's default 8 hardware queues,
some of DALI's ~16 streams share a queue with the training stream and their kernels wait behind
it, behind the whole step when it is one CUDA graph (ResNet-50 with the whole step captured:
0.81 of synthetic-data throughput at 8 queues, 0.99 at 32; see :mod:`fastloop.cuda_env`). The
record says when it is missing.

Ladder position: last, after the model speedups, because that is where the data bottleneck
shows: once bf16, channels_last and compile make the step fast, the CPU JPEG pipeline is the
limit again, and this rung says what moving decoding to the GPU buys. DALI replaces the whole
torchvision loader, so ``workers``, ``pin_memory`` and ``prefetch`` stop acting once it applies
(DALI reads with its own threads and keeps batches queued on the GPU).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch

from fastloop.cuda_env import CUDA_QUEUES_VAR, cuda_queues_note, ensure_cuda_queues
from fastloop.speedups.base import Context, Skip, Speedup, register
from fastloop.speedups.dali.folder import DaliFolderLoader, NotTranslated, check_folder
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.run import Run

__all__ = ["Dali"]


@register
class Dali(Speedup):
    __doc__ = __doc__
    name = "dali"
    trains = "own_draws"  # its own decoder and its own random crops
    ladder = LadderTraits(
        replaces_loader=True,
        feeds=True,
        in_default=True,  # tried where the loader's folder and transform translate (why_not_data)
    )
    changes = "data"
    order = 65

    def __init__(self, **options) -> None:
        super().__init__(**options)
        # asking for DALI (callbacks("...,dali"), FastLoop, a run) before CUDA starts is in time to
        # give it its own hardware queues; later, the record and DaliLoader say what is missing
        self.queues = ensure_cuda_queues()

    def why_not(self, ctx: Context) -> str | None:
        try:
            import nvidia.dali  # noqa: F401
        except ImportError:
            return "NVIDIA DALI is not installed (pip install 'fastloop[dali]')"
        return None

    def apply(self, run: Run) -> None:
        run.change_loader(lambda loader: self.apply_loader(loader, run.ctx))

    def why_not_data(self, loader: Any) -> str | None:
        try:
            check_folder(loader)
        except NotTranslated as why:
            return str(why)
        return None

    def apply_loader(self, loader: Iterable, ctx: Context) -> Iterable:
        detail = ""
        if ctx.cuda:
            note = cuda_queues_note()
            detail = f"warning: {note}" if note else f"{CUDA_QUEUES_VAR}={os.environ[CUDA_QUEUES_VAR]}"
        device_id = (
            (ctx.device.index if ctx.device.index is not None else torch.cuda.current_device()) if ctx.cuda else None
        )
        try:
            seed = int(torch.initial_seed() % 2**31)
            out = DaliFolderLoader(loader, device_id=device_id, seed=seed)  # type: ignore[arg-type]
        except NotTranslated as why:
            raise Skip(f"not served by DALI: {why}") from None
        p = out.plan
        ctx.record(
            self.name,
            "applied",
            "",
            f"DALI reads the folder's {out.n:,} files and decodes them "
            f"{'on the GPU (mixed)' if ctx.cuda else 'on the CPU'}: "
            + ("random-resized crop" if p.random_crop else f"resize {p.resize_shorter}, center crop")
            + f" to {p.crop[0]}x{p.crop[1]}, flip p={p.flip:g}, normalize"
            + (f"; rank {out.shard} of {out.num_shards} reads its shard" if out.num_shards > 1 else "")
            + (f"; {detail}" if detail else ""),
        )
        return out
