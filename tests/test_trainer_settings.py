"""The user's Trainer settings travel with the target (a third element, a dict
of Trainer keyword arguments): every run trains with them, fastloop's speedups respect them,
settings fastloop's measurement owns are left out with the reason, bad ones are refused."""

from __future__ import annotations

import pytest

from fastloop.drivers.runner import run_configuration
from fastloop.errors import FastloopError

T = "tests/targets.py"


def _run(fn: str, spec: str = "none", **target_kwargs):
    return run_configuration(
        f"{T}:{fn}", spec, steps=6, warmup=2, device="cpu", steady_warmup=False, target_kwargs=target_kwargs or None
    )


def test_the_targets_trainer_settings_are_used_and_owned_ones_left_out():
    clipped = _run("with_trainer_settings")
    plain = _run("tiny_mlp")
    used = clipped["trainer_settings"]["used"]
    assert used == {"gradient_clip_val": "0.001"}
    assert "max_epochs" in clipped["trainer_settings"]["left_out"]
    # the clipping really trained: the trajectory differs from the unclipped module's
    assert clipped["losses"][0] == pytest.approx(plain["losses"][0])
    assert max(abs(a - b) for a, b in zip(clipped["losses"][2:], plain["losses"][2:])) > 1e-4
    assert plain["trainer_settings"]["used"] == {}


def test_callbacks_that_need_what_a_run_turns_off_are_left_out_with_the_reason_and_the_users_own_run(
    tmp_path, monkeypatch
):
    """A LearningRateMonitor with the logger left out failed the run as 'an error in your code'."""
    monkeypatch.setenv("FASTLOOP_TEST_COUNT_FILE", str(tmp_path / "count"))
    doc = _run("with_callbacks")
    assert int((tmp_path / "count").read_text()) >= doc["steps"] + doc["warmup_steps"]  # the user's own callback ran
    settings = doc["trainer_settings"]
    assert settings["callbacks"] == ["CountSteps"]
    left = settings["left_out"]
    assert left["callbacks: LearningRateMonitor"] == "fastloop's runs write no logs"
    assert (
        "no checkpoints" in left["callbacks: ModelCheckpoint"] and "do not validate" in left["callbacks: EarlyStopping"]
    )
    assert "logger" in left
    assert doc["steps"] == 6


def test_a_precision_the_user_chose_wins_over_the_bf16_speedup():
    doc = _run("with_trainer_settings", "bf16", precision="bf16-mixed")
    rec = next(r for r in doc["speedups"] if r["name"] == "bf16")
    assert rec["status"] == "skipped" and "bf16-mixed" in rec["reason"]
    assert doc["trainer_settings"]["used"]["precision"] == "'bf16-mixed'"


def test_bad_trainer_settings_are_refused_with_the_reason():
    with pytest.raises(FastloopError, match="Trainer does not take: bogus_setting"):
        _run("with_trainer_settings", extra="bogus_setting")
    with pytest.raises(FastloopError, match="dict of Trainer keyword arguments was expected"):
        _run("trainer_settings_not_a_dict")
