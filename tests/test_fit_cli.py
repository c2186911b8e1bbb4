"""``fastloop fit`` and ``fastloop ab --fit`` end to end: each fit a fresh process, timed from spawn
to exit by the command (the outside clock)."""

from __future__ import annotations

import json

import pytest

from fastloop.cli import main


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_fit_demo_accounts_for_the_outside_clock(tmp_path):
    """The must-show: the phases sum to the outside clock, `other` (the remainder) within 5% of it,
    and each phase the demo's fit has is non-zero (no compile: the plain fit compiles nothing)."""
    out = tmp_path / "fit.json"
    assert main(["fit", "demo", "--epochs", "2", "--device", "cpu", "--json", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    phases, wall = doc["phases"], doc["wall_s"]
    assert sum(phases.values()) == pytest.approx(wall, rel=1e-9)
    assert 0 <= phases["other"] <= 0.05 * wall and doc["phase_check"]["within"], doc["phase_check"]
    for phase in ("startup", "train", "validation", "checkpoint", "epoch_edges", "host_syncs"):
        assert phases[phase] > 0, phase
    assert phases["compile"] == 0 and doc["compiles"]["count"] == 0
    assert [e["epoch"] for e in doc["epochs"]] == [0, 1] and all(e["samples"] == 2048 for e in doc["epochs"])
    runs = doc["outcome"]["validation"]
    assert [r["step"] for r in runs] == [64, 128] and set(runs[-1]["metrics"]) == {"val_acc", "val_loss"}
    assert 0 < doc["step_only"]["covers_frac"] < doc["phases"]["train"] / wall + 0.2
    assert doc["settings"]["root_dir"] is None  # no --out: its logs and checkpoints went to a removed folder


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["fit", "demo", "--epochs", "1", "--until", "val_acc>0.9"], "--until 'val_acc>0.9' is malformed"),
        (["fit", "demo", "--epochs", "1", "--max-steps", "3"], "not allowed with argument --epochs"),
        (["ab", "demo", "--a", "none", "--b", "workers", "--epochs", "1"], "--epochs compare whole fits: add --fit"),
        (["fit", "demo", "--child-of", "1.0"], "--child-of is fastloop fit's own process"),
    ],
)
def test_bad_fit_input_exits_2_with_one_line(argv, msg, capsys):
    try:
        rc = main([*argv, "--device", "cpu"])
    except SystemExit as e:
        rc = e.code
    assert rc == 2 and msg in _err_line(capsys)


@pytest.mark.slow
def test_a_metric_never_logged_and_a_fit_without_a_length_exit_2(capsys, tmp_path):
    argv = ["fit", "tests/targets.py:fit_tiny", "--device", "cpu", "--quiet"]
    assert main([*argv, "--epochs", "1", "--until", "val_top1>=0.5"]) == 2
    assert "never logs 'val_top1' in validation; it logs: val_acc, val_loss" in _err_line(capsys)
    assert main(argv) == 2
    assert "give the fit no length" in _err_line(capsys)


@pytest.mark.slow
def test_a_fit_that_raises_in_validation_exits_1_with_the_users_line_and_keeps_its_timeline(tmp_path, capsys):
    out = tmp_path / "f.json"
    argv = ["fit", "tests/targets.py:fit_fails_in_validation", "--epochs", "2", "--device", "cpu"]
    assert main([*argv, "--json", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "raised in its validation phase" in err
    assert (
        "validation_step() at targets.py:" in err and "ValueError: validation labels out of range in my_metric" in err
    )
    doc = json.loads(out.read_text())
    assert doc["failed"]["phase"] == "validation" and doc["phases"]["train"] > 0
    assert len(doc["outcome"]["train_loss"]["value"]) == 16


@pytest.mark.slow
def test_ab_fit_on_the_demo_prints_the_time_and_outcome_verdicts(tmp_path, capsys):
    """The must-show: 2 seeds a side (too few for a time verdict, which says so), counterbalanced."""
    argv = ["ab", "demo", "--fit", "--a", "none", "--b", "workers", "--epochs", "1", "--seeds", "2"]
    assert main([*argv, "--device", "cpu", "--json", str(tmp_path / "ab.json")]) == 0
    printed = capsys.readouterr().out
    for figure in ("whole fit", "step only", "validation", "checkpoint"):
        assert figure in printed, figure
    assert "too few runs to tell (2 runs per side" in printed
    assert "val_acc" in printed and "learn" in printed  # the outcome verdict on the validation metric
    doc = json.loads((tmp_path / "ab.json").read_text())
    assert doc["run_order"] == ["A", "B", "B", "A"] and len(doc["fits"]["a"]) == len(doc["fits"]["b"]) == 2
    assert {o["metric"] for o in doc["outcome"]} == {"val_acc", "val_loss"}
