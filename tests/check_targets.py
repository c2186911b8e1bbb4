"""Targets for the check of a pick (tests/test_pick_check.py): modules built so that a speedup
changes what they train in a way no static check sees, each an ordinary bug of a real class, and
their correct twins.

- ``cursor_records``: a map-style dataset that reads "the next record" from a reader it holds
  and ignores the index (a record file wrapped in a Dataset). In the main process it serves the
  records in order; in worker processes each worker copies the reader at the same position and
  serves the same records again: with ``workers`` the step trains on duplicated samples.
- ``strided_pool_cnn``: a 2x2 average pool written with ``as_strided`` and strides computed for a
  contiguous NCHW tensor (as hand-written unfold and sliding-window code does). In channels_last
  memory the same strides read other elements: with ``channels_last`` the step computes
  something else, on the same batches.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from fastloop._compat import LightningModule


class Records(Dataset):
    """``n`` records of 16 features and a label (which quarter of the features' sum they fall in)."""

    def __init__(self, n: int = 512, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 16, generator=g)
        self.y = (self.x @ torch.randn(16, 4, generator=g)).argmax(1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class CursorRecords(Records):
    """The same records, read as a stream: each read returns the next record, whatever the index."""

    def __init__(self, n: int = 512, seed: int = 0) -> None:
        super().__init__(n, seed)
        self.cursor = 0

    def __getitem__(self, i: int):
        j, self.cursor = self.cursor, (self.cursor + 1) % len(self)
        return self.x[j], self.y[j]


class MLP(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def cursor_records(batch_size: int = 16):
    torch.manual_seed(0)
    return MLP(), DataLoader(CursorRecords(), batch_size=batch_size)


def indexed_records(batch_size: int = 16):
    torch.manual_seed(0)
    return MLP(), DataLoader(Records(), batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))


def strided_pool(x: torch.Tensor) -> torch.Tensor:
    """2x2 average pooling through ``as_strided`` with the strides of a contiguous NCHW tensor."""
    b, c, h, w = x.shape
    windows = x.as_strided((b, c, h // 2, w // 2, 2, 2), (c * h * w, h * w, 2 * w, 2, w, 1))
    return windows.mean((-1, -2))


class StridedPoolCNN(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Linear(8 * 4 * 4, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = strided_pool(torch.relu(self.conv(x)))
        return torch.nn.functional.cross_entropy(self.head(h.flatten(1)), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def strided_pool_cnn(batch_size: int = 16):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 3, 8, 8, generator=g)
    y = (x.flatten(1) @ torch.randn(192, 4, generator=g)).argmax(1)
    data = torch.utils.data.TensorDataset(x, y)
    return StridedPoolCNN(), DataLoader(data, batch_size=batch_size, shuffle=True, generator=g)


class DropoutMLP(MLP):
    """The MLP with dropout and a step-wise learning-rate schedule: what a CUDA graph or a compiled
    step must replay exactly as eager runs it (the masks drawn from the same generator, the rate
    followed)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 256), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(256, 4)
        )

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def dropout_mlp(batch_size: int = 64):
    torch.manual_seed(0)
    data = Records(n=4096)
    return DropoutMLP(), DataLoader(data, batch_size=batch_size, shuffle=True)
