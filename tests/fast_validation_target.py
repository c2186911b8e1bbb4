"""A fit whose epochs end in a short batch, for ``tests/test_fast_validation.py``: 100 training samples
in batches of 16 (six of 16, one of 4), 37 validation samples in batches of 8 (four of 8, one of 5),
each validation batch carrying its samples' indices, which the module keeps per validation run. The
model has what a warm-up must leave as it was: BatchNorm's running statistics, dropout's random draws,
an AdamW's state, a list attribute the validation step appends to."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from fastloop._compat import LightningModule

TRAIN, VAL, TRAIN_BATCH, VAL_BATCH = 100, 37, 16, 8


class ShortBatches(LightningModule):
    """An MLP with BatchNorm and dropout; ``runs`` holds the sample indices each validation run saw."""

    def __init__(self, children: int = 1) -> None:
        super().__init__()
        layers = [
            torch.nn.Linear(16, 32),
            torch.nn.BatchNorm1d(32),
            torch.nn.ReLU(),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(32, 4),
        ]
        if children == 1:
            self.net = torch.nn.Sequential(*layers)
        else:  # three children with parameters, each compiled on its own by the compile speedup
            self.inp, self.norm, self.out = layers[0], layers[1], layers[4]
        self.runs: list[list[int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "net"):
            return self.net(x)
        return self.out(torch.nn.functional.dropout(torch.relu(self.norm(self.inp(x))), 0.2, self.training))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def on_validation_epoch_start(self) -> None:
        self.runs.append([])

    def validation_step(self, batch, batch_idx):
        x, y, index = batch
        self.runs[-1].extend(index.tolist())
        logits = self(x)
        self.log("val_loss", torch.nn.functional.cross_entropy(logits.float(), y), prog_bar=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def loaders(seed: int = 0) -> tuple[DataLoader, DataLoader]:
    """The training loader (shuffled by its own generator) and the validation loader (in order)."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(TRAIN + VAL, 16, generator=g), torch.randn(16, 4, generator=g)
    y = (x @ w).argmax(1)
    train = DataLoader(
        TensorDataset(x[:TRAIN], y[:TRAIN]),
        batch_size=TRAIN_BATCH,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    val = DataLoader(TensorDataset(x[TRAIN:], y[TRAIN:], torch.arange(VAL)), batch_size=VAL_BATCH)
    return train, val


class ShortBatchesWithData(ShortBatches):
    """The same, with its loaders as its own hooks (what ``fastloop fit`` trains)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self._loaders = loaders(seed)

    def train_dataloader(self):
        return self._loaders[0]

    def val_dataloader(self):
        return self._loaders[1]


def compiled_fit(seed: int = 0):
    """For ``fastloop fit``: the model compiled by its user (backend "eager": Dynamo traces and guards as
    Inductor's compile does, nothing is generated), validated every epoch."""
    torch.manual_seed(seed)
    module = ShortBatchesWithData(seed)
    module.net = torch.compile(module.net, backend="eager")
    return module, None, {"enable_checkpointing": False, "log_every_n_steps": 2}


class PaddedText(LightningModule):
    """Rows of 3 to 24 tokens padded to each batch's longest (as ``DataCollatorWithPadding`` pads), the
    mean of the unmasked embeddings classified; ``runs`` as in :class:`ShortBatches`."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.out = torch.nn.Embedding(50, 16), torch.nn.Linear(16, 4)
        self.runs: list[list[int]] = []

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).float()
        return self.out((self.embed(ids) * m).sum(1) / m.sum(1))

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self(batch["ids"], batch["mask"]), batch["labels"])

    def on_validation_epoch_start(self) -> None:
        self.runs.append([])

    def validation_step(self, batch, batch_idx):
        self.runs[-1].extend(batch["index"].tolist())
        logits = self(batch["ids"], batch["mask"])
        self.log("val_loss", torch.nn.functional.cross_entropy(logits, batch["labels"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _pad(rows: list[tuple[torch.Tensor, int, int]]) -> dict[str, torch.Tensor]:
    longest = max(len(ids) for ids, _, _ in rows)
    ids, mask = torch.zeros(len(rows), longest, dtype=torch.long), torch.zeros(len(rows), longest, dtype=torch.long)
    for i, (row, _, _) in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    return {
        "ids": ids,
        "mask": mask,
        "labels": torch.tensor([label for _, label, _ in rows]),
        "index": torch.tensor([index for _, _, index in rows]),
    }


def padded_loaders(seed: int = 0) -> tuple[DataLoader, DataLoader]:
    """Training (64 rows, batches of 16) and validation (37 rows, four batches of 8 and one of 5) rows,
    each batch padded to its longest row."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 25, (64 + VAL,), generator=g).tolist()
    rows = [(torch.randint(1, 50, (n,), generator=g), n % 4, i) for i, n in enumerate(lengths)]
    train = DataLoader(rows[:64], batch_size=16, collate_fn=_pad)
    val = DataLoader([(ids, label, i) for i, (ids, label, _) in enumerate(rows[64:])], batch_size=8, collate_fn=_pad)
    return train, val
