"""``deferred_logging``: logged values read to the host in batches, not after every step.

Lightning reads every ``self.log(..., prog_bar=True)`` value to the host after each training step
(``.item()`` in its logger connector, whether a progress bar is shown or not) and every logged value
at each ``log_every_n_steps``; on CUDA each read waits for the GPU, which then idles while the host
builds the next step. With this speedup the values stay on the device and are read once ``every``
steps or ``seconds`` seconds have passed since the last read (whichever comes first), all of them in
one transfer per device and dtype. The logger receives every row Lightning would have written, with the same values
at the same steps, only later; the progress bar is at most that late; what callbacks read
(``trainer.callback_metrics``: ``ModelCheckpoint(monitor=...)``, ``EarlyStopping``,
``ReduceLROnPlateau``) is the current tensors, as without it.

The card (when it helps, when it hurts, what it costs): ``docs/speedups/deferred_logging.md``.
The functional core here knows no Lightning (:func:`keep`, :func:`read_to_host`, :class:`Cadence`);
the Lightning adapter's connector is :mod:`fastloop.adapters.lightning_logging`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fastloop.speedups.base import Speedup, register
from fastloop.speedups.options import Options, option
from fastloop.speedups.run import Run

__all__ = ["Cadence", "DeferredLogging", "DeferredLoggingOptions", "keep", "read_to_host"]


def _single(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() == 1


def _grouped(values: Sequence[torch.Tensor]) -> dict[tuple[torch.device, torch.dtype], list[int]]:
    """The positions of ``values`` by device and dtype (one copy or one transfer each)."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(values):
        groups.setdefault((t.device, t.dtype), []).append(i)
    return groups


def keep(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each one-element tensor replaced by a copy on its device (detached; one copy
    kernel per device and dtype, no host read), so that what the step changes in place later does
    not reach the kept value; other values are kept as given.

    Example:
        >>> loss = torch.tensor(0.25)
        >>> kept = keep({"loss": loss, "epoch": 0})
        >>> loss.add_(1.0) and None
        >>> kept["loss"].item(), kept["epoch"]
        (0.25, 0)
    """
    names = [k for k, v in values.items() if _single(v)]
    tensors = [values[k].detach().reshape(()) for k in names]
    copies: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for positions in _grouped(tensors).values():
            stacked = torch.stack([tensors[i] for i in positions])
            copies.update({names[i]: stacked[j] for j, i in enumerate(positions)})
    return {k: copies.get(k, v) for k, v in values.items()}


def read_to_host(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each row with its one-element tensors as the Python numbers ``.item()`` gives (the same
    type and value, bit for bit), read in one transfer per device and dtype for all the rows
    together: on CUDA one wait for the GPU where ``.item()`` on each would wait once per value.
    Other values (floats, tensors of several elements) are left as they are.

    Example:
        >>> rows = [{"loss": torch.tensor(0.5), "n": torch.tensor(3)}, {"loss": torch.tensor(0.25), "epoch": 1}]
        >>> read_to_host(rows)
        [{'loss': 0.5, 'n': 3}, {'loss': 0.25, 'epoch': 1}]
    """
    where = [(r, k) for r, row in enumerate(rows) for k, v in row.items() if _single(v)]
    tensors = [rows[r][k].detach().reshape(()) for r, k in where]
    numbers: dict[tuple[int, str], Any] = {}
    with torch.no_grad():
        for positions in _grouped(tensors).values():
            read = torch.stack([tensors[i] for i in positions]).tolist()  # the one host read of this group
            numbers.update({where[i]: x for i, x in zip(positions, read)})
    return [{k: numbers.get((r, k), v) for k, v in row.items()} for r, row in enumerate(rows)]


class Cadence:
    """When kept values are due to be read: once ``every`` steps have passed since the last read,
    or ``seconds`` have (whichever comes first; None: that bound is off).

    Example:
        >>> now = [0.0]
        >>> cadence = Cadence(every=3, seconds=0.5, clock=lambda: now[0])
        >>> [cadence.step() or cadence.due() for _ in range(3)]
        [False, False, True]
        >>> cadence.restart(); now[0] = 0.6
        >>> cadence.due()
        True
    """

    def __init__(
        self, every: int | None, seconds: float | None, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        if every is None and seconds is None:
            raise ValueError("a cadence needs every (steps) or seconds, or both")
        self.every, self.seconds, self._clock = every, seconds, clock
        self.steps = 0
        """Steps since the last read."""
        self._since = clock()

    def step(self) -> None:
        """One more step (a training or validation batch) has ended."""
        self.steps += 1

    def due(self) -> bool:
        """True when the values kept since the last read should be read now."""
        if self.every is not None and self.steps >= self.every:
            return True
        return self.seconds is not None and self._clock() - self._since >= self.seconds

    def restart(self) -> None:
        """The values were just read: count from here."""
        self.steps, self._since = 0, self._clock()


@dataclass(frozen=True, kw_only=True)
class DeferredLoggingOptions(Options):
    """Options of ``deferred_logging``: when the kept values are read (the :class:`Cadence`)."""

    speedup = "deferred_logging"
    every: int | None = option(
        100, "read the logged values once N steps (training or validation batches) passed; none: by time alone", low=1
    )
    seconds: float | None = option(
        0.5,
        "or once this many seconds passed since the last read, whichever comes first; none: by steps alone",
        low=0.0,
        low_open=True,
        high=3600.0,
    )

    def check(self) -> None:
        if self.every is None and self.seconds is None:
            raise self.refuse("every", None, "an integer >= 1 where seconds is none (one of the two bounds)")


@register
class DeferredLogging(Speedup):
    __doc__ = __doc__
    name = "deferred_logging"
    changes = "step"
    order = 67
    fit_phase = "host_syncs"
    options_type = DeferredLoggingOptions

    def apply(self, run: Run) -> None:
        run.defer_logging(self.opts.every, self.opts.seconds)
