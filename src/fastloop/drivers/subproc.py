"""Run one measured configuration in a fresh Python process (compile caches, allocator state
and TF32 flags must not leak between the configurations being compared).

The child runs in its own process group, so Ctrl-C in the terminal reaches only the leader,
which then ends the whole group (the child and its DataLoader workers) at once. If the leader
is killed outright, the kernel sends the child SIGKILL (``PR_SET_PDEATHSIG``), and the watchdog
of :mod:`fastloop.drivers.reaper` ends the rest of its group (loader workers, compile workers,
DDP ranks) and removes its folder.

On Linux the process is forked from :mod:`fastloop.drivers.forkserver` (torch and Lightning imported
once per leader, not once per run); ``FASTLOOP_FORKSERVER=0``, another OS, a server that cannot
start, or a child that cannot start CUDA in a fork fall back to a new interpreter per run.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from fastloop.drivers.reaper import run_folder, unwatch_group, watch_group
from fastloop.errors import ConfigurationFailed

__all__ = ["ConfigurationFailed", "run_fresh", "run_in_subprocess"]


def die_with_parent() -> None:
    """In a child (between fork and exec, or in a forked run): its own process group, and
    SIGKILL when its parent dies."""
    os.setpgrp()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: killed when the leader dies
    except OSError:  # pragma: no cover - not Linux
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    _killpg(proc.pid)
    proc.wait()
    unwatch_group(proc.pid)


class _ForkServer:
    """The leader's side of :mod:`fastloop.drivers.forkserver` (one per leader process, started lazily)."""

    def __init__(self, env: dict, wait: bool = True) -> None:
        self.env = _import_env(env)  # torch and Lightning read some variables at import: a new env, a new server
        server_env = {**env, "FASTLOOP_FORKSERVER_ENTRY": "fastloop.cli:main"}  # the run's entry, handed down
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fastloop.drivers.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=server_env,
            preexec_fn=die_with_parent,
        )
        watch_group(self.proc.pid)
        self._buf = b""
        self.ready = False
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Block until the server has imported what every run needs (RuntimeError if it failed)."""
        if self.ready:
            return
        msg = self._read(120)
        if not msg or not msg.get("ready"):
            self.close()
            raise RuntimeError((msg or {}).get("error", "the fork server did not start"))
        self.ready = True

    def _read(self, timeout: float | None) -> dict | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise subprocess.TimeoutExpired("fastloop.drivers.forkserver", timeout or 0)
            chunk = os.read(fd, 65536)
            if not chunk:
                return None  # the server died
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def run(self, argv: list[str], err_path: str, env: dict, timeout: float) -> int | None:
        """Run ``fastloop <argv>`` in a forked child; its exit status (None: the server died)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(
            (json.dumps({"argv": argv, "stderr": err_path, "env": env, "cwd": os.getcwd()}) + "\n").encode()
        )
        self.proc.stdin.flush()
        started = self._read(60)
        if started is None or "pid" not in started:  # the server died, or gave up ({"error"}): no fork
            self.close()
            return None
        pid = started["pid"]
        watch_group(pid)
        try:
            done = self._read(timeout)
        except BaseException:  # timeout, Ctrl-C or any error in the leader: the child's group ends
            _killpg(pid)
            unwatch_group(pid)
            self.close()
            raise
        _killpg(pid)  # loader workers the child left behind
        unwatch_group(pid)
        return None if done is None else done["rc"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        unwatch_group(self.proc.pid)


RUN_TIME_ENV = frozenset({"FASTLOOP_PROFILE_STEPS"})
"""Variables fastloop reads while a run starts, not at import: a change needs no new fork server
(each forked child gets the request's whole environment)."""


def _import_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k not in RUN_TIME_ENV}


_SERVER: _ForkServer | None = None
_SERVER_OFF = False


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _server_wanted() -> bool:
    """Runs may fork from a server: on Linux, unless it failed here or FASTLOOP_FORKSERVER=0."""
    return not _SERVER_OFF and os.environ.get("FASTLOOP_FORKSERVER", "1") != "0" and sys.platform.startswith("linux")


def _fork_server(env: dict) -> _ForkServer | None:
    """The running fork server, started on first use; None when off or it cannot start."""
    global _SERVER, _SERVER_OFF
    if not _server_wanted():
        return None
    if _SERVER is not None and _SERVER.proc.poll() is None and _SERVER.env == _import_env(env):
        try:
            _SERVER.wait_ready()  # started early (prestart_fork_server): its imports may still run
            return _SERVER
        except (OSError, RuntimeError, subprocess.TimeoutExpired):
            _SERVER, _SERVER_OFF = None, True
            return None
    if _SERVER is not None:
        _SERVER.close()
    try:
        _SERVER = _ForkServer(env)
    except (OSError, RuntimeError, subprocess.TimeoutExpired):
        _SERVER, _SERVER_OFF = None, True
        return None
    atexit.register(_SERVER.close)
    return _SERVER


def prestart_fork_server() -> None:
    """Start the fork server now without waiting for it: its torch and Lightning imports run
    while the leader does its own (``fastloop ladder`` and ``ab`` call this before importing
    torch; on the 2-core CPU the two imports take ~4-8 s each). The first run waits for it."""
    global _SERVER
    if _SERVER is not None or not _server_wanted():
        return
    try:
        _SERVER = _ForkServer(child_env(), wait=False)
    except OSError:
        _SERVER = None
        return
    atexit.register(_SERVER.close)


def child_env(profile: bool = True) -> dict:
    """The environment of a configuration's process: the leader's, with fastloop and the working
    directory on ``PYTHONPATH`` (``profile=False``: no GPU profile of extra steps)."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])  # src/, above fastloop/drivers/
    env["PYTHONPATH"] = os.pathsep.join([src, os.getcwd(), env.get("PYTHONPATH", "")])
    if not profile:
        env["FASTLOOP_PROFILE_STEPS"] = "0"
    return env


def _stop_fork_server() -> None:
    """End the fork server (and stop using one in this process)."""
    global _SERVER, _SERVER_OFF
    if _SERVER is not None:
        _SERVER.close()
    _SERVER, _SERVER_OFF = None, True


_FORK_TROUBLE = (
    "forked subprocess",
    "Cannot re-initialize CUDA",
    "CUDA driver initialization failed",
    "CUDA error: initialization error",
)
"""A forked child that failed with one of these is run again the plain way, without the server."""


def run_in_subprocess(
    target: str,
    speedups: str,
    *,
    steps: int,
    warmup: int,
    device: str,
    timeout: float = 3600,
    devices: int = 1,
    strategy: str | None = None,
    profile: bool = True,
    measure_s: float | None = None,
    step_rate: float | None = None,
    compile_cache: bool = True,
    seed: int | None = None,
) -> dict:
    """``fastloop run`` in a child process; returns its JSON document.

    ``compile_cache=False``: the child compiles cold and leaves the compile cache as it was
    (``--no-cache``); else its compiles read and write the project's cache, which outlives it.

    ``step_rate``: the step rate (steps/s) the driver declares to the run (``--step-rate``).
    ``seed``: a paired run (``--seed``: :mod:`fastloop.drivers.paired_run`).

    ``profile=False`` turns the GPU profile of the extra steps after the measured ones off
    (``FASTLOOP_PROFILE_STEPS=0`` in the child): a configuration's later runs need no second one.

    Raises :class:`ConfigurationFailed` when the child ends without a result (its last stderr
    line is the reason) and ``KeyboardInterrupt`` after ending the child's process group.
    """
    with run_folder() as tmp:
        path = os.path.join(tmp, "run.json")
        cmd = [
            sys.executable,
            "-m",
            "fastloop.cli",
            "run",
            target,
            "--speedups",
            speedups or "none",
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
            "--device",
            device,
            "--json",
            path,
            "--quiet",
        ]
        if measure_s is not None:
            cmd += ["--measure-s", repr(float(measure_s))]
        if step_rate is not None:
            cmd += ["--step-rate", repr(float(step_rate))]
        if not compile_cache:
            cmd += ["--no-cache"]
        if seed is not None:
            cmd += ["--seed", str(seed)]
        if devices > 1 or strategy:  # the ranks are started by Lightning inside the child
            cmd += ["--devices", str(devices), "--strategy", strategy or "ddp", "--no-scaling"]
        env = child_env(profile)
        err_path = os.path.join(tmp, "stderr.txt")
        t_ask = time.perf_counter()
        server = _fork_server(env) if devices == 1 and not strategy else None
        t0 = time.perf_counter()
        startup_s = t0 - t_ask  # waiting for the fork server's imports: the first run's alone
        rc: int | None = None
        if server is not None:
            try:
                rc = server.run(cmd[3:], err_path, env, timeout)
            except subprocess.TimeoutExpired:
                _stop_fork_server()
                raise ConfigurationFailed(
                    f"configuration {speedups!r} ran past {timeout:.0f} s and was stopped", None
                ) from None
            stderr = _read(err_path)
            if rc is None or (rc != 0 and any(t in stderr for t in _FORK_TROUBLE)):
                # the server died, or CUDA cannot start in a fork: this and later runs the plain way
                _stop_fork_server()
                server, rc = None, None
                t0 = time.perf_counter()
        if server is None:
            rc = _plain_run(cmd, env, err_path, timeout, speedups)
            stderr = _read(err_path)
        if rc != 0 or not os.path.exists(path):
            lines = [ln for ln in stderr.strip().splitlines() if ln.strip()] or [f"(exit status {rc}, no output)"]
            last = lines[-1].removeprefix("fastloop: error: ")
            raise ConfigurationFailed(f"configuration {speedups!r} failed in its process: {last}", rc, stderr)
        with open(path) as f:
            doc = json.load(f)
        # the child's whole life as the leader saw it (with the fork server: from the fork)
        doc.setdefault("timings", {})["process_s"] = time.perf_counter() - t0
        doc["timings"]["forked"] = server is not None
        doc["timings"]["startup_s"] = startup_s if server is not None else 0.0
        return doc


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def _plain_run(cmd: list[str], env: dict, err_path: str, timeout: float, speedups: str) -> int:
    """``python -m fastloop.cli run ...`` as a new interpreter; its exit status."""
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file, env=env, preexec_fn=die_with_parent)
        watch_group(proc.pid)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise ConfigurationFailed(
                f"configuration {speedups!r} ran past {timeout:.0f} s and was stopped", None
            ) from None
        except BaseException:  # Ctrl-C or any error in the leader: the group ends with it
            _kill_group(proc)
            raise
        _kill_group(proc)  # loader workers the child left behind
    return rc


def run_fresh(cmd: list[str], env: dict, err_path: str, timeout: float, what: str) -> int:
    """``cmd`` as a new interpreter (never forked from the server: a fit pays its own imports, as
    the user's command does), in its own process group, its stderr to ``err_path``; its exit
    status. ``what`` names it in the message of a run past ``timeout``."""
    return _plain_run(cmd, env, err_path, timeout, what)
