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
    """One callback per speedup in ``spec``, for ``Trainer(callbacks=...)``.

    ``batch_size`` becomes a :class:`BatchSizeSearch` that searches with the other speedups of
    ``spec`` on; every other speedup a :class:`SpeedupCallback`, all sharing one
    :class:`~fastloop.speedups.base.RunInputs`. A speedup that cannot apply (no CUDA, a setting of
    your Trainer it would fight) changes nothing and says why in its record (:func:`records_of`).

    Args:
        spec: the speedups: ``"bf16,compile:max-autotune"``, a list of names, specs or speedup
            objects (``[Compile(mode="max-autotune")]``). ``None``, ``"none"``, ``""`` and ``[]`` mean
            the baseline (no callbacks), as in :func:`~fastloop.speedups.base.resolve` and
            ``FastLoop(speedups=None)``.
        step_rate: steps/s your step reaches without waiting for data, if you measured it
            (``workers`` then sizes the loader to the step's demand); None: not known.

    Returns:
        The callbacks, in ladder order (not the order ``spec`` names them).

    Raises:
        FastloopError: an unknown name, a bad option, a speedup given twice or two that conflict.

    Example:
        >>> from fastloop._compat import Trainer
        >>> from fastloop.recipes.demo.target import make
        >>> module, loader = make(n=64, fields=16, batch_size=16, latency_s=0.0)
        >>> trainer = Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
        ...                   enable_progress_bar=False, enable_model_summary=False,
        ...                   callbacks=callbacks("fused_optimizer,tf32"))
        >>> trainer.fit(module, loader)
        >>> [(r.name, r.status, r.reason) for r in records_of(trainer)]
        [('tf32', 'skipped', 'no CUDA'), ('fused_optimizer', 'applied', '')]
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
    """What each fastloop speedup did in ``trainer``'s fit.

    Args:
        trainer: a Trainer given fastloop's :func:`callbacks` (other callbacks are passed over).

    Returns:
        One :class:`~fastloop.speedups.base.Record` per speedup callback, in the Trainer's order:
        ``applied``, ``skipped`` (with the reason) or ``fallback`` (it broke mid-run; the reason).

    Example:
        >>> from fastloop._compat import Trainer
        >>> trainer = Trainer(accelerator="cpu", logger=False, callbacks=callbacks("channels_last"))
        >>> records_of(trainer)[0].name, records_of(Trainer(accelerator="cpu", logger=False))
        ('channels_last', [])
    """
    return [c.record for c in trainer.callbacks if isinstance(c, (SpeedupCallback, BatchSizeSearch))]
