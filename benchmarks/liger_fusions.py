"""liger-kernel's other fusion that fits GPT-2 (issue 15): its Triton LayerNorm in place of
``nn.LayerNorm``, measured on the recipe's GPT-2 124M (T=1024, bf16 autocast, TF32, fused AdamW),
eager and compiled, in one process. (liger's RMSNorm, SwiGLU/GeGLU and RoPE kernels have no
counterpart in GPT-2's architecture; its fused linear cross-entropy is the ``fused_loss`` rung.)

Each variant is a fresh model from the same seed; the step time is CUDA-event timed over
``--steps`` steps after 8 warm-up steps, three times (median, min, max reported), and the first
losses of each variant are kept to show the swap does not change the math beyond bf16 rounding.
Under ``torch.compile`` the liger kernel is traced if Dynamo can; if it cannot, it runs outside
the graph (``torch.compiler.disable``), which the JSON says.

    python3 benchmarks/liger_fusions.py --batch 16 --steps 20
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from benchmarks._common import emit
from fastloop.recipes.gpt.model import GPT, GPTConfig


def swap_layernorms(model: nn.Module, disable_compile: bool = False) -> int:
    """Replace every ``nn.LayerNorm`` with liger's ``LigerLayerNorm`` (same weights); returns the count."""
    from liger_kernel.transformers import LigerLayerNorm

    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.LayerNorm):
                new = LigerLayerNorm(child.normalized_shape[0], eps=child.eps, bias=True).to(child.weight.device)
                with torch.no_grad():
                    new.weight.copy_(child.weight)
                    if child.bias is not None:
                        new.bias.copy_(child.bias)
                    else:
                        new.bias.zero_()
                        new.bias.requires_grad_(False)
                if disable_compile:
                    new.forward = torch.compiler.disable(new.forward)
                setattr(parent, name, new)
                n += 1
    return n


def measure(variant: str, batch: int, steps: int, compiled: bool) -> dict:
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("gpt2")).cuda()
    swapped = 0
    mode = "nn.LayerNorm"
    if variant == "liger":
        swapped = swap_layernorms(model)
        mode = "LigerLayerNorm"
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True)
    if compiled:
        model.compile()
    g = torch.Generator(device="cuda").manual_seed(1)
    xs = [torch.randint(0, 50257, (batch, 1024), device="cuda", generator=g) for _ in range(4)]
    losses: list[float] = []

    def step(i: int) -> torch.Tensor:
        x = xs[i % len(xs)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t = time.perf_counter()
    note = ""
    try:
        for i in range(8):
            losses.append(step(i).item())
    except Exception as err:  # noqa: BLE001 - Dynamo cannot trace the kernel: run it outside the graph
        if not (compiled and variant == "liger"):
            raise
        first_line = str(err).splitlines()[0][:160]
        note = f"traced compile failed ({type(err).__name__}: {first_line}); liger LayerNorm run outside the graph"
        torch._dynamo.reset()
        return {**measure_disabled(batch, steps), "note": note}
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t
    reps = []
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for i in range(steps):
            step(i)
        e.record()
        e.synchronize()
        reps.append(s.elapsed_time(e) / steps)
    med = statistics.median(reps)
    return {
        "variant": mode,
        "compiled": compiled,
        "layernorms_swapped": swapped,
        "step_ms_median": med,
        "step_ms_min": min(reps),
        "step_ms_max": max(reps),
        "tokens_per_s": batch * 1024 / med * 1e3,
        "warmup_s": warm_s,
        "first_losses": losses[:8],
        "note": note,
    }


def measure_disabled(batch: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("gpt2")).cuda()
    swapped = swap_layernorms(model, disable_compile=True)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True)
    model.compile()
    x = torch.randint(0, 50257, (batch, 1024), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(8):
        step()
    reps = []
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(steps):
            step()
        e.record()
        e.synchronize()
        reps.append(s.elapsed_time(e) / steps)
    med = statistics.median(reps)
    return {
        "variant": "LigerLayerNorm (outside the compiled graph)",
        "compiled": True,
        "layernorms_swapped": swapped,
        "step_ms_median": med,
        "step_ms_min": min(reps),
        "step_ms_max": max(reps),
        "tokens_per_s": batch * 1024 / med * 1e3,
    }


def main(batch: int, steps: int, only_eager: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    rows = []
    for compiled in [False] if only_eager else [False, True]:
        for variant in ("torch", "liger"):
            rows.append(measure(variant, batch, steps, compiled))
            r = rows[-1]
            print(
                f"{'compiled' if compiled else 'eager':8} {r['variant']:45} {r['step_ms_median']:7.2f} ms "
                f"[{r['step_ms_min']:.2f}, {r['step_ms_max']:.2f}] {r['tokens_per_s']:10,.0f} tok/s "
                f"{r.get('note', '')}",
                flush=True,
            )
    ratios = {}
    for compiled in (False, True):
        pair = [r for r in rows if r["compiled"] == compiled]
        if len(pair) == 2:
            ratios["compiled" if compiled else "eager"] = pair[0]["step_ms_median"] / pair[1]["step_ms_median"]
    emit(
        f"liger_fusions_b{batch}",
        {
            "batch": batch,
            "steps": steps,
            "rows": rows,
            "speedup_liger_layernorm": ratios,
            "method": "CUDA events over steps x3 per variant after 8 warm-up steps; "
            "speedup = torch step / liger step (>1: liger faster)",
        },
    )


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only-eager", action="store_true")
    a = ap.parse_args()
    main(a.batch, a.steps, a.only_eager)
