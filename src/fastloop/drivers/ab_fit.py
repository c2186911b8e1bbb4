"""``fastloop ab --fit``: two whole fits a seed, and whether B is faster and learns the same.

Each fit is a fresh process (:func:`~fastloop.drivers.fit.run_fit`); seed ``i`` runs on both
sides, in counterbalanced order (A B, then B A, A B, ...), so drift between processes lands on
both. The run is the unit of evidence, as in every fastloop comparison (``compare.py``,
``measure/stats.py``): each verdict is a paired interval over the seeds.

- **Time**: the whole fit's wall clock, each phase, the step-only figure from the fits' own steady
  steps (beside the fit's, so the two speedups can be read together), and the time to the
  ``--until`` target ("B never reached it" when it did not).
- **Outcome**: the final value of the metric (the ``--until`` metric, else every metric both sides
  log in validation, else the training loss of the last tenth of the steps), B - A paired over
  seeds with a t-interval. "Learns the same" only when the interval lies inside the tolerance: an
  absolute band, ``--tolerance`` or by default twice A's seed-to-seed standard deviation (at least
  1% of A's mean); "does not learn the same" when the interval lies outside it; otherwise "not shown
  to learn the same". Where a side's curve first leaves the band is named.
- A run that diverged (a non-finite loss, a blow-up) is reported as such and left out of every
  verdict, never averaged in.

Example:
    >>> d = outcome_verdict("val_acc", [0.90, 0.91, 0.92], [0.60, 0.62, 0.61], tolerance=None, higher_better=True)
    >>> d["verdict"].split(":")[0], d["learns_same"]
    ('B does not learn the same as A', False)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from fastloop.compare import VERDICT_CONFIDENCE
from fastloop.drivers.fit import FitOptions, run_fit
from fastloop.drivers.fit_result import PHASE_NAMES
from fastloop.errors import ConfigurationFailed, FastloopError, UserCodeError
from fastloop.measure.stats import run_ratio_ci, t_quantile, verdict

__all__ = ["DEFAULT_SEEDS", "RELATIVE_FLOOR", "outcome_verdict", "run_ab_fit", "time_verdict"]

DEFAULT_SEEDS = 3
RELATIVE_FLOOR = 0.01
"""The default tolerance is at least this fraction of A's mean final value (seeds that agree to
the last digit would otherwise leave a band of zero width)."""
TAIL = 0.1
"""Without a validation metric the outcome is the mean training loss over this last share of steps."""


def time_verdict(name: str, a: list[float | None], b: list[float | None], labels: tuple[str, str]) -> dict:
    """A paired run-level interval of A's seconds over B's (``ratio > 1``: B faster) for one figure.

    Example:
        >>> time_verdict("wall", [10.0, 11.0, 10.5], [5.0, 5.4, 5.2], ("A (none)", "B (workers)"))["verdict"]
        'wall: B (workers) is 2.02x faster than A (none) (97% CI 1.959-2.080)'
    """
    pairs = [(x, y) for x, y in zip(a, b) if x and y and x > 0 and y > 0]
    if not pairs:
        return {"name": name, "verdict": f"{name}: not in both fits", "a_s": None, "b_s": None}
    ci = run_ratio_ci([[x] for x, _ in pairs], [[y] for _, y in pairs], confidence=VERDICT_CONFIDENCE, min_steps=1)
    return {
        "name": name,
        **ci.to_dict(),
        "a_s": statistics.fmean(x for x, _ in pairs),
        "b_s": statistics.fmean(y for _, y in pairs),
        "verdict": f"{name}: {verdict(ci, label_a=labels[0], label_b=labels[1])}",
    }


def _step_verdict(a: list[dict], b: list[dict], labels: tuple[str, str]) -> dict:
    """The step-only figure's interval: each fit's median steady step (the run is the unit)."""
    out = time_verdict(
        "step only", [d["step_only"]["median_s"] for d in a], [d["step_only"]["median_s"] for d in b], labels
    )
    if out.get("a_s") is None:
        out["verdict"] = "step only: no steady steps on both sides"
    return out


def _interval(d: list[float]) -> tuple[float, float | None, float | None]:
    """(mean, low, high) of a paired t-interval at VERDICT_CONFIDENCE (no interval below 2 values)."""
    m = statistics.fmean(d)
    if len(d) < 2:
        return m, None, None
    half = t_quantile(0.5 + VERDICT_CONFIDENCE / 2, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
    return m, m - half, m + half


def outcome_verdict(
    metric: str, a: list[float], b: list[float], *, tolerance: float | None, higher_better: bool | None
) -> dict:
    """Does B learn the same as A on ``metric`` (the seeds' final values, paired)? See the module's
    docstring for the tolerance and the three verdicts."""
    d = [y - x for x, y in zip(a, b)]
    mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
    if tolerance is not None:
        tol, basis = tolerance, "--tolerance"
    else:
        spread = 2 * statistics.stdev(a) if len(a) >= 2 else 0.0
        tol = max(spread, RELATIVE_FLOOR * abs(mean_a))
        basis = f"twice A's seed-to-seed standard deviation, at least {100 * RELATIVE_FLOOR:g}% of A's mean"
    m, lo, hi = _interval(d)
    numbers = f"{metric} {mean_b:.4g} vs {mean_a:.4g}, B - A {m:+.3g}"
    band = f"the tolerance +-{tol:.3g} ({basis})"
    ci = "" if lo is None else f"{100 * VERDICT_CONFIDENCE:g}% CI {lo:+.3g} to {hi:+.3g}"
    if lo is None or hi is None:
        text, same = f"too few seeds to tell ({len(d)}; an interval needs 2 or more): {numbers}", None
    elif -tol <= lo and hi <= tol:
        text, same = f"B learns the same as A: {numbers} ({ci}) within {band}", True
    elif lo > tol or hi < -tol:
        side = "higher" if m > 0 else "lower"
        judged = "" if higher_better is None else (", better" if (m > 0) == higher_better else ", worse")
        text = f"B does not learn the same as A: its {metric} is {side}{judged}: {numbers} ({ci}), outside {band}"
        same = False
    else:
        text, same = f"not shown to learn the same: {numbers} ({ci}) reaches outside {band}", None
    return {
        "metric": metric,
        "a_final": a,
        "b_final": b,
        "difference": {"mean": m, "ci_low": lo, "ci_high": hi},
        "tolerance": tol,
        "tolerance_basis": basis,
        "learns_same": same,
        "verdict": text,
    }


TRAIN_TAIL = "train_loss (last tenth of the steps)"


def _final(doc: dict, metric: str) -> float | None:
    """A fit's final value of ``metric`` (:data:`TRAIN_TAIL`: the mean loss of its last tenth of steps)."""
    if metric == TRAIN_TAIL:
        values = [v for v in doc["outcome"]["train_loss"]["value"] if v is not None]
        tail = values[-max(1, int(len(values) * TAIL)) :]
        return statistics.fmean(tail) if tail else None
    runs = doc["outcome"]["validation"]
    value = runs[-1]["metrics"].get(metric) if runs else None
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def _metrics(docs: list[dict], until: str | None) -> list[str]:
    """The metrics the outcome compares: the ``--until`` metric, else every one all fits logged last."""
    if until:
        return [until.split(">=")[0].split("<=")[0]]
    common = None
    for d in docs:
        names = {
            k
            for k, v in (d["outcome"]["validation"][-1]["metrics"] if d["outcome"]["validation"] else {}).items()
            if v is not None
        }
        common = names if common is None else common & names
    return sorted(common) if common else [TRAIN_TAIL]


def _higher_better(metric: str, until: str | None) -> bool | None:
    """Which way is better: the ``--until`` target's, else guessed from the name (None: not known)."""
    if until and until.startswith(metric):
        return ">=" in until
    low = metric.lower()
    if "loss" in low or "err" in low or "perplexity" in low:
        return False
    if "acc" in low or "top" in low or "f1" in low or "auc" in low:
        return True
    return None


def _parted(pairs: list[tuple[dict, dict]], metric: str, tol: float) -> str | None:
    """Where the two sides' curves of ``metric`` first part: the first validation run (by index)
    whose mean B - A over the seeds leaves the tolerance."""
    if metric == TRAIN_TAIL or not pairs:
        return None
    runs = min(min(len(a["outcome"]["validation"]), len(b["outcome"]["validation"])) for a, b in pairs)
    for j in range(runs):
        va = [a["outcome"]["validation"][j]["metrics"].get(metric) for a, _ in pairs]
        vb = [b["outcome"]["validation"][j]["metrics"].get(metric) for _, b in pairs]
        if None in va or None in vb:
            continue
        gap = statistics.fmean(vb) - statistics.fmean(va)
        if abs(gap) > tol:
            step = pairs[0][0]["outcome"]["validation"][j]["step"]
            return (
                f"the curves part at validation run {j + 1} (step {step}): {metric} A {statistics.fmean(va):.4g}, "
                f"B {statistics.fmean(vb):.4g}"
            )
    return None


def _to_target(pairs: list[tuple[dict, dict]], until: str | None, labels: tuple[str, str]) -> dict | None:
    """Time to the ``--until`` target (seconds from the process's spawn), or who never reached it."""
    if not until:
        return None
    reached = (
        [[(d["outcome"]["reached"] or {}).get("second") for d in side] for side in zip(*pairs)] if pairs else [[], []]
    )
    if pairs and all(v is not None for v in reached[0] + reached[1]):
        return time_verdict(f"time to {until}", reached[0], reached[1], labels)
    counts = [sum(v is not None for v in side) for side in reached]
    n = len(pairs)
    never = [lab for lab, c in zip(("A", "B"), counts) if c == 0]
    text = (
        f"time to {until}: {' and '.join(never)} never reached it ({n} fit{'s' if n != 1 else ''} a side)"
        if never
        else f"time to {until}: reached by A in {counts[0]} and by B in {counts[1]} of {n} fits a side: no ratio"
    )
    return {"name": f"time to {until}", "verdict": text, "reached": {"a": reached[0], "b": reached[1]}}


def _pairs(runs: dict[str, list[dict]]) -> tuple[list[tuple[dict, dict]], list[str]]:
    """The seeds both sides finished without diverging, and what diverged (never averaged in)."""
    pairs, diverged = [], []
    for a, b in zip(runs["a"], runs["b"]):
        bad = [(s, d) for s, d in (("A", a), ("B", b)) if d["outcome"].get("diverged")]
        for side, d in bad:
            diverged.append(
                f"{side} (seed {d['settings']['seed']}) diverged at step {d['outcome']['diverged']['step']}: "
                f"{d['outcome']['diverged']['why']}; left out of every verdict"
            )
        if not bad:
            pairs.append((a, b))
    return pairs, diverged


def _outcome(pairs: list[tuple[dict, dict]], until: str | None, tolerance: float | None) -> list[dict]:
    out = []
    for metric in _metrics([d for p in pairs for d in p], until):
        finals = [(_final(a, metric), _final(b, metric)) for a, b in pairs]
        finals = [(x, y) for x, y in finals if x is not None and y is not None]
        if not finals:
            continue
        v = outcome_verdict(
            metric,
            [x for x, _ in finals],
            [y for _, y in finals],
            tolerance=tolerance,
            higher_better=_higher_better(metric, until),
        )
        v["parted"] = None if v["learns_same"] else _parted(pairs, metric, v["tolerance"])
        if v["parted"]:
            v["verdict"] += f"; {v['parted']}"
        out.append(v)
    return out


def ab_fit_doc(
    base: FitOptions, a: str, b: str, runs: dict[str, list[dict]], order: list[str], seeds: int, tolerance: float | None
) -> dict:
    """The ``ab --fit`` document from the fits finished so far."""
    labels = (f"A ({a})", f"B ({b})")
    pairs, diverged = _pairs(runs)
    sides = [[p[k] for p in pairs] for k in (0, 1)]
    wall = time_verdict("whole fit", [d["wall_s"] for d in sides[0]], [d["wall_s"] for d in sides[1]], labels)
    phases = {
        ph: time_verdict(ph, [d["phases"][ph] for d in sides[0]], [d["phases"][ph] for d in sides[1]], labels)
        for ph in PHASE_NAMES
        if any(d["phases"][ph] > 0 for d in sides[0] + sides[1])
    }
    step = _step_verdict(sides[0], sides[1], labels)
    target = _to_target(pairs, base.until, labels)
    outcome = _outcome(pairs, base.until, tolerance)
    verdicts = [wall["verdict"], step["verdict"]] + ([target["verdict"]] if target else [])
    verdicts += [o["verdict"] for o in outcome] + diverged
    return {
        "kind": "ab-fit",
        "a_spec": a,
        "b_spec": b,
        "seeds": seeds,
        "length": {"epochs": base.epochs, "max_steps": base.max_steps, "max_time": base.max_time},
        "until": base.until,
        "run_order": order,
        "time": {"wall": wall, "phases": phases, "step_only": step, "to_target": target},
        "outcome": outcome,
        "diverged": diverged,
        "verdicts": verdicts,
        "fits": runs,
        "method": "each fit a fresh process; seed i on both sides, counterbalanced (A B, B A, ...); time: a paired "
        "t-interval on the log of the seeds' A/B ratios; outcome: a paired t-interval on B - A of the final metric "
        "against a stated tolerance; a diverged run is left out of every verdict",
    }


def run_ab_fit(
    base: FitOptions,
    a: str,
    b: str,
    *,
    seeds: int = DEFAULT_SEEDS,
    tolerance: float | None = None,
    fit_one: Callable[[FitOptions], tuple[dict, str | None]] | None = None,
    progress: Callable[[str], None] | None = None,
    on_update: Callable[[dict], None] | None = None,
) -> dict:
    """Fit A and B once a seed for ``seeds`` seeds (``base`` gives the target, length and first
    seed); ``fit_one(options) -> (document, the user's error or None)`` runs one fit (default: a
    fresh process, :func:`~fastloop.drivers.fit.run_fit`). ``on_update(doc)`` after every fit.
    On Ctrl-C the fits finished so far are returned with ``"interrupted": True``; when a side's
    code raised, the partial document goes to ``on_update`` and the user's error is raised."""
    from dataclasses import replace

    from fastloop.speedups.base import resolve

    if not isinstance(seeds, int) or seeds < 1:
        raise FastloopError(f"--seeds must be an integer >= 1, got {seeds!r}")
    resolve(a)
    resolve(b)  # both checked before the first fit
    fit_one = fit_one or (lambda opts: run_fit(opts))
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    order: list[str] = []

    def doc() -> dict:
        return ab_fit_doc(base, a, b, runs, order, seeds, tolerance)

    try:
        for i in range(seeds):
            for side in ("a", "b") if i % 2 == 0 else ("b", "a"):
                spec = a if side == "a" else b
                if progress:
                    progress(f"fit {i + 1} of {seeds}: {side.upper()} = {spec}")
                order.append(side.upper())
                try:
                    fitted, error = fit_one(replace(base, speedups=spec, seed=base.seed + i))
                except ConfigurationFailed as err:
                    raise FastloopError(str(err)) from None
                if error is not None:
                    partial = {**doc(), "failed_side": {"side": side.upper(), "spec": spec, "fit": fitted}}
                    if on_update:
                        on_update(partial)
                    raise UserCodeError(
                        f"side {side.upper()} ({spec}) of the A/B failed, so there is no comparison:\n{error}"
                    )
                runs[side].append(fitted)
                if on_update:
                    on_update(doc())
    except KeyboardInterrupt:
        return {**doc(), "interrupted": True}
    return doc()
