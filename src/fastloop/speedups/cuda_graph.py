"""``cuda_graph``: the train step captured as a CUDA graph and replayed, in tiers (the whole
step; forward and backward through compile's CUDA graphs; compiled without graphs where those
would train wrong; eager with the cause).

The card, with when it helps, when it hurts, what each tier costs and which patterns of ordinary
Lightning code reach which tier: ``docs/speedups/cuda_graph.md``. The Lightning capture is in
:mod:`fastloop.adapters.lightning_graph`, the tiers in :class:`fastloop.lightning.SpeedupCallback`, the
plain loop's in :mod:`fastloop.adapters.graph_step`.
"""

from __future__ import annotations

from fastloop.errors import GraphIneligible
from fastloop.speedups.base import Speedup, register
from fastloop.speedups.run import Run
from fastloop.speedups.torch_facts import raised_by_compiler

__all__ = ["CudaGraph", "MAX_GRAPHS"]

MAX_GRAPHS = 8
"""The most batch shapes captured (one whole-step graph each, all in one memory pool): the buckets
of ``pad_buckets``; a shape past them runs eagerly. Both adapters' captures read it."""


@register
class CudaGraph(Speedup):
    __doc__ = __doc__
    name = "cuda_graph"
    ablation_rank = 1
    compiles = True
    changes = "step"
    order = 60
    in_default_ladder = True
    warmup_cost = True
    needs_cuda = True

    def apply(self, run: Run) -> None:
        run.graph_step()

    def uses_cudagraphs(self) -> bool:
        return True

    def claims(self, err: BaseException) -> bool:
        return raised_by_compiler(err) or isinstance(err, GraphIneligible)
