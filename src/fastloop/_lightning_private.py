"""Every use of a Lightning private, in one place. Each says why and what public API would
replace it; ``tests/test_privates.py`` fails with a clear message when a release changes one.

Supported: lightning 2.5 and 2.6 (``pyproject.toml``), also as ``pytorch_lightning``.
"""

from __future__ import annotations

from typing import Any

from fastloop._compat import Trainer

__all__ = ["ddp_kwargs", "set_train_source", "train_source"]


def train_source(trainer: Trainer) -> Any:
    """The DataLoader or DataModule given to ``fit`` (``trainer.fit_loop._data_source.instance``).

    Why: the data speedups change the training loader of a Trainer they did not build, in
    ``setup``, before Lightning asks for it. Lightning has no public setter for the train loader
    after ``fit`` is called (``trainer.train_dataloader`` is read-only and filled later); the
    public route would be for the user to pass our loader to ``fit`` themselves.
    """
    return trainer.fit_loop._data_source.instance


def set_train_source(trainer: Trainer, source: Any) -> None:
    """Replace what ``train_source`` returns (same private, same reason)."""
    trainer.fit_loop._data_source.instance = source


def ddp_kwargs(strategy: Any) -> dict | None:
    """The keyword arguments Lightning's DDPStrategy passes to ``DistributedDataParallel``
    (``strategy._ddp_kwargs``; None for another strategy). Why: the ``ddp_comm`` speedup tunes
    DDP's gradient buckets of a Trainer it did not build, before the strategy wraps the model
    (after the callbacks' ``setup``). The public route is ``DDPStrategy(**kwargs)`` given to the
    Trainer by the user."""
    kwargs = getattr(strategy, "_ddp_kwargs", None)
    return kwargs if isinstance(kwargs, dict) else None
