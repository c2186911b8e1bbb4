"""``cuda_graph``: the whole train step captured once as a CUDA graph and replayed.

Card:
- Helps: launch-bound steps (small models, small batches): one graph launch replaces
  hundreds of kernel launches and their Python overhead (tiny MLP on our H200: 7.2x).
- Hurts: a GPU data pipeline on its own streams when CUDA has too few hardware queues: with
  CUDA's default 8, DALI's kernels that share a queue with the training stream wait behind the
  whole captured step (DALI-fed ResNet-50 on our H200: 0.81x of synthetic data, data wait 20%;
  0.99x with the 32 queues fastloop's command line asks for, see :mod:`fastloop.cuda_env`);
  steps with host syncs (``.item()``, printing, data-dependent control flow), dynamic
  shapes, or CPU-side logic per step: these are checked before capture and the step runs
  eagerly with the cause recorded. A short last batch runs eagerly.
- Costs: a few warm-up steps and the capture (reported apart); static input buffers and
  a private memory pool; the optimizer is made capturable.
Plain loop: forward + backward + optimizer step in one graph. Lightning: the whole step too
(``fastloop.lightning_graph``): one call of the ``optimizer_step`` hook, with the
``training_step`` and backward it runs, is captured after warm-up and replayed, the batch copied
into static buffers, the values ``training_step`` logs re-logged after each replay (CIFAR
ResNet-18 on our H200: the step went from host-bound 5.5 ms to GPU-bound 4.0 ms). Where a hook of
the module or of a callback runs inside the step, or with manual optimization, gradient
accumulation, fp16's GradScaler or several processes, Lightning falls back to forward and
backward through ``torch.compile(mode="reduce-overhead")`` with a fused optimizer (compile's own
mode raised when ``compile`` is also requested: one compilation). A host sync in the step, a
Python value logged from it, or a capture error leaves the steps eager in the same run, the
record ``fallback`` with the cause; elsewhere a capture error repeats the run without cuda_graph.
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
