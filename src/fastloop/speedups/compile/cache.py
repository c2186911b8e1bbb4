"""The compile cache that outlives the process: what ``compile`` (and ``cuda_graph``'s compiled
tier) compile is kept on disk in a directory per project, so that the next process compiling the
same graphs reads them back: the ladder's runs warm the user's fit, a second ``fastloop run`` of a
configuration compiles from the cache.

The caches are Inductor's own (its FX graph cache and AOTAutograd's cache, the Triton kernels
bundled in); fastloop only chooses where they live and says what they did. Where:
``$FASTLOOP_CACHE_DIR/compile/KEY`` (default ``~/.cache/fastloop``, or ``$XDG_CACHE_HOME/fastloop``
where that is set; ``TORCHINDUCTOR_CACHE_DIR``, when you set it, wins), with ``key.json`` beside
the entries. KEY hashes torch's, Triton's and CUDA's versions, the device (GPU name and compute
capability, or the CPU's instruction set) and the source files that define the model's modules.
Inductor keys every entry by the graph itself, so an entry is never used for other code; the
directory's key keeps projects and versions apart and makes an old one easy to find and remove.

The record (``compile_cache`` in the run's statistics): ``warm`` (every lookup hit), ``cold``
(every lookup missed: compiled from scratch), ``partly warm``, or ``none`` (nothing was looked up),
the hits, misses and bypasses torch counted, the directory and its size. A run told not to use the
cache (``--no-cache``, ``RunInputs(compile_cache=False)``) compiles in a fresh empty directory,
removed after it: a cold compile that leaves the cache as it was.

Example:
    >>> import os, tempfile, torch
    >>> from fastloop.speedups.base import RunInputs
    >>> os.environ["FASTLOOP_CACHE_DIR"] = root = tempfile.mkdtemp()
    >>> stats = {}
    >>> with CompileCache(torch.nn.Linear(2, 2), torch.device("cpu"), stats=stats):
    ...     inside = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    >>> inside.startswith(root), stats["compile_cache"]["state"], os.environ.pop("FASTLOOP_CACHE_DIR") == root
    (True, 'none', True)
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import inspect
import json
import os
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from fastloop._torch_private import inductor_cache_counters, inductor_default_cache_dir
from fastloop.speedups.run import Run

__all__ = [
    "CACHE_ENV",
    "STATS_KEY",
    "CompileCache",
    "cache_key",
    "cache_root",
    "compile_cache_dir",
    "hold_compile_cache",
]

CACHE_ENV = "FASTLOOP_CACHE_DIR"
"""Where fastloop keeps what outlives a process (its ``compile/`` folder holds the compile cache)."""
STATS_KEY = "compile_cache"
INDUCTOR_ENV, TRITON_ENV = "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"

_HELD: dict[str, int] = {}
"""The directories this process holds as Inductor's cache now (a second hold of the same run, by
compile and cuda_graph together, leaves the first one's in place)."""


def cache_root() -> Path:
    """Where fastloop keeps what outlives a process: ``$FASTLOOP_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/fastloop``, else ``~/.cache/fastloop``.

    Example:
        >>> import os
        >>> os.environ["FASTLOOP_CACHE_DIR"] = "/tmp/fl-cache"
        >>> str(cache_root()), os.environ.pop("FASTLOOP_CACHE_DIR")
        ('/tmp/fl-cache', '/tmp/fl-cache')
    """
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given).expanduser().absolute()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base).absolute() / "fastloop"


def _triton_version() -> str | None:
    for dist in ("triton", "pytorch-triton"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    return None


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return f"{torch.cuda.get_device_name(index)} sm_{major}{minor}"
    return f"{device.type} {platform.machine()} {torch.backends.cpu.get_cpu_capability()}"


def _code_files(model: torch.nn.Module | None) -> list[tuple[str, str]]:
    """(module name, source file) of the classes of ``model``'s modules, torch's own left out
    (torch's version stands for them)."""
    found: dict[str, str] = {}
    for m in model.modules() if model is not None else ():
        cls = type(m)
        if cls.__module__.split(".")[0] == "torch" or cls.__module__ in found:
            continue
        try:
            path = inspect.getsourcefile(cls)
        except (TypeError, OSError):
            path = None
        found[cls.__module__] = path or ""
    return sorted(found.items())


def cache_key(model: torch.nn.Module | None, device: torch.device) -> dict[str, Any]:
    """What the compile cache's directory is keyed by (the key itself under ``key``): torch's,
    Triton's and CUDA's versions, the device, and a hash of the source files defining ``model``'s
    modules (their names where a file cannot be read).

    Example:
        >>> import torch
        >>> facts = cache_key(torch.nn.Linear(2, 2), torch.device("cpu"))
        >>> sorted(facts), len(facts["key"])
        (['code', 'code_files', 'cuda', 'device', 'key', 'torch', 'triton'], 16)
    """
    code = hashlib.sha256()
    files = _code_files(model)
    for name, path in files:
        code.update(name.encode())
        try:
            code.update(Path(path).read_bytes())
        except OSError:
            pass  # a class without a readable file: its module's name stands for it
    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "triton": _triton_version(),
        "cuda": torch.version.cuda,
        "device": _device_name(device),
        "code": code.hexdigest()[:16],
    }
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    return {**facts, "code_files": [p for _, p in files if p], "key": key}


def compile_cache_dir(facts: dict[str, Any]) -> Path:
    """The directory of the compile cache keyed by ``facts`` (from :func:`cache_key`)."""
    return cache_root() / "compile" / facts["key"]


def _size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def _write_key(directory: Path, facts: dict[str, Any]) -> None:
    """``key.json`` beside the entries, written once (what the directory's name stands for)."""
    path = directory / "key.json"
    if path.exists():
        return
    tmp = directory / f".key.json.{os.getpid()}"
    tmp.write_text(json.dumps(facts, indent=2) + "\n")
    os.replace(tmp, path)


class CompileCache:
    """Held while a run trains: Inductor reads and writes its caches in the project's directory
    (:func:`compile_cache_dir`), or, with ``use=False``, in a fresh empty directory removed after;
    on exit the environment is as before and ``stats[STATS_KEY]`` says what the caches did.

    Args:
        model: the model compiled (its modules' source files are part of the key).
        device: the device it trains on (part of the key).
        use: read and write the project's cache (False: a cold compile that leaves it untouched).
        stats: the run's statistics, where the record goes.
    """

    def __init__(
        self, model: torch.nn.Module | None, device: torch.device, *, use: bool = True, stats: dict | None = None
    ) -> None:
        self.model, self.device, self.use = model, device, use
        self.stats = stats if stats is not None else {}
        self.directory: str | None = None
        self.chosen_by = ""
        self.facts: dict[str, Any] | None = None
        self._set = False
        self._saved: dict[str, str | None] = {}
        self._before: dict[str, int] = {}

    def __enter__(self) -> CompileCache:
        self._before = inductor_cache_counters()
        self._saved = {v: os.environ.get(v) for v in (INDUCTOR_ENV, TRITON_ENV)}
        current = self._saved[INDUCTOR_ENV]
        if current is not None and current in _HELD:  # held already by another speedup of this run
            self.directory, self.chosen_by = current, "fastloop"
        elif not self.use:
            self.directory, self.chosen_by = tempfile.mkdtemp(prefix="fastloop-compile-cold-"), "no-cache"
            self._set = True
        elif current is not None and os.path.abspath(current) != inductor_default_cache_dir():
            self.directory, self.chosen_by = current, INDUCTOR_ENV  # yours: left as you set it
        else:
            self.facts = cache_key(self.model, self.device)
            directory = compile_cache_dir(self.facts)
            directory.mkdir(parents=True, exist_ok=True)
            _write_key(directory, self.facts)
            self.directory, self.chosen_by, self._set = str(directory), "fastloop", True
        if self._set:
            os.environ[INDUCTOR_ENV] = self.directory  # Triton's cache follows (unless TRITON_CACHE_DIR is set)
            _HELD[self.directory] = _HELD.get(self.directory, 0) + 1
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._record()
        finally:
            if self._set:
                assert self.directory is not None
                _HELD[self.directory] -= 1
                if not _HELD[self.directory]:
                    del _HELD[self.directory]
                for name, value in self._saved.items():  # Inductor sets TRITON_CACHE_DIR at its first kernel
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
                if not self.use:
                    shutil.rmtree(self.directory, ignore_errors=True)

    def _record(self) -> None:
        after = inductor_cache_counters()
        delta = {k: after[k] - self._before.get(k, 0) for k in after}
        hits = delta["fxgraph_hit"] + delta["autograd_hit"]
        misses = delta["fxgraph_miss"] + delta["autograd_miss"]
        if hits + misses == 0 and STATS_KEY in self.stats:
            return  # a later part of the same run that compiled nothing keeps what the first found
        state = "none" if hits + misses == 0 else "warm" if not misses else "cold" if not hits else "partly warm"
        assert self.directory is not None
        self.stats[STATS_KEY] = {
            "state": state,
            "used": self.use,
            "dir": self.directory if self.use else None,
            "chosen_by": self.chosen_by,
            "key": self.facts,
            "hits": hits,
            "misses": misses,
            "bypassed": delta["fxgraph_bypass"] + delta["autograd_bypass"],
            "counters": delta,
            "size_bytes": _size(Path(self.directory)) if self.use else None,
        }


def hold_compile_cache(run: Run) -> None:
    """While ``run`` trains, its compiles read and write the project's compile cache (a fresh empty
    directory where the run was told not to use it: ``RunInputs.compile_cache``); the record lands
    in the run's statistics."""
    model, ctx = run.model, run.ctx
    run.hold(lambda: CompileCache(model, ctx.device, use=ctx.inputs.compile_cache, stats=ctx.stats))
