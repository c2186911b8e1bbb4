"""``channels_last``: NHWC memory layout for models with 4-D convolutions.

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/channels_last.md``.
Changes the model (and its inputs).
"""

from __future__ import annotations

import torch

from fastloop.data import to_channels_last
from fastloop.speedups.base import Speedup, register
from fastloop.speedups.run import Run

__all__ = ["ChannelsLast", "apply_channels_last", "has_conv2d"]


def has_conv2d(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def apply_channels_last(model: torch.nn.Module) -> torch.nn.Module:
    """Convert ``model``'s 4-D parameters and buffers to channels_last (in place)."""
    return model.to(memory_format=torch.channels_last)


@register
class ChannelsLast(Speedup):
    __doc__ = __doc__
    name = "channels_last"
    trains = "reordered"  # convolutions in another layout: other kernels, other summation order
    ablation_rank = 4
    changes = "model"
    order = 40
    in_default_ladder = True

    def why_not_model(self, model: torch.nn.Module) -> str | None:
        return None if has_conv2d(model) else "model has no Conv2d layers"

    def apply(self, run: Run) -> None:
        run.change_model(apply_channels_last)
        run.change_batch(to_channels_last)  # 4-D floating inputs, once on the device
