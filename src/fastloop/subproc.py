"""Run one measured configuration in a fresh Python process (compile caches, allocator state
and TF32 flags must not leak between the configurations being compared).

The child runs in its own process group, so Ctrl-C in the terminal reaches only the leader,
which then ends the whole group (the child and its DataLoader workers) at once. If the leader
is killed outright, the kernel sends the child SIGKILL (``PR_SET_PDEATHSIG``), and its loader
workers notice that their parent is gone and exit.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from fastloop.errors import FastloopError

__all__ = ["ConfigurationFailed", "run_in_subprocess"]


class ConfigurationFailed(FastloopError):
    """A configuration's process ended without a result. ``returncode`` 1 means the user's code
    raised there (``detail`` holds the child's message), 2 bad input, anything else a crash."""

    def __init__(self, message: str, returncode: int | None, detail: str = "") -> None:
        super().__init__(message)
        self.returncode = returncode
        self.detail = detail


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setpgrp()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: killed when the leader dies
    except OSError:  # pragma: no cover - not Linux
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_in_subprocess(target: str, speedups: str, *, steps: int, warmup: int, device: str,
                      timeout: float = 3600, devices: int = 1, strategy: str | None = None) -> dict:
    """``fastloop run`` in a child process; returns its JSON document.

    Raises :class:`ConfigurationFailed` when the child ends without a result (its last stderr
    line is the reason) and ``KeyboardInterrupt`` after ending the child's process group.
    """
    with tempfile.TemporaryDirectory(prefix="fastloop-") as tmp:
        path = os.path.join(tmp, "run.json")
        cmd = [sys.executable, "-m", "fastloop.cli", "run", target, "--speedups", speedups or "none",
               "--steps", str(steps), "--warmup", str(warmup), "--device", device, "--json", path, "--quiet"]
        if devices > 1 or strategy:  # the ranks are started by Lightning inside the child
            cmd += ["--devices", str(devices), "--strategy", strategy or "ddp", "--no-scaling"]
        env = dict(os.environ)
        src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join([src, os.getcwd(), env.get("PYTHONPATH", "")])
        err_path = os.path.join(tmp, "stderr.txt")
        with open(err_path, "w") as err_file:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file, env=env,
                                    preexec_fn=_die_with_parent)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise ConfigurationFailed(f"configuration {speedups!r} ran past {timeout:.0f} s and was stopped", None) from None
            except BaseException:  # Ctrl-C or any error in the leader: the group ends with it
                _kill_group(proc)
                raise
            _kill_group(proc)  # loader workers the child left behind
        with open(err_path, errors="replace") as f:
            stderr = f.read()
        if rc != 0 or not os.path.exists(path):
            lines = [ln for ln in stderr.strip().splitlines() if ln.strip()] or [f"(exit status {rc}, no output)"]
            last = lines[-1].removeprefix("fastloop: error: ")
            raise ConfigurationFailed(f"configuration {speedups!r} failed in its process: {last}", rc, stderr)
        with open(path) as f:
            doc = json.load(f)
        # the child's whole life as the leader saw it (interpreter start and imports included)
        doc.setdefault("timings", {})["process_s"] = time.perf_counter() - t0
        return doc
