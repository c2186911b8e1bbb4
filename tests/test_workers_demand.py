"""``workers`` weighs the loader's measured rates against what the step consumes: on an H200
a CIFAR loader measured 91.7k samples/s alone and 137.8k with 16 workers (1.5x, so workers were
used) for a step that consumed ~15k/s, and trained 0.90x; a GPT loader delivers ~15k/s for a step
that consumes 500/s. With the step's rate known (``RunInputs.step_rate``, which the ladder declares
to a feed candidate's runs), workers are used only where they save the main process >= 10%."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from fastloop.adapters.loop import LoopRun
from fastloop.drivers.ladder import run_ladder
from fastloop.speedups import resolve
from fastloop.speedups import workers as W
from fastloop.speedups.base import Context, RunInputs, Skip, apply_all

CPU = torch.device("cpu")


def _loader(bs: int = 16) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(64, 3), torch.arange(64)), batch_size=bs)


def _apply(monkeypatch, rates: dict[str, float], step_rate: float | None):
    monkeypatch.setattr(
        W,
        "choose_num_workers",
        lambda loader, most=None: (max((int(k) for k in rates), key=lambda k: rates[str(k)]), rates),
    )
    (s,) = resolve("workers")
    ctx = Context(CPU, inputs=RunInputs(step_rate=step_rate))
    loader = _loader()
    run = LoopRun(ctx, None, None, loader)
    apply_all([s], run)  # records applied, or skipped with the reason
    return loader, run.loader, ctx


def test_a_step_that_consumes_little_keeps_the_main_process(monkeypatch):
    # 31.25 steps/s x 16 = 500 samples/s from a loader at 15,000/s alone and 30,000/s with 4 workers
    loader, out, ctx = _apply(monkeypatch, {"0": 15_000.0, "4": 30_000.0}, 31.25)
    rec = ctx.records["workers"]
    assert out is loader and rec.status == "skipped"
    assert "consumes 500 samples/s" in rec.reason and "1.7% of its time, under 10%" in rec.reason
    assert ctx.stats["step_demand"] == pytest.approx(500.0)
    assert ctx.stats["predicted_saving"] == pytest.approx(500 / 15_000 - 500 / 30_000)
    # what the ladder needs to measure the larger counts in the configuration (fastloop.drivers.ladder.sizing)
    assert W.Workers.ladder.sized.above_kept(ctx.stats) == (0, [4])


def test_a_hungry_step_gets_workers_and_without_a_demand_the_rates_decide(monkeypatch):
    # 500 steps/s x 16 = 8,000 samples/s: the main process spends 80% of its time loading, workers 20%
    loader, out, ctx = _apply(monkeypatch, {"0": 10_000.0, "4": 40_000.0}, 500.0)
    assert ctx.records["workers"].status == "applied" and out.num_workers == 4
    assert ctx.stats["predicted_saving"] == pytest.approx(0.6)
    assert ctx._details["workers"] == (
        "4 worker processes (measured fastest: 40,000 samples/s against 10,000 with none; "
        "predicted to save the main process 60% of its time at the step's 8,000 samples/s)"
    )
    # the GPT case again, with no step rate: the 1.25x rule alone uses workers
    for bad in (None, 0.0, -1.0, float("inf"), float("nan")):
        loader, out, ctx = _apply(monkeypatch, {"0": 15_000.0, "4": 30_000.0}, bad)
        assert ctx.records["workers"].status == "applied" and out.num_workers == 4 and "step_demand" not in ctx.stats


def test_the_ladder_tells_a_feed_candidate_the_steps_rate_and_only_a_feed():
    seen: dict[str, list] = {}
    rng = np.random.default_rng(0)

    def measure(target, spec, **kw):
        seen.setdefault(spec, []).append(kw.get("step_rate"))
        names = [] if spec == "none" else spec.split(",")
        mean = 0.010 / (1.5 if "bf16" in names else 1.0)
        steps = list(mean * (1 + 0.001 * rng.standard_normal()) * np.ones(30))
        return {
            "step_s_all": steps,
            "step_s": {"mean": mean},
            "items_per_step": 16,
            "data_wait_frac": 0.5,
            "host_wait_frac": 0.5,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "speedups": [{"name": n, "status": "applied", "reason": ""} for n in names],
            "loss": {"first": 1.0, "last": 0.5},
            "steps": 30,
            "warmup_steps": 5,
        }

    run_ladder("x", measure=measure, device="cpu", mode="sequential")  # the default rungs: feeds last
    assert set(seen["bf16"]) == {None}  # not a feed: no rate
    # workers (a feed) is tried on top of bf16, whose step runs 6.67 ms of which half waits:
    # the step alone would run 300 steps/s
    rates = {float(r) for r in seen["bf16,workers"][:3]}  # its rung's runs (a final rung is no feed comparison)
    assert len(rates) == 1 and rates.pop() == pytest.approx(1 / (0.010 / 1.5 * 0.5), rel=0.01)


def test_round_8s_cifar_rates_skip_workers_once_the_demand_is_known(monkeypatch):
    """The H200 figures themselves: 91.7k/s alone, 137.8k/s with 16 workers, a step of 17.07 ms
    with 5.5% data wait (62 steps/s x 256 = 15.9k samples/s): a predicted 5.8% saving, and the A/B
    measured 0.90x. Once told the step's rate, workers stay out."""
    rates = {"0": 91_718.7, "16": 137_752.0}
    monkeypatch.setattr(W, "choose_num_workers", lambda loader, most=None: (16, rates))
    (s,) = resolve("workers")
    ctx = Context(CPU, inputs=RunInputs(step_rate=1 / (256 / 14_996 * (1 - 0.055))))
    loader = _loader(256)
    with pytest.raises(Skip, match="measured loader rates"):
        s.apply_loader(loader, ctx)
    run = LoopRun(ctx, None, None, loader)
    apply_all([s], run)
    assert run.loader is loader and ctx.records["workers"].status == "skipped"
    assert ctx.stats["predicted_saving"] == pytest.approx(0.058, abs=0.001)


def test_an_ab_tells_b_the_step_rate_of_a_only_when_b_adds_feeds_alone():
    from fastloop.drivers.ab import run_ab

    told: dict[str, list] = {}

    def measure(target, spec, **kw):
        told.setdefault(spec, []).append(kw.get("step_rate"))
        names = [] if spec == "none" else spec.split(",")
        mean = 0.010 / (1.5 if "bf16" in names else 1.0)
        return {
            "step_s_all": [mean] * 10,
            "items_per_step": 16,
            "data_wait_frac": 0.0,
            "host_wait_frac": 0.0,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "step_s": {"mean": mean},
            "speedups": [{"name": n, "status": "applied", "reason": ""} for n in names],
            "loss": {"first": 1.0, "last": 0.5},
            "steps": 10,
            "warmup_steps": 2,
        }

    run_ab("x", "bf16", "bf16,workers", repeats=2, measure=measure)
    assert told["bf16"] == [None, None] and [float(r) for r in told["bf16,workers"]] == [pytest.approx(150.0)] * 2
    told.clear()
    run_ab("x", "none", "bf16,workers", repeats=2, measure=measure)  # B changes the step too: no rate
    assert told["bf16,workers"] == [None, None]
    told.clear()
    run_ab("x", "workers", "workers", repeats=2, measure=measure)  # A vs A: both sides alike, neither told
    assert told["workers"] == [None] * 4


def test_a_step_the_main_process_cannot_feed_is_described_without_a_share_above_100_percent(monkeypatch):
    # the demo on 2 cores: the step consumes 5,854 samples/s, the main process loads 1,094/s, 4 workers 3,090/s
    loader, out, ctx = _apply(monkeypatch, {"0": 1_094.0, "4": 3_090.0}, 5_854 / 16)
    assert out.num_workers == 4
    detail = ctx._details["workers"]
    assert "cannot keep up with the step's 5,854 samples/s (loading would take 5.4x the step's time)" in detail
    assert "%" not in detail


def test_with_the_demand_known_the_fewest_workers_that_cover_it_are_used(monkeypatch):
    """Workers sized for the step they feed: the U-Net case (16 workers measured fastest alone, a
    step that eats 4,000 samples/s): the fewest counts delivering 1.5x the demand, and the record
    says how the count was chosen and what each count measured."""
    rates = {"0": 900.0, "1": 1_700.0, "2": 3_300.0, "4": 6_400.0, "8": 11_000.0, "16": 14_300.0}
    # 125 steps/s x 32 = 4,000 samples/s: 4 workers deliver 6,400 >= 1.5 x 4,000
    monkeypatch.setattr(W, "choose_num_workers", lambda loader, most=None: (16, rates))
    (s,) = resolve("workers")
    ctx = Context(CPU, inputs=RunInputs(step_rate=125.0))
    run = LoopRun(ctx, None, None, _loader(32))
    apply_all([s], run)
    assert ctx.records["workers"].status == "applied" and run.loader.num_workers == 4
    assert "the fewest that deliver 1.5x the step's 4,000 samples/s" in ctx.stats["worker_sizing"]
    assert "16: 14,300/s" in ctx.stats["worker_sizing"] and "sized for the step" in ctx._details["workers"]
    # a hungrier step: nothing but the fastest covers it
    ctx = Context(CPU, inputs=RunInputs(step_rate=400.0))
    run = LoopRun(ctx, None, None, _loader(32))
    apply_all([s], run)
    assert run.loader.num_workers == 16 and "the fastest" in ctx.stats["worker_sizing"]


def test_a_rate_the_probe_could_not_time_is_null_in_strict_json_with_its_reason(monkeypatch):
    """A loader that runs dry while 8 workers fill their prefetch buffer has no rate at 8 (the probe's
    NaN): the run's statistics say null, and why, and the counts the ladder sizes around skip it."""
    import json

    loader, out, ctx = _apply(monkeypatch, {"0": 10_000.0, "4": 40_000.0, "8": float("nan")}, None)
    assert ctx.records["workers"].status == "applied" and out.num_workers == 4
    strict = json.loads(json.dumps(ctx.stats, allow_nan=False))  # raises on a NaN left in the statistics
    assert strict["loader_rates"] == {"0": 10_000.0, "4": 40_000.0, "8": None}
    assert strict["loader_rates_unmeasured"] == {"8": W.UNMEASURED_RATE}
    assert W.sizes_around(strict) == (4, []) and W.sizes_above_kept(strict) == (0, [4])
