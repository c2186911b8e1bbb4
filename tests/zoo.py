"""A zoo of ordinary LightningModules, written the usual way (from Lightning's docs and
examples, not for fastloop), to check that fastloop is a drop-in on code it has never seen.

Each builder takes keyword arguments and returns ``(module, data)`` like any fastloop target.
All data are generated from fixed seeds (no download).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from fastloop._compat import LightningDataModule, LightningModule

try:
    import torchmetrics
except ImportError:  # pragma: no cover - lightning depends on torchmetrics
    torchmetrics = None


def _images(n: int = 96, seed: int = 0, classes: int = 4) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 8, 8, generator=g)
    y = (x.mean((1, 2, 3)) * 10).long().remainder(classes)
    return TensorDataset(x, y)


class BNNet(LightningModule):
    """BatchNorm + dropout + ``self.log`` + a torchmetrics metric + a per-step scheduler."""

    def __init__(self, lr: float = 0.05, batch_size: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Dropout(0.2),
        )
        self.head = nn.Linear(32, 4)
        self.train_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=4)

    def forward(self, x):
        return self.head(self.features(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.train_acc(logits, y)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", self.train_acc, on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self):
        return DataLoader(_images(), batch_size=self.hparams.batch_size, shuffle=True)


def bn_net(batch_size: int = 16):
    return BNNet(batch_size=batch_size), None


class GAN(LightningModule):
    """Two optimizers, manual optimization (Lightning's GAN example, shrunk)."""

    def __init__(self, latent: int = 8, batch_size: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(latent, 32), nn.LeakyReLU(0.2), nn.Linear(32, 16), nn.Tanh())
        self.discriminator = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))

    def forward(self, z):
        return self.generator(z)

    def training_step(self, batch):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.shape[0], self.hparams.latent, device=self.device, dtype=real.dtype)
        ones = torch.ones(real.shape[0], 1, device=self.device, dtype=real.dtype)

        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z)), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)

        self.toggle_optimizer(opt_d)
        fake = self(z).detach()
        d_loss = (
            F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
            + F.binary_cross_entropy_with_logits(self.discriminator(fake), torch.zeros_like(ones))
        ) / 2
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss})

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
        return [opt_g, opt_d], []


def gan(batch_size: int = 16):
    g = torch.Generator().manual_seed(1)
    real = torch.tanh(torch.randn(128, 16, generator=g))
    return GAN(batch_size=batch_size), DataLoader(TensorDataset(real), batch_size=batch_size, shuffle=True)


class LSTMLM(LightningModule):
    """An LSTM language model with a (seq, batch) layout like Lightning's old examples."""

    def __init__(self, vocab: int = 50, batch_size: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, 32)
        self.lstm = nn.LSTM(32, 32, num_layers=2, batch_first=True, dropout=0.1)
        self.out = nn.Linear(32, vocab)

    def forward(self, x):
        h, _ = self.lstm(self.embed(x))
        return self.out(h)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def lstm_lm(batch_size: int = 8):
    g = torch.Generator().manual_seed(2)
    toks = torch.randint(0, 50, (80, 17), generator=g)
    return LSTMLM(batch_size=batch_size), DataLoader(
        TensorDataset(toks[:, :-1], toks[:, 1:]), batch_size=batch_size, shuffle=True
    )


class ImageDataModule(LightningDataModule):
    """A DataModule whose datasets are made in ``setup`` and which normalizes on the device."""

    def __init__(self, batch_size: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.train_set = None

    def setup(self, stage: str) -> None:
        self.train_set = _images(n=80, seed=3)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        x, y = batch
        return (x - 0.5) / 2.0, y


class PlainConv(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.last_input_channels_last = x.is_contiguous(memory_format=torch.channels_last)
        h = F.relu(self.conv(x)).mean((2, 3))
        return F.cross_entropy(self.head(h), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def datamodule_conv(batch_size: int = 16):
    return PlainConv(), ImageDataModule(batch_size=batch_size)


class PlateauNet(LightningModule):
    """The LR scheduler monitors ``val_loss`` (ReduceLROnPlateau), as in Lightning's docs."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(16, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.layer(x), y))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt), "monitor": "val_loss"},
        }

    def val_dataloader(self):
        return DataLoader(_vectors(n=32, seed=5), batch_size=16)


def _vectors(n: int = 64, seed: int = 4) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    return TensorDataset(x, (x.sum(1) > 0).long() + 2 * (x[:, 0] > 0).long())


def plateau(batch_size: int = 16):
    return PlateauNet(), DataLoader(_vectors(), batch_size=batch_size, shuffle=True)


class Linear4(LightningModule):
    """A ``training_step`` without ``batch_idx``; some steps return None (skipped)."""

    def __init__(self, skip_every: int = 0) -> None:
        super().__init__()
        self.layer = nn.Linear(16, 4)
        self.skip_every = skip_every
        self.calls = 0

    def training_step(self, batch):
        self.calls += 1
        if self.skip_every and self.calls % self.skip_every == 0:
            return None
        x, y = batch
        return F.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def batch_sampler_loader(batch_size: int = 16):  # noqa: D103
    ds = _vectors(n=147)
    sampler = BatchSampler(RandomSampler(ds), batch_size=batch_size, drop_last=False)
    return Linear4(), DataLoader(ds, batch_sampler=sampler)


def sometimes_none():
    return Linear4(skip_every=3), DataLoader(_vectors(), batch_size=8, shuffle=True)


class PatchMLP(LightningModule):
    """4-D image inputs and no convolution: patches flattened with ``view``."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(3 * 8 * 8, 32), nn.ReLU(), nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.mlp(x.view(x.size(0), -1)), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def patch_mlp(batch_size: int = 16):
    return PatchMLP(), DataLoader(_images(), batch_size=batch_size, shuffle=True)


class OwnParams(LightningModule):
    """Parameters held directly by the module (no child modules)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 4) * 0.1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(x @ self.w, y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def own_params(batch_size: int = 16):
    return OwnParams(), DataLoader(_vectors(), batch_size=batch_size, shuffle=True)


ZOO = {
    "bn_net": bn_net,
    "gan": gan,
    "lstm_lm": lstm_lm,
    "datamodule_conv": datamodule_conv,
    "plateau": plateau,
    "batch_sampler": batch_sampler_loader,
    "patch_mlp": patch_mlp,
}
"""The modules the issue names; ``sometimes_none`` and ``own_params`` have tests of their own."""
