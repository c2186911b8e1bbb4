"""Statistics for step times: medians with spread, a run-level CI for a speed ratio, and a
bootstrap CI for a ratio of medians within one run.

Comparisons between configurations (``ab``, the ladder) use :func:`run_ratio_ci`: the run (a
fresh process) is the unit of evidence, because fresh processes differ from each other by a
few percent (clocks, allocator, compile luck) far more than steps within a run do. Each run is
reduced to its mean step time; the interval is a Student-t interval on the log of the ratio
with ``n - 1`` degrees of freedom (paired when A and B were interleaved run by run). Below
:data:`MIN_RUNS` runs per side the verdict is "too few runs to tell", never "significant".

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

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

__all__ = [
    "MIN_EFFECT",
    "MIN_RUNS",
    "MIN_STEPS",
    "STEADY_TOLERANCE",
    "change_point",
    "half_ratio",
    "is_steady",
    "RatioCI",
    "bootstrap_ratio_ci",
    "check_times",
    "one_run_ci",
    "run_ratio_ci",
    "summarize",
    "t_quantile",
    "verdict",
]


STEADY_TOLERANCE = 1.15
"""A run's rate is steady when the second half of its measured steps averages within this factor
of the first half (either way)."""


def half_ratio(step_s: list[float]) -> float | None:
    """The mean of the second half of ``step_s`` over the mean of the first (None below 8 steps).

    Example:
        >>> half_ratio([0.01] * 10 + [0.02] * 10), half_ratio([0.01] * 7)
        (2.0, None)
    """
    n = len(step_s) // 2
    if n < 4:
        return None
    first, second = sum(step_s[:n]) / n, sum(step_s[n:]) / (len(step_s) - n)
    return second / first if first > 0 else None


def is_steady(ratio: float) -> bool:
    """Whether a :func:`half_ratio` is within STEADY_TOLERANCE of 1, either way."""
    return 1 / STEADY_TOLERANCE <= ratio <= STEADY_TOLERANCE


def change_point(step_s: list[float]) -> int:
    """Where the step time changed: the split ``k`` (1 to n-1) that leaves the two segments'
    squared deviations from their means smallest (one mean shift, least squares).

    Example:
        >>> change_point([0.003] * 35 + [0.05] * 30), change_point([0.01, 0.02])
        (35, 1)
    """
    n = len(step_s)
    if n < 3:
        return 1
    total, total_sq = sum(step_s), sum(x * x for x in step_s)
    best_k, best, head, head_sq = 1, float("inf"), 0.0, 0.0
    for k in range(1, n):
        head += step_s[k - 1]
        head_sq += step_s[k - 1] ** 2
        tail, tail_sq = total - head, total_sq - head_sq
        sse = (head_sq - head * head / k) + (tail_sq - tail * tail / (n - k))
        if sse < best - 1e-15:
            best_k, best = k, sse
    return best_k


MIN_RUNS = 3
"""Fewer runs per side than this: no verdict ("too few runs to tell")."""
MIN_STEPS = 3
"""Fewer measured steps per run than this: no verdict."""
MIN_EFFECT = 0.01
"""The smallest difference a comparison of runs calls a difference: 1%. On a quiet GPU whole-step
graph (H200, U-Net, 0.09% run-to-run spread) two sides of the same configuration came out 0.08%
apart with an interval that excluded 1; a verdict "A is 1.00x faster" helps no one, and a ladder
would keep a speedup for a 0.2% gain. Below this the verdict is "no meaningful difference"."""


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
    runs: int | None = None
    """Runs (fresh processes) per side behind the interval; None for a within-run bootstrap."""
    too_few: bool = False
    """True when there were too few runs or steps for any verdict (then never significant)."""
    method: str = "bootstrap"
    negligible: bool = False
    """True when the interval excludes 1 but the ratio is within ``MIN_EFFECT`` of it (then not
    significant): apart, but by too little to matter."""

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("confidence")
        return d


def check_times(groups: Sequence[Sequence[float]], name: str) -> list[np.ndarray]:
    """Step times must be finite and positive: raise ValueError naming ``name`` otherwise."""
    if isinstance(groups, (str, bytes)) or not hasattr(groups, "__iter__"):
        raise TypeError(
            f"{name} must be a list of runs, each a list of step times in seconds; got {type(groups).__name__}"
        )
    out = []
    for g in groups:
        try:
            x = np.asarray(list(g), dtype=float)
        except (TypeError, ValueError):
            raise TypeError(f"{name}: step times must be numbers in seconds, got {g!r:.60}") from None
        if x.ndim != 1:
            raise ValueError(f"{name}: each run must be a flat list of step times")
        if x.size and (not np.all(np.isfinite(x)) or np.any(x <= 0)):
            bad = x[~np.isfinite(x) | (x <= 0)][0]
            raise ValueError(f"{name}: step times must be finite and > 0 seconds, got {bad}")
        if x.size:
            out.append(x)
    return out


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on its CDF)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float) -> float:  # Simpson's rule on the density from 0 to |x|
        n = 2000
        h = abs(x) / n
        f = [math.exp(log_norm - (df + 1) / 2 * math.log1p((i * h) ** 2 / df)) for i in range(n + 1)]
        area = h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
        return 0.5 + math.copysign(area, x)

    lo, hi = -1e3, 1e3
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def run_ratio_ci(
    groups_a: Sequence[Sequence[float]],
    groups_b: Sequence[Sequence[float]],
    *,
    confidence: float = 0.95,
    min_runs: int = MIN_RUNS,
    min_steps: int = MIN_STEPS,
    paired: bool = True,
    min_effect: float = MIN_EFFECT,
) -> RatioCI:
    """CI for ``mean step time of A / mean step time of B`` with the run as the unit.

    ``groups_a``/``groups_b``: one list of step times (seconds) per run. Runs given in the same
    order on both sides (A1 B1 A2 B2 ...) with equal counts are paired, so slow drift of the
    machine cancels; otherwise (or with ``paired=False``: runs that were not interleaved) a Welch
    interval on the logs is used. ``ratio > 1``: B is faster. A ratio within ``min_effect`` of 1
    is never significant, even when the interval excludes 1 (``negligible``).

    Example:
        >>> a = [[0.010, 0.011, 0.010]] * 2 + [[0.012, 0.011, 0.012]] * 2
        >>> b = [[0.005, 0.0051, 0.005]] * 4
        >>> ci = run_ratio_ci(a, b)
        >>> round(ci.ratio, 2), ci.significant, ci.runs
        (2.18, True, 4)
        >>> run_ratio_ci(a[:1], b[:1]).too_few
        True
        >>> tiny = run_ratio_ci([[0.01000] * 3] * 3 + [[0.01001] * 3] * 3, [[0.00999] * 3] * 3 + [[0.01000] * 3] * 3)
        >>> tiny.significant, tiny.negligible
        (False, True)
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if not 0 <= min_effect < 1:
        raise ValueError(f"min_effect must be a fraction in [0, 1), got {min_effect!r}")
    ga, gb = check_times(groups_a, "groups_a"), check_times(groups_b, "groups_b")
    if not ga or not gb:
        raise ValueError("run_ratio_ci needs at least one run with step times on each side")
    la = np.log([g.mean() for g in ga])
    lb = np.log([g.mean() for g in gb])
    runs = min(len(la), len(lb))
    too_few = runs < min_runs or min(len(g) for g in ga + gb) < min_steps
    if paired and len(la) == len(lb) and len(la) >= 2:
        d = la - lb
        centre, se, df = float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d))), len(d) - 1
        method = "paired t on log run-mean ratios"
    elif len(la) >= 2 and len(lb) >= 2:
        va, vb = la.var(ddof=1) / len(la), lb.var(ddof=1) / len(lb)
        centre, se = float(la.mean() - lb.mean()), float(math.sqrt(va + vb))
        df = max(1, int((va + vb) ** 2 / ((va**2 / (len(la) - 1) + vb**2 / (len(lb) - 1)) or 1e-300)))
        method = "Welch t on log run means"
    else:
        centre, se, df = float(la.mean() - lb.mean()), math.inf, 1
        method = "one run: no interval"
    ratio = math.exp(centre)
    if math.isinf(se):
        lo, hi = 0.0, math.inf
    else:
        half = t_quantile(0.5 + confidence / 2, df) * se
        lo, hi = math.exp(centre - half), math.exp(centre + half)
    apart = (not too_few) and (lo > 1.0 or hi < 1.0)
    negligible = apart and abs(centre) < math.log1p(min_effect)
    return RatioCI(
        ratio=ratio,
        ci_low=lo,
        ci_high=hi if math.isfinite(hi) else None,  # type: ignore[arg-type]
        significant=apart and not negligible,
        confidence=confidence,
        runs=runs,
        too_few=too_few,
        method=method,
        negligible=negligible,
    )


def one_run_ci(
    groups_a: Sequence[Sequence[float]],
    run_b: Sequence[float],
    *,
    confidence: float = 0.95,
    min_runs: int = MIN_RUNS,
    min_steps: int = MIN_STEPS,
) -> RatioCI:
    """CI for ``mean step time of A / mean step time of B`` from A's runs and *one* run of B.

    A prediction interval: B's one log run mean against the mean of A's, with the spread of A's
    runs standing for B's too (``se = s_A * sqrt(1 + 1/n_A)``, ``n_A - 1`` degrees of freedom).
    It assumes B's run-to-run spread is A's; the ladder uses it only to stop measuring a
    candidate that is clearly slower, never to keep one. Below ``min_runs`` runs of A: no verdict.

    Example:
        >>> a = [[0.0100] * 5, [0.0101] * 5, [0.0099] * 5]
        >>> ci = one_run_ci(a, [0.0125] * 5)
        >>> round(ci.ratio, 2), ci.significant, ci.ci_high < 1
        (0.8, True, True)
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    ga, gb = check_times(groups_a, "groups_a"), check_times([run_b], "run_b")
    if not ga or not gb:
        raise ValueError("one_run_ci needs runs with step times on A's side and one run on B's")
    la = np.log([g.mean() for g in ga])
    lb = float(np.log(gb[0].mean()))
    centre = float(la.mean()) - lb
    too_few = len(la) < min_runs or min(len(g) for g in ga + gb) < min_steps
    if len(la) >= 2:
        se = float(la.std(ddof=1)) * math.sqrt(1 + 1 / len(la))
        half = t_quantile(0.5 + confidence / 2, len(la) - 1) * se
        lo, hi = math.exp(centre - half), math.exp(centre + half)
    else:
        lo, hi = 0.0, math.inf
    return RatioCI(
        ratio=math.exp(centre),
        ci_low=lo,
        ci_high=hi if math.isfinite(hi) else None,  # type: ignore[arg-type]
        significant=(not too_few) and (lo > 1.0 or hi < 1.0),
        confidence=confidence,
        runs=1,
        too_few=too_few,
        method="one run of B against A's runs (prediction interval; assumes A's run-to-run spread)",
    )


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
    if not isinstance(n_boot, int) or n_boot < 100:
        raise ValueError(f"n_boot must be an integer >= 100, got {n_boot!r}")
    if statistic not in ("median", "mean"):
        raise ValueError(f"statistic must be 'median' or 'mean', got {statistic!r}")
    stat = np.median if statistic == "median" else np.mean
    rng = np.random.default_rng(seed)
    ga = check_times(groups_a or [a], "groups_a" if groups_a else "a")
    gb = check_times(groups_b or [b], "groups_b" if groups_b else "b")
    if not ga or not gb:
        raise ValueError("bootstrap_ratio_ci needs at least one sample on each side")
    too_few = min(sum(len(g) for g in ga), sum(len(g) for g in gb)) < MIN_STEPS
    ratio = float(stat(np.concatenate(ga)) / stat(np.concatenate(gb)))

    def resample(groups: list[np.ndarray]) -> float:
        pick = rng.integers(0, len(groups), len(groups)) if len(groups) > 1 else [0]
        parts = [groups[i][rng.integers(0, len(groups[i]), len(groups[i]))] for i in pick]
        return float(stat(np.concatenate(parts)))

    boots = np.array([resample(ga) / resample(gb) for _ in range(n_boot)])
    lo, hi = np.percentile(boots, [100 * (1 - confidence) / 2, 100 * (1 + confidence) / 2])
    lo, hi = float(min(lo, ratio)), float(max(hi, ratio))
    return RatioCI(
        ratio=ratio,
        ci_low=lo,
        ci_high=hi,
        significant=bool(not too_few and (lo > 1.0 or hi < 1.0)),
        confidence=confidence,
        too_few=too_few,
    )


def verdict(ci: RatioCI, *, label_a: str = "A", label_b: str = "B") -> str:
    """One honest sentence about a ratio CI (``ratio``: B's speed over A's), naming the two
    configurations, the ratio always printed the same way (B over A): "a tie" only where the
    interval holds 1, "slower" where B is significantly slower.

    Example:
        >>> verdict(RatioCI(0.97, 0.94, 0.99, True, 0.97, runs=3), label_a="workers:4", label_b="workers:4,bf16")
        'workers:4,bf16 is slower than workers:4: 0.97x (97% CI 0.940-0.990)'
    """
    if ci.too_few:
        runs = f"{ci.runs} run{'s' if ci.runs != 1 else ''} per side" if ci.runs is not None else "too few steps"
        return f"too few runs to tell ({runs}; {MIN_RUNS} or more are needed for a verdict; measured {ci.ratio:.3f}x)"
    if ci.ci_high is None:
        return f"no interval ({ci.ratio:.3f}x)"
    pct = f"{100 * ci.confidence:g}%"
    span = f"{pct} CI {ci.ci_low:.3f}-{ci.ci_high:.3f}"
    if ci.negligible:
        return f"no meaningful difference ({ci.ratio:.3f}x, {span}: apart, but by less than {100 * MIN_EFFECT:g}%)"
    if not ci.significant:
        return f"no significant difference, a tie ({ci.ratio:.3f}x, {span})"
    if ci.ratio > 1:
        return f"{label_b} is {ci.ratio:.2f}x faster than {label_a} ({span})"
    return f"{label_b} is slower than {label_a}: {ci.ratio:.2f}x ({span})"
