"""Configuration runs through the fork server: a fresh process per run without paying Python's
start-up and the torch/Lightning imports each time; the same results as a new interpreter; a
plain run when the server is off or a forked child cannot start CUDA."""

from __future__ import annotations

import pytest

from fastloop.drivers import subproc
from fastloop.drivers.subproc import run_in_subprocess


@pytest.fixture
def fresh_server(monkeypatch):
    monkeypatch.delenv("FASTLOOP_FORKSERVER", raising=False)
    subproc._stop_fork_server()
    monkeypatch.setattr(subproc, "_SERVER_OFF", False)
    yield
    subproc._stop_fork_server()
    subproc._SERVER_OFF = False


def _run(target="tests/targets.py:tiny_mlp"):
    return run_in_subprocess(target, "none", steps=6, warmup=2, device="cpu")


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_forked_runs_are_separate_processes_and_train_as_a_new_interpreter_does(fresh_server, monkeypatch):
    a, b = _run(), _run()
    assert a["timings"]["forked"] and b["timings"]["forked"]
    assert a["timings"]["pid"] != b["timings"]["pid"]  # one process per run
    server = subproc._SERVER
    assert (
        server is not None
        and server.proc.poll() is None
        and server.proc.pid not in (a["timings"]["pid"], b["timings"]["pid"])
    )
    monkeypatch.setenv("FASTLOOP_FORKSERVER", "0")
    plain = _run()
    assert plain["timings"]["forked"] is False
    n = min(len(a["losses"]), len(plain["losses"]))
    assert n >= 8 and a["losses"][:n] == plain["losses"][:n]  # bitwise: same seed, same batches, same math


def test_a_user_error_in_a_forked_run_is_reported_like_a_plain_one(fresh_server):
    with pytest.raises(subproc.ConfigurationFailed) as err:
        _run("tests/targets.py:raises")
    assert err.value.returncode == 1 and "dataset folder /data/x is empty" in err.value.detail
    assert subproc._SERVER is not None and subproc._SERVER.proc.poll() is None  # the server carries on


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_a_child_that_cannot_start_cuda_in_a_fork_reruns_the_plain_way(fresh_server):
    doc = _run("tests/targets.py:fork_trouble")
    assert doc["timings"]["forked"] is False and doc["steps"] == 6
    assert subproc._SERVER is None and subproc._SERVER_OFF  # later runs start Python afresh


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_a_changed_environment_gets_a_new_server(fresh_server, monkeypatch):
    # torch reads some variables at import (TORCHINDUCTOR_*, ...): runs see the leader's env as of now
    a = _run()
    first = subproc._SERVER.proc.pid
    monkeypatch.setenv("FASTLOOP_TEST_MARK", "1")
    b = _run()
    assert b["timings"]["forked"] and subproc._SERVER.proc.pid != first
    assert a["losses"][:8] == b["losses"][:8]


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_later_runs_skip_the_profile_without_a_new_server(fresh_server, monkeypatch, tmp_path):
    """A configuration's GPU profile is taken in its first run only; the flag travels in the
    child's environment and is read at run time, so the server is kept."""
    from fastloop.compare import measure_interleaved

    probe = tmp_path / "probe.txt"
    monkeypatch.setenv("FASTLOOP_TEST_PROBE", str(probe))
    monkeypatch.delenv("FASTLOOP_PROFILE_STEPS", raising=False)
    runs = measure_interleaved(
        "tests/targets.py:env_probe", ["none", "bf16"], 2, measure=run_in_subprocess, steps=4, warmup=1, device="cpu"
    )
    assert [len(r.docs) for r in runs.values()] == [2, 2]
    assert probe.read_text().split() == ["unset", "unset", "0", "0"]  # none 1, bf16 1, none 2, bf16 2
    assert len({d["timings"]["pid"] for r in runs.values() for d in r.docs}) == 4
    assert all(d["timings"]["forked"] for r in runs.values() for d in r.docs)
    first = subproc._SERVER.proc.pid
    run_in_subprocess("tests/targets.py:env_probe", "none", steps=4, warmup=1, device="cpu", profile=False)
    assert subproc._SERVER.proc.pid == first


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_the_step_rate_reaches_a_forked_run_without_a_new_server(fresh_server, monkeypatch, tmp_path):
    """An A/B declares A's step rate to B's runs and not to A's (``--step-rate`` in B's arguments,
    ``run_inputs`` in its document); the declaration is an argument of the run, so one server
    forks all four runs (torch and Lightning imported once)."""
    from fastloop.drivers.ab import run_ab

    monkeypatch.setenv("FASTLOOP_TEST_PROBE", str(tmp_path / "probe.txt"))
    pids, told = [], []

    def measure(target, spec, **kwargs):
        doc = run_in_subprocess(target, spec, **kwargs)
        pids.append(subproc._SERVER.proc.pid)
        told.append((spec, kwargs.get("step_rate"), doc["run_inputs"]["step_rate"]))
        return doc

    run_ab("tests/targets.py:env_probe", "none", "pin_memory", repeats=2, steps=4, warmup=1, measure=measure)
    assert [t[0] for t in told] == ["none", "pin_memory", "pin_memory", "none"]  # counterbalanced
    assert all(t[1:] == (None, None) for t in told if t[0] == "none")
    assert all(t[1] > 0 and t[2] == pytest.approx(t[1]) for t in told if t[0] == "pin_memory")
    assert len(set(pids)) == 1  # one server for all four runs


@pytest.mark.slow  # a process importing the compiler: .ci/run's second step
def test_the_compiler_preload_imports_inductor_without_initializing_cuda():
    import subprocess
    import sys

    code = (
        "import torch; from fastloop.drivers.forkserver import preload_compiler, wants_compiler; "
        "done = preload_compiler(); print(sorted(done)); print(torch.cuda.is_initialized()); "
        "print(wants_compiler(['run', 'x', '--speedups', 'bf16,cuda_graph']), wants_compiler(['run', 'compiled']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    ).stdout.split("\n")
    assert "torch._inductor.compile_fx" in out[0] and "torch._functorch.partitioners" in out[0]
    assert out[1] == "False"
    assert out[2] == "True False"


def test_a_server_started_early_is_the_one_the_first_run_uses(fresh_server):
    """``fastloop ladder`` and ``ab`` start the server before importing torch (the two imports
    overlap); the first run waits for it to be ready and forks from it, no second server."""
    subproc.prestart_fork_server()
    early = subproc._SERVER
    assert early is not None and early.proc.poll() is None
    doc = _run()
    assert doc["timings"]["forked"] and subproc._SERVER is early and early.ready
    subproc.prestart_fork_server()  # a second call starts nothing
    assert subproc._SERVER is early
