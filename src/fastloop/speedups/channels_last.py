"""``channels_last``: NHWC memory layout for models with 4-D convolutions.

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/channels_last.md``.
Changes the model (and its inputs).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fastloop.data import to_channels_last
from fastloop.speedups.base import Speedup, register
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.run import Run

__all__ = ["ChannelsLast", "apply_channels_last", "channels_last_undo", "has_conv2d"]


def has_conv2d(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def apply_channels_last(model: torch.nn.Module) -> torch.nn.Module:
    """Convert ``model``'s 4-D parameters and buffers to channels_last (in place)."""
    return model.to(memory_format=torch.channels_last)


def channels_last_undo(model: torch.nn.Module) -> Callable[[], None]:
    """What puts back the memory layout of ``model``'s 4-D parameters and buffers that are not in
    channels_last now (called at the end of a Lightning fit: the module leaves as it came).

    Example:
        >>> net = torch.nn.Conv2d(3, 4, 3)
        >>> undo = channels_last_undo(net)
        >>> _ = apply_channels_last(net)
        >>> undo()
        >>> net.weight.is_contiguous()
        True
    """
    layout = torch.channels_last
    was = [
        (m, kind, name)
        for m in model.modules()
        for kind in ("_parameters", "_buffers")
        for name, t in getattr(m, kind).items()
        if t is not None and t.dim() == 4 and not t.is_contiguous(memory_format=layout)
    ]

    def undo() -> None:
        for m, kind, name in was:
            t = getattr(m, kind)[name]
            if t is None or not t.is_contiguous(memory_format=layout) or t.is_contiguous():
                continue
            if kind == "_parameters":  # in place: the optimizer holds the Parameter
                t.data = t.data.contiguous()
            else:
                m._buffers[name] = t.contiguous()

    return undo


@register
class ChannelsLast(Speedup):
    __doc__ = __doc__
    name = "channels_last"
    trains = "reordered"  # convolutions in another layout: other kernels, other summation order
    ladder = LadderTraits(ablation_rank=4, in_default=True)
    changes = "model"
    order = 40

    def why_not_model(self, model: torch.nn.Module) -> str | None:
        return None if has_conv2d(model) else "model has no Conv2d layers"

    def apply(self, run: Run) -> None:
        def convert(model: torch.nn.Module) -> torch.nn.Module:
            run.ctx.undo.append(channels_last_undo(model))  # at the end of a Lightning fit; at once if it fails
            return apply_channels_last(model)

        run.change_model(convert)
        run.change_batch(to_channels_last)  # 4-D floating inputs, once on the device
