"""A fit on 2 CPU processes (gloo) whose logged values are reduced across them (``sync_dist=True``),
run as a script by tests/test_deferred_logging.py: ``python tests/ddp_logging.py LOG_DIR [SPEC]``
writes rank 0's CSVLogger file under LOG_DIR, with the speedups SPEC (none: eager logging)."""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "src")]

from fastloop._compat import LightningModule, Trainer  # noqa: E402
from fastloop.lightning import callbacks  # noqa: E402


class Synced(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(16, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        self.log("loss", loss, prog_bar=True, sync_dist=True)
        acc = (out.argmax(1) == y).float().mean()
        self.log("acc", acc, on_step=True, on_epoch=True, sync_dist=True)
        self.log("x_max", x.max(), on_step=False, on_epoch=True, reduce_fx="max", sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y), prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(n: int, seed: int) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(
        TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)), batch_size=8
    )


if __name__ == "__main__":
    from lightning.pytorch.loggers import CSVLogger

    warnings.simplefilter("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    log_dir, spec = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
    torch.manual_seed(0)
    trainer = Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=CSVLogger(log_dir, name="run", version=0),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks(spec),
    )
    trainer.fit(Synced(), _loader(128, 1), _loader(40, 2))
