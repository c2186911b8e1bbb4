"""CUDA_DEVICE_MAX_CONNECTIONS: set before CUDA starts, kept when the user chose, never changed late."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from fastloop.cuda_env import CUDA_QUEUES_VAR, cuda_queues_note, ensure_cuda_queues


def test_ensure_sets_keeps_and_is_never_late(monkeypatch):
    env: dict[str, str] = {}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert ensure_cuda_queues(env) == "set" and env == {CUDA_QUEUES_VAR: "32"}
    mine = {CUDA_QUEUES_VAR: "4"}
    assert ensure_cuda_queues(mine) == "kept" and mine == {CUDA_QUEUES_VAR: "4"}
    late: dict[str, str] = {}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert ensure_cuda_queues(late) == "late" and late == {}


def test_note_says_what_is_wrong_and_what_to_do():
    assert cuda_queues_note({CUDA_QUEUES_VAR: "32"}) is None
    assert cuda_queues_note({CUDA_QUEUES_VAR: "16"}) is None
    for env, says in (({}, "is not set"), ({CUDA_QUEUES_VAR: "8"}, "is '8'"), ({CUDA_QUEUES_VAR: "x"}, "is 'x'")):
        note = cuda_queues_note(env)
        assert note is not None and says in note and f"{CUDA_QUEUES_VAR}=32" in note


def test_the_command_line_sets_it_for_its_children(tmp_path):
    """``fastloop`` sets the variable before anything imports torch, so the runs it starts (the
    ladder's and A/B's child processes) inherit it; a user's own value stays."""
    code = (
        "import os, fastloop.cli as c\n"
        "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print('VALUE', os.environ.get('{CUDA_QUEUES_VAR}'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != CUDA_QUEUES_VAR}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "VALUE 32" in out.stdout, out.stderr[-2000:]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**env, CUDA_QUEUES_VAR: "2"}, timeout=120
    )
    assert "VALUE 2" in out.stdout, out.stderr[-2000:]


def test_the_runner_sets_it_and_the_report_stamps_it(monkeypatch):
    from fastloop.drivers.runner import run_configuration

    monkeypatch.setenv(CUDA_QUEUES_VAR, "")  # restored after the test; empty counts as unset
    from fastloop.measure.env import env_stamp

    run_configuration("tests/targets.py:tiny_mlp", "none", steps=2, warmup=0, device="cpu")
    assert os.environ[CUDA_QUEUES_VAR] == "32"
    assert env_stamp()["cuda_device_max_connections"] == "32"


def test_asking_for_dali_before_cuda_starts_sets_it(monkeypatch):
    """``callbacks("bf16,dali")`` in a user's script, before the fit starts CUDA, is in time."""
    from fastloop.speedups.base import resolve

    monkeypatch.setenv(CUDA_QUEUES_VAR, "")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    (dali,) = resolve("dali")
    assert dali.queues == "set" and os.environ[CUDA_QUEUES_VAR] == "32"
    monkeypatch.setenv(CUDA_QUEUES_VAR, "")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    (late,) = resolve("dali")
    assert late.queues == "late" and os.environ[CUDA_QUEUES_VAR] == ""
