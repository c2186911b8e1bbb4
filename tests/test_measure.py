import time

import numpy as np
import pytest
import torch

from fastloop.measure.flops import count_train_flops, mfu, peak_tflops
from fastloop.measure.stats import bootstrap_ratio_ci, summarize, verdict
from fastloop.measure.timer import StepTimer


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_step_time_agrees_with_an_outside_clock_on_the_same_steps():
    """Relative, not absolute (a busy CI machine stretches every step): the timer's median step
    agrees within 5% with a host clock read around the same steps by the test itself."""
    t = StepTimer("cpu", warmup=2)
    outside = []
    last = time.perf_counter()
    for _ in range(30):
        with t.fetching():
            pass
        busy(0.010)
        t.step_end()
        now = time.perf_counter()
        outside.append(now - last)
        last = now
    r = t.result()
    ref = float(np.median(outside[2:]))
    assert abs(summarize(r.step_s)["median"] - ref) / ref < 0.05
    assert summarize(r.step_s)["median"] >= 0.0099  # a 10 ms busy step is never measured shorter


def test_sleepy_loader_data_wait_fraction_matches_the_time_spent_in_the_loader():
    """The data-wait fraction agrees (within 0.05) with the share of the same steps' wall time
    that the test itself measured inside the loader's ``next`` (relative: robust to load)."""
    waited = []

    def loader():
        while True:
            t0 = time.perf_counter()
            time.sleep(0.006)  # 6 ms to produce each batch
            waited.append(time.perf_counter() - t0)
            yield 1

    t = StepTimer("cpu", warmup=1)
    start = None
    for i, _ in enumerate(t.wrap(loader())):
        busy(0.004)  # 4 ms of compute
        t.step_end()
        if i == 0:
            start, first = time.perf_counter(), len(waited)
        if i == 25:
            break
    total = time.perf_counter() - start
    expected = sum(waited[first:]) / total
    r = t.result()
    assert abs(r.data_wait_frac - expected) < 0.05, (r.data_wait_frac, expected)
    assert 0.3 < r.data_wait_frac < 0.8  # the loader's 6 ms against 4 ms of compute dominates the step


def test_warmup_steps_excluded_and_counted():
    t = StepTimer("cpu", warmup=3)
    for i in range(10):
        with t.fetching():
            pass
        busy(0.05 if i < 3 else 0.002)  # slow "compile" steps first
        t.step_end()
    r = t.result()
    assert r.warmup_steps == 3 and r.steps == 7
    assert max(r.step_s) < 0.02


def test_timer_requires_fetch_marks():
    t = StepTimer("cpu")
    t.step_end()
    with pytest.raises(RuntimeError):
        t.result()


@pytest.mark.parametrize("true_ratio", [1.5, 2.0, 0.5])
def test_bootstrap_ci_contains_known_ratio(true_ratio):
    rng = np.random.default_rng(1)
    a = 0.010 * (1 + 0.05 * rng.standard_normal(200))
    b = 0.010 / true_ratio * (1 + 0.05 * rng.standard_normal(200))
    ci = bootstrap_ratio_ci(a, b)
    assert ci.ci_low <= true_ratio <= ci.ci_high
    assert ci.significant
    assert ("faster" in verdict(ci)) == (true_ratio > 1) and ("slower" in verdict(ci)) == (true_ratio < 1)


def test_a_vs_a_is_not_significant():
    rng = np.random.default_rng(2)
    a = 0.010 * (1 + 0.05 * rng.standard_normal(100))
    b = 0.010 * (1 + 0.05 * rng.standard_normal(100))
    ci = bootstrap_ratio_ci(a, b)
    assert not ci.significant
    assert verdict(ci).startswith("no significant difference")


def test_grouped_bootstrap_is_wider_when_repeats_disagree():
    rng = np.random.default_rng(3)
    ga = [0.010 * s * (1 + 0.01 * rng.standard_normal(50)) for s in (0.9, 1.1, 1.0)]
    gb = [0.010 * (1 + 0.01 * rng.standard_normal(50)) for _ in range(3)]
    flat = bootstrap_ratio_ci(np.concatenate(ga), np.concatenate(gb))
    grouped = bootstrap_ratio_ci([], [], groups_a=ga, groups_b=gb)
    assert grouped.ci_high - grouped.ci_low > flat.ci_high - flat.ci_low


def test_mean_statistic_sees_bursty_arrivals():
    steps = [0.001, 0.001, 0.001, 0.037] * 10  # 4 batches arrive together every 40 ms
    base = [0.040] * 40
    med = bootstrap_ratio_ci(base, steps)
    mean = bootstrap_ratio_ci(base, steps, statistic="mean")
    assert med.ratio == pytest.approx(40.0)
    assert mean.ratio == pytest.approx(4.0)


def test_flops_of_a_known_model_and_mfu():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.Linear(128, 10, bias=False))
    x = torch.randn(32, 64)
    fwd = 2 * 32 * (64 * 128 + 128 * 10)
    # backward: grad wrt weights for both layers, grad wrt input only for the second layer
    bwd = 2 * 32 * (64 * 128 + 128 * 10) + 2 * 32 * 128 * 10
    assert count_train_flops(model, x) == fwd + bwd
    assert mfu(fwd + bwd, 1e-3, 10.0) == pytest.approx((fwd + bwd) / 1e-3 / 10e12)


def test_peak_table_recognises_devices():
    assert peak_tflops("NVIDIA H200", "bf16") == 989.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == 156.0
    assert peak_tflops("NVIDIA L4", "bf16") == 121.0
    assert peak_tflops("Tesla T4", "fp16") == 65.0
    assert peak_tflops("Some Unknown GPU", "bf16") is None


def test_env_stamp_has_contract_keys():
    from fastloop.measure.env import env_stamp

    env = env_stamp()
    for k in ("gpu", "driver", "cuda", "torch", "lightning", "python", "platform", "commit", "date"):
        assert k in env
    assert env["torch"] == torch.__version__


def test_draining_buffer_is_flagged_not_steady():
    from fastloop.drivers.runner import steadiness_warning

    assert steadiness_warning([0.01] * 10 + [0.05] * 10).startswith("not steady")
    assert steadiness_warning([0.01, 0.011] * 10) is None
    assert steadiness_warning([0.01] * 10 + [0.05] * 10, reached=True) is None  # measured on until steady
    unsteady = steadiness_warning([0.01] * 10 + [0.05] * 10, reached=False, measured_on=12)
    assert "after measuring on for 12 more steps" in unsteady and "measure more" not in unsteady


def test_measured_ceiling_roundtrip(tmp_path, monkeypatch):
    from fastloop.measure.flops import load_measured_ceiling, save_measured_ceilings

    monkeypatch.setenv("FASTLOOP_CACHE", str(tmp_path))
    assert load_measured_ceiling("NVIDIA H200", "bf16") is None
    save_measured_ceilings("NVIDIA H200", {"bf16": 776.3, "fp32": 50.8})
    save_measured_ceilings("NVIDIA H200", {"tf32": 392.5})
    assert load_measured_ceiling("NVIDIA H200", "bf16") == 776.3
    assert load_measured_ceiling("NVIDIA H200", "tf32") == 392.5
    assert load_measured_ceiling("NVIDIA L4", "bf16") is None


@pytest.mark.slow  # windows of up to seconds, timed: .ci/run's second step
def test_measure_s_is_a_time_window_however_short_or_long_the_step():
    """``--measure-s``: a window of seconds of steady steps. A 48 ms step (16 samples x 3 ms of
    loading) measures 10 steps (the least), not 30, in a 0.2 s window; a sub-millisecond step
    measures many more than ``--steps`` in a 1 s window. (The count comes from the steady warm-up's
    step time: on a busy machine the measured steps may then run slower, so the window's length is
    bounded below only.)"""
    from fastloop.drivers.subproc import run_in_subprocess

    slow = run_in_subprocess("tests/targets.py:sleepy_3ms", "none", steps=30, warmup=3, device="cpu", measure_s=0.2)
    assert slow["steps_planned"] == 30 and slow["steps"] == 10 and slow["measure_s"] == 0.2
    assert len(slow["step_s_all"]) == 10
    fast = run_in_subprocess("tests/targets.py:tiny_mlp", "none", steps=5, warmup=3, device="cpu", measure_s=1.0)
    # more than --steps and more than the least the window allows: the window set the count (a
    # sub-millisecond step gives hundreds; under two CPU burners a warm-up step of 30-50 ms gave 20-30)
    assert fast["steps_planned"] == 5 and fast["steps"] > 10 and len(fast["step_s_all"]) == fast["steps"]
    assert sum(fast["step_s_all"]) > 0.3  # about 1 s of steps, never a handful


@pytest.mark.slow  # windows of up to seconds, timed: .ci/run's second step
def test_a_window_the_warmup_underestimated_ends_on_time():
    """A data-bound step (2 loader workers, 0.16 s a batch) whose warm-up ran from a full prefetch
    buffer looked ~5 ms long, so a 1 s window planned ~200 steps (33.6 s measured with the cut
    disabled); the window now ends once it has run WINDOW_OVERRUN times longer than asked."""
    from fastloop.drivers.subproc import run_in_subprocess
    from fastloop.measure.callback import MIN_MEASURED_STEPS, WINDOW_OVERRUN

    d = run_in_subprocess("tests/targets.py:slow_workers", "none", steps=200, warmup=2, device="cpu", measure_s=1.0)
    measured = sum(d["step_s_all"])
    assert d["steps"] == len(d["step_s_all"]) >= MIN_MEASURED_STEPS
    assert measured < WINDOW_OVERRUN * 1.0 + 2 * max(d["step_s_all"]), (measured, d["steps"])
    assert d["steps"] < 200 and d["measure_window_cut"] is True


class _Timer:
    """Step times from a list, as StepTimer reports them (steps after ``warmup``, up to ``upto``)."""

    def __init__(self, times: list[float], warmup: int) -> None:
        self.times, self.warmup, self.recorded_steps = times, warmup, 0

    def result(self, upto=None):
        from fastloop.measure.timer import StepStats

        n = self.recorded_steps if upto is None else upto
        return StepStats(step_s=self.times[self.warmup : n], wait_s=[0.0] * (n - self.warmup), warmup_steps=self.warmup)


def _window(
    times: list[float], monkeypatch, warmup: int = 2, steps: int = 20, measure_s: float = 1.0, clock_scale: float = 1.0
):
    """Drive MeasureCallback's end-of-window logic over ``times`` (a fake clock advancing by each
    step's time); returns the callback when it stops the fit."""
    from types import SimpleNamespace

    import fastloop.measure.callback as cb

    clock = [0.0]
    monkeypatch.setattr(cb.time, "perf_counter", lambda: clock[0])
    m = cb.MeasureCallback(warmup=warmup, steps=steps, measure_s=measure_s)
    m.timer = _Timer(times, warmup)
    m._window_t0 = 0.0
    trainer = SimpleNamespace(
        world_size=1, should_stop=False, fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(max_steps=-1))
    )
    for n in range(1, len(times) + 1):
        clock[0] += clock_scale * times[n - 1]
        m.timer.recorded_steps = n
        m._maybe_stop(trainer)
        if trainer.should_stop:
            return m
    raise AssertionError("the window never ended")


def test_a_window_that_spans_a_change_of_rate_measures_on_until_steady(monkeypatch):
    """The step turns 16x slower at step 12, inside the first window (steps 2-21). The
    run does not report the mixed window with a request to measure more: the steps before the
    change become warm-up and it measures on until the window is steady, and says it did."""
    from fastloop.drivers.run_document import steadiness_warning

    m = _window([0.003] * 12 + [0.05] * 200, monkeypatch)
    measured = m.timer.result(upto=m._measured_end).step_s
    assert m.steady_reached is True and m.unsteady_steps == 10 and m.warmup == 12
    assert measured == [0.05] * 20  # only steps after the change
    assert steadiness_warning(measured, m.steady_reached, m.unsteady_steps) is None


def test_a_rate_that_never_settles_is_marked_and_said_once_without_asking_for_more(monkeypatch):
    """Every step 3% slower than the one before: the run measures on up to 3x its first window,
    then is marked not steady; the warning says what was measured, not what to redo."""
    from fastloop.drivers.run_document import steadiness_warning

    m = _window([0.01 * 1.03**i for i in range(400)], monkeypatch)
    measured = m.timer.result(upto=m._measured_end).step_s
    assert m.steady_reached is False and m.unsteady_steps > 0
    warning = steadiness_warning(measured, m.steady_reached, m.unsteady_steps)
    assert warning.startswith("not steady: after measuring on") and "measure more" not in warning


def test_a_steady_window_ends_where_planned(monkeypatch):
    m = _window([0.01] * 100, monkeypatch, measure_s=0.2)
    assert m.steady_reached is True and m.unsteady_steps == 0 and m._measured_end == 22
    assert m.window_extended == 0 and m.window_short_why is None


def test_a_window_whose_planned_steps_fall_short_of_measure_s_measures_on(monkeypatch):
    """The warm-up's estimate planned 20 steps, but they sum to 0.2 s of the 1 s asked
    for: the window extends until its measured steps' times sum to at least ``measure_s``."""
    m = _window([0.01] * 300, monkeypatch, measure_s=1.0)
    measured = m.timer.result(upto=m._measured_end).step_s
    assert sum(measured) >= 1.0 and m.window_extended > 0 and m.window_short_why is None
    assert len(measured) < 120  # extended by what was missing, not without end


def test_a_window_extension_ends_on_the_hosts_clock_and_says_why(monkeypatch):
    """A step whose measured time is far below its wall time (the fake clock runs 40x the step
    times): past WINDOW_OVERRUN x measure_s of wall time the window is not extended, and says why."""
    from fastloop.measure.callback import WINDOW_OVERRUN

    m = _window([0.01] * 2000, monkeypatch, measure_s=1.0, clock_scale=40.0)
    measured = m.timer.result(upto=m._measured_end).step_s
    assert sum(measured) < 1.0 and (m.window_cut or "clock" in (m.window_short_why or ""))
    assert sum(measured) * 40.0 > WINDOW_OVERRUN * 1.0 and m.window_extended == 0


def test_measure_s_must_be_positive():
    import pytest

    from fastloop.drivers.runner import run_configuration
    from fastloop.errors import FastloopError

    with pytest.raises(FastloopError, match="--measure-s must be"):
        run_configuration("tests/targets.py:tiny_mlp", "none", steps=3, warmup=1, device="cpu", measure_s=0)


def test_a_full_collection_ends_the_warmup_not_a_measured_step():
    """compile's garbage is collected once where the warm-up ends (reported as warmup_gc_s), so a
    full collection does not land in some runs' measured steps by chance."""
    import gc

    from fastloop._compat import Callback, Trainer
    from fastloop.measure.callback import MeasureCallback
    from tests.targets import tiny_mlp

    batch_of_full_gc: list[int] = []
    current = [-1]

    class Where(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            current[0] = batch_idx

    def seen(phase, info):
        if phase == "start" and info["generation"] == 2:
            batch_of_full_gc.append(current[0])

    module, data = tiny_mlp()
    measure = MeasureCallback(warmup=3, steady=False, steps=6, count_flops=False)
    trainer = Trainer(
        accelerator="cpu",
        max_steps=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Where(), measure],
    )
    gc.callbacks.append(seen)
    try:
        trainer.fit(module, train_dataloaders=data)
    finally:
        gc.callbacks.remove(seen)
    assert measure.warmup_gc_s is not None and measure.warmup_gc_s >= 0
    assert 2 in batch_of_full_gc  # after the third (last warm-up) batch, before the first measured one
    assert all(i < 3 for i in batch_of_full_gc)  # none during the measured batches 3..8


def test_time_between_a_steps_end_and_resume_belongs_to_no_step():
    t = StepTimer("cpu", warmup=2)
    for i in range(5):
        with t.fetching():
            pass
        busy(0.004)
        t.step_end()
        if i == 1:
            time.sleep(0.1)  # the warm-up's full garbage collection
            t.resume()
    r = t.result()
    assert r.steps == 3 and max(r.step_s) < 0.05  # without resume() the first measured step holds the 0.1 s


def test_measured_steps_exclude_the_warmup_collection(monkeypatch):
    """The collection that ends the warm-up is reported apart (warmup_gc_s), never in a step."""
    import fastloop.measure.callback as cb
    from fastloop.drivers.runner import run_configuration

    monkeypatch.setattr(cb, "collect_garbage", lambda: (time.sleep(0.3), 0.3)[1])
    doc = run_configuration("tests/targets.py:tiny_mlp", "none", steps=5, warmup=2, device="cpu", steady_warmup=False)
    assert doc["warmup_gc_s"] == 0.3
    assert max(doc["step_s_all"]) < 0.2


@pytest.mark.slow
def test_every_run_of_a_default_window_ladder_measures_the_asked_seconds(tmp_path):
    """On a ~1 ms-step CPU fixture, without --steps, every run of every rung measures
    at least 0.9 s of the CPU's default 1 s window (the sum of its measured steps' times)."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastloop.cli",
            "ladder",
            "tests/targets.py:tiny_mlp",
            "--device",
            "cpu",
            "--rungs",
            "bf16,fused_optimizer",
            "--out",
            str(tmp_path),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "report.json").read_text())
    windows = [e["measured_s"] for e in doc["run_log"] if e.get("measured_s") is not None]
    assert len(windows) == len(doc["run_log"]) >= 6
    assert min(windows) >= 0.9, windows
