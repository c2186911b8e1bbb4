"""``bf16`` and ``fp16``: autocast mixed precision.

The cards (when each helps, when it hurts, what it costs, with measured figures):
``docs/speedups/bf16.md`` and ``docs/speedups/fp16.md``.
Both change the train step; they cannot be combined.
"""

from __future__ import annotations

import torch

from fastloop.speedups.base import Context, Speedup, register
from fastloop.speedups.run import Run

__all__ = ["BF16", "FP16"]


@register
class BF16(Speedup):
    __doc__ = __doc__
    name = "bf16"
    ablation_rank = 5
    changes = "step"
    order = 30
    in_default_ladder = True
    math_dtype = "bf16"
    conflicts = ("fp16",)

    def why_not(self, ctx: Context) -> str | None:
        if ctx.cuda and not torch.cuda.is_bf16_supported():
            return f"{torch.cuda.get_device_name(ctx.device)} does not support bf16 (use fp16)"
        return None

    def apply(self, run: Run) -> None:
        run.autocast(torch.bfloat16)


@register
class FP16(Speedup):
    __doc__ = __doc__
    name = "fp16"
    ablation_rank = 6
    changes = "step"
    order = 31
    math_dtype = "fp16"
    conflicts = ("bf16",)

    def why_not(self, ctx: Context) -> str | None:
        if not ctx.cuda:
            return "no CUDA (fp16 autocast with loss scaling is a GPU feature; use bf16 on CPU)"
        return None

    def apply(self, run: Run) -> None:
        run.autocast(torch.float16, scale_loss=True)
