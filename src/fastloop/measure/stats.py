"""Statistics for step times: medians with spread, and a bootstrap CI for a ratio of medians.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> a = 0.010 * (1 + 0.02 * rng.standard_normal(60))
    >>> b = 0.005 * (1 + 0.02 * rng.standard_normal(60))
    >>> ci = bootstrap_ratio_ci(a, b)  # ratio = median(a) / median(b): B is ~2x faster
    >>> round(ci.ratio, 1), ci.significant
    (2.0, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["RatioCI", "bootstrap_ratio_ci", "summarize", "verdict"]


def summarize(samples: Sequence[float]) -> dict:
    """Median, p25, p75 and mean of ``samples`` (``None`` values when empty)."""
    x = np.asarray(list(samples), dtype=float)
    if x.size == 0:
        return {"median": None, "p25": None, "p75": None, "mean": None}
    p25, med, p75 = np.percentile(x, [25, 50, 75])
    return {"median": float(med), "p25": float(p25), "p75": float(p75), "mean": float(x.mean())}


@dataclass
class RatioCI:
    """``ratio = median(a) / median(b)`` with a bootstrap confidence interval.

    For step times, ``ratio > 1`` means B is faster.
    """

    ratio: float
    ci_low: float
    ci_high: float
    significant: bool
    confidence: float = 0.95

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("confidence")
        return d


def bootstrap_ratio_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
    groups_a: Sequence[Sequence[float]] | None = None,
    groups_b: Sequence[Sequence[float]] | None = None,
    statistic: str = "median",
) -> RatioCI:
    """Percentile-bootstrap CI for ``stat(a) / stat(b)``, ``stat`` the median (default) or mean.

    Use ``statistic="mean"`` for throughput: items per second over a window is items over the
    *sum* of step times, and a loader that delivers in bursts makes the median step far
    shorter than the real average.

    If ``groups_a``/``groups_b`` are given (one list of step times per repeat, e.g. per fresh
    process), the bootstrap resamples whole repeats first and then steps within them, so
    run-to-run variation (allocator, clocks, compile luck) widens the interval as it should.
    The verdict is "significant" only when the interval excludes 1.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if statistic not in ("median", "mean"):
        raise ValueError(f"statistic must be 'median' or 'mean', got {statistic!r}")
    stat = np.median if statistic == "median" else np.mean
    rng = np.random.default_rng(seed)
    ga = [np.asarray(g, float) for g in (groups_a or [a]) if len(g)]
    gb = [np.asarray(g, float) for g in (groups_b or [b]) if len(g)]
    if not ga or not gb:
        raise ValueError("bootstrap_ratio_ci needs at least one sample on each side")
    ratio = float(stat(np.concatenate(ga)) / stat(np.concatenate(gb)))

    def resample(groups: list[np.ndarray]) -> float:
        pick = rng.integers(0, len(groups), len(groups)) if len(groups) > 1 else [0]
        parts = [groups[i][rng.integers(0, len(groups[i]), len(groups[i]))] for i in pick]
        return float(stat(np.concatenate(parts)))

    boots = np.array([resample(ga) / resample(gb) for _ in range(n_boot)])
    lo, hi = np.percentile(boots, [100 * (1 - confidence) / 2, 100 * (1 + confidence) / 2])
    lo, hi = float(min(lo, ratio)), float(max(hi, ratio))
    return RatioCI(ratio=ratio, ci_low=lo, ci_high=hi, significant=bool(lo > 1.0 or hi < 1.0), confidence=confidence)


def verdict(ci: RatioCI, *, label_a: str = "A", label_b: str = "B") -> str:
    """One honest sentence about a ratio CI."""
    if not ci.significant:
        return f"no significant difference ({ci.ratio:.3f}x, 95% CI {ci.ci_low:.3f}-{ci.ci_high:.3f})"
    faster, r = (label_b, ci.ratio) if ci.ratio > 1 else (label_a, 1 / ci.ratio)
    return f"{faster} is {r:.2f}x faster (95% CI {ci.ci_low:.3f}-{ci.ci_high:.3f})"
