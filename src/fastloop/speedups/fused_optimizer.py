"""``fused_optimizer``: Adam, AdamW and SGD switched to their fused implementation.

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/fused_optimizer.md``.
Changes the optimizer. Other optimizers are left as they are, with the reason recorded.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fastloop.speedups.base import Skip, Speedup, register
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.run import Run

__all__ = ["FUSABLE", "FusedOptimizer", "apply_fused_optimizer", "fused_undo"]

FUSABLE = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


def why_not_fused(opt: torch.optim.Optimizer) -> str | None:
    if not isinstance(opt, FUSABLE):
        return f"{type(opt).__name__} has no fused implementation (fusable: Adam, AdamW, SGD)"
    for group in opt.param_groups:
        for p in group["params"]:
            if not p.is_floating_point():
                return "optimizer holds non-floating-point parameters"
            if p.device.type not in ("cuda", "cpu", "xpu", "mps"):
                return f"no fused optimizer on device {p.device.type}"
    if any(g.get("differentiable") for g in opt.param_groups):
        return "differentiable optimizers cannot be fused"
    return None


def apply_fused_optimizer(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Switch ``opt`` to its fused implementation in place; raises ValueError if it cannot."""
    reason = why_not_fused(opt)
    if reason:
        raise ValueError(reason)
    for group in opt.param_groups:
        group["fused"] = True
        group["foreach"] = False
    opt.defaults["fused"] = True
    opt.defaults["foreach"] = False
    # fused kernels read 'step' as a float32 tensor on the parameter's device
    for p, state in opt.state.items():
        if "step" in state and torch.is_tensor(state["step"]) and state["step"].device != p.device:
            state["step"] = state["step"].to(p.device, torch.float32)
    return opt


def fused_undo(opt: torch.optim.Optimizer) -> Callable[[], None]:
    """What puts ``opt`` back as it is now, after :func:`apply_fused_optimizer` (called at the end
    of a fit, so that the optimizer a checkpoint saves afterwards resumes as the user's own): each
    group's and the defaults' ``fused`` and ``foreach``, and the ``step`` counters on the host where
    the unfused optimizer keeps them there (neither fused nor capturable).

    Example:
        >>> opt = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
        >>> undo = fused_undo(opt)
        >>> _ = apply_fused_optimizer(opt)
        >>> undo()
        >>> opt.param_groups[0]["fused"], opt.defaults["foreach"]
        (None, None)
    """
    keys = ("fused", "foreach")
    groups = [(g, {k: g[k] for k in keys if k in g}) for g in opt.param_groups]
    defaults = {k: opt.defaults[k] for k in keys if k in opt.defaults}

    def undo() -> None:
        for target, before in [*groups, (opt.defaults, defaults)]:
            for k in keys:
                if k in before:
                    target[k] = before[k]
                else:
                    target.pop(k, None)
        host = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32  # torch's own choice
        for group in opt.param_groups:
            if group.get("fused") or group.get("capturable"):
                continue
            for p in group["params"]:
                step = opt.state.get(p, {}).get("step")
                if torch.is_tensor(step) and step.device.type != "cpu":
                    opt.state[p]["step"] = step.to("cpu", host)

    return undo


@register
class FusedOptimizer(Speedup):
    __doc__ = __doc__
    name = "fused_optimizer"
    trains = "reordered"  # one kernel for the whole update: the same formula, rounded in another order
    advice_pattern = r"fused[ _]optimizer"
    changes = "optimizer"
    order = 35
    ladder = LadderTraits(in_default=True)

    def apply(self, run: Run) -> None:
        fused: list[str] = []

        def fuse(optimizer: torch.optim.Optimizer) -> None:  # in place: the run keeps its objects
            reason = why_not_fused(optimizer)
            if reason:
                raise Skip(reason)
            run.ctx.undo.append(fused_undo(optimizer))  # at the end of a Lightning fit; at once if it fails
            apply_fused_optimizer(optimizer)
            fused.append(type(optimizer).__name__)
            run.ctx.describe(self.name, "fused " + ", ".join(fused))

        run.change_optimizers(fuse)
