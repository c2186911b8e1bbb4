"""The checkpoint benchmark: how long a save blocks training, synchronous (Lightning's own) against
``async_checkpoint``, on a model of ``--mb`` MB of parameters (default 512: with AdamW's two states
a checkpoint of about 2 GB), and whether the two write the same file.

Each mode is one fit of the same seeded module (a stack of ``width x width`` Linear layers, AdamW),
saving ``--saves`` times, every ``--every`` steps, to the same path. A save is timed from
``trainer.save_checkpoint`` to its return (``host_s``, what the training thread waited), and to
the end of the GPU's work queued by then (``device_s``: the snapshot's copy runs on the step's
stream, so the next step starts after it); the GPU is idle and the previous write has ended when
the timer starts (saves as far apart as a fit's; the record's ``write_s`` says how far that is,
and a save sooner waits for the last: ``waited_s``). The first save
of each mode is reported apart (it allocates the pinned host copy). After the timed saves the
async fit saves once more, and that checkpoint is also written by Lightning's synchronous IO from
the same dictionary; training then goes on while the async file is written, and the two files are
compared byte for byte. The files go to ``--dir`` (default a temporary folder, removed after).

Usage: ``python3 benchmarks/run.py checkpoint [--mb 512] [--saves 4] [--every 5]``; a CPU smoke
test: ``checkpoint --device cpu --mb 8 --saves 2``. Writes ``checkpoint.json`` under $OUT; prints a
table last (goal: the async median blocked time <= 10% of the synchronous one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

from benchmarks._common import emit
from fastloop._compat import Callback, LightningModule, Trainer, pl
from fastloop.lightning import callbacks


class Stack(LightningModule):
    """``layers`` Linear layers of ``width x width`` (fp32), ReLU between them, AdamW."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            *[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
        )

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class TimedSaves(Callback):
    """Saves every ``every`` steps, ``saves`` times, timed; then one more save, compared with a
    synchronous write of the same checkpoint (``reference``: where that goes, None for none)."""

    def __init__(self, path: str, every: int, saves: int, reference: str | None) -> None:
        self.path, self.every, self.saves, self.reference = path, every, saves, reference
        self.host_s: list[float] = []
        self.device_s: list[float] = []

    def _sync(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every or step == 0:
            return
        n = step // self.every
        if n <= self.saves:
            writer = getattr(trainer.strategy.checkpoint_io, "writer", None)
            if writer is not None:  # saves as far apart as a fit's: the previous write has ended
                writer.wait()
            self._sync()  # the step's own work is not the save's
            t0 = time.perf_counter()
            trainer.save_checkpoint(self.path)
            self.host_s.append(time.perf_counter() - t0)
            self._sync()
            self.device_s.append(time.perf_counter() - t0)
        elif n == self.saves + 1 and self.reference is not None:
            io = trainer.strategy.checkpoint_io
            save, reference = io.save_checkpoint, self.reference

            def also_synchronously(checkpoint, path, storage_options=None):
                pl.plugins.io.TorchCheckpointIO().save_checkpoint(checkpoint, reference)
                save(checkpoint, path, storage_options)

            io.save_checkpoint = also_synchronously
            try:
                trainer.save_checkpoint(self.path + ".same-step")
            finally:
                del io.save_checkpoint


def fit(speedups: str, args: argparse.Namespace, folder: str, reference: str | None) -> dict:
    width = 4096 if args.device == "cuda" else 256
    layers = max(1, round(args.mb * 2**20 / (4 * width * width)))
    torch.manual_seed(0)
    module = Stack(width, layers)
    data = DataLoader(TensorDataset(torch.randn(64 * 8, width)), batch_size=64)
    saves = TimedSaves(os.path.join(folder, f"{speedups}.ckpt"), args.every, args.saves, reference)
    trainer = Trainer(
        max_steps=args.every * (args.saves + 2),
        accelerator="gpu" if args.device == "cuda" else "cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[saves, *callbacks(speedups)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train_dataloaders=data)
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    stats = next((c.ctx.stats for c in trainer.callbacks if getattr(c, "ctx", None) is not None), {})
    return {
        "speedups": speedups,
        "param_bytes": params,
        "file_bytes": os.path.getsize(saves.path),
        "host_s": saves.host_s,
        "device_s": saves.device_s,
        "record": stats.get("async_checkpoint"),
    }


def _steady(xs: list[float]) -> float:
    """The median of the saves after the first (the first allocates the host copy)."""
    return statistics.median(xs[1:] if len(xs) > 1 else xs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=float, default=512, help="the model's parameters, MB (fp32)")
    p.add_argument("--saves", type=int, default=4)
    p.add_argument("--every", type=int, default=5, help="steps between saves")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary folder, removed)")
    args = p.parse_args(argv)
    folder = args.dir or tempfile.mkdtemp(prefix="fastloop-checkpoint-bench-")
    os.makedirs(folder, exist_ok=True)
    reference = os.path.join(folder, "synchronous-same-step.ckpt")
    try:
        sync = fit("none", args, folder, None)
        done = fit("async_checkpoint", args, folder, reference)
        with open(reference, "rb") as a, open(os.path.join(folder, "async_checkpoint.ckpt.same-step"), "rb") as b:
            same = a.read() == b.read()
    finally:
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    ratio = {k: _steady(done[k]) / _steady(sync[k]) for k in ("host_s", "device_s")}
    emit(
        "checkpoint",
        {
            "synchronous": sync,
            "async": done,
            "blocked_ratio_steady": ratio,
            "goal": "async blocked <= 10% of synchronous (device_s, saves after the first)",
            "pass": ratio["device_s"] <= 0.10,
            "files_equal": same,
        },
    )
    mib = {k: sync[k] / 2**20 for k in ("param_bytes", "file_bytes")}
    print(f"\ncheckpoint: {mib['param_bytes']:,.0f} MiB of parameters, {mib['file_bytes']:,.0f} MiB files")
    print("| mode | first save s (host / device) | later saves median s (host / device) | files equal |")
    print("| --- | --- | --- | --- |")
    for name, r in (("synchronous", sync), ("async_checkpoint", done)):
        print(
            f"| {name} | {r['host_s'][0]:.3f} / {r['device_s'][0]:.3f} | "
            f"{_steady(r['host_s']):.3f} / {_steady(r['device_s']):.3f} | {same if r is done else ''} |"
        )
    print(f"async / synchronous (later saves): host {ratio['host_s']:.3f}, device {ratio['device_s']:.3f}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
