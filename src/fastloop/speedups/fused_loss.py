"""``fused_loss``: the output projection and cross-entropy as one fused kernel (liger-kernel),
so the logits (batch x tokens x vocabulary, the largest tensor of a language model's step) are
never materialised.

A recipe-level speedup: it applies to a model that offers the hook, a ``fused_loss`` attribute
(None by default) on the module whose forward computes ``lm_head`` + cross-entropy. The GPT
recipe's model has it: set to a callable ``(weight, hidden_2d, targets_1d) -> loss``, its
forward returns no logits and calls that instead. Liger's ``LigerFusedLinearCrossEntropyLoss``
computes the loss and the gradients chunk by chunk (Triton kernels).

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/fused_loss.md``.
Skipped without CUDA (Triton), when liger-kernel is not installed (``pip install
'fastloop[fused_loss]'``) and for models without the hook. Changes the model.
"""

from __future__ import annotations

import importlib.util

import torch

from fastloop.speedups.base import Context, Speedup, register
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.run import Run

__all__ = ["FusedLoss", "fused_linear_cross_entropy", "hooks_of"]


def hooks_of(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The submodules that offer the fused-loss hook (a ``fused_loss`` attribute)."""
    return [m for m in model.modules() if "fused_loss" in vars(m)]


def fused_linear_cross_entropy() -> torch.nn.Module:
    """liger-kernel's fused linear + cross-entropy loss (mean over targets, ignore_index -100)."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    return LigerFusedLinearCrossEntropyLoss()


@register
class FusedLoss(Speedup):
    __doc__ = __doc__
    name = "fused_loss"
    trains = "reordered"  # the loss and its gradients chunk by chunk: another summation order
    ladder = LadderTraits(ablation_rank=3)
    compiles = True
    changes = "model"
    order = 47
    needs_cuda = True

    def why_not(self, ctx: Context) -> str | None:
        if importlib.util.find_spec("liger_kernel") is None:
            return "liger-kernel is not installed (pip install 'fastloop[fused_loss]')"
        if not ctx.cuda:
            return "no CUDA (liger's fused loss is a Triton kernel)"
        return None

    def why_not_model(self, model: torch.nn.Module) -> str | None:
        if not hooks_of(model):
            return (
                "the model offers no fused-loss hook (a `fused_loss` attribute on the module that computes "
                "lm_head + cross-entropy, as the GPT recipe's model has)"
            )
        return None

    def apply(self, run: Run) -> None:
        run.change_model(lambda model: self.apply_model(model, run.ctx))

    def apply_model(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        kernel = fused_linear_cross_entropy()
        # Dynamo cannot trace liger's Triton autograd function (measured on the H200: "RuntimeError
        # when making fake tensor call", and compile fell back for the whole model); left out of
        # the graph, compile keeps the transformer and the loss runs as liger's own kernels
        loss = torch.compiler.disable(lambda weight, hidden, targets: kernel(weight, hidden, targets))
        hooked = hooks_of(model)
        for m in hooked:
            m.fused_loss = loss

        def restore() -> None:
            for m in hooked:
                m.fused_loss = None

        ctx.undo.append(restore)
        ctx.describe(self.name, f"liger fused linear cross-entropy in {', '.join(type(m).__name__ for m in hooked)}")
        return model
