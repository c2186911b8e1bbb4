"""A CIFAR-shaped ResNet-18 written as in Lightning's CIFAR-10 tutorial: torchvision's resnet18
with a 3x3 stem and no max-pool, SGD with momentum, data already transformed and held in memory
as a TensorDataset (10k samples, normalised float32, 32x32), batch 256."""

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
    def __init__(self, lr: float = 0.05, batch_size: int = 256) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.batch_size = batch_size
        self.model = create_model()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.model(x), dim=1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.nll_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=5e-4)


def make(batch_size: int = 256, n: int = 10_000, seed: int = 0):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    images = (torch.rand(n, 3, 32, 32, generator=g) - 0.48) / 0.25  # already normalised, as after the transforms
    labels = torch.randint(0, 10, (n,), generator=g)
    data = DataLoader(
        TensorDataset(images, labels),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    return LitResnet(batch_size=batch_size), data
