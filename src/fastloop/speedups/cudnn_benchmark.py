"""``cudnn_benchmark``: let cuDNN time its convolution algorithms and keep the fastest.

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/cudnn_benchmark.md``.
Changes the train step (``torch.backends.cudnn.benchmark``, restored afterwards); the same
switch as Lightning's ``Trainer(benchmark=True)``. Models without convolutions are skipped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from fastloop._torch_private import CONV_TYPES
from fastloop.speedups.base import Context, Speedup, register
from fastloop.speedups.run import Run

__all__ = ["CudnnBenchmark", "apply_cudnn_benchmark", "has_conv"]


def has_conv(model: torch.nn.Module) -> bool:
    return any(isinstance(m, CONV_TYPES) for m in model.modules())


def apply_cudnn_benchmark(enabled: bool = True) -> bool:
    """Set ``torch.backends.cudnn.benchmark``; returns the previous value for restoring.

    >>> prev = apply_cudnn_benchmark(True)
    >>> torch.backends.cudnn.benchmark
    True
    >>> _ = apply_cudnn_benchmark(prev)
    """
    prev = bool(torch.backends.cudnn.benchmark)
    torch.backends.cudnn.benchmark = enabled
    return prev


@register
class CudnnBenchmark(Speedup):
    __doc__ = __doc__
    name = "cudnn_benchmark"
    trains = "reordered"  # the fastest convolution algorithm, not the default one: another summation order
    changes = "step"
    order = 21
    needs_cuda = True

    def why_not(self, ctx: Context) -> str | None:
        return None if ctx.cuda else "no CUDA"

    def why_not_model(self, model: torch.nn.Module) -> str | None:
        return None if has_conv(model) else "model has no convolution layers: nothing for cuDNN to tune"

    def apply(self, run: Run) -> None:
        run.hold(lambda: self.run_context(run.ctx))

    @contextlib.contextmanager
    def run_context(self, ctx: Context) -> Iterator[None]:
        prev = apply_cudnn_benchmark(True)
        try:
            yield
        finally:
            apply_cudnn_benchmark(prev)
