"""Nothing a run starts outlives the leader: a watchdog for process groups, and run folders that
a dead run left behind.

Each configuration's process runs in its own process group (:func:`~fastloop.drivers.subproc.die_with_parent`);
its DataLoader workers, Inductor compile workers, DDP ranks and DALI's worker processes are
started in that group. The leader tells a small watchdog process (a bare interpreter in its own
session, started once per leader, ignoring SIGINT/SIGTERM/SIGHUP) each group and each run folder
while they live. When the leader dies by any signal, SIGKILL included, the kernel closes the
watchdog's stdin; the watchdog then sends SIGKILL to every registered group and removes the
registered folders, within milliseconds. (A parent-death signal alone reaches only a direct
child: the loader workers are the leader's grandchildren, and PyTorch's own parent-alive check
runs every 5 s.)

Run folders (``$TMPDIR/fastloop-*``) also hold a lock (``flock`` on ``.owner``) while their run
lives. A later run's start removes each folder whose lock it can take: its owner is gone,
whatever happened to the watchdog. The lock belongs to the open file, not to a PID, so PID reuse
and PID namespaces on a shared ``/tmp`` cannot make a live run's folder look dead, and a folder
without ``.owner`` (not ours, or still being set up) is never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["run_folder", "sweep_dead_folders", "watch_group", "unwatch_group"]

PREFIX = "fastloop-"
OWNER = ".owner"

_WATCHDOG_CODE = r"""
import os, shutil, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
groups, dirs = set(), set()
for line in sys.stdin:
    op, _, arg = line.rstrip("\n").partition(" ")
    if op == "+g": groups.add(int(arg))
    elif op == "-g": groups.discard(int(arg))
    elif op == "+d": dirs.add(arg)
    elif op == "-d": dirs.discard(arg)
for g in groups:
    try: os.killpg(g, signal.SIGKILL)
    except OSError: pass
for d in dirs:
    shutil.rmtree(d, ignore_errors=True)
"""

_WATCHDOG: subprocess.Popen | None = None
_SWEPT = False


def _tell(line: str) -> None:
    """One line to the watchdog, started on first use (silently nothing where it cannot run)."""
    global _WATCHDOG
    if not sys.platform.startswith("linux"):  # pragma: no cover - the groups are Linux's
        return
    if _WATCHDOG is None or _WATCHDOG.poll() is not None:
        try:
            _WATCHDOG = subprocess.Popen(
                [sys.executable, "-S", "-c", _WATCHDOG_CODE],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                text=True,
            )
        except OSError:  # pragma: no cover - no processes left: the run itself would fail
            _WATCHDOG = None
            return
    try:
        assert _WATCHDOG.stdin is not None
        _WATCHDOG.stdin.write(line + "\n")
        _WATCHDOG.stdin.flush()
    except (BrokenPipeError, OSError):  # pragma: no cover - the watchdog was killed
        _WATCHDOG = None


def watch_group(pgid: int) -> None:
    """Have the watchdog end process group ``pgid`` if the leader dies before :func:`unwatch_group`."""
    _tell(f"+g {pgid}")


def unwatch_group(pgid: int) -> None:
    """The group ended (the leader killed it): the watchdog forgets it (its ID may be reused)."""
    _tell(f"-g {pgid}")


def _take(lock_path: Path) -> int | None:
    """An open, exclusively locked descriptor of ``lock_path``; None if a live run holds it."""
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def sweep_dead_folders(root: str | None = None) -> list[str]:
    """Remove the run folders under ``root`` (the temporary directory) whose owner is gone; the
    removed paths. A folder whose lock is held, or without ``.owner``, stays."""
    removed = []
    for d in Path(root or tempfile.gettempdir()).glob(PREFIX + "*"):
        fd = _take(d / OWNER) if d.is_dir() and not d.is_symlink() else None
        if fd is None:
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def run_folder() -> Iterator[str]:
    """A temporary folder for one configuration's run, locked while it lives and removed after
    it (by the watchdog if the leader dies; by a later run's sweep if both died). The first call
    in a process sweeps the folders of runs that died."""
    global _SWEPT
    if not _SWEPT:
        _SWEPT = True
        sweep_dead_folders()
    path = tempfile.mkdtemp(prefix=PREFIX)
    fd = os.open(os.path.join(path, OWNER + ".new"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # locked before it is named: a sweep never sees it unlocked
        os.rename(os.path.join(path, OWNER + ".new"), os.path.join(path, OWNER))
        _tell(f"+d {path}")
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        _tell(f"-d {path}")
        os.close(fd)
