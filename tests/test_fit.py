"""``fastloop fit`` and ``ab --fit`` on the CPU: the phase clock, a fit run in this process (the
same code the fit's own process runs), ``--until``, the outcome verdicts, the reports.

The end-to-end commands (fresh processes) are in tests/test_fit_cli.py."""

from __future__ import annotations

import dataclasses
import time

import pytest

from fastloop.drivers.ab_fit import outcome_verdict, run_ab_fit, time_verdict
from fastloop.drivers.fit import FitOptions, fit_here, fit_result
from fastloop.drivers.fit_result import divergence
from fastloop.errors import FastloopError
from fastloop.measure.fit_clock import PhaseClock
from fastloop.measure.until import Until

TINY = "tests/targets.py:fit_tiny"


def _fit(tmp_path, target: str = TINY, **kw) -> dict:
    """One fit in this process, as the fit's own process runs it; its document (wall: from here)."""
    opts = FitOptions(target=target, **{"epochs": 2, **kw})
    t0 = time.monotonic()
    record, error = fit_here(opts, spawned_at=t0, root_dir=str(tmp_path / f"fit-{time.monotonic_ns()}"))
    if error is not None:
        raise error
    return fit_result(record, time.monotonic() - t0, opts).to_dict() | {"record": record}


def test_the_clock_charges_each_second_to_one_phase_and_a_claim_left_open_ends_with_its_parent():
    ticks = iter(float(t) for t in range(1, 12))
    clock = PhaseClock(origin=0.0, now=lambda: next(ticks))
    clock.set_base("train")  # 0-1 s: startup
    clock.enter("validation", sync=True)  # 1-2 s: train
    clock.enter("checkpoint")  # 2-3 s: validation
    clock.leave("validation")  # 3-4 s: checkpoint: the save, opened inside validation, ends with it
    assert clock.current == "train"
    with pytest.raises(ValueError), clock.claim("host_syncs"):  # 4-5 s: train
        raise ValueError("in the progress bar")  # where it raised: 6 s; 5-7 s host_syncs
    assert clock.failed_in == ("host_syncs", 6.0)
    total = clock.finish()  # 7-8 s: train
    assert {k: v for k, v in clock.totals.items() if v} == {
        "startup": 1.0,
        "train": 3.0,
        "validation": 1.0,
        "checkpoint": 1.0,
        "host_syncs": 2.0,
    }
    assert sum(clock.totals.values()) == total == 8.0
    assert clock.interruptions == 1  # only the synced claim stopped training


def test_until_is_checked_before_anything_runs():
    assert Until.parse("val_loss <= 1.5e-1") == Until("val_loss", "<=", 0.15)
    for bad in ("val_loss<1", "val_loss>=", ">=0.9", "val_loss>=abc", "val_acc>=0.9,val_loss<=1"):
        with pytest.raises(FastloopError, match="malformed: give METRIC>=X or METRIC<=X"):
            Until.parse(bad)


def test_a_fit_in_process_accounts_for_its_phases_and_records_its_outcome(tmp_path):
    doc = _fit(tmp_path, target="tests/targets.py:fit_compiled")
    phases, record = doc["phases"], doc["record"]
    for phase in ("startup", "compile", "train", "validation", "checkpoint", "epoch_edges", "host_syncs"):
        assert phases[phase] > 0, phase
    assert abs(sum(record["phases"].values()) - record["record_s"]) < 1e-6  # every second charged once
    assert doc["compiles"]["count"] >= 2 and {e["phase"] for e in doc["compiles"]["events"]} >= {"train"}
    assert [e["batches"] for e in doc["epochs"]] == [16, 16] and [e["samples"] for e in doc["epochs"]] == [256, 256]
    runs = doc["outcome"]["validation"]
    assert [r["step"] for r in runs] == [16, 32] and set(runs[0]["metrics"]) == {"val_acc", "val_loss"}
    assert runs[0]["second"] < runs[1]["second"] <= doc["wall_s"]
    loss = doc["outcome"]["train_loss"]
    assert len(loss["value"]) == 32 and loss["step"][-1] == 32 and loss["value"][-1] < loss["value"][0]
    s = doc["step_only"]
    # an epoch's first batch follows its edge, so at most 15 of its 16 ran back to back
    assert 0 < s["steady_steps"] <= 30 and 0 < s["median_s"] and 0 < s["covers_frac"] < 1
    assert doc["settings"]["left_out"] == {} and "ModelCheckpoint" in doc["settings"]["callbacks"]


def test_a_step_interrupted_by_a_validation_run_is_not_a_steady_step(tmp_path):
    doc = _fit(tmp_path, target="tests/targets.py:fit_mid_validation")
    assert len(doc["outcome"]["validation"]) == 4  # twice an epoch
    # of an epoch's 16 batches, the first follows its edge and one follows the mid-epoch validation
    assert doc["step_only"]["steady_steps"] == 2 * 14


def test_a_save_from_the_users_own_callback_is_checkpoint_time(tmp_path):
    doc = _fit(tmp_path, target="tests/targets.py:fit_saves_itself", epochs=1)
    assert "ModelCheckpoint" not in doc["settings"]["callbacks"] and doc["phases"]["checkpoint"] > 0


def test_until_stops_the_fit_at_the_first_validation_run_that_reaches_it(tmp_path):
    doc = _fit(tmp_path, epochs=3, until="val_acc>=0")
    assert len(doc["outcome"]["validation"]) == 1 and doc["outcome"]["reached"]["step"] == 16
    assert len(doc["outcome"]["train_loss"]["value"]) == 16  # not the 48 batches of 3 epochs


@pytest.mark.slow
def test_the_gpt_recipe_stops_at_its_validation_loss_target(tmp_path):
    """The recipe's own module and data (tiny, validated every 10 steps); its loss falls from ~5.5."""
    from fastloop.drivers.targets import recipe_fit_settings

    assert recipe_fit_settings("gpt") == {"val_check_interval": 250}  # what `fastloop fit gpt` validates at
    doc = _fit(tmp_path, target="tests/targets.py:gpt_fit_tiny", epochs=None, max_steps=200, until="val_loss<=5.2")
    assert doc["outcome"]["reached"]["step"] <= 50 and len(doc["outcome"]["train_loss"]["value"]) < 200
    assert doc["outcome"]["validation"][-1]["metrics"]["val_loss"] <= 5.2


@pytest.mark.slow
def test_the_imagenet_recipe_stops_at_its_top1_target(tmp_path, monkeypatch):
    """The recipe by its short name on a small generated folder (3 classes): the first validation
    run reaches val_top1>=0, so the 3 epochs asked stop after one."""
    from fastloop.recipes.imagenet.generate import generate

    root = generate(tmp_path / "img", classes=3, train=8, val=2, workers=2)
    monkeypatch.setenv("FASTLOOP_IMAGENET_ROOT", str(root))
    monkeypatch.setenv("FASTLOOP_IMAGENET_BATCH", "4")
    doc = _fit(tmp_path, target="imagenet", epochs=3, until="val_top1>=0")
    assert doc["outcome"]["reached"]["validation_run"] == 0 and len(doc["epochs"]) == 1
    assert {"val_loss", "val_top1", "val_top5"} <= set(doc["outcome"]["validation"][0]["metrics"])


def test_a_target_not_reached_ends_with_the_curve_so_far(tmp_path):
    doc = _fit(tmp_path, epochs=None, max_time=1.0, until="val_acc>=2")
    assert doc["outcome"]["reached"] is None and doc["failed"] is None
    assert doc["settings"]["length"]["max_time"] == 1.0


def test_a_metric_the_module_never_logs_is_named_with_those_it_does(tmp_path):
    with pytest.raises(FastloopError, match=r"never logs 'val_top1' in validation; it logs: val_acc, val_loss"):
        _fit(tmp_path, epochs=1, until="val_top1>=0.5")


def test_a_target_without_a_length_is_refused(tmp_path):
    with pytest.raises(FastloopError, match="give the fit no length"):
        _fit(tmp_path, epochs=None)


def test_a_fit_that_raises_in_validation_keeps_its_timeline(tmp_path):
    opts = FitOptions(target="tests/targets.py:fit_fails_in_validation", epochs=2)
    t0 = time.monotonic()
    record, error = fit_here(opts, spawned_at=t0, root_dir=str(tmp_path / "f"))
    assert isinstance(error, ValueError) and "my_metric" in str(error)
    assert record["failed"]["phase"] == "validation" and record["phases"]["train"] > 0
    assert len(record["train_loss"]["value"]) == 16  # the first epoch trained, then its validation raised


def test_divergence_is_found_and_never_averaged_in():
    assert divergence([1, 2, 3], [1.0, float("inf"), 0.5])["step"] == 2
    assert divergence(list(range(30)), [2.0] * 29 + [30.0])["step"] == 29
    assert divergence(list(range(30)), [2.0 - 0.05 * i for i in range(30)]) is None


def test_the_outcome_verdict_says_same_only_inside_the_tolerance():
    same = outcome_verdict("val_acc", [0.80, 0.82, 0.81], [0.81, 0.81, 0.815], tolerance=0.05, higher_better=True)
    assert same["learns_same"] is True and same["verdict"].startswith("B learns the same as A")
    worse = outcome_verdict("val_acc", [0.80, 0.82, 0.81], [0.50, 0.53, 0.52], tolerance=None, higher_better=True)
    assert (
        worse["learns_same"] is False
        and "does not learn the same" in worse["verdict"]
        and ", worse" in worse["verdict"]
    )
    wide = outcome_verdict("val_acc", [0.80, 0.82], [0.70, 0.85], tolerance=0.05, higher_better=True)
    assert wide["learns_same"] is None and wide["verdict"].startswith("not shown to learn the same")
    one = outcome_verdict("val_acc", [0.8], [0.8], tolerance=None, higher_better=True)
    assert one["learns_same"] is None and one["verdict"].startswith("too few seeds")


def test_time_verdicts_pair_the_seeds_and_need_three():
    two = time_verdict("whole fit", [10.0, 10.2], [5.0, 5.1], ("A", "B"))
    assert "too few runs to tell" in two["verdict"] and two["ratio"] == pytest.approx(2.0, rel=0.01)
    three = time_verdict("whole fit", [10.0, 10.2, 10.1], [5.0, 5.1, 5.05], ("A", "B"))
    assert three["verdict"].startswith("whole fit: B is 2.00x faster than A") and three["significant"]


def _in_process(tmp_path, noisy_spec: str):
    """Fits in this process; the side asking for ``noisy_spec`` trains on labels 80% random."""

    def fit_one(opts: FitOptions):
        noise = 0.8 if opts.speedups == noisy_spec else 0.0
        target = f"{TINY}" if not noise else "tests/targets.py:fit_noisy"
        return _fit(tmp_path, **{**dataclasses.asdict(opts), "target": target, "speedups": "none"}), None

    return fit_one


def test_a_model_made_to_learn_worse_does_not_learn_the_same(tmp_path):
    base = FitOptions(target=TINY, epochs=1)
    doc = run_ab_fit(base, "none", "prefetch", seeds=3, fit_one=_in_process(tmp_path, "prefetch"))
    assert doc["run_order"] == ["A", "B", "B", "A", "A", "B"]
    acc = next(o for o in doc["outcome"] if o["metric"] == "val_acc")
    assert (
        acc["learns_same"] is False and "B does not learn the same as A: its val_acc is lower, worse" in acc["verdict"]
    )
    assert "the curves part at validation run" in acc["verdict"]
    assert (
        [f["settings"]["seed"] for f in doc["fits"]["a"]]
        == [0, 1, 2]
        == [f["settings"]["seed"] for f in doc["fits"]["b"]]
    )
    assert doc["verdicts"][0].startswith("whole fit: ") and doc["verdicts"][1].startswith("step only: ")


def test_no_cache_reaches_the_fits_own_process_and_its_run_inputs():
    """``fastloop fit --no-cache`` (and ``ab --fit --no-cache``): the fit's own process is started with
    --no-cache, and parses back to the options that compile cold."""
    from fastloop.cli import _parser
    from fastloop.drivers.fit import _child_command
    from fastloop.drivers.fit_commands import fit_options

    for argv, cached in (
        (["fit", "demo", "--epochs", "1"], True),
        (["fit", "demo", "--epochs", "1", "--no-cache"], False),
    ):
        opts = fit_options(_parser().parse_args(argv), "cpu")
        assert opts.compile_cache is cached
        child = _child_command(opts, "compile", "/tmp/r.json", "/tmp/root", 0.0)
        assert ("--no-cache" in child) is not cached
        back = fit_options(_parser().parse_args(child[3:]), "cpu")
        assert back.compile_cache is cached and isinstance(back, type(opts))
    ab = fit_options(
        _parser().parse_args(["ab", "demo", "--a", "none", "--b", "compile", "--fit", "--no-cache"]), "cpu"
    )
    assert ab.compile_cache is False
