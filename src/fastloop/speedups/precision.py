"""``bf16`` and ``fp16``: autocast mixed precision.

The cards (when each helps, when it hurts, what it costs, with measured figures):
``docs/speedups/bf16.md`` and ``docs/speedups/fp16.md``.
Both change the train step; they cannot be combined.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fastloop.speedups.base import Context, Skip, Speedup, register
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
        if not run.ctx.cuda and isinstance(run.model, torch.nn.Module):  # the model as the run holds it
            _cpu_runs_its_recurrent_layers_in_bf16(run.model)
        run.autocast(torch.bfloat16)


_RNN_PROBES: dict[tuple, str | None] = {}


def _cpu_runs_its_recurrent_layers_in_bf16(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` as it is, or :class:`Skip` where this CPU cannot run one of its recurrent layers
    (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) under bf16 autocast: oneDNN's bf16 RNN kernels need
    instructions some CPUs lack, and torch then fails in the first forward ("could not create a
    primitive descriptor for the LSTM forward propagation primitive"). Each kind of layer is tried
    once per process, on a layer of its kind two wide and one step long."""
    for layer in model.modules():
        if not isinstance(layer, torch.nn.RNNBase):
            continue
        key = (layer.mode, layer.bidirectional, layer.proj_size > 0)
        if key not in _RNN_PROBES:
            try:
                with torch.random.fork_rng(devices=[]), torch.autocast("cpu", dtype=torch.bfloat16):
                    projected = {"proj_size": 1} if layer.proj_size > 0 else {}  # an LSTM's only
                    probe = type(layer)(2, 2, bidirectional=layer.bidirectional, **projected)
                    probe(torch.zeros(1, 1, 2))  # the user's random streams are as they were
                _RNN_PROBES[key] = None
            except RuntimeError as err:
                _RNN_PROBES[key] = str(err).split(". ")[0]
        if _RNN_PROBES[key]:
            raise Skip(
                f"this CPU cannot run {type(layer).__name__} under bf16 autocast (torch: {_RNN_PROBES[key]}); "
                "the fit stays in fp32"
            )
    return model


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
