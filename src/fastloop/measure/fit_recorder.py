"""What a fit did, step by step: its training loss, each validation run's metrics, the samples of
each epoch, the steady steps, and the ``--until`` target, recorded by one Lightning callback that
also moves the :class:`~fastloop.measure.fit_clock.PhaseClock` between its base phases.

Losses stay on the device and are read once at the end (no per-step sync). A validation run's
metrics are read when it ends (one read per run): those whose values it changed are the ones the
module logs in validation.

The ``--until`` target is :class:`~fastloop.measure.until.Until`.
"""

from __future__ import annotations

from typing import Any

import torch

from fastloop._compat import Callback, LightningModule, Trainer
from fastloop.errors import FastloopError
from fastloop.measure.batches import batch_items
from fastloop.measure.fit_clock import PhaseClock
from fastloop.measure.until import Until

__all__ = ["FitRecorder", "loader_batches"]


def _scalar(value: Any) -> float | None:
    if torch.is_tensor(value):
        if value.numel() != 1:
            return None
        value = value.detach().float().item()
    return float(value) if isinstance(value, (int, float)) else None


def loader_batches(loaders: Any) -> int | None:
    """The batches of one pass over ``loaders`` (a loader, or a list or dict of them: their sum);
    None where there is none or one has no length.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> loader_batches([DataLoader(range(10), batch_size=4), DataLoader(range(3))]), loader_batches(None)
        (6, None)
    """
    if loaders is None:
        return None
    parts = list(loaders.values()) if isinstance(loaders, dict) else loaders
    parts = parts if isinstance(parts, (list, tuple)) else [parts]
    try:
        return sum(len(p) for p in parts) if parts else None
    except TypeError:  # an iterable dataset without __len__
        return None


class FitRecorder(Callback):
    """The fit's record (see the module's docstring) and the clock's base phases: start-up until
    training starts, then an epoch edge until each epoch's first step, training from there until
    the epoch ends, and ``other`` after training (Lightning's teardown).

    Args:
        clock: the fit's :class:`PhaseClock`.
        until: stop the fit at the end of the first validation run that reaches it.
    """

    def __init__(self, clock: PhaseClock, until: Until | None = None) -> None:
        self.clock, self.until = clock, until
        self.steps: list[tuple[int, float]] = []
        """(global step, second) at the end of each training batch."""
        self._losses: list[torch.Tensor | None] = []
        self.validation: list[dict] = []
        """Per validation run: its index, epoch, global step, second and metrics."""
        self.samples: dict[int, int] = {}
        self.batches: dict[int, int] = {}
        self.steady_s: list[float] = []
        """The training seconds between two training batches that ran back to back (no
        validation, save, compile or epoch edge between them; the progress bar's, the loggers'
        and the checkpoint callbacks' per-step work left out): the step-only figure's steps."""
        self.reached: dict | None = None
        self.val_batches = 0
        """Validation batches the fit ran (the sanity check's apart: :attr:`sanity_batches`)."""
        self.sanity_batches = 0
        self.loader_batches: dict[str, int | None] = {"train": None, "val": None}
        """The batches of a whole epoch of the training loader and of a whole validation run, as
        the loaders give them (None: a loader without a length, or none): a fit limited to fewer
        batches (a short fit) says what the full one would run."""
        self._before: dict[str, Any] = {}
        self._last_end: tuple[float, int, int] | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.until is not None and type(pl_module).validation_step is LightningModule.validation_step:
            raise FastloopError(
                f"--until {self.until}: {type(pl_module).__name__} has no validation_step, so it logs no "
                "validation metric; give --epochs, --max-steps or --max-time alone"
            )

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.clock.epoch = trainer.current_epoch
        self.clock.set_base("epoch_edges", sync=True)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.clock.epoch = trainer.current_epoch
        self._last_end = None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.clock.set_base("train", sync=True)
        epoch = trainer.current_epoch
        self.samples[epoch] = self.samples.get(epoch, 0) + batch_items(batch, trainer)
        self.batches[epoch] = self.batches.get(epoch, 0) + 1

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self._losses.append(loss.detach().float().reshape(()) if torch.is_tensor(loss) and loss.numel() == 1 else None)
        now = self.clock.seconds()
        self.steps.append((trainer.global_step, now))
        mark = (self.clock.charged("train"), self.clock.interruptions, trainer.current_epoch)
        if self._last_end is not None and mark[1:] == self._last_end[1:]:
            self.steady_s.append(mark[0] - self._last_end[0])
        self._last_end = mark

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.clock.set_base("epoch_edges", sync=True)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.clock.set_base("other", sync=True)
        self.clock.epoch = None
        self.loader_batches = {
            "train": loader_batches(trainer.train_dataloader),
            "val": loader_batches(trainer.val_dataloaders),
        }

    def on_validation_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int, *args: Any
    ) -> None:
        if trainer.sanity_checking:
            self.sanity_batches += 1
        else:
            self.val_batches += 1

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._before = dict(trainer.callback_metrics)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        after = trainer.callback_metrics
        logged = {k: _scalar(v) for k, v in after.items() if k not in self._before or self._before[k] is not v}
        self.validation.append(
            {
                "index": len(self.validation),
                "epoch": trainer.current_epoch,
                "step": trainer.global_step,
                "second": self.clock.seconds(),
                "metrics": dict(sorted(logged.items())),
            }
        )
        self._check_until(trainer, logged)

    def _check_until(self, trainer: Trainer, logged: dict[str, float | None]) -> None:
        if self.until is None or self.reached is not None:
            return
        if self.until.metric not in logged:
            names = ", ".join(sorted(logged)) or "none"
            raise FastloopError(
                f"--until {self.until}: the module never logs {self.until.metric!r} in validation; it logs: {names}"
            )
        if self.until.met(logged[self.until.metric]):
            run = self.validation[-1]
            self.reached = {"step": run["step"], "second": run["second"], "validation_run": run["index"]}
            trainer.should_stop = True

    def train_loss(self) -> list[float | None]:
        """The training loss of every batch (None where the step returned no loss), read once."""
        present = [t for t in self._losses if t is not None]
        values = iter(torch.stack(present).cpu().tolist() if present else [])
        return [None if t is None else next(values) for t in self._losses]
