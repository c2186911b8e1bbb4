"""Ctrl-C to a ladder whose configuration runs loader workers: exit 130 within 2 s, no process
of it left 1 s later, and report.json valid with the finished runs, marked interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _processes_with(mark: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if mark.encode() in (d / "environ").read_bytes():
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def _bound_s() -> float:
    """2 s, the promise, on a machine that is not oversubscribed (0.1-0.4 s measured since the
    leader skips the interpreter's teardown after Ctrl-C; 1.6-4.9 s before, which failed this test
    in a CI-like run); on one whose load average already exceeds its cores (other jobs running),
    the same work takes proportionally longer, so the bound scales with that measured load."""
    cores = len(os.sched_getaffinity(0))
    return 2.0 * max(1.0, os.getloadavg()[0] / cores)


def _start(tmp_path: Path, cmd: str, **extra_env: str) -> tuple[subprocess.Popen, str, Path]:
    mark = f"FASTLOOP_TEST_MARK={uuid.uuid4().hex}"
    env = dict(os.environ, FASTLOOP_TEST_MARK=mark.split("=", 1)[1], **extra_env)
    out = tmp_path / "rep"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fastloop.cli",
            cmd,
            "tests/targets.py:slow_workers",
            "--device",
            "cpu",
            "--steps",
            "200",
            "--warmup",
            "2",
            "--out",
            str(out),
            "--quiet",
            # long runs (200 steps of ~0.16 s, not the 1 s CPU window): the command is
            # surely still running when the test sends Ctrl-C
            *(["--measure-s", "20", "--budget", "3000"] if cmd == "ladder" else []),
            *(["--rungs", "fused_optimizer"] if cmd == "ladder" else ["--a", "none", "--b", "fused_optimizer"]),
        ],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, mark, out


def _wait_for_a_finished_run(out: Path, proc: subprocess.Popen, limit: float = 240) -> None:
    t0 = time.time()
    while time.time() - t0 < limit:
        if (out / "report.json").exists():
            doc = json.loads((out / "report.json").read_text())
            rungs = doc.get("rungs") or [doc.get("a", {})]
            if any(r.get("repeats") for r in rungs):
                return
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    raise AssertionError("no run finished in time")


def _ctrl_c_when_running(proc: subprocess.Popen, mark: str, processes: int, settle: float = 0.0) -> None:
    """Wait until ``processes`` of the command run, send Ctrl-C, and check the promise: status
    130 within the bound, no traceback, and none of its processes left 1 s later."""
    try:
        deadline = time.time() + 60
        while len(_processes_with(mark)) < processes and time.time() < deadline:
            time.sleep(0.2)
        assert len(_processes_with(mark)) >= processes, f"expected {processes} processes of the command"
        time.sleep(settle)
        bound = _bound_s()
        t0 = time.time()
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=10)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert rc == 130, err
    assert took < bound, (took, bound)
    assert "Traceback" not in err
    time.sleep(1.0)
    assert _processes_with(mark) == []


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_ctrl_c_to_a_ladder_with_loader_workers(tmp_path):
    proc, mark, out = _start(tmp_path, "ladder")
    _wait_for_a_finished_run(out, proc)
    _ctrl_c_when_running(proc, mark, 3)  # the leader, the next configuration and its loader workers
    doc = json.loads((out / "report.json").read_text())
    assert doc["interrupted"] is True
    assert any(r.get("repeats") for r in doc["rungs"])  # the finished runs are kept
    assert "Interrupted" in (out / "report.md").read_text()
    assert not list(out.glob(".fastloop-*"))  # no temporary file left behind


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_a_killed_leader_takes_its_children_along(tmp_path):
    proc, mark, out = _start(tmp_path, "ab")
    try:
        _wait_for_a_finished_run(out, proc)
        deadline = time.time() + 60
        while len(_processes_with(mark)) < 3 and time.time() < deadline:
            time.sleep(0.2)
        proc.kill()  # SIGKILL: no chance to clean up
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.time() + 5
    while _processes_with(mark) and time.time() < deadline:
        time.sleep(0.2)
    assert _processes_with(mark) == []
    json.loads((out / "report.json").read_text())  # what was written is whole


def _descendants(pid: int) -> set[int]:
    """The processes below ``pid`` now (children, grandchildren, ...), from /proc."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_nothing_outlives_a_killed_ladder(sig, tmp_path):
    """The leader of a ladder whose configuration runs 2 loader workers (the leader's
    grandchildren) dies by ``sig``: 2 s later no process it started is alive, and its run
    folder is gone (here the watchdog removed it; a folder a fully killed run left is removed by
    the next run's sweep, tested in test_a_dead_runs_folder_is_swept_and_a_live_one_kept)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc, mark, out = _start(tmp_path, "ladder", TMPDIR=str(tmpdir))
    try:
        _wait_for_a_finished_run(out, proc)
        deadline = time.time() + 60
        while time.time() < deadline:  # watchdog, fork server, configuration run, 2 loader workers
            below = _descendants(proc.pid)
            if len(below) >= 5 and list(tmpdir.glob("fastloop-*")):
                break
            time.sleep(0.2)
        assert len(below) >= 5, below
        assert list(tmpdir.glob("fastloop-*/.owner"))
        proc.send_signal(sig)
        proc.wait(timeout=10)
        time.sleep(2.0)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [p for p in below if _alive(p)] == []
    assert _processes_with(mark) == []
    assert list(tmpdir.glob("fastloop-*")) == []


def test_a_dead_runs_folder_is_swept_and_a_live_one_kept(tmp_path):
    """A folder whose run died with its watchdog (both SIGKILLed) is removed by the next sweep;
    one a live process holds, and one without ``.owner``, stay."""
    code = (
        "import os, sys, time; from fastloop.drivers import reaper; import fastloop.drivers.reaper as r\n"
        "r._tell = lambda line: None\n"  # no watchdog: as if it died too
        "with reaper.run_folder() as d:\n    print(d, flush=True); time.sleep(60)\n"
    )
    env = dict(os.environ, TMPDIR=str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    live = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        dead_dir, live_dir = Path(dead.stdout.readline().strip()), Path(live.stdout.readline().strip())
        dead.kill()
        dead.wait()
        assert dead_dir.is_dir() and live_dir.is_dir()
        foreign = tmp_path / "fastloop-notours"
        foreign.mkdir()
        from fastloop.drivers.reaper import sweep_dead_folders

        assert sweep_dead_folders(str(tmp_path)) == [str(dead_dir)]
        assert not dead_dir.exists() and live_dir.is_dir() and foreign.is_dir()
    finally:
        live.kill()
        live.wait()


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_a_killed_configuration_is_failed_and_the_others_stay(tmp_path):
    """The third process (the first candidate's second run: rungs run in ladder order, bf16 first,
    and the pairs counterbalanced: none, bf16, then bf16, none) is killed: that rung is 'failed'
    with its reason; the baseline, the next rung and the final measurement are in
    report.json/md/html."""
    env = dict(os.environ, FASTLOOP_TEST_COUNTER=str(tmp_path / "count"), FASTLOOP_TEST_DIE_AT="3")
    out = tmp_path / "rep"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastloop.cli",
            "ladder",
            "tests/targets.py:dies_fourth",
            "--device",
            "cpu",
            "--rungs",
            "fused_optimizer,bf16",
            "--max-repeats",
            "3",
            "--steps",
            "5",
            "--warmup",
            "1",
            "--sequential",
            "--out",
            str(out),
            "--quiet",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads((out / "report.json").read_text())
    by = {r["rung"]: r for r in doc["rungs"]}
    assert by["+bf16"]["rung_status"] == "failed"
    assert "failed in its process" in by["+bf16"]["rung_reason"] and "-9" in by["+bf16"]["rung_reason"]
    assert by["baseline"]["repeats"] >= 1 and by["+fused_optimizer"]["repeats"] == 3
    assert by["+fused_optimizer"]["speedup_vs_prev"]["runs"] == 3
    assert doc["rungs"][-1].get("final")
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "+bf16 (failed" in md and "+fused_optimizer" in md and "+fused_optimizer" in html


@pytest.mark.slow  # CLI processes interrupted: .ci/run's second step
@pytest.mark.parametrize(
    "cmd",
    [
        ["run", "tests/targets.py:slow_workers", "--steps", "100000"],
        ["batch-size", "tests/targets.py:sleepy", "--max", "4096"],
    ],
)
def test_ctrl_c_during_run_and_batch_size(cmd, tmp_path):
    """In-process commands: Lightning turns Ctrl-C into its own shutdown and exit(1); fastloop
    answers 130 within 2 s, no traceback, and leaves no loader worker behind."""
    mark = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastloop.cli", *cmd, "--device", "cpu", "--quiet"],
        cwd=ROOT,
        env=dict(os.environ, FASTLOOP_TEST_MARK=mark),
        stderr=subprocess.PIPE,
        text=True,
    )
    _ctrl_c_when_running(proc, mark, 3 if cmd[0] == "run" else 1, settle=3.0)  # torch imported, target built


def test_ctrl_c_inside_a_weakref_callback_still_interrupts_the_main_code():
    """A Ctrl-C that lands in a weakref callback (matplotlib's, while a report is drawn) is
    swallowed there by Python with a traceback printed; the command raises it again in the main
    code, so the orderly exit runs and no traceback is printed (seen in CI)."""
    code = (
        "import signal, time, weakref\n"
        "from fastloop.drivers.exits import arm_interrupt_deadline\n"
        "arm_interrupt_deadline()\n"
        "class A: pass\n"
        "try:\n"
        "    a = A()\n"
        "    r = weakref.ref(a, lambda _: signal.raise_signal(signal.SIGINT))\n"
        "    del a\n"
        "    time.sleep(0.5)\n"
        "    print('not interrupted')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted in the main code')\n"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "interrupted in the main code" and "Traceback" not in out.stderr, out
