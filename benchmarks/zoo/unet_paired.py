"""The zoo's U-Net (benchmarks/zoo/unet.py) fed as segmentation users write it: uint8 images and
their masks held in memory at 160x160, the Dataset cropping both to 128x128 at the same random
offset and flipping both together, by hand in ``__getitem__`` (no torchvision pipeline that a
translation could reach), then scaling the image to [0, 1] and normalising; 4 loader workers.
Only the workers (and what follows them) can help this feed."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.zoo.unet import LitUNet

MEAN = torch.tensor([0.5, 0.5, 0.5]).view(3, 1, 1)
STD = torch.tensor([0.25, 0.25, 0.25]).view(3, 1, 1)


class PairedCrops(Dataset):
    """uint8 images and long masks in memory; a paired random crop and flip per sample."""

    def __init__(self, n: int = 2048, size: int = 160, crop: int = 128, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
        self.masks = (self.images[:, 0] > 128).long() + (self.images[:, 1] > 192).long() * 2
        self.crop = crop

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        img, mask = self.images[i], self.masks[i]
        top = int(torch.randint(0, img.shape[1] - self.crop + 1, ()))
        left = int(torch.randint(0, img.shape[2] - self.crop + 1, ()))
        img = img[:, top : top + self.crop, left : left + self.crop]
        mask = mask[top : top + self.crop, left : left + self.crop]
        if torch.rand(()) < 0.5:
            img, mask = img.flip(-1), mask.flip(-1)
        return (img.float() / 255 - MEAN) / STD, mask.contiguous()


def make(batch_size: int = 32, workers: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    loader = DataLoader(
        PairedCrops(seed=seed),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    return LitUNet(), loader


def expert(batch_size: int = 32, seed: int = 0):
    """By hand: 8 workers, pinned memory, bf16-mixed, channels_last, TF32, cuDNN benchmark and
    ``torch.compile(mode="reduce-overhead")`` (compile's CUDA graphs, each step marked)."""
    from benchmarks.zoo._expert import MarkStep, tf32

    tf32()
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(seed)
    module = LitUNet()
    module.net = module.net.to(memory_format=torch.channels_last)
    module.net.compile(mode="reduce-overhead")
    loader = DataLoader(
        PairedCrops(seed=seed),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=8,
        pin_memory=True,
        persistent_workers=True,
        prefetch_factor=4,
    )
    return module, loader, {"precision": "bf16-mixed", "callbacks": [MarkStep()]}
