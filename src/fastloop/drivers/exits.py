"""How the ``fastloop`` command ends: the Ctrl-C deadline, and leaving at once with a status
(loader workers and the fork server killed, output flushed), also where a rank's peer failed.

Example:
    >>> peer_failed(ValueError("shapes do not match"))
    False
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time

__all__ = ["INTERRUPT_DEADLINE_S", "arm_interrupt_deadline", "distributed_left_open", "leave_now", "peer_failed"]


INTERRUPT_DEADLINE_S = 1.2
"""After Ctrl-C the command has this long to write what it finished; then it ends regardless."""


def arm_interrupt_deadline() -> None:
    """On the first Ctrl-C, a timer ends the process (status 130, its loader workers and other
    children killed) if the orderly path (Lightning's shutdown, writing the reports) has not
    finished within :data:`INTERRUPT_DEADLINE_S`; the orderly path runs meanwhile as usual."""

    def deadline() -> None:
        time.sleep(INTERRUPT_DEADLINE_S)
        sys.stderr.write("fastloop: interrupted\n")
        leave_now(130)

    def on_sigint(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C changes nothing now
        threading.Thread(target=deadline, daemon=True).start()
        raise KeyboardInterrupt

    def again(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = sys.unraisablehook

    def unraisable(args: object) -> None:
        # Ctrl-C that landed in a weakref callback or __del__ (matplotlib's, while a report is drawn)
        # is swallowed there with a traceback: raise it again in the main thread's code instead
        if (
            isinstance(getattr(args, "exc_value", None), KeyboardInterrupt)
            and threading.current_thread() is threading.main_thread()
        ):
            signal.signal(signal.SIGINT, again)
            import _thread

            threading.Timer(0.01, _thread.interrupt_main).start()  # after the callback has returned
            return
        previous(args)  # type: ignore[arg-type]

    sys.unraisablehook = unraisable
    signal.signal(signal.SIGINT, on_sigint)


_PEER_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "remote worker",
    "distbackenderror",
    "communicator was aborted",
    "broken pipe",
)


def peer_failed(err: BaseException) -> bool:
    """In a multi-rank run: did this rank fail only because another rank died (a collective
    lost its peer)?"""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1 and "MASTER_PORT" not in os.environ:
        return False  # not a rank (Lightning's launcher sets MASTER_PORT in rank 0, WORLD_SIZE in the others)
    seen, e = set(), err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = f"{type(e).__name__}: {e}".lower()
        if any(m in text for m in _PEER_MARKERS):
            return True
        e = e.__cause__ or e.__context__
    return False


def distributed_left_open() -> bool:
    """True when this process still holds a torch.distributed process group (a multi-rank run
    that ended in an error: Lightning's teardown did not destroy it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.distributed.is_available() and torch.distributed.is_initialized())
    except Exception:  # noqa: BLE001 - a probe at exit
        return False


def leave_now(rc: int) -> None:
    """End the process at once with ``rc``: loader workers and the fork server killed, output flushed."""
    for child in multiprocessing.active_children():  # DataLoader workers
        child.kill()
    subproc = sys.modules.get("fastloop.drivers.subproc")
    if subproc is not None:
        subproc._stop_fork_server()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
