"""The ladder aimed at the fit (``fastloop ladder TARGET --objective fit``,
fastloop.drivers.ladder.fit_objective): the prediction from a fit's measured phases, a short fit
scaled to a whole epoch, the fit speedups as rungs where the target has what they shorten, the
budget kept for their fit, the default objective's document unchanged, the reports; end to end on
``demo`` (slow)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from fastloop.drivers.fit import FitOptions, fit_here, fit_result
from fastloop.drivers.ladder import run_ladder
from fastloop.drivers.ladder.fit_objective import FitShape, fit_shape, predict_pick
from fastloop.report.ladder_fit import fit_objective_lines
from fastloop.report.markdown import render_markdown

PARTS = {"validates": True, "checkpoints": True, "progress_bar": True, "logs": True}


def _fit_doc(phases: dict[str, float], *, batches: int = 10, parts: dict | None = None, speedups=()) -> dict:
    """A fit document of one epoch whose every phase but start-up and teardown is the epoch's."""
    epoch = {k: v for k, v in phases.items() if k not in ("startup", "other", "compile")}
    return {
        "kind": "fit",
        "wall_s": sum(phases.values()),
        "phases": dict(phases),
        "epochs": [{"epoch": 0, "phases": epoch, "batches": batches, "samples": 16 * batches}],
        "step_only": {"median_s": phases.get("train", 0.0) / batches},
        "outcome": {"validation": [{"index": 0}]},
        "loaders": {"train": batches, "val": 4, "val_run": 4, "sanity_run": 0},
        "parts": dict(PARTS if parts is None else parts),
        "speedups": [{"name": n, "status": "applied", "reason": ""} for n in speedups],
    }


def test_a_2x_step_on_a_fit_whose_training_is_half_of_it_predicts_1_33x():
    doc = _fit_doc({"startup": 2.0, "train": 5.0, "validation": 2.0, "checkpoint": 0.5, "other": 0.5})
    plain = fit_shape(doc)
    assert plain.total() == pytest.approx(doc["wall_s"])  # a fit of its own length is itself
    pick = predict_pick(plain, 2.0, {}, None)
    assert plain.total() / pick.total() == pytest.approx(10 / 7.5)  # 1.33x
    assert pick.phases()["validation"] == 2.0 and pick.phases()["train"] == 2.5


def test_a_short_fit_is_scaled_to_a_whole_epoch_by_its_batches():
    doc = _fit_doc({"startup": 3.0, "train": 4.0, "validation": 1.0, "host_syncs": 0.4, "checkpoint": 0.2})
    doc["loaders"] = {"train": 40, "val": 16, "val_run": 4, "sanity_run": 2}  # ran 10 of 40; 4 of 16
    doc["step_only"] = {"median_s": 0.3}  # the first batches were slower: the rest at the steady step
    shape = fit_shape(doc)
    assert shape.epoch["train"] == pytest.approx(4.0 + 30 * 0.3)
    assert shape.epoch["host_syncs"] == pytest.approx(0.4 * 4)
    assert shape.epoch["validation"] == pytest.approx(1.0 * 4)
    assert shape.epoch["checkpoint"] == pytest.approx(0.2) and shape.once["startup"] == 3.0


def test_a_kept_fit_speedup_brings_its_phase_and_a_compile_its_seconds():
    plain = FitShape(once={"startup": 2.0}, epoch={"train": 4.0, "checkpoint": 2.0, "host_syncs": 1.0})
    saves = FitShape(once={"startup": 2.2}, epoch={"train": 4.2, "checkpoint": 0.1, "host_syncs": 1.1})
    pick = predict_pick(plain, 2.0, {"checkpoint": saves}, 5.0)
    assert (pick.phase("checkpoint"), pick.phase("host_syncs"), pick.phase("compile")) == (0.1, 1.0, 5.0)
    assert pick.phase("startup") == 2.0 and pick.phase("train") == 2.0


def _fake_measure(speed: dict[str, float], seed: int = 0, clock=None, run_s: float = 0.0, noise: float = 0.01):
    """Step runs: each named speedup multiplies the step's speed (``noise``: run to run)."""
    rng = np.random.default_rng(seed)

    def measure(target, spec, **kw):
        if clock is not None:
            clock.spend(run_s)
        names = [] if spec == "none" else [s.split(":")[0] for s in spec.split(",")]
        mean = 0.010 / float(np.prod([speed.get(n, 1.0) for n in names]))
        return {
            "step_s_all": list(mean * (1 + noise * rng.standard_normal()) * (1 + 0.005 * rng.standard_normal(60))),
            "items_per_step": 16,
            "throughput": {"value": 16 / mean, "unit": "samples/s"},
            "data_wait_frac": 0.0,
            "step_s": {"mean": mean},
            "speedups": [{"name": n, "status": "applied", "reason": ""} for n in names],
            "loss": {"first": 1.0, "last": 0.5},
            "steps": 60,
            "warmup_steps": 5,
            "compile_s": None,
        }

    return measure


def _fake_fit(parts: dict | None = None, clock=None, fit_s: float = 0.0, asked: list | None = None):
    """Short fits: async_checkpoint makes saves 10x shorter, deferred_logging the syncs 4x."""

    def fit(opts: FitOptions) -> dict:
        if clock is not None:
            clock.spend(fit_s)
        if asked is not None:
            asked.append(opts)
        names = [] if opts.speedups == "none" else opts.speedups.split(",")
        phases = {"startup": 2.0, "train": 3.0, "validation": 1.0, "checkpoint": 2.0, "host_syncs": 1.0, "other": 0.2}
        phases["checkpoint"] /= 10 if "async_checkpoint" in names else 1
        phases["host_syncs"] /= 4 if "deferred_logging" in names else 1
        return _fit_doc(phases, parts=parts, speedups=names)

    return fit


def test_the_fit_objective_predicts_the_fit_plain_vs_pick_beside_the_step():
    asked: list[FitOptions] = []
    doc = run_ladder(
        "x",
        ["bf16", "deferred_logging", "async_checkpoint"],
        device="cpu",
        budget=None,
        measure=_fake_measure({"bf16": 2.0}),
        objective="fit",
        fit=_fake_fit(asked=asked),
    )
    assert doc["objective"] == "fit" and doc["selected"] == ["bf16"]
    fit = doc["fit"]
    assert [f["spec"] for f in fit["fits"]] == ["none", "deferred_logging,async_checkpoint"]
    assert all(o.train_batches and o.val_batches and o.epochs == 1 for o in asked)  # short fits
    assert {r["name"]: r["kept"] for r in fit["rungs"]} == {"deferred_logging": True, "async_checkpoint": True}
    assert not any("deferred_logging" in r["spec"] for r in doc["rungs"])  # not a rung of the step's search
    assert fit["pick_spec"] == "bf16,deferred_logging,async_checkpoint"
    assert "bf16,deferred_logging,async_checkpoint" in fit["callbacks_line"]
    p = fit["predicted"]
    step = p["step_speedup"]["ratio"]
    assert step == pytest.approx(2.0, rel=0.05)
    # plain 9.2 s; the pick: train 3/step, saves 0.2, syncs 0.25, the rest as plain
    assert p["plain"]["wall_s"] == pytest.approx(9.2)
    assert p["pick"]["wall_s"] == pytest.approx(2.0 + 3.0 / step + 1.0 + 0.2 + 0.25 + 0.2)
    assert p["speedup"]["ratio"] == pytest.approx(9.2 / p["pick"]["wall_s"])
    assert p["speedup"]["ci_low"] <= p["speedup"]["ratio"] <= p["speedup"]["ci_high"]
    assert p["epoch_speedup"] > p["speedup"]["ratio"]  # start-up is paid once
    assert fit["method"] == "predicted from measured phases" and "a short fit of this target cost" in fit["why"]


def test_a_fit_speedup_is_not_measured_where_the_target_has_nothing_for_it_to_shorten():
    parts = {"validates": True, "checkpoints": False, "progress_bar": False, "logs": False}
    doc = run_ladder(
        "x",
        ["bf16", "deferred_logging", "async_checkpoint"],
        device="cpu",
        budget=None,
        measure=_fake_measure({"bf16": 2.0}),
        objective="fit",
        fit=_fake_fit(parts),
    )
    fit = doc["fit"]
    assert [f["spec"] for f in fit["fits"]] == ["none"]  # nothing to measure in a second fit
    reasons = {r["name"]: (r["status"], r["reason"]) for r in fit["rungs"]}
    assert reasons["async_checkpoint"] == ("skipped", reasons["async_checkpoint"][1])
    assert "no checkpoint save" in reasons["async_checkpoint"][1]
    assert "no logger or progress bar" in reasons["deferred_logging"][1]
    assert fit["pick_spec"] == "bf16" and fit["predicted"]["pick"]["phases"]["checkpoint"] == 2.0


def test_a_fit_speedup_that_saves_a_sliver_of_the_fit_is_not_kept():
    def fit(opts: FitOptions) -> dict:  # the syncs 0.05 s shorter in a fit of 9 s: within one fit's noise
        syncs = 0.05 if opts.speedups == "none" else 0.01
        phases = {"startup": 2.0, "train": 5.0, "validation": 1.9, "host_syncs": syncs, "other": 0.1}
        return _fit_doc(phases, speedups=[] if opts.speedups == "none" else opts.speedups.split(","))

    doc = run_ladder(
        "x", ["deferred_logging"], device="cpu", budget=None, measure=_fake_measure({}), objective="fit", fit=fit
    )
    (rung,) = doc["fit"]["rungs"]
    assert rung["kept"] is False and "less than 0.09 s" in rung["decision"]
    assert doc["fit"]["pick_spec"] == "none" and doc["fit"]["callbacks_line"].startswith("#")


def test_the_fit_objective_on_several_devices_is_refused(capsys):
    from fastloop.cli import main

    assert main(["ladder", "demo", "--objective", "fit", "--devices", "2", "--device", "cpu"]) == 2
    assert "--objective fit measures fits on one device" in capsys.readouterr().err


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def spend(self, seconds: float) -> None:
        self.t += seconds


def test_the_budget_keeps_room_for_the_fit_with_the_fit_speedups(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    # candidates within the runs' noise: comparisons that would take every run the budget allows
    speed = {"bf16": 1.02, "fused_optimizer": 1.01, "channels_last": 1.01, "workers": 1.01}
    doc = run_ladder(
        "x",
        ["bf16", "fused_optimizer", "channels_last", "workers", "async_checkpoint"],
        device="cpu",
        budget=90.0,
        measure=_fake_measure(speed, clock=clock, run_s=2.0, noise=0.05),
        objective="fit",
        fit=_fake_fit(clock=clock, fit_s=20.0),
    )
    fit = doc["fit"]
    assert [f["label"] for f in fit["fits"]] == ["plain", "fit speedups"]  # its fit was measured, in the budget
    assert fit["rungs"][0]["status"] == "applied" and fit["rungs"][0]["kept"] is True
    assert [t["name"] for t in doc["not_tried"]] == ["workers"]  # the step's search stopped for it
    assert doc["wall_s"] <= 90.0


def test_the_step_objective_leaves_the_ladders_document_as_it_was():
    kw = dict(device="cpu", budget=None, measure=_fake_measure({"bf16": 2.0}))
    default = run_ladder("x", ["bf16", "workers"], **kw)
    step = run_ladder("x", ["bf16", "workers"], objective="step", **kw)
    assert "fit" not in default and "objective" not in default
    assert sorted(step) == sorted(default)


def test_an_unknown_objective_is_refused():
    from fastloop.errors import FastloopError

    with pytest.raises(FastloopError, match="--objective must be one of step, fit"):
        run_ladder("x", ["bf16"], device="cpu", objective="epoch", measure=_fake_measure({}))


def test_the_reports_give_the_fit_plain_vs_pick_next_to_the_step():
    doc = run_ladder(
        "x",
        ["bf16", "async_checkpoint"],
        device="cpu",
        budget=None,
        measure=_fake_measure({"bf16": 2.0}),
        objective="fit",
        fit=_fake_fit(),
    )
    doc = {**doc, "target": "x", "env": {}, "fastloop_version": "0"}
    lines = fit_objective_lines(doc)
    p = doc["fit"]["predicted"]
    assert any(
        f"{p['speedup']['ratio']:.2f}x" in line and f"{p['step_speedup']['ratio']:.2f}x" in line for line in lines
    )
    md = render_markdown(doc)
    assert "The whole fit (--objective fit)" in md and "| checkpoint |" in md and "bf16,async_checkpoint" in md
    from fastloop.report.html import render_html

    assert "The whole fit (--objective fit)" in render_html(copy.deepcopy(doc))
    from rich.console import Console

    from fastloop.report.terminal import print_document

    console = Console(width=160, record=True)
    print_document(doc, console)
    assert "predicted plain" in console.export_text()


def test_a_short_fit_runs_its_batches_and_records_the_whole_epochs(tmp_path):
    opts = FitOptions(target="tests/targets.py:fit_tiny", epochs=1, train_batches=4, val_batches=2)
    t0 = time.monotonic()
    record, error = fit_here(opts, spawned_at=t0, root_dir=str(tmp_path / "fit"))
    assert error is None
    doc = fit_result(record, time.monotonic() - t0, opts).to_dict()
    assert doc["epochs"][0]["batches"] == 4
    assert doc["loaders"]["train"] == 16 and doc["loaders"]["val_run"] == 2  # 256 samples, batches of 16
    assert doc["loaders"]["val"] > 2 and doc["parts"] == PARTS
    assert doc["settings"]["length"]["limit_train_batches"] == 4


@pytest.mark.slow
def test_the_demo_ladder_aimed_at_the_fit_reports_the_fit_plain_vs_pick(tmp_path):
    out, js = tmp_path / "out", tmp_path / "ladder.json"
    cmd = [sys.executable, "-m", "fastloop.cli", "ladder", "demo", "--objective", "fit"]
    cmd += ["--rungs", "workers,async_checkpoint,deferred_logging", "--budget", "150", "--device", "cpu"]
    proc = subprocess.run([*cmd, "--quiet", "--json", str(js), "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(js.read_text())
    fit = doc["fit"]
    assert fit["parts"]["validates"] and fit["parts"]["checkpoints"] and fit["parts"]["logs"]
    plain = fit["fits"][0]
    assert plain["spec"] == "none" and plain["phases"]["validation"] > 0 and plain["phases"]["checkpoint"] > 0
    assert plain["loaders"]["train"] == 64  # demo: 2048 records, batches of 32
    p = fit["predicted"]
    assert p["plain"]["wall_s"] > 0 and p["pick"]["wall_s"] > 0 and "step_speedup" in p  # None: no step pick
    assert {r["name"] for r in fit["rungs"]} == {"async_checkpoint", "deferred_logging"}
    assert "The whole fit (--objective fit)" in (out / "report.md").read_text()
