"""A small U-Net for segmentation with BatchNorm (two 3x3 conv + BN + ReLU per level, four
levels, transposed-conv upsampling, skip connections), Adam, cross-entropy over 4 classes,
128x128 images and masks held in memory, batch 32."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    from lightning.pytorch import LightningModule
except ImportError:  # pragma: no cover
    from pytorch_lightning import LightningModule  # type: ignore[no-redef]


def block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    def __init__(self, classes: int = 4, width: int = 32) -> None:
        super().__init__()
        w = [width * 2**i for i in range(4)]
        self.downs = nn.ModuleList([block(3, w[0]), block(w[0], w[1]), block(w[1], w[2])])
        self.mid = block(w[2], w[3])
        self.ups = nn.ModuleList([nn.ConvTranspose2d(w[i + 1], w[i], 2, stride=2) for i in reversed(range(3))])
        self.dec = nn.ModuleList([block(2 * w[i], w[i]) for i in reversed(range(3))])
        self.out = nn.Conv2d(w[0], classes, 1)

    def forward(self, x):
        skips = []
        for down in self.downs:
            x = down(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.mid(x)
        for up, dec, skip in zip(self.ups, self.dec, reversed(skips)):
            x = dec(torch.cat([up(x), skip], 1))
        return self.out(x)


class LitUNet(LightningModule):
    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = UNet()

    def training_step(self, batch, batch_idx):
        x, mask = batch
        loss = F.cross_entropy(self.net(x), mask)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def _data(n: int, size: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, size, size, generator=g)
    mask = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long() * 2
    return x, mask


def make(batch_size: int = 32, size: int = 128, n: int = 1024, seed: int = 0):
    torch.manual_seed(seed)
    data = DataLoader(
        TensorDataset(*_data(n, size, seed)),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    return LitUNet(), data


def expert(batch_size: int = 32, size: int = 128, n: int = 1024, seed: int = 0):
    """By hand: the data on the GPU, bf16-mixed, channels_last, TF32, cuDNN benchmark, and
    ``torch.compile(mode="reduce-overhead")`` (compile's CUDA graphs, each step marked)."""
    from benchmarks.zoo._expert import GpuData, MarkStep, tf32

    tf32()
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(seed)
    module = LitUNet()
    module.net = module.net.to(memory_format=torch.channels_last)
    module.net.compile(mode="reduce-overhead")
    x, mask = _data(n, size, seed)
    return (
        module,
        GpuData(x.contiguous(memory_format=torch.channels_last), mask, batch_size=batch_size, seed=seed),
        {"precision": "bf16-mixed", "callbacks": [MarkStep()]},
    )
