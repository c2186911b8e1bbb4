"""A module that writes to ``self.logger`` trains in a measured run (whose logs are not the
training's): it had failed with "'NoneType' object has no attribute 'log_hyperparams'"."""

from __future__ import annotations

import os
from pathlib import Path

from fastloop.drivers.runner import run_configuration
from fastloop.drivers.silent_logger import SilentLogger


def test_a_module_that_logs_to_its_logger_trains_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc = run_configuration(
        f"{Path(__file__).parent / 'targets.py'}:uses_its_logger",
        "none",
        steps=12,
        warmup=2,
        device="cpu",
        steady_warmup=False,
    )
    assert doc["steps"] == 12 and len(doc["losses"]) >= 12
    assert os.listdir(tmp_path) == []  # no event files, no CSV, no checkpoints


def test_the_silent_loggers_experiment_takes_any_call():
    log = SilentLogger()
    exp = log.experiment
    assert exp.add_image("x", None, 0) is exp and exp.log({"a": 1}) is exp and log[0] is log
    exp.summary["best"] = 1.0
    assert log.save_dir == os.getcwd() and log.name == "fastloop"
