"""``fp8``: float8 training of the model's Linear layers (torchao), past the bf16 ceiling.

Each ``nn.Linear`` whose shapes suit fp8 tensor cores (both dimensions multiples of 16) is
swapped for torchao's ``Float8Linear``: its matmuls (forward, grad-input, grad-weight) run in
float8 with dynamic scales, the weights stay in their dtype. Layers whose shapes do not suit
fp8 stay as they are; the record's detail counts both. Use it with ``bf16`` (the rest of the
model) and ``compile`` (torchao's casts are fused by Inductor; without compile they cost more
than fp8 saves).

Options: ``fp8:tensorwise`` (default: one scale per tensor, the fastest) or ``fp8:rowwise`` (a
scale per row: closer to bf16, slower).

The card (when it helps, when it hurts, what it costs, with measured figures): ``docs/speedups/fp8.md``.
Skipped without CUDA, before sm_89, and when torchao is not installed
(``pip install 'fastloop[fp8]'``). Changes the model.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from fastloop.speedups.base import Context, Speedup, register
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.options import Options, option
from fastloop.speedups.run import Run

__all__ = ["FP8", "RECIPES", "apply_fp8", "fp8_eligible"]

RECIPES = ("tensorwise", "rowwise")


OUTPUT_NAMES = ("lm_head", "output", "head", "classifier", "fc")
"""Output layers stay in their dtype (as torchtitan does): their logits feed the loss."""


def fp8_eligible(module: torch.nn.Module, fqn: str = "") -> bool:
    """An ``nn.Linear`` whose in and out features are multiples of 16 (fp8 GEMM alignment) and
    that is not the output layer (named as in :data:`OUTPUT_NAMES`)."""
    return (
        type(module) is torch.nn.Linear
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
        and fqn.rsplit(".", 1)[-1] not in OUTPUT_NAMES
    )


def apply_fp8(model: torch.nn.Module, recipe: str = "tensorwise") -> tuple[int, int, list]:
    """Swap ``model``'s eligible Linear layers for torchao Float8Linear in place; returns
    (converted, Linear layers left in their dtype, the swaps as (parent, name, original))."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if recipe not in RECIPES:
        raise ValueError(f"unknown fp8 recipe {recipe!r}; valid: {', '.join(RECIPES)}")
    before = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()]
    linears = [(n, m) for n, m in model.named_modules() if type(m) is torch.nn.Linear]
    eligible = sum(fp8_eligible(m, n) for n, m in linears)
    convert_to_float8_training(
        model, config=Float8LinearConfig.from_recipe_name(recipe), module_filter_fn=lambda m, fqn: fp8_eligible(m, fqn)
    )
    swaps = [(p, n, c) for p, n, c in before if getattr(p, n, None) is not c]
    return eligible, len(linears) - eligible, swaps


@dataclass(frozen=True, kw_only=True)
class FP8Options(Options):
    """Options of ``fp8``."""

    speedup = "fp8"
    recipe: str = option(
        "tensorwise",
        "torchao scaling recipe: tensorwise (one scale per tensor, fastest) or rowwise (closer to bf16)",
        choices=RECIPES,
    )


@register
class FP8(Speedup):
    __doc__ = __doc__
    name = "fp8"
    ladder = LadderTraits(ablation_rank=2)
    compiles = True
    changes = "model"
    order = 45
    needs_cuda = True
    trains = "band"

    def band(self) -> float:
        return 2.0**-3  # e4m3's machine epsilon (what both torchao recipes cast to): 4 significant bits

    options_type = FP8Options

    def why_not(self, ctx: Context) -> str | None:
        if importlib.util.find_spec("torchao") is None:
            return "torchao is not installed (pip install 'fastloop[fp8]')"
        if not ctx.cuda:
            return "no CUDA (fp8 matmuls need an sm_89+ GPU)"
        cap = torch.cuda.get_device_capability(ctx.device)
        if cap < (8, 9):
            return (
                f"{torch.cuda.get_device_name(ctx.device)} (sm_{cap[0]}{cap[1]}) has no fp8 tensor cores (needs sm_89+)"
            )
        return None

    def why_not_model(self, model: torch.nn.Module) -> str | None:
        if not any(fp8_eligible(m, n) for n, m in model.named_modules()):
            return (
                "no Linear layer (other than the output layer) with both dimensions multiples of 16: nothing suits fp8"
            )
        return None

    def apply(self, run: Run) -> None:
        run.change_model(lambda model: self.apply_model(model, run.ctx))

    def apply_model(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        converted, kept, swaps = apply_fp8(model, self.opts.recipe)

        def restore() -> None:  # the original Linear layers hold the same (trained) parameters
            for parent, name, original in swaps:
                setattr(parent, name, original)

        ctx.undo.append(restore)
        ctx.describe(
            self.name,
            f"{converted} Linear layers in fp8 ({self.opts.recipe})"
            + (f", {kept} left in their dtype (output layer, or shapes not multiples of 16)" if kept else ""),
        )
        return model
