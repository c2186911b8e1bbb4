"""fastloop for a Lightning ``Trainer``: the public entry point. ``callbacks(...)`` builds the
callbacks (:class:`~fastloop.adapters.lightning.SpeedupCallback`, one per speedup, and
:class:`~fastloop.adapters.lightning_batch_size.BatchSizeSearch` for ``batch_size``);
``records_of(trainer)`` says what each did.

Example:
    >>> from fastloop.lightning import callbacks
    >>> [type(c).__name__ for c in callbacks("bf16,compile")]
    ['SpeedupCallback', 'SpeedupCallback']

    ``Trainer(callbacks=callbacks("workers,pin_memory,prefetch,bf16,fused_optimizer,compile"))``
"""

from __future__ import annotations

from fastloop._compat import Callback, Trainer
from fastloop.adapters.lightning import BatchSizeSearch, SpeedupCallback
from fastloop.speedups.base import Record, RunInputs, Speedup, resolve, valid_step_rate

__all__ = ["BatchSizeSearch", "SpeedupCallback", "callbacks", "records_of"]


def callbacks(spec: str | list[str | Speedup] | None, *, step_rate: float | None = None) -> list[Callback]:
    """One callback per speedup in ``spec`` (validated: unknown names raise FastloopError).
    ``None``, ``"none"``, ``""`` and ``[]`` mean the baseline (no callbacks), as in
    :func:`~fastloop.speedups.base.resolve` and ``FastLoop(speedups=None)``.

    ``batch_size`` becomes a :class:`BatchSizeSearch` that searches with the other speedups of
    ``spec`` on; every other speedup a :class:`SpeedupCallback`, all sharing one
    :class:`~fastloop.speedups.base.RunInputs`. ``step_rate``: steps/s your step reaches without
    waiting for data, if you measured it (``workers`` then sizes the loader to the step's demand).
    """
    if spec is not None and not isinstance(spec, (str, list, tuple)):
        raise TypeError(
            f"callbacks() takes a comma-separated string, a list of speedup names or objects, or None, "
            f"got {type(spec).__name__}"
        )
    chosen = resolve(spec)
    if step_rate is not None and not valid_step_rate(step_rate):
        raise ValueError(f"step_rate must be steps per second, a number > 0, got {step_rate!r}")
    in_training = [s for s in chosen if not s.prepares_run]
    inputs = RunInputs(step_rate=step_rate)
    return [
        BatchSizeSearch(speedups=in_training or None) if s.prepares_run else SpeedupCallback(s, inputs=inputs)
        for s in chosen
    ]


def records_of(trainer: Trainer) -> list[Record]:
    """The outcome of every fastloop speedup callback attached to ``trainer``."""
    return [c.record for c in trainer.callbacks if isinstance(c, (SpeedupCallback, BatchSizeSearch))]
