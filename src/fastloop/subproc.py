"""Run one measured configuration in a fresh Python process (compile caches, allocator state
and TF32 flags must not leak between the configurations being compared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from fastloop.errors import FastloopError

__all__ = ["run_in_subprocess"]


def run_in_subprocess(target: str, speedups: str, *, steps: int, warmup: int, device: str,
                      timeout: float = 3600) -> dict:
    """``fastloop run`` in a child process; returns its JSON document."""
    with tempfile.TemporaryDirectory(prefix="fastloop-") as tmp:
        path = os.path.join(tmp, "run.json")
        cmd = [sys.executable, "-m", "fastloop.cli", "run", target, "--speedups", speedups or "none",
               "--steps", str(steps), "--warmup", str(warmup), "--device", device, "--json", path, "--quiet"]
        env = dict(os.environ)
        src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join([src, os.getcwd(), env.get("PYTHONPATH", "")])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0 or not os.path.exists(path):
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise FastloopError(f"configuration {speedups!r} failed in its process: {last}")
        with open(path) as f:
            return json.load(f)
