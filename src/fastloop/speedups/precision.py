"""``bf16`` and ``fp16``: autocast mixed precision.

Card (bf16):
- Helps: any matmul/conv-heavy model on Ampere+ (2x over tf32 for GPT-2 on our H200).
- Hurts: ops autocast keeps in fp32 stay fp32; losses differ from fp32 by bf16 rounding
  (~1e-2 relative per step, trajectories stay close).
- Costs: nothing; no loss scaling needed (bf16 has fp32's exponent range).
Card (fp16):
- Helps: GPUs without bf16 (V100, T4).
- Hurts: overflow: a GradScaler skips steps whose gradients are inf/NaN; fastloop counts
  them and does not advance the LR scheduler on a skipped step (plain loop and Lightning).
- Costs: the scaler's unscale pass per step.
Both change the train step; they cannot be combined.
"""

from __future__ import annotations

import torch

from fastloop.speedups.base import Context, Speedup, StepPlan, register

__all__ = ["BF16", "FP16"]


@register
class BF16(Speedup):
    __doc__ = __doc__
    name = "bf16"
    changes = "step"
    order = 30
    in_default_ladder = True
    math_dtype = "bf16"
    conflicts = ("fp16",)

    def why_not(self, ctx: Context) -> str | None:
        if ctx.cuda and not torch.cuda.is_bf16_supported():
            return f"{torch.cuda.get_device_name(ctx.device)} does not support bf16 (use fp16)"
        return None

    def apply_step(self, plan: StepPlan, ctx: Context) -> None:
        plan.autocast_dtype = torch.bfloat16


@register
class FP16(Speedup):
    __doc__ = __doc__
    name = "fp16"
    changes = "step"
    order = 31
    math_dtype = "fp16"
    conflicts = ("bf16",)

    def why_not(self, ctx: Context) -> str | None:
        if not ctx.cuda:
            return "no CUDA (fp16 autocast with loss scaling is a GPU feature; use bf16 on CPU)"
        return None

    def apply_step(self, plan: StepPlan, ctx: Context) -> None:
        plan.autocast_dtype = torch.float16
        plan.grad_scaler = True
