"""Every use of a torch private, in one place. Each says why and what public API would replace
it; ``tests/test_privates.py`` fails with a clear message when a release changes one.

Supported: torch 2.11 to 2.14 (the GPU machine and CI).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "CONV_TYPES",
    "IndexSamplerAtLength",
    "compile_call",
    "compile_event_hooks",
    "compiled_call",
    "compiled_draws_as_eager",
    "compiled_graph_count",
    "first_graph_break",
    "draw_loader_base_seed",
    "dynamo_counters",
    "dynamo_frames",
    "found_inf",
    "inductor_cache_counters",
    "inductor_default_cache_dir",
    "is_compiled",
    "loader_auto_collation",
    "loader_iterator",
    "recompile_limit_at_least",
    "scaler_scale",
    "set_compiled_call",
    "shutdown_workers",
]

# Why: "is this a convolution" for cuDNN and MFU decisions. Public alternative: listing
# Conv1d/2d/3d and the transposed ones (which is what this tuple is built from, where it can).
CONV_TYPES: tuple[type, ...] = (torch.nn.modules.conv._ConvNd,)


def scaler_scale(scaler: Any) -> torch.Tensor | None:
    """The GradScaler's current scale as a device tensor (``scaler._scale``), None before its
    first step. Why: the public ``get_scale()`` returns a Python float, a host sync per step."""
    return getattr(scaler, "_scale", None)


def found_inf(scaler: Any, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """Whether the last ``scaler.step`` found inf/NaN gradients, as a device tensor
    (``scaler._found_inf_per_device``). Why: no public API says whether a step was skipped
    without a sync; the public way compares ``get_scale()`` before and after (a sync)."""
    return sum(v for v in scaler._found_inf_per_device(optimizer).values())  # type: ignore[return-value]


def dynamo_counters() -> dict:
    """Dynamo's process-wide counters (``torch._dynamo.utils.counters``): graphs, graph breaks,
    recompiles. Why: no public API counts recompilations; ``torch._logging`` only logs them."""
    from torch._dynamo.utils import (
        counters,  # imported here: importing Dynamo costs ~1 s
    )

    return counters


def compile_event_hooks(start: Any, end: Any) -> Any:
    """Call ``start(args)`` and ``end(args)`` around every compile Dynamo runs in this process (a new
    frame, a backward compiled when first run, a CUDA graph recorded; ``args.callback_trigger``
    says which; nested compiles count once), and return the undo. Why: ``torch._dynamo.callback``'s
    handler is the one place that sees each compile begin and end, lazy backward compiles
    included; the public ``torch.compiler`` API has no such hook (``compile_times()`` totals the
    frames only, after the fact)."""
    from torch._dynamo.callback import callback_handler

    callback_handler.register_start_callback(start)
    callback_handler.register_end_callback(end)

    def undo() -> None:
        callback_handler.remove_start_callback(start)
        callback_handler.remove_end_callback(end)

    return undo


def compiled_graph_count() -> tuple[int, int]:
    """(graphs Dynamo compiled, frames it tried to convert) in this process so far
    (``counters["stats"]["unique_graphs"]``, ``counters["frames"]["total"]``). A frame tried that
    left no graph fell back to eager; no frame tried at all is a cache hit (a second fit)."""
    c = dynamo_counters()
    return int(c["stats"].get("unique_graphs", 0)), int(c["frames"].get("total", 0))


INDUCTOR_CACHE_COUNTERS = {
    "fxgraph_hit": ("inductor", "fxgraph_cache_hit"),
    "fxgraph_miss": ("inductor", "fxgraph_cache_miss"),
    "fxgraph_bypass": ("inductor", "fxgraph_cache_bypass"),
    "autograd_hit": ("aot_autograd", "autograd_cache_hit"),
    "autograd_miss": ("aot_autograd", "autograd_cache_miss"),
    "autograd_bypass": ("aot_autograd", "autograd_cache_bypass"),
}


def inductor_cache_counters() -> dict[str, int]:
    """How often Inductor's FX graph cache and AOTAutograd's cache were hit, missed and bypassed in
    this process so far (``counters["inductor"]["fxgraph_cache_*"]``,
    ``counters["aot_autograd"]["autograd_cache_*"]``). Why: the compile cache's record says
    whether a run's compiles were read from the cache (warm) or made (cold); torch logs its cache
    lookups but has no public count of them."""
    c = dynamo_counters()
    return {name: int(c[group].get(key, 0)) for name, (group, key) in INDUCTOR_CACHE_COUNTERS.items()}


def inductor_default_cache_dir() -> str:
    """The directory Inductor caches in when ``TORCHINDUCTOR_CACHE_DIR`` is not set
    (``torch._inductor.runtime.cache_dir_utils.default_cache_dir``: ``$TMPDIR/torchinductor_$USER``).
    Why: Inductor writes that default into ``TORCHINDUCTOR_CACHE_DIR`` at its first compile, after
    which the variable no longer says whether the user chose the directory."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())


def recompile_limit() -> tuple[int, bool]:
    """(Dynamo's recompile limit per frame, whether it marks a dimension dynamic once it sees it
    change): ``torch._dynamo.config.recompile_limit`` (``cache_size_limit`` before torch 2.6) and
    ``automatic_dynamic_shapes``."""
    import torch._dynamo.config as config

    limit = getattr(config, "recompile_limit", None) or getattr(config, "cache_size_limit", 8)
    return int(limit), bool(getattr(config, "automatic_dynamic_shapes", True))


@contextlib.contextmanager
def recompile_limit_at_least(limit: int) -> Iterator[None]:
    """While inside, Dynamo's recompile limit per code object is at least ``limit``
    (``torch._dynamo.config.recompile_limit``, ``cache_size_limit`` before torch 2.6); put back on exit.
    Why: every module compiled in place (``nn.Module.compile``) runs the same code object (torch
    compiles its bound ``_call_impl`` through ``torch._dynamo.external_utils.wrap_inline``'s
    ``inner``), so they all share one limit of 8: a model with three compiled children reaches it at
    its first eval-mode batch, and every frame past it runs eagerly without a word (seen on torch
    2.14). The public route would be ``torch._dynamo.config.patch``, which is the same private config."""
    import torch._dynamo.config as config

    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    before = getattr(config, name)
    setattr(config, name, max(int(before), int(limit)))
    try:
        yield
    finally:
        setattr(config, name, before)


def dynamo_frames() -> tuple[int, int]:
    """(frames Dynamo tried to convert, frames it converted) in this process so far
    (``counters["frames"]["total"]`` and ``["ok"]``): a frame tried and not converted runs eagerly
    (a recompile limit reached, a frame Dynamo cannot trace). Same private, same reason as
    :func:`dynamo_counters`."""
    frames = dynamo_counters()["frames"]
    return int(frames.get("total", 0)), int(frames.get("ok", 0))


def first_graph_break() -> str | None:
    """The first line of the first graph-break reason Dynamo counted in this process, if any."""
    breaks = dynamo_counters().get("graph_break") or {}
    first = next(iter(breaks), None)
    return str(first).strip().splitlines()[0] if first else None


def loader_auto_collation(loader: torch.utils.data.DataLoader) -> bool:
    """``loader._auto_collation``: whether the loader batches with its own BatchSampler. Why:
    rebuilding a loader needs to know whether ``batch_sampler`` was made from ``batch_size``;
    the public attributes cannot tell a default BatchSampler from a user's."""
    return bool(getattr(loader, "_auto_collation", True))


def draw_loader_base_seed(loader: torch.utils.data.DataLoader) -> None:
    """Draw from the loader's generator what a DataLoader iterator draws before its sampler runs
    (its workers' base seed, ``_BaseDataLoaderIter.__init__``), so an imitation of the loader
    (gpu_resident) shuffles exactly as the loader would. No public API exposes this order."""
    torch.empty((), dtype=torch.int64).random_(generator=loader.generator)


def compiled_call(module: torch.nn.Module) -> Any:
    """What ``nn.Module.compile`` installed on ``module`` (``module._compiled_call_impl``; None when
    not compiled). Why: after a fit the Lightning callbacks put a compiled child back as it was;
    torch has no public "uncompile"."""
    return getattr(module, "_compiled_call_impl", None)


def set_compiled_call(module: torch.nn.Module, value: Any) -> None:
    """Put back what :func:`compiled_call` returned (same private, same reason)."""
    module._compiled_call_impl = value


def compile_call(module: torch.nn.Module, **options: Any) -> Any:
    """What ``module.compile(**options)`` would install as its compiled call, without installing it
    (``torch.compile(module._call_impl, **options)``, as ``nn.Module.compile`` builds it), for
    :func:`set_compiled_call`. Why: ``fast_validation`` gives a module a second compiled call for the
    validation loop (compile's CUDA graphs, where the training step's own call cannot have them) and
    swaps it in while Lightning validates; ``nn.Module.compile`` can only replace the one it holds."""
    return torch.compile(module._call_impl, **options)


def is_compiled(module: torch.nn.Module) -> bool:
    """Whether ``module`` or any submodule was compiled in place (``nn.Module.compile``). Why: FLOP
    counting must not trace compiled code; no public API tells a compiled module apart."""
    return any(compiled_call(m) is not None for m in module.modules())


def loader_iterator(loader: torch.utils.data.DataLoader) -> Any:
    """The iterator a loader with persistent workers keeps between epochs (``loader._iterator``;
    None before the first epoch). Why: such a loader reuses it, and the workers it holds live
    until it is dropped; there is no public way to end them."""
    return getattr(loader, "_iterator", None)


def shutdown_workers(loader: Any) -> None:
    """End the persistent worker processes a DataLoader holds (``_shutdown_workers`` of its kept
    iterator, then drop the iterator). Why: the loaders fastloop built for a fit must not keep
    processes alive after it; torch ends them only when the loader is garbage-collected."""
    it = loader_iterator(loader) if isinstance(loader, torch.utils.data.DataLoader) else None
    if it is None:
        return
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    loader._iterator = None


def compiled_draws_as_eager() -> None:
    """Compiled code's random numbers (dropout, ``torch.rand`` in a compiled forward) drawn from
    the generator eager draws them from, in eager's order (``torch._inductor.config.fallback_random``;
    torch's own debugging switch for comparing compiled with eager runs). Why: a check that pairs a
    compiled run with an eager one step by step needs the same dropout masks on both sides;
    Inductor otherwise draws its own (equally random, never equal). For the check's runs only:
    the ladder's timed runs draw as Inductor does."""
    import torch._inductor.config as config

    config.fallback_random = True


class _AtLength:
    """An index sampler whose iterator stops after ``len(inner)`` items without asking for one more."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Any:
        return itertools.islice(iter(self.inner), len(self.inner))


class IndexSamplerAtLength:
    """A mixin for a DataLoader subclass (before ``DataLoader`` in its bases): its iterators take
    at most ``len`` batches of indices from the loader's index sampler and never ask it for more
    (``DataLoader._index_sampler``, what ``_BaseDataLoaderIter`` iterates; unsized ones as they are).

    Why: torch's ``RandomSampler`` with a generator draws one more permutation from it, and throws
    it away, when its iterator is asked past its last index. Lightning stops a plain loader at its
    length, so it never asks; worker processes fetch indices ahead and do, so from the second
    epoch a seeded loader with workers would shuffle otherwise than the same loader without.
    No public API bounds what a DataLoader's iterator draws from its sampler."""

    @property
    def _index_sampler(self) -> Any:
        inner = super()._index_sampler  # type: ignore[misc]
        try:
            len(inner)
        except TypeError:  # an iterable dataset's sampler has no length: nothing to bound
            return inner
        return _AtLength(inner)
