"""``fastloop ladder demo``: a small classifier fed by a slow record store (the data wall).

Each sample is a CSV text record of ``fields`` numbers, read from a store with ``latency_s``
per read (network or object storage; simulated with a sleep, since nothing may be downloaded)
and parsed and featurised in Python in the dataset's ``__getitem__``, as tabular and
log-processing pipelines do. The model is a small MLP, so the step waits for its batches: the
case where loader workers help (measured; several reads wait in parallel, even on two cores)
and precision or compile changes cannot. Records are generated from a fixed seed.

Example:
    >>> module, loader = make(n=64, fields=32, batch_size=16)
    >>> x, y = next(iter(loader))
    >>> tuple(x.shape), tuple(y.shape), module.batch_size
    ((16, 32), (16,), 16)
"""

from __future__ import annotations

import math
import random
import time

import torch
from torch.utils.data import DataLoader, Dataset

from fastloop._compat import LightningModule

LADDER = ["workers", "bf16", "fused_optimizer"]
"""This recipe's own default ladder (the CPU main job: no compile, which costs tens of seconds a
process on a CPU)."""

__all__ = ["Records", "TabularMLP", "make"]


class Records(Dataset):
    """``n`` CSV text records of ``fields`` numbers each; label = which quarter the first field's
    hash lands in (learnable from the features)."""

    def __init__(
        self, n: int = 2048, fields: int = 256, seed: int = 0, latency_s: float = 0.0005, label_noise: float = 0.0
    ) -> None:
        rng = random.Random(seed)
        self.lines = [",".join(f"{rng.gauss(0, 1):.6f}" for _ in range(fields)) for _ in range(n)]
        self.fields = fields
        self.latency_s = latency_s
        noisy = random.Random(seed + 1)  # its own stream: the records are the same with or without noise
        self.noise = {i: noisy.randrange(4) for i in range(n) if noisy.random() < label_noise}
        """Records whose label is replaced, and by what (none by default)."""

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.latency_s:
            time.sleep(self.latency_s)  # the store's read latency
        values = [float(v) for v in self.lines[i].split(",")]
        feats = [math.copysign(math.log1p(abs(v)), v) for v in values]  # per-sample featurising
        label = self.noise.get(i, int(sum(values[:8]) > 0) + 2 * int(values[8] > 0))
        return torch.tensor(feats, dtype=torch.float32), torch.tensor(label)


class TabularMLP(LightningModule):
    """The MLP, with a held-out set of records for validation (``fastloop fit``'s outcome: its loss
    and accuracy); the measured runs of ``run``, ``ladder`` and ``ab`` do not validate."""

    def __init__(
        self,
        fields: int = 256,
        hidden: int = 256,
        batch_size: int = 64,
        lr: float = 1e-3,
        val_records: Records | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["val_records"])
        self.batch_size = batch_size
        self.val_records = val_records
        self.net = torch.nn.Sequential(torch.nn.Linear(fields, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", torch.nn.functional.cross_entropy(logits, y), prog_bar=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), prog_bar=True)

    def val_dataloader(self):
        return DataLoader(self.val_records or [], batch_size=self.batch_size)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def make(
    n: int = 2048,
    fields: int = 256,
    batch_size: int = 32,
    latency_s: float = 0.0005,
    seed: int = 0,
    label_noise: float = 0.0,
):
    """``(TabularMLP, training DataLoader)``; the module validates on ``n // 4`` records of their own
    (the same store). ``label_noise``: the share of training records whose label is replaced by a
    random one (a model made to learn worse, for ``ab --fit``'s outcome verdict)."""
    torch.manual_seed(seed)
    val = Records(max(1, n // 4), fields, seed + 1_000_003, latency_s)
    return (
        TabularMLP(fields=fields, batch_size=batch_size, val_records=val),
        DataLoader(
            Records(n, fields, seed, latency_s, label_noise),
            batch_size=batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(seed),
        ),
    )
