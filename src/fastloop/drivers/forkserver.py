"""A fork server for configuration runs: the slow imports once, a fresh process per run.

Every measured configuration runs in a process of its own (caches, allocator state and global
flags must not leak between the configurations being compared). Starting Python and importing
torch and Lightning costs ~3.5 s on a 2-core machine, several times the run itself for a small
model, and a ladder makes dozens of runs. This server imports fastloop's runner (torch,
Lightning) once and forks one child per run: each child is still a new process, with its own
CUDA context (the server never initializes CUDA), its own process group and the same exit
status and files as ``python -m fastloop.cli run ...``.

Protocol (one JSON object per line): the leader writes ``{"argv", "stderr", "env", "cwd"}``; the
server answers ``{"pid"}`` when the child starts and ``{"pid", "rc"}`` when it ends. The server
dies with the leader (``PR_SET_PDEATHSIG``), and each child with the server.

``FASTLOOP_FORKSERVER=0`` turns it off (every run then starts Python afresh).

The first request whose arguments name a compiling speedup
(:attr:`~fastloop.speedups.base.Speedup.compiles`) also makes the server import torch's compiler
stack (:data:`COMPILER_MODULES`: Inductor's code generators and the partitioner) before it forks:
each compiling child would otherwise import it again, 3.3 s on a 2-core machine for a first
``torch.compile`` (4.4 s -> 1.1 s with them imported), paid by every compile run of a ladder.
Importing them initializes no CUDA (checked; the server gives the preload up otherwise).
``FASTLOOP_FORKSERVER_PRELOAD=0`` turns that off.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import traceback
from typing import Any

from fastloop.drivers.subproc import die_with_parent

__all__ = ["serve"]


def _child(req: dict) -> int:
    die_with_parent()  # its own group (the leader ends it and its loader workers with one killpg)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(err, 2)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    if req["cwd"] not in sys.path:
        sys.path.insert(0, req["cwd"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = ["fastloop", *req["argv"]]
    return _ENTRY[0](req["argv"])


COMPILER_MODULES = (
    "torch._inductor.compile_fx",
    "torch._inductor.codegen.cpp",
    "torch._inductor.codegen.triton",
    "torch._inductor.codegen.wrapper",
    "torch._functorch.partitioners",
)
"""What a first ``torch.compile`` imports that importing torch does not (the slow part of it)."""


def wants_compiler(argv: list[str]) -> bool:
    """Whether a run's arguments name a compiling speedup.

    Example:
        >>> wants_compiler(["run", "gpt", "--speedups", "bf16,compile"]), wants_compiler(["run", "gpt"])
        (True, False)
    """
    from fastloop.speedups import REGISTRY  # the server imports torch before its first request
    from fastloop.speedups.base import name_of

    words = {name_of(w) for arg in argv for w in arg.replace("+", ",").split(",") if w}
    return any(cls.compiles for name, cls in REGISTRY.items() if name in words)


def preload_compiler() -> list[str]:
    """Import :data:`COMPILER_MODULES` (those that import here); returns the ones imported. Each
    must leave CUDA uninitialized: the first that does not stops the preload."""
    import importlib

    import torch

    done = []
    for name in COMPILER_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a backend missing here (no triton) is the child's to meet
            continue
        if torch.cuda.is_initialized():
            break
        done.append(name)
    return done


ENTRY = "FASTLOOP_FORKSERVER_ENTRY"
"""The environment variable naming the function a forked run calls with its arguments
(``module:function``; the leader hands the command line's ``fastloop.cli:main``): this module
sits below the command line and does not import it."""


_ENTRY: list = []  # the resolved entry point, once the server started (its children use it)


def entry_point() -> Any:
    """The function each forked run calls with its arguments, as the leader named it."""
    module, _, name = os.environ.get(ENTRY, "fastloop.cli:main").partition(":")
    return getattr(importlib.import_module(module), name)


def _send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def serve() -> None:
    """Import, report ready, then fork one child per request line until stdin closes (the leader
    started this process in its own group, to be killed when the leader dies)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the leader's to handle
    # torch.cuda.is_available() without initializing the CUDA driver here (a driver initialized
    # before fork() is unusable in the child); each child initializes its own
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    _ENTRY.append(entry_point())  # the command line's imports, which every run needs, paid once
    import torch

    import fastloop.drivers.runner  # noqa: F401

    if torch.cuda.is_initialized():
        _send({"error": "CUDA was initialized while importing; forked runs could not use it"})
        return
    _send({"ready": True})
    preload = os.environ.get("FASTLOOP_FORKSERVER_PRELOAD", "1") != "0"
    for line in sys.stdin:
        req = json.loads(line)
        if preload and wants_compiler(req.get("argv", [])):
            preload = False
            preload_compiler()
            if torch.cuda.is_initialized():
                _send({"error": "CUDA was initialized while importing the compiler; forked runs could not use it"})
                return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            rc = 1
            try:
                rc = _child(req)
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
            except BaseException:  # noqa: BLE001 - reported on the child's stderr file
                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(rc)
        _send({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send({"pid": pid, "rc": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    serve()
