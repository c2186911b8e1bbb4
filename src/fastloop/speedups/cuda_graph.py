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
graphed through ``torch.compile(mode="reduce-overhead")`` with a fused optimizer.
Changes the train step.
"""

from __future__ import annotations

from fastloop.speedups.base import Context, Speedup, StepPlan, register

__all__ = ["CudaGraph"]


@register
class CudaGraph(Speedup):
    __doc__ = __doc__
    name = "cuda_graph"
    changes = "step"
    order = 60
    needs_cuda = True

    def apply_step(self, plan: StepPlan, ctx: Context) -> None:
        plan.cuda_graph = True
