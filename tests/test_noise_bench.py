"""The noise benchmark's analysis (benchmarks/noise_bench.py) recovers what a synthetic noise
study was built with: the drift of the second process of a round and the run-to-run spread, the
figures RESULTS.md quotes from the H200."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("noise_bench", ROOT / "benchmarks" / "noise_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _trials(rng, drift: float, run_sd: float, trials: int = 30) -> list[dict]:
    """A vs A trials as ``fastloop ab`` writes them: counterbalanced run_order, per-side run means."""
    order = ["A", "B", "B", "A", "A", "B", "B", "A", "A", "B"]
    out = []
    for _ in range(trials):
        sides: dict[str, list[float]] = {"A": [], "B": []}
        for i, side in enumerate(order):
            sides[side].append(0.027 * math.exp(run_sd * rng.standard_normal() + (drift if i % 2 else 0.0)))
        out.append({"run_order": order, "a": {"run_mean_step_s": sides["A"]}, "b": {"run_mean_step_s": sides["B"]}})
    return out


@pytest.mark.parametrize("drift", [0.0, math.log(0.97)])
def test_the_noise_study_recovers_the_drift_and_the_spread(drift):
    nb = _bench()
    study = nb.noise_study(_trials(np.random.default_rng(7), drift, 0.02))
    d = study["second_vs_first"]
    assert d["low"] <= drift <= d["high"]
    assert (d["high"] < 0) == (drift < 0)  # a 3% drift is found; none is not invented
    assert study["run_sd"] == pytest.approx(0.02, rel=0.2)
    assert study["runs"] == 300 and study["rounds"] == 150


def test_counterbalancing_holds_the_false_positives_under_drift_and_power_grows_with_runs():
    nb = _bench()
    old, new = nb.simulate(0.0233, -0.03, False, trials=400), nb.simulate(0.0233, -0.03, True, trials=400)
    assert old > 0.10 and new <= 0.05, (old, new)
    assert nb.power(0.0233, 1.10, 6, trials=200) > nb.power(0.0233, 1.05, 6, trials=200) > 0.3
