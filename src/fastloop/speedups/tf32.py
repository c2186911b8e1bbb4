"""``tf32``: TensorFloat-32 for fp32 matmuls and cuDNN convolutions.

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/tf32.md``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from fastloop.speedups.base import Context, Speedup, register
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.run import Run

__all__ = ["TF32", "apply_tf32"]


def apply_tf32(enabled: bool = True) -> dict:
    """Set TF32 for matmul and cuDNN; returns the previous settings for restoring."""
    prev = {
        "matmul": torch.backends.cuda.matmul.allow_tf32,
        "cudnn": torch.backends.cudnn.allow_tf32,
        "precision": torch.get_float32_matmul_precision(),
    }
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    return prev


def restore_tf32(prev: dict) -> None:
    torch.backends.cuda.matmul.allow_tf32 = prev["matmul"]
    torch.backends.cudnn.allow_tf32 = prev["cudnn"]
    torch.set_float32_matmul_precision(prev["precision"])


@register
class TF32(Speedup):
    __doc__ = __doc__
    name = "tf32"
    changes = "step"
    order = 20
    needs_cuda = True
    math_dtype = "tf32"
    ladder = LadderTraits(in_default=True)
    trains = "band"

    def band(self) -> float:
        return 2.0**-10  # TF32's machine epsilon: 11 significant bits (fp32's range)

    def why_not(self, ctx: Context) -> str | None:
        if not ctx.cuda:
            return "no CUDA"
        if torch.cuda.get_device_capability(ctx.device)[0] < 8:
            return f"{torch.cuda.get_device_name(ctx.device)} has no TF32 (needs Ampere, sm_80+)"
        return None

    def apply(self, run: Run) -> None:
        run.hold(lambda: self.run_context(run.ctx))

    @contextlib.contextmanager
    def run_context(self, ctx: Context) -> Iterator[None]:
        prev = apply_tf32(True)
        try:
            yield
        finally:
            restore_tf32(prev)
