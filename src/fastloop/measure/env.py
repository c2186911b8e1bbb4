"""The environment stamp every report carries (DESIGN.md: "stamp every report")."""

from __future__ import annotations

import datetime as _dt
import functools
import platform
import subprocess
from pathlib import Path

import torch

__all__ = ["env_stamp"]


@functools.cache  # a ladder stamps its report after every run: one git and one nvidia-smi call a process
def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        # "-dirty" where the working tree differs from the commit: the figures are then not that commit's
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7", "--exclude=*"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


@functools.cache
def _driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _lightning_version() -> str | None:
    for name in ("lightning", "pytorch_lightning"):
        try:
            mod = __import__(name)
            return f"{name} {mod.__version__}"
        except ImportError:
            continue
    return None


def env_stamp() -> dict:
    """GPU, driver, CUDA, torch, lightning, python, platform, commit and date (UTC, ISO 8601)."""
    from fastloop import __version__

    cuda = torch.cuda.is_available()
    return {
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "driver": _driver() if cuda else None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "lightning": _lightning_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": __import__("os").cpu_count(),
        "cuda_device_max_connections": __import__("os").environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
        "commit": _git_commit(),
        "fastloop": __version__,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
