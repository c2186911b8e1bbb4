"""Where the time of a compiled bf16 GPT-2 124M step goes: GPU time per kernel family from
torch.profiler (plain PyTorch loop, fused AdamW, B16 x T1024), to say what limits tokens/s.

``--fp8 tensorwise|rowwise`` swaps the Linear layers for torchao Float8Linear first (fastloop's
``apply_fp8``, lm_head kept), ``--fused-loss`` routes the LM head + loss through liger-kernel's
fused linear cross-entropy (fastloop's ``fused_loss`` hook, kept out of the compiled graph).

    python3 benchmarks/gpt_profile.py --fp8 tensorwise --batch 16
"""

from __future__ import annotations

import collections

import torch

from benchmarks._common import emit
from fastloop.recipes.gpt.model import GPT, GPTConfig


def family(name: str) -> str:
    n = name.lower()
    if "float8" in n or "fp8" in n or "scale" in n or "amax" in n or "e4m3" in n:
        return "fp8 casts/scales"
    if "liger" in n or "fused_linear_cross" in n or "_cross_entropy_kernel" in n or "element_mul" in n:
        return "fused loss (liger)"
    if "flash" in n or "fmha" in n or "attention" in n:
        return "attention (flash/SDPA)"
    if "gemm" in n or "cutlass" in n or "nvjet" in n or "sm90" in n or "wgmma" in n or "cublas" in n:
        return "matmul (cuBLAS/CUTLASS)"
    if "adam" in n or "multi_tensor" in n or "fused_adam" in n:
        return "optimizer"
    if "triton" in n:
        return "fused elementwise/norm (Triton)"
    if "memcpy" in n or "memset" in n:
        return "memcpy/memset"
    if "nll" in n or "softmax" in n or "cross_entropy" in n or "log_softmax" in n:
        return "loss"
    return "other"


def main(
    batch: int = 16, steps: int = 10, fp8: str | None = None, fused_loss: bool = False, sdpa: str | None = None
) -> None:
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }.get(sdpa or "")
    held = contextlib.ExitStack()
    if backend is not None:  # one SDPA backend only (it raises if that backend cannot run the shapes)
        held.enter_context(sdpa_kernel([backend]))
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("gpt2")).cuda()
    converted = None
    if fp8:
        from fastloop.speedups.fp8 import apply_fp8

        converted, kept, _ = apply_fp8(model, fp8)
    if fused_loss:
        from fastloop.speedups.fused_loss import fused_linear_cross_entropy

        kernel = fused_linear_cross_entropy()
        model.fused_loss = torch.compiler.disable(lambda w, h, t: kernel(w, h, t))
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True)
    model.compile()
    x = torch.randint(0, 50257, (batch, 1024), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(8):
        step()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(steps):
        step()
    e.record()
    e.synchronize()
    step_ms = s.elapsed_time(e) / steps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    fam: dict[str, float] = collections.defaultdict(float)
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if ev.key and t and not ev.key.startswith("ProfilerStep"):
            fam[family(ev.key)] += t / 1e3 / steps
    busy = sum(fam.values())
    held.close()
    tag = "".join(
        [f"_fp8{fp8}" if fp8 else "", "_fusedloss" if fused_loss else "", f"_sdpa{sdpa}" if sdpa else "", f"_b{batch}"]
    )
    emit(
        "gpt_profile" + tag,
        {
            "batch": batch,
            "fp8": fp8,
            "fp8_linear_layers": converted,
            "fused_loss": fused_loss,
            "sdpa_backend": sdpa or "default (PyTorch's choice)",
            "step_ms": step_ms,
            "tokens_per_s": batch * 1024 / step_ms * 1e3,
            "gpu_busy_ms": busy,
            "ms_per_family": dict(sorted(fam.items(), key=lambda kv: -kv[1])),
            "note": "device time summed per family over kernels; busy < step means idle gaps",
        },
    )


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--fp8", choices=["tensorwise", "rowwise"], default=None)
    ap.add_argument("--fused-loss", action="store_true")
    ap.add_argument("--sdpa", choices=["flash", "cudnn", "efficient"], default=None)
    a = ap.parse_args()
    main(a.batch, a.steps, a.fp8, a.fused_loss, a.sdpa)
