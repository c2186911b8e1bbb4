"""Loader alone (no model): images/s of the torchvision ImageFolder pipeline with N workers vs
the DALI pipeline with GPU ("mixed") decoding, at batch 256, 224 px, on the same JPEG folder.

    FASTLOOP_IMAGENET_ROOT=/data/imnet python3 benchmarks/loader_throughput.py
"""

from __future__ import annotations

import os
import time

import torch

from benchmarks._common import emit
from fastloop.recipes.imagenet.data import ImageData


def rate(loader, batches: int = 20, warm: int = 3) -> float:
    it = iter(loader)
    for _ in range(warm):
        next(it)
    torch.cuda.synchronize()
    t0, n = time.perf_counter(), 0
    for _ in range(batches):
        x, _ = next(it)
        if not x.is_cuda:
            x = x.cuda(non_blocking=True)
        n += x.shape[0]
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def main() -> None:
    root = os.environ["FASTLOOP_IMAGENET_ROOT"]
    workers = max(1, (os.cpu_count() or 2) - 1)
    tv = ImageData(root, loader="torchvision", batch_size=256, num_workers=workers)
    dali = ImageData(root, loader="dali", batch_size=256)
    res = {f"torchvision_{workers}_workers": rate(tv.train_dataloader()), "dali_mixed": rate(dali.train_dataloader())}
    emit("loader_throughput", {"images_per_s": res, "batch": 256, "crop": 224, "files": len(tv.files)})


if __name__ == "__main__":
    main()
