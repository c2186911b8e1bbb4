"""The zoo's ViT (benchmarks/zoo/vit.py) fed the way torchvision's v2 API is written for CIFAR:
uint8 images held in memory, the Dataset applying ``v2.Compose([RandomCrop(32, padding=4),
RandomHorizontalFlip(), ToDtype(float32, scale=True), Normalize(...)])`` to each sample on the
CPU; AdamW with OneCycleLR, a torchmetrics accuracy, gradient clipping, batch 256, 8 workers (the
CPU pipeline's users add them). Where ``gpu_augment`` translates the pipeline, the augmentation
runs on the GPU on each whole batch instead."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.zoo.vit import LitViT

MEAN, STD = [0.49, 0.48, 0.45], [0.25, 0.24, 0.26]


def pipeline():
    from torchvision.transforms import v2

    return v2.Compose(
        [
            v2.RandomCrop(32, padding=4),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )


class CifarLike(Dataset):
    """uint8 CHW images in memory, ``transform`` applied per sample."""

    def __init__(self, n: int = 20_000, seed: int = 0, transform=None) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
        self.targets = torch.randint(0, 10, (n,), generator=g).tolist()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        img = self.data[i]
        return (self.transform(img) if self.transform is not None else img), self.targets[i]


def make(batch_size: int = 256, seed: int = 0, workers: int = 8):
    torch.manual_seed(seed)
    loader = DataLoader(
        CifarLike(seed=seed, transform=pipeline()),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    return LitViT(batch_size=batch_size), loader, {"gradient_clip_val": 1.0}


def expert(batch_size: int = 256, seed: int = 0):
    """By hand: 8 workers, pinned memory, bf16-mixed, TF32, compile (default mode)."""
    from benchmarks.zoo._expert import tf32

    tf32()
    torch.manual_seed(seed)
    module = LitViT(batch_size=batch_size)
    module.model.compile()
    loader = DataLoader(
        CifarLike(seed=seed, transform=pipeline()),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=8,
        pin_memory=True,
        persistent_workers=True,
        prefetch_factor=4,
    )
    return module, loader, {"gradient_clip_val": 1.0, "precision": "bf16-mixed"}
