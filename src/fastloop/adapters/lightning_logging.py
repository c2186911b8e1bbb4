"""deferred_logging under Lightning: the Trainer's logger connector with its host reads deferred.

Lightning's logger connector reads values to the host in three places: each ``prog_bar=True``
value after every batch (``_ResultCollection.metrics``, whether a progress bar is shown or not), each
logged value when it writes a row (``log_metrics``, at every ``log_every_n_steps`` and at epoch
ends), and the bar's values again when the bar asks for them. :class:`DeferredReads`, mixed into the
connector's class for one fit, changes only when those reads happen:

- what is computed, reduced and synced (``sync_dist``) stays Lightning's own, at the same moments:
  the connector's methods run as before and only the conversion to Python numbers waits;
- a row Lightning would write is kept (a device copy of its tensors, the step and epoch it would be
  written at) and written later, with the same values at the same step, in order;
- the kept rows and the progress bar's values are read together, in one transfer per device and
  dtype, when the :class:`~fastloop.speedups.deferred_logging.Cadence` says so, at every epoch's end
  (once per epoch), before a checkpoint is saved (so that a fit resumed from it lost no row) and
  when the fit ends or fails;
- ``trainer.callback_metrics`` and ``trainer.logged_metrics`` hold the current tensors as without
  it, so ``ModelCheckpoint(monitor=...)``, ``EarlyStopping`` and ``ReduceLROnPlateau`` decide on the
  current values; only ``trainer.progress_bar_metrics`` (numbers) is as late as the cadence.

Every Lightning private it touches is in :mod:`fastloop.adapters._lightning_private`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fastloop._compat import Trainer
from fastloop.adapters._lightning_private import (
    at_epoch_level,
    batches_that_stepped,
    logged_values,
    logger_connector,
    progress_bar_values,
    progress_bar_values_as_tensors,
    swap_logger_connector,
)
from fastloop.adapters.lightning_changes import patch_attr
from fastloop.speedups.base import Skip
from fastloop.speedups.deferred_logging import Cadence, keep, read_to_host

__all__ = ["DeferredReads", "defer_logged_reads"]


@dataclass
class _Row:
    """A row that would have been written now: its values kept on the device, and what decides its
    step (the ``step`` given, else a logged ``step`` value, else the training step now). ``to``: the
    one logger a callback gave it to (``LearningRateMonitor`` writes to its loggers itself); None:
    the connector's, for every logger."""

    values: dict[str, Any]
    step: int | None
    epoch: int = 0
    stepped: int = 0
    to: Any = None


@dataclass
class _Kept:
    cadence: Cadence
    rows: list[_Row] = field(default_factory=list)
    shown: dict[str, Any] = field(default_factory=dict)
    """The progress bar's values computed since the last read (tensors, the latest per name)."""
    reads: int = 0
    """Host transfers so far (one per device and dtype of a read)."""
    steps: int = 0
    writers: dict[int, Callable[..., Any]] = field(default_factory=dict)
    """Each logger's own ``log_metrics`` (by ``id``), which the kept rows are written with."""


class DeferredReads:
    """Mixed in before Lightning's ``_LoggerConnector`` class (see the module's docstring); the
    members it overrides are :data:`fastloop.adapters._lightning_private.LOGGER_CONNECTOR_OVERRIDES`."""

    _kept: _Kept
    trainer: Trainer

    @property
    def metrics(self) -> Any:
        with progress_bar_values_as_tensors():
            out = super().metrics  # type: ignore[misc]
        self._kept.shown.update(out["pbar"])  # read at the next read, not now
        return {**out, "pbar": {}}

    @property
    def progress_bar_metrics(self) -> dict:
        shown = super().progress_bar_metrics  # type: ignore[misc]  # keeps the current values (no read)
        self._read_if_due()
        return shown

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        if not self.trainer.loggers or not metrics:
            return
        logged_values(self).update(metrics)
        if any(isinstance(v, torch.Tensor) and not _one_element(v) for v in metrics.values()):
            _convert_tensors_to_scalars(metrics)  # raises Lightning's error, at the step that logged it
        trainer = self.trainer
        self._kept.rows.append(_Row(keep(metrics), step, trainer.current_epoch, batches_that_stepped(trainer)))
        self._read_if_due()

    def on_batch_end(self) -> None:
        super().on_batch_end()  # type: ignore[misc]
        self._kept.cadence.step()
        self._kept.steps += 1
        self._read_if_due()

    def reset_metrics(self) -> None:
        super().reset_metrics()  # type: ignore[misc]
        self._kept.shown.clear()  # as Lightning forgets the values it showed (after the sanity check)

    def _read_if_due(self) -> None:
        # at an epoch's end a read costs one per epoch, and the bar and the logger show the epoch at once
        if at_epoch_level(self) or self._kept.cadence.due():
            self.read_now()

    def read_now(self) -> None:
        """Read every kept value to the host (one transfer per device and dtype), write the kept rows
        to the loggers in order, and show the progress bar's latest values."""
        kept = self._kept
        rows, shown = kept.rows, kept.shown
        kept.rows, kept.shown = [], {}
        kept.cadence.restart()
        if not rows and not shown:
            return
        values = [r.values for r in rows] + [shown]
        kept.reads += len({(v.device, v.dtype) for row in values for v in row.values() if _one_element(v)})
        *written, numbers = read_to_host(values)
        progress_bar_values(self).update(numbers)
        for row, scalars in zip(rows, written):
            self._write(row, scalars)

    def _write(self, row: _Row, scalars: dict) -> None:
        """What Lightning's ``log_metrics`` does once the values are numbers, with the step and epoch
        of the moment it was called."""
        step = row.step
        if row.to is not None:  # as the callback gave it
            self._kept.writers[id(row.to)](scalars, step=step)
            return
        if step is None:
            logged_step = scalars.pop("step", None)
            if logged_step is not None:
                step = int(logged_step)
            else:
                scalars.setdefault("epoch", row.epoch)
                step = row.stepped
        for logger in self.trainer.loggers:
            self._kept.writers.get(id(logger), logger.log_metrics)(metrics=scalars, step=step)
            logger.save()


def _one_element(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() == 1


def _convert_tensors_to_scalars(values: dict) -> dict:
    """Lightning's own conversion of logged values to numbers (with its error for a tensor of several
    elements): fabric's public ``convert_tensors_to_scalars``."""
    try:
        from lightning.fabric.utilities.apply_func import convert_tensors_to_scalars
    except ImportError:  # pragma: no cover
        from lightning_fabric.utilities.apply_func import convert_tensors_to_scalars  # type: ignore[no-redef]
    return convert_tensors_to_scalars(values)


def defer_logged_reads(trainer: Trainer, cadence: Cadence, undo: list, stats: dict) -> DeferredReads:
    """Defer the host reads of ``trainer``'s logged values for one fit (see the module's docstring);
    ``undo`` gets what puts the connector and the Trainer back (after a last read), which also puts
    in ``stats`` how many reads there were (``deferred_logging_reads``) in how many steps
    (``deferred_logging_steps``). Raises :class:`~fastloop.speedups.base.Skip` where there is
    nothing to defer.

    Example:
        >>> from fastloop._compat import Trainer
        >>> from fastloop.adapters._lightning_private import logger_connector
        >>> trainer, undo, stats = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False), [], {}
        >>> deferred = defer_logged_reads(trainer, Cadence(every=10, seconds=None), undo, stats)
        >>> deferred is logger_connector(trainer), type(deferred).__name__
        (True, 'DeferredReads_LoggerConnector')
        >>> while undo:
        ...     undo.pop()()
        >>> type(logger_connector(trainer)).__name__, stats
        ('_LoggerConnector', {'deferred_logging_reads': 0, 'deferred_logging_steps': 0})
    """
    if trainer.barebones:
        raise Skip("Trainer(barebones=True) logs nothing: there is no read to defer")
    connector = logger_connector(trainer)
    if isinstance(connector, DeferredReads):
        raise Skip("this Trainer's logged values are deferred already (another deferred_logging callback)")
    connector._kept = _Kept(cadence)
    restore = swap_logger_connector(trainer, DeferredReads)
    deferred: DeferredReads = connector

    def put_back() -> None:
        try:
            deferred.read_now()  # after an exception too: the rows kept so far reach the logger
        except Exception as err:  # the device may be what failed: say so, and leave Lightning's error to stand
            warnings.warn(f"deferred_logging could not write its last rows: {type(err).__name__}: {err}", stacklevel=1)
        stats["deferred_logging_reads"], stats["deferred_logging_steps"] = deferred._kept.reads, deferred._kept.steps
        restore()
        vars(connector).pop("_kept", None)

    undo.append(put_back)
    original: Callable[..., Any] = trainer.save_checkpoint

    def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        deferred.read_now()  # a fit resumed from this checkpoint re-trains only the steps after it
        return original(*args, **kwargs)

    patch_attr(trainer, "save_checkpoint", save_checkpoint, undo)
    for logger in trainer.loggers:  # rows a callback gives a logger itself keep their place among the kept ones
        _keep_in_order(deferred, logger, undo)
    return deferred


def _keep_in_order(deferred: DeferredReads, logger: Any, undo: list) -> None:
    """``logger.log_metrics`` keeps its row with the connector's until the next read (the file's
    rows stay in the order eager logging writes them), for this fit."""
    kept = deferred._kept
    kept.writers[id(logger)] = logger.log_metrics

    def log_metrics(metrics: dict, step: int | None = None) -> None:
        kept.rows.append(_Row(keep(metrics), step, to=logger))

    patch_attr(logger, "log_metrics", log_metrics, undo)
