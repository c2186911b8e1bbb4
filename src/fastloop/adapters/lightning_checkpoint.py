"""How the Lightning callbacks send a fit's checkpoint saves through a
:class:`~fastloop.speedups.async_checkpoint.CheckpointWriter`: the strategy's ``checkpoint_io`` (the
one object every save, load and deletion of ``trainer.save_checkpoint`` and ``ModelCheckpoint``
goes through) is wrapped for the fit and put back at teardown.

Example:
    >>> from fastloop._compat import Trainer
    >>> from fastloop.speedups.async_checkpoint import CheckpointWriter
    >>> trainer = Trainer(accelerator="cpu", logger=False)
    >>> undo = []
    >>> install_checkpoint_writer(trainer, CheckpointWriter(), undo)
    >>> type(trainer.strategy.checkpoint_io).__name__
    'WriterCheckpointIO'
    >>> undo.pop()()
    >>> type(trainer.strategy.checkpoint_io).__name__
    'TorchCheckpointIO'
"""

from __future__ import annotations

import os
from typing import Any

from fastloop._compat import Logger, Trainer
from fastloop.adapters.lightning_changes import patch_attr
from fastloop.speedups.async_checkpoint import CheckpointWriter, closing_after_interrupt
from fastloop.speedups.base import Skip

try:  # pragma: no cover - which branch runs depends on the machine
    from lightning.pytorch.plugins.io import CheckpointIO, TorchCheckpointIO
    from lightning.pytorch.strategies import Strategy
except ImportError:  # pragma: no cover
    from pytorch_lightning.plugins.io import CheckpointIO, TorchCheckpointIO  # type: ignore[no-redef]
    from pytorch_lightning.strategies import Strategy  # type: ignore[no-redef]

__all__ = ["WriterCheckpointIO", "install_checkpoint_writer", "why_not_writer"]


def _local(path: Any) -> bool:
    """A path on this machine's file system (a URL such as ``s3://`` is written by fsspec)."""
    return "://" not in str(os.fspath(path))


class WriterCheckpointIO(CheckpointIO):
    """Lightning's ``TorchCheckpointIO``, with each save of a local file handed to ``writer``; a
    load or a deletion of a file still being written waits for it (``ModelCheckpoint``'s top-k
    deletions included); a save the writer cannot take (a URL, ``storage_options``) goes to
    Lightning's own after the write in flight, recorded as written at once."""

    def __init__(self, inner: Any, writer: CheckpointWriter) -> None:
        self.inner, self.writer = inner, writer

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None or not _local(path):
            why = "storage_options were given" if storage_options is not None else "the path is a URL"
            self.writer.save_at_once(lambda: self.inner.save_checkpoint(checkpoint, path, storage_options), why)
            return
        os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)  # as TorchCheckpointIO does
        self.writer.save(checkpoint, path)

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if _local(path):
            self.writer.wait(path)
        return self.inner.load_checkpoint(path, *args, **kwargs)

    def remove_checkpoint(self, path: Any) -> None:
        if _local(path):
            self.writer.wait(path)  # else the rename that ends the write would bring the file back
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.writer.close(abandon=closing_after_interrupt())
        self.inner.teardown()


def why_not_writer(trainer: Trainer) -> str | None:
    """Why the fit's saves cannot go through a writer (None: they can): a strategy that saves its
    own way, or a checkpoint IO other than Lightning's ``torch.save`` one."""
    strategy = trainer.strategy
    if type(strategy).save_checkpoint is not Strategy.save_checkpoint:
        return (
            f"{type(strategy).__name__} saves checkpoints its own way (sharded, or through its engine): left as it is"
        )
    io = strategy.checkpoint_io
    if type(io) is not TorchCheckpointIO:
        already = " (already asynchronous)" if "async" in type(io).__name__.lower() else ""
        return f"the Trainer saves through {type(io).__name__}{already}, not Lightning's torch.save: left as it is"
    return None


def _hand_loggers_whole_files(trainer: Trainer, writer: CheckpointWriter, undo: list) -> list[str]:
    """A logger that reads each checkpoint as soon as it is saved (its ``after_save_checkpoint``:
    W&B, MLflow and Neptune upload them) is called after the write has ended: such a save waits
    for its write. Returns the loggers' class names."""
    names = []
    for logger in trainer.loggers:
        if type(logger).after_save_checkpoint is Logger.after_save_checkpoint:
            continue  # the base logger's does nothing
        names.append(type(logger).__name__)
        original = logger.after_save_checkpoint

        def after_save_checkpoint(checkpoint_callback: Any, original: Any = original) -> None:
            writer.wait()
            original(checkpoint_callback)

        patch_attr(logger, "after_save_checkpoint", after_save_checkpoint, undo)
    return names


def install_checkpoint_writer(trainer: Trainer, writer: CheckpointWriter, undo: list) -> None:
    """Wrap the strategy's checkpoint IO for this fit (a logger that reads each checkpoint as it is
    saved gets it once written); ``undo`` gets the functions that end the write in flight
    (abandoned after Ctrl-C, else waited for) and put the originals back. Raises
    :class:`~fastloop.speedups.base.Skip` where :func:`why_not_writer` says why not."""
    why = why_not_writer(trainer)
    if why:
        raise Skip(why)
    strategy = trainer.strategy
    original = strategy.checkpoint_io
    strategy.checkpoint_io = WriterCheckpointIO(original, writer)
    readers = _hand_loggers_whole_files(trainer, writer, undo)
    if readers:
        writer.record["waits_for_loggers"] = readers

    def restore() -> None:
        try:
            writer.close(abandon=closing_after_interrupt())
        finally:
            strategy.checkpoint_io = original

    undo.append(restore)
