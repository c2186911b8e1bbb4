"""The ``--until`` target of a fit: ``METRIC>=X`` or ``METRIC<=X``, checked after each validation run.
Imports without torch (the command line checks it before anything is imported).

Example:
    >>> until = Until.parse("val_acc>=0.9")
    >>> until.metric, until.op, until.value, until.met(0.95), until.met(0.5)
    ('val_acc', '>=', 0.9, True, False)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fastloop.errors import FastloopError, shorten

__all__ = ["Until"]

_UNTIL = re.compile(r"^\s*([A-Za-z_][\w./-]*)\s*(>=|<=)\s*([-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class Until:
    """A target a validation run may reach: ``METRIC>=X`` or ``METRIC<=X``."""

    metric: str
    """The name the module logs in validation (``self.log("val_loss", ...)``)."""
    op: str
    """``>=`` (higher is better, as an accuracy) or ``<=`` (lower is better, as a loss)."""
    value: float
    """The threshold."""

    @classmethod
    def parse(cls, text: str) -> Until:
        """``"val_loss<=1.5"`` -> ``Until("val_loss", "<=", 1.5)``; FastloopError for anything else.

        Example:
            >>> Until.parse("val_top1 >= 0.6")
            Until(metric='val_top1', op='>=', value=0.6)
        """
        m = _UNTIL.match(text or "")
        if m is None:
            raise FastloopError(
                f"--until {shorten(text, 40)!r} is malformed: give METRIC>=X or METRIC<=X, e.g. val_loss<=1.5 or "
                "val_acc>=0.9 (METRIC a name the module logs in validation, X a number)"
            )
        return cls(m.group(1), m.group(2), float(m.group(3)))

    def met(self, value: float | None) -> bool:
        """Whether ``value`` reaches the target (never for a missing or non-finite value)."""
        if value is None or not math.isfinite(value):
            return False
        return value >= self.value if self.op == ">=" else value <= self.value

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"
