"""What the drivers are asked, typed and checked once: :class:`RunConfig` (one measured
configuration: ``fastloop run``, and each run of a ladder or an A/B), a keyword-only dataclass whose
``__post_init__`` refuses what the command line refuses, with the same one-line message
(:data:`BOUNDS`: each number's range is written once, here, and the command line's argument types
are made from it, :meth:`Bound.argument`). The speedup list is parsed once, into speedup objects,
when the configuration is made; a process of its own is handed them back as a spec
(:attr:`RunConfig.spec`: each speedup's :attr:`~fastloop.speedups.base.Speedup.spec` reads back as
the same object).

Imports without torch (the command line checks its numbers before torch is imported); parsing a
speedup list imports the registry.

Example:
    >>> BOUNDS["steps"].check(0)
    Traceback (most recent call last):
    ...
    fastloop.errors.FastloopError: --steps must be an integer from 1 to 1,000,000, got 0
    >>> RunConfig(target="demo", speedups="bf16,tf32").spec
    'tf32,bf16'
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastloop.errors import FastloopError, shorten

if TYPE_CHECKING:
    from fastloop.speedups.base import Speedup

__all__ = ["BOUNDS", "Bound", "RunConfig", "join_specs", "parse_speedups"]


@dataclass(frozen=True, slots=True)
class Bound:
    """The values a number of the drivers accepts, and the one line that says so."""

    accepted: str
    """The message's head: ``--steps must be an integer from 1 to 1,000,000``."""
    kind: type
    """``int`` or ``float`` (a float bound takes an int too; neither takes a bool)."""
    low: float
    high: float
    low_open: bool = False

    def ok(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float) if self.kind is float else int):
            return False
        if not math.isfinite(value):
            return False
        return (self.low < value if self.low_open else self.low <= value) and value <= self.high

    def check(self, value: Any) -> Any:
        """``value`` when accepted, else :class:`~fastloop.errors.FastloopError` saying what is accepted."""
        if not self.ok(value):
            raise FastloopError(f"{self.accepted}, got {shorten(value, 40)}")
        return value

    def check_optional(self, value: Any) -> Any:
        """As :meth:`check`, None accepted (the driver's default)."""
        return None if value is None else self.check(value)

    def argument(self) -> Callable[[str], Any]:
        """The argparse type of this number: the text converted and checked (one line on failure)."""

        def convert(text: str) -> Any:
            try:
                value = self.kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{self.accepted}, got {shorten(text, 40)!r}") from None
            try:
                return self.check(value)
            except FastloopError:
                raise argparse.ArgumentTypeError(f"{self.accepted}, got {shorten(text, 40)}") from None

        return convert


def _count(flag: str, low: int, high: int) -> Bound:
    return Bound(f"{flag} must be an integer from {low} to {high:,}", int, low, high)


def _seconds(flag: str, high: float, shown: str) -> Bound:
    return Bound(f"{flag} must be seconds, a number in (0, {shown})", float, 0, high, low_open=True)


BOUNDS: dict[str, Bound] = {
    "steps": _count("--steps", 1, 1_000_000),
    "warmup": _count("--warmup", 0, 100_000),
    "devices": _count("--devices", 1, 1024),
    "repeats": _count("--repeats", 1, 1000),
    "seed": _count("--seed", 0, 2**31 - 1),
    "max_repeats": _count("--max-repeats", 3, 100),
    "max_size": _count("--max", 1, 1_000_000),
    "epochs": _count("--epochs", 1, 1_000_000),
    "max_steps": _count("--max-steps", 1, 10**9),
    "seeds": _count("--seeds", 1, 1000),
    "train_batches": _count("--train-batches", 1, 1_000_000),  # a short fit (the ladder's fit objective)
    "val_batches": _count("--val-batches", 1, 1_000_000),
    "measure_s": _seconds("--measure-s", 1e6, "1e6"),
    "budget": _seconds("--budget", 1e6, "1e6"),
    "max_time": _seconds("--max-time", 1e7, "1e7"),
    "step_rate": Bound("--step-rate must be steps per second, a number > 0", float, 0, 1e9, low_open=True),
    "margin": Bound("--margin must be a number in (0, 1]", float, 0, 1, low_open=True),
    "tolerance": Bound("--tolerance must be a number > 0", float, 0, 1e9, low_open=True),
}
"""Every number a driver takes from the command line, by its keyword: the CLI's argument types
(:meth:`Bound.argument`) and the configurations' checks read the same bound."""

STRATEGIES = ("ddp", "fsdp")


def join_specs(specs: list[str]) -> str:
    """A configuration's spec string: its speedups' specs joined, ``none`` for the baseline.

    Example:
        >>> join_specs([]), join_specs(["bf16", "compile"])
        ('none', 'bf16,compile')
    """
    return ",".join(specs) or "none"


def parse_speedups(value: Any) -> list[Speedup]:
    """A speedup list parsed once (:func:`~fastloop.speedups.base.resolve`): speedup objects in
    ladder order; ``None``, ``""`` and ``"none"`` are the baseline, ``[]``."""
    from fastloop.speedups.base import resolve

    return resolve(value)


def _check_text(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise FastloopError(f"{name} must be a non-empty string, got {shorten(repr(value), 40)}")


def _check_strategy(strategy: Any) -> None:
    if strategy is not None and strategy not in STRATEGIES:
        raise FastloopError(f"--strategy must be ddp or fsdp, got {shorten(repr(strategy), 40)}")


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # a frozen configuration's own __post_init__ normalizes it


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    """One measured configuration (``fastloop run``, and each run of a ladder or an A/B)."""

    target: str
    """``FILE.py:FUNCTION``, ``package.module:FUNCTION`` or a recipe's short name."""
    speedups: Any = field(default_factory=list)
    """The speedups (``"bf16,compile"``, names or specs, speedup objects, or None /
    ``"none"``: the baseline), held parsed, in ladder order."""
    steps: int = 30
    """Measured steps (fewer when ``measure_s`` is given and the step is slow)."""
    warmup: int = 5
    """Steps before measuring (compile and capture happen here)."""
    device: str = "auto"
    devices: int = 1
    """Devices to train on; more than 1 (or a ``strategy``): Lightning's DDP/FSDP starts the ranks."""
    strategy: str | None = None
    measure_s: float | None = None
    """Measure a window of this many seconds of steady steps (at least 10) instead of ``steps``."""
    step_rate: float | None = None
    """Steps/s the step reaches without data wait, when a driver measured it (told to the speedups)."""
    compile_cache: bool = True
    """Compiles read and write the project's compile cache (False: cold, in a fresh directory)."""
    seed: int | None = None
    """A paired run: every generator seeded with it before the target is built."""
    target_kwargs: dict[str, Any] | None = None
    """Keyword arguments for the target's function."""
    quiet: bool = True
    """Hide what the user's code prints while training."""
    steady_warmup: bool = True
    """Extend the warm-up until step times are steady (off: exactly ``warmup + steps`` steps)."""

    def __post_init__(self) -> None:
        _check_text("target", self.target)
        _set(self, "speedups", parse_speedups(self.speedups))
        BOUNDS["steps"].check(self.steps)
        BOUNDS["warmup"].check(self.warmup)
        BOUNDS["devices"].check(self.devices)
        _check_strategy(self.strategy)
        BOUNDS["measure_s"].check_optional(self.measure_s)
        BOUNDS["step_rate"].check_optional(self.step_rate)
        BOUNDS["seed"].check_optional(self.seed)

    @property
    def spec(self) -> str:
        """The speedups as a spec a process of its own reads back (``none`` for the baseline)."""
        return join_specs([s.spec for s in self.speedups])

    @property
    def distributed(self) -> bool:
        """Its ranks are started by Lightning's strategy."""
        return self.devices > 1 or self.strategy is not None
