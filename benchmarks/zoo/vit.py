"""A small ViT on CIFAR-shaped images with the usual per-sample CPU augmentation in the Dataset
(random crop with padding, horizontal flip, normalize), a torchmetrics accuracy logged every
step, AdamW with OneCycleLR, and gradient clipping set on the Trainer, batch 256."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

try:
    from lightning.pytorch import LightningModule
except ImportError:  # pragma: no cover
    from pytorch_lightning import LightningModule  # type: ignore[no-redef]
import torchmetrics

MEAN = torch.tensor([0.49, 0.48, 0.45]).view(3, 1, 1)
STD = torch.tensor([0.25, 0.24, 0.26]).view(3, 1, 1)


class AugmentedImages(Dataset):
    """uint8 images in memory; each sample cropped, flipped and normalised on the CPU."""

    def __init__(self, n: int = 20_000, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        img = F.pad(self.images[i].float() / 255.0, (4, 4, 4, 4), mode="reflect")
        top, left = torch.randint(0, 9, (2,)).tolist()
        img = img[:, top : top + 32, left : left + 32]
        if torch.rand(()) < 0.5:
            img = img.flip(-1)
        return (img - MEAN) / STD, self.labels[i]


class ViT(nn.Module):
    def __init__(self, dim: int = 256, depth: int = 6, heads: int = 8, patch: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (32 // patch) ** 2 + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.1, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, depth)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


class LitViT(LightningModule):
    def __init__(self, lr: float = 1e-3, batch_size: int = 256, total_steps: int = 10_000) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = ViT()
        self.train_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=10)

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y, label_smoothing=0.1)
        self.train_acc(logits, y)
        self.log("train_loss", loss)
        self.log("train_acc", self.train_acc, on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.hparams.lr, total_steps=self.hparams.total_steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make(batch_size: int = 256, seed: int = 0):
    torch.manual_seed(seed)
    loader = DataLoader(AugmentedImages(seed=seed), batch_size=batch_size, shuffle=True, drop_last=True)
    return LitViT(batch_size=batch_size), loader, {"gradient_clip_val": 1.0}


def expert(batch_size: int = 256, seed: int = 0):
    """By hand: 8 workers, pinned memory, bf16-mixed, TF32, compile (default mode)."""
    from benchmarks.zoo._expert import tf32

    tf32()
    torch.manual_seed(seed)
    module = LitViT(batch_size=batch_size)
    module.model.compile()
    loader = DataLoader(
        AugmentedImages(seed=seed),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=8,
        pin_memory=True,
        persistent_workers=True,
        prefetch_factor=4,
    )
    return module, loader, {"gradient_clip_val": 1.0, "precision": "bf16-mixed"}
