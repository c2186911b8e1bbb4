"""``compile``: ``torch.compile`` of the model (Inductor: fused kernels, fewer launches).

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/compile.md``.
Options: ``mode`` (``default``, ``reduce-overhead``, ``max-autotune``, ...): ``compile:max-autotune``;
``shapes`` (``auto``: torch's rule, a second shape recompiles with dynamic sizes; ``static``: one
graph per shape; ``dynamic``: dynamic sizes from the first): ``compile:shapes=static``.
Changes the model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from fastloop._torch_private import compiled_graph_count, dynamo_counters, first_graph_break
from fastloop.speedups.base import Speedup, register
from fastloop.speedups.compile.cache import hold_compile_cache
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.options import Options, option
from fastloop.speedups.run import Run
from fastloop.speedups.torch_facts import raised_by_compiler

__all__ = [
    "CUDAGRAPH_MODES",
    "Compile",
    "apply_compile",
    "check_compiled",
    "compile_counters",
    "compiled_by_user",
    "compiled_nothing",
    "compiles",
    "graphs_so_far",
]

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")
"""The modes in which torch.compile replays CUDA graphs."""


GRAPHED_BY_COMPILE = "forward+backward graphed"
"""cuda_graph's second tier (``cuda_graph.TIERS[1]``, which imports this module): compile's CUDA graphs."""

SHAPES = {"auto": None, "static": False, "dynamic": True}
"""``shapes`` option -> ``torch.compile(dynamic=...)``: auto (torch's automatic dynamic shapes: a
second shape recompiles once with dynamic sizes), static (one graph per shape, each specialised:
under pad_buckets one per bucket), dynamic (one graph with dynamic sizes from the first shape)."""


def apply_compile(model: torch.nn.Module, mode: str = "default", shapes: str = "auto") -> torch.nn.Module:
    """Compile ``model`` in place (``nn.Module.compile``), so references to it stay valid;
    ``mode`` and ``shapes`` are checked as the speedup's options are (:class:`CompileOptions`)."""
    CompileOptions(mode=mode, shapes=shapes)
    model.compile(mode=None if mode == "default" else mode, dynamic=SHAPES[shapes])
    return model


def compiled_by_user(model: torch.nn.Module) -> bool:
    """Whether ``model`` is the wrapper ``torch.compile(module)`` returns (the user's own compile;
    fastloop compiles in place and never makes one). Compiling it again would compile the
    compiled module, in fastloop's mode instead of the user's."""
    return type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod")


def compile_counters() -> dict:
    """Dynamo's graph and recompile counters (process-wide); ``recompiles`` is None where this
    torch keeps no such counter (2.14 does not: a 0 there would claim none happened)."""
    counters = dynamo_counters()
    return {
        "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "recompiles": int(sum(counters["recompiles"].values())) if "recompiles" in counters else None,
    }


@dataclass(frozen=True, kw_only=True)
class CompileOptions(Options):
    """Options of ``compile``."""

    speedup = "compile"
    mode: str = option(
        "default", "torch.compile mode (reduce-overhead and max-autotune replay CUDA graphs)", choices=MODES
    )
    shapes: str = option(
        "auto",
        "batch shapes: auto (torch's rule: a second shape recompiles with dynamic sizes), "
        "static (one graph per shape: under pad_buckets one per bucket), dynamic (dynamic "
        "sizes from the start)",
        choices=tuple(SHAPES),
    )


@register
class Compile(Speedup):
    __doc__ = __doc__
    name = "compile"
    trains = "reordered"  # fused kernels sum floats in another order
    ladder = LadderTraits(ablation_rank=0, in_default=True)
    compiles = True
    changes = "model"
    order = 50
    warmup_cost = True

    options_type = CompileOptions

    def apply(self, run: Run) -> None:
        run.compile_step(self.opts.mode, shapes=self.opts.shapes)
        hold_compile_cache(run)  # compile is lazy: the cache is in place before the first step compiles

    def uses_cudagraphs(self) -> bool:
        return self.compile_mode() in CUDAGRAPH_MODES

    def compile_mode(self) -> str:
        return self.opts.mode

    def run_stats(self) -> dict:
        return {"compile_counters": compile_counters()}

    def claims(self, err: BaseException) -> bool:
        return raised_by_compiler(err)

    def fallback_variant(self, err: BaseException) -> Compile | None:
        """A CUDA-graph failure of reduce-overhead/max-autotune keeps the compiled kernels:
        the run is repeated without the graphs (default mode, or max-autotune-no-cudagraphs)."""
        if not self.uses_cudagraphs() or "cudagraph" not in f"{err}".lower():
            return None
        mode = "max-autotune-no-cudagraphs" if self.compile_mode() == "max-autotune" else "default"
        return Compile(mode=mode, shapes=self.opts.shapes)


def graphs_so_far() -> tuple[int, int]:
    """(graphs Dynamo compiled, frames it tried) in this process: taken before the run trains,
    for :func:`compiled_nothing` after it."""
    return compiled_graph_count()


def compiles(speedup: Speedup) -> bool:
    """The one rule of both adapters: ``speedup`` compiles the step (its own mode, or compile's
    CUDA graphs in one of cuda_graph's tiers), so its run is checked by :func:`check_compiled`."""
    return speedup.compile_mode() is not None or speedup.uses_cudagraphs()


def check_compiled(ctx: Any, speedups: Iterable[Speedup], before: tuple[int, int] | None) -> None:
    """After a run, in both adapters: each applied speedup that compiles (:func:`compiles`) but
    whose run compiled no graph is ``fallback`` with torch's first graph-break reason, and a tier
    it had recorded (``NAME_tier``) becomes ``eager``."""
    for s in speedups:
        if not (compiles(s) and ctx.applied(s.name)):
            continue
        tier = ctx.stats.get(f"{s.name}_tier")
        why = compile_fell_back(before, compile_mode=s.compile_mode(), graphed_by_compile=tier == GRAPHED_BY_COMPILE)
        if why:
            if tier is not None:
                ctx.stats[f"{s.name}_tier"] = "eager"
            ctx.record(s.name, "fallback", why)


def compile_fell_back(
    before: tuple[int, int] | None, *, compile_mode: str | None, graphed_by_compile: bool
) -> str | None:
    """The one rule of both adapters, after the run: a speedup that compiled (its own
    ``compile_mode``, or cuda_graph's second tier through compile's graphs) when the process
    compiled no graph since ``before`` is ``fallback`` with this reason; else None."""
    if before is None or (compile_mode is None and not graphed_by_compile):
        return None
    return compiled_nothing(before)


def compiled_nothing(before: tuple[int, int]) -> str | None:
    """Why a run that asked for compile ran eagerly (frames were tried since ``before`` and none
    gave a graph), or None. Both adapters record it the same way: ``fallback`` with this reason."""
    graphs, frames = compiled_graph_count()
    if graphs == before[0] and frames > before[1]:
        why = first_graph_break() or "no frame of the model was compiled"
        return f"torch.compile compiled no graph, the steps ran eagerly: {why}"
    return None
