"""``cuda_graph``: the whole train step captured once as a CUDA graph and replayed.

Card:
- Helps: launch-bound steps (small models, small batches): one graph launch replaces
  hundreds of kernel launches and their Python overhead (tiny MLP on our H200: 7.2x).
- Hurts: steps with host syncs (``.item()``, printing, data-dependent control flow), dynamic
  shapes, or CPU-side logic per step: these are checked before capture and the step runs
  eagerly with the cause recorded. A short last batch runs eagerly.
- Costs: a few warm-up steps and the capture (reported apart); static input buffers and
  a private memory pool; the optimizer is made capturable.
Plain loop: forward + backward + optimizer step in one graph. Lightning: forward and backward
graphed through ``torch.compile(mode="reduce-overhead")`` with a fused optimizer; each step's
start is marked (``torch.compiler.cudagraph_mark_step_begin``) so Lightning may keep a step's
outputs. With ``compile`` also requested, compile's own mode is raised to reduce-overhead (one
compilation, not two). A model that keeps a graph output across steps (a cache created in
``forward``) or a capture error falls back: the run is repeated without cuda_graph and the
record says why.
Changes the train step.
"""

from __future__ import annotations

from fastloop.graph_step import GraphIneligible
from fastloop.speedups.base import (
    Context,
    Speedup,
    StepPlan,
    raised_by_compiler,
    register,
)

__all__ = ["CudaGraph"]


@register
class CudaGraph(Speedup):
    __doc__ = __doc__
    name = "cuda_graph"
    changes = "step"
    order = 60
    in_default_ladder = True
    warmup_cost = True
    needs_cuda = True

    def apply_step(self, plan: StepPlan, ctx: Context) -> None:
        plan.cuda_graph = True

    def uses_cudagraphs(self) -> bool:
        return True

    def claims(self, err: BaseException) -> bool:
        return raised_by_compiler(err) or isinstance(err, GraphIneligible)
