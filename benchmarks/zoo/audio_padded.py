"""A keyword-spotting classifier on raw audio, written the ordinary way: in-memory waveforms of
0.5-1 s at 16 kHz, a ``collate_fn`` that zero-pads each batch to its longest clip and returns the
clips' lengths, a strided 1-D convolution front end and residual blocks of masked convolutions
(each conv's input zeroed past the clip's length, as NeMo's ``MaskedConv1d`` does), mean pooling
over the real frames, AdamW with a cosine schedule, batch 64, ``num_workers=0``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

try:
    from lightning.pytorch import LightningModule
except ImportError:  # pragma: no cover
    from pytorch_lightning import LightningModule  # type: ignore[no-redef]

RATE, SHORTEST, LONGEST, CLASSES = 16_000, 8_000, 16_000, 12
HOP = 160  # the front end's stride: 10 ms frames


class Clips(Dataset):
    """Waveforms of 0.5-1 s (a tone per class and noise) and a label each."""

    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(SHORTEST, LONGEST + 1, (n,), generator=g).tolist()
        self.labels = torch.randint(0, CLASSES, (n,), generator=g).tolist()
        t = torch.arange(LONGEST) / RATE
        self.clips = [
            (torch.sin(2 * math.pi * (200 + 80 * c) * t[:k]) + 0.3 * torch.randn(k, generator=g)).float()
            for k, c in zip(lengths, self.labels)
        ]

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.clips[i], self.labels[i]


def collate(samples: list, pad_to: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Zero-pad to the batch's longest clip (or ``pad_to``): (waves (B, T), lengths (B,), labels (B,))."""
    longest = pad_to or max(len(w) for w, _ in samples)
    waves = torch.zeros(len(samples), longest)
    for i, (w, _) in enumerate(samples):
        waves[i, : len(w)] = w
    lengths = torch.tensor([len(w) for w, _ in samples])
    return waves, lengths, torch.tensor([y for _, y in samples])


def collate_longest(samples: list):
    return collate(samples, pad_to=LONGEST)


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv1d(c, c, 5, padding=2), nn.Conv1d(c, c, 5, padding=2)
        self.n1, self.n2 = nn.BatchNorm1d(c), nn.BatchNorm1d(c)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.n1(self.conv1(x))) * keep
        return F.relu(x + self.n2(self.conv2(h))) * keep


class Spotter(LightningModule):
    def __init__(self, channels: int = 128, blocks: int = 6, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.front = nn.Sequential(
            nn.Conv1d(1, channels, 400, stride=HOP, padding=200), nn.BatchNorm1d(channels), nn.ReLU()
        )
        self.body = nn.ModuleList([Block(channels) for _ in range(blocks)])
        self.head = nn.Linear(channels, CLASSES)

    def forward(self, waves: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = self.front(waves[:, None])
        frames = torch.arange(x.shape[-1], device=x.device)
        keep = (frames[None] * HOP < lengths[:, None]).to(x.dtype)[:, None]  # the frames of real audio
        x = x * keep
        for block in self.body:
            x = block(x, keep)
        return self.head(x.sum(-1) / keep.sum(-1))

    def training_step(self, batch, batch_idx):
        waves, lengths, labels = batch
        loss = F.cross_entropy(self(waves, lengths), labels)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10_000)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make(batch_size: int = 64, n: int = 64 * 40, seed: int = 0):
    torch.manual_seed(seed)
    loader = DataLoader(
        Clips(n, seed),
        batch_size=batch_size,
        shuffle=True,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(seed),
    )
    return Spotter(), loader


def expert(batch_size: int = 64, n: int = 64 * 40, seed: int = 0):
    """By hand: every batch padded to the longest clip (1 s), pinned memory, bf16-mixed, TF32 and
    ``torch.compile(mode="reduce-overhead")`` on the network (compile's CUDA graphs, each step marked)."""
    from benchmarks.zoo._expert import MarkStep, tf32

    tf32()
    torch.manual_seed(seed)
    module = Spotter()
    for part in (module.front, *module.body, module.head):
        part.compile(mode="reduce-overhead")
    loader = DataLoader(
        Clips(n, seed),
        batch_size=batch_size,
        shuffle=True,
        collate_fn=collate_longest,
        pin_memory=True,
        generator=torch.Generator().manual_seed(seed),
    )
    return module, loader, {"precision": "bf16-mixed", "callbacks": [MarkStep()]}
