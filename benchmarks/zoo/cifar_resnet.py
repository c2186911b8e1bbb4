"""A CIFAR-10 ResNet-18 written as in Lightning's CIFAR-10 tutorial: torchvision's resnet18 with a
3x3 stem and no max-pool, SGD with momentum and OneCycleLR stepped every batch, ``self.log`` of
the loss, the data already transformed and held in memory as a TensorDataset, batch 256."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, TensorDataset

try:
    from lightning.pytorch import LightningModule
except ImportError:  # pragma: no cover
    from pytorch_lightning import LightningModule  # type: ignore[no-redef]


def create_model() -> torch.nn.Module:
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    model.conv1 = torch.nn.Conv2d(3, 64, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False)
    model.maxpool = torch.nn.Identity()
    return model


class LitResnet(LightningModule):
    def __init__(self, lr: float = 0.05, batch_size: int = 256, steps_per_epoch: int = 39) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.batch_size = batch_size
        self.model = create_model()

    def forward(self, x):
        return F.log_softmax(self.model(x), dim=1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.nll_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=5e-4)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, 0.1, epochs=30, steps_per_epoch=self.hparams.steps_per_epoch
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _data(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    images = (torch.rand(n, 3, 32, 32, generator=g) - 0.48) / 0.25  # already normalised
    return images, torch.randint(0, 10, (n,), generator=g)


def make(batch_size: int = 256, n: int = 10_000, seed: int = 0):
    torch.manual_seed(seed)
    x, y = _data(n, seed)
    data = DataLoader(
        TensorDataset(x, y),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    return LitResnet(batch_size=batch_size, steps_per_epoch=n // batch_size), data


def expert(batch_size: int = 256, n: int = 10_000, seed: int = 0):
    """By hand: the data on the GPU, bf16-mixed, channels_last, TF32, and
    ``torch.compile(mode="reduce-overhead")`` (forward and backward graphed, each step marked)."""
    from benchmarks.zoo._expert import GpuData, MarkStep, tf32

    tf32()
    torch.manual_seed(seed)
    module = LitResnet(batch_size=batch_size, steps_per_epoch=n // batch_size)
    module.model = module.model.to(memory_format=torch.channels_last)
    module.model.compile(mode="reduce-overhead")
    x, y = _data(n, seed)
    data = GpuData(x.contiguous(memory_format=torch.channels_last), y, batch_size=batch_size, seed=seed)
    return module, data, {"precision": "bf16-mixed", "callbacks": [MarkStep()]}
