"""``bf16`` and ``fp16``: autocast mixed precision.

The cards (when each helps, when it hurts, what it costs, with measured figures):
``docs/speedups/bf16.md`` and ``docs/speedups/fp16.md``.
Both change the train step; they cannot be combined.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fastloop.speedups.base import Context, Speedup, register
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.run import Run

__all__ = ["BF16", "FP16", "held_on_skipped_steps"]

HELD_STAT = "fp16_scheduler_steps_held"
"""The run's ``extra`` key counting scheduler steps held (both adapters)."""


def held_on_skipped_steps(step: Callable[..., Any], skipped: Callable[[], bool], ctx: Context) -> Callable[..., Any]:
    """fp16's rule for LR schedulers, the same in both adapters: a scheduler step that follows an
    optimizer step the GradScaler skipped (inf/NaN gradients) does not advance the schedule; the
    held steps are counted in ``ctx.stats[HELD_STAT]``. ``skipped()`` tells about the last
    optimizer step (one host read of the scale or the inf flag per scheduler step).

    Example:
        >>> calls = []
        >>> ctx = Context(torch.device("cpu"))
        >>> step = held_on_skipped_steps(lambda: calls.append(1), lambda: True, ctx)
        >>> step(); calls, ctx.stats[HELD_STAT]
        ([], 1)
    """

    def step_unless_skipped(*args: Any, **kwargs: Any) -> Any:
        if skipped():
            ctx.stats[HELD_STAT] = ctx.stats.get(HELD_STAT, 0) + 1
            return None
        return step(*args, **kwargs)

    return step_unless_skipped


@register
class BF16(Speedup):
    __doc__ = __doc__
    name = "bf16"
    ladder = LadderTraits(ablation_rank=5, in_default=True)
    changes = "step"
    order = 30
    math_dtype = "bf16"
    conflicts = ("fp16",)
    trains = "band"

    def band(self) -> float:
        return 2.0**-7  # bf16's machine epsilon: 8 significant bits

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
    ladder = LadderTraits(ablation_rank=6)
    changes = "step"
    order = 31
    math_dtype = "fp16"
    conflicts = ("bf16",)
    trains = "band"

    def band(self) -> float:
        return 2.0**-10  # fp16's machine epsilon: 11 significant bits

    def why_not(self, ctx: Context) -> str | None:
        if not ctx.cuda:
            return "no CUDA (fp16 autocast with loss scaling is a GPU feature; use bf16 on CPU)"
        return None

    def apply(self, run: Run) -> None:
        run.autocast(torch.float16, scale_loss=True)
