"""``fastloop run imagenet``: ResNet-50 on an ImageFolder tree (default: generated JPEGs).

Environment overrides for benchmarks: FASTLOOP_IMAGENET_ROOT, FASTLOOP_IMAGENET_BATCH,
FASTLOOP_IMAGENET_LOADER (torchvision|dali|synthetic), FASTLOOP_IMAGENET_WORKERS.
"""

from __future__ import annotations

import os

import torch

from recipes.imagenet.data import ImageData
from recipes.imagenet.module import ImageClassifier

__all__ = ["make"]


def make(root: str | None = None, arch: str | None = None, batch_size: int | None = None, loader: str | None = None,
         num_workers: int | None = None, crop: int | None = None, seed: int = 0):
    cuda = torch.cuda.is_available()
    env = os.environ.get
    root = root or env("FASTLOOP_IMAGENET_ROOT")
    arch = arch or ("resnet50" if cuda else "resnet18")
    batch_size = batch_size or int(env("FASTLOOP_IMAGENET_BATCH", 256 if cuda else 16))
    loader = loader or env("FASTLOOP_IMAGENET_LOADER", "torchvision")
    num_workers = int(env("FASTLOOP_IMAGENET_WORKERS", 0)) if num_workers is None else num_workers
    crop = crop or (224 if cuda else 112)
    torch.manual_seed(seed)
    data = ImageData(root, loader=loader, batch_size=batch_size, crop=crop, num_workers=num_workers, seed=seed)
    module = ImageClassifier(arch=arch, num_classes=data.num_classes, batch_size=batch_size)
    return module, data
