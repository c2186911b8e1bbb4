"""fastloop against the same training written by hand in plain PyTorch, one process per side.

Cases (each side is one fresh process; ``all`` alternates them):
- ``gpt``: GPT-2 124M, T=1024, batch B, tf32 + bf16 autocast + fused AdamW + compile. fastloop:
  ``run_configuration("gpt", "tf32,bf16,fused_optimizer,compile")`` (a Lightning Trainer with
  the callbacks); by hand: the recipe's model and loader, a loop a careful user writes
  (non_blocking copies, fused AdamW, the same LR schedule, ``model.compile()``).
- ``rn50``: ResNet-50 B256 224 px, synthetic images on the GPU, bf16 + channels_last + compile +
  cudnn.benchmark + fused SGD. fastloop: ``run_configuration("imagenet", ...)`` with the
  synthetic loader; by hand: the same model and optimizer in a plain loop.
- ``mlp``: the launch-bound MLP (benchmarks/launch_bound.py): fastloop's plain-loop whole-step
  graph (``FastLoop(..., speedups="cuda_graph")``) against a hand capture of forward + backward
  + capturable AdamW step in one ``torch.cuda.graph``, as in PyTorch's CUDA-graph docs.

Throughput: fastloop's reported figure (items per step / mean measured step); by hand, the
wall time of the measured steps with one synchronize at each end (no per-step sync).

Usage: ``python3 benchmarks/vs_handwritten.py CASE SIDE [--batch B] [--steps N] [--warmup W]``;
prints one JSON document (also under $OUT as ``vs_hand_CASE_SIDE_B_RUN.json`` with ``--tag``).
``python3 benchmarks/run.py vs-hand all [--rounds R]`` runs every case, each side in a fresh
process, and prints the table last.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import torch

from benchmarks._common import emit


def _fastloop(target: str, speedups: str, steps: int, warmup: int, kwargs: dict) -> dict:
    from fastloop.drivers.runner import run_configuration

    doc = run_configuration(target, speedups, steps=steps, warmup=warmup, device="cuda", target_kwargs=kwargs)
    return {
        "throughput": doc["throughput"]["value"],
        "unit": doc["throughput"]["unit"],
        "median_step_s": doc["step_s"]["median"],
        "mean_step_s": doc["step_s"]["mean"],
        "steps": doc["steps"],
        "warmup_steps": doc["warmup_steps"],
        "compile_s": doc["compile_s"],
        "speedups": doc["speedups"],
        "loss_last": doc["loss"]["last"],
        "gpu_profile": doc.get("gpu_profile"),
    }


def _timed(step, batches, steps: int, warmup: int, items: int) -> dict:
    for _ in range(warmup):
        step(next(batches))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = None
    for _ in range(steps):
        loss = step(next(batches))
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    from fastloop.measure.gpu_busy import GpuProfile, per_measured_step

    prof = GpuProfile()  # 3 extra steps under the profiler, as fastloop's runner does
    prof.start()
    for _ in range(3):
        step(next(batches))
    return {
        "throughput": items * steps / wall,
        "mean_step_s": wall / steps,
        "steps": steps,
        "warmup_steps": warmup,
        "loss_last": float(loss) if loss is not None else None,
        "gpu_profile": per_measured_step(prof.stop(3), wall / steps),
    }


def _forever(loader):
    while True:
        yield from loader


def gpt_hand(batch: int, steps: int, warmup: int) -> dict:
    from fastloop.recipes.gpt.target import make

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    module, data = make(preset="gpt2", batch_size=batch)
    if hasattr(data, "setup"):
        data.setup("fit")
    model = module.model.cuda()
    hp = module.hparams
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=hp.lr,
        betas=(0.9, 0.95),
        fused=True,
    )

    def lr_lambda(step: int) -> float:
        if step < hp.warmup_steps:
            return (step + 1) / hp.warmup_steps
        progress = min(1.0, (step - hp.warmup_steps) / max(1, hp.max_steps - hp.warmup_steps))
        return hp.min_lr_ratio + (1 - hp.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    model.compile()
    model.train()

    def step(b):
        x, y = (t.cuda(non_blocking=True) for t in b)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        return loss.detach()

    t0 = time.perf_counter()
    out = _timed(step, _forever(data.train_dataloader()), steps, warmup, batch * module.cfg.block_size)
    out["unit"] = "tokens/s"
    out["total_s"] = time.perf_counter() - t0
    return out


def rn50_hand(batch: int, steps: int, warmup: int) -> dict:
    from fastloop.recipes.imagenet.target import make

    torch.backends.cudnn.benchmark = True
    module, data = make(batch_size=batch, loader="synthetic")
    model = module.to("cuda").to(memory_format=torch.channels_last)
    hp = module.hparams
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD(
        [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=hp.lr * hp.batch_size / 256,
        momentum=hp.momentum,
        nesterov=True,
        fused=True,
    )
    net = module.model if hasattr(module, "model") else module
    net.compile()
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch, 3, 224, 224, device="cuda", generator=g).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, data.num_classes, (batch,), device="cuda", generator=g)

    def step(_):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = module.criterion(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    out = _timed(step, iter(int, 1), steps, warmup, batch)
    out["unit"] = "samples/s"
    return out


def mlp_hand(steps: int, warmup: int) -> dict:
    from benchmarks.launch_bound import data, mlp

    torch.manual_seed(0)
    model = mlp().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    batches = data()
    sx, sy = (t.clone() for t in batches[0])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream before capture (PyTorch docs)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(sx), sy).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = torch.nn.functional.cross_entropy(model(sx), sy)
        static_loss.backward()
        opt.step()
    it = _forever(batches)

    def step(b):
        sx.copy_(b[0])
        sy.copy_(b[1])
        graph.replay()
        return static_loss

    step_times = []
    for _ in range(warmup):
        step(next(it))
    for _ in range(5):  # 5 timed blocks: a spread, like fastloop's per-step figures
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps // 5):
            step(next(it))
        torch.cuda.synchronize()
        step_times.append((time.perf_counter() - t0) / (steps // 5))
    return {
        "median_step_s": statistics.median(step_times),
        "mean_step_s": statistics.mean(step_times),
        "throughput": 32 / statistics.mean(step_times),
        "unit": "samples/s",
        "steps": steps,
    }


def mlp_fastloop(steps: int, warmup: int) -> dict:
    from benchmarks.launch_bound import data, mlp
    from fastloop.loop import FastLoop

    torch.manual_seed(0)
    model = mlp()
    loop = FastLoop(
        model,
        torch.optim.AdamW(model.cuda().parameters(), lr=1e-3),
        data(),
        loss_fn=torch.nn.functional.cross_entropy,
        speedups="cuda_graph",
        device="cuda",
    )
    res = loop.train(steps=steps, warmup=warmup)
    mean = sum(res.stats.step_s) / len(res.stats.step_s)
    return {
        "median_step_s": statistics.median(res.stats.step_s),
        "mean_step_s": mean,
        "throughput": 32 / mean,
        "unit": "samples/s",
        "steps": steps,
        "speedups": [r.to_dict() for r in res.records],
    }


ALL = [("gpt", 16, 50, 10), ("gpt", 32, 50, 10), ("rn50", 256, 40, 10), ("mlp", 32, 500, 20)]
"""The cases of ``all``: (case, batch, steps, warm-up), as recorded in RESULTS.md."""


def run_all(rounds: int, cases: str | None = None) -> None:
    """Every case (or those of ``cases``: ``mlp,gpt:16`` names a case, or a case at one batch),
    each side in a fresh process, the sides' order alternating by round (hand first in odd
    rounds): a table of the ratio per case (the mean over rounds), JSON under $OUT."""
    import json
    import subprocess
    import sys

    wanted = [c.strip() for c in cases.split(",")] if cases else None
    rows = []
    for case, batch, steps, warmup in ALL:
        if wanted is not None and case not in wanted and f"{case}:{batch}" not in wanted:
            continue
        got: dict[str, list[float]] = {"hand": [], "fastloop": []}
        for r in range(rounds):
            for side in ("hand", "fastloop") if r % 2 == 0 else ("fastloop", "hand"):
                proc = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        case,
                        side,
                        "--batch",
                        str(batch),
                        "--steps",
                        str(steps),
                        "--warmup",
                        str(warmup),
                        "--tag",
                        f"r{r}",
                    ],
                    capture_output=True,
                    text=True,
                )
                if proc.returncode:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"{case} {side} failed (exit {proc.returncode})")
                got[side].append(json.loads(proc.stdout[proc.stdout.rindex('{\n  "benchmark"') :])["throughput"])
        hand, fl = statistics.mean(got["hand"]), statistics.mean(got["fastloop"])
        rows.append({"case": case, "batch": batch, "hand": hand, "fastloop": fl, "ratio": fl / hand, "runs": got})
    emit("vs_hand_all", {"rounds": rounds, "rows": rows})
    print(f"{'case':<6} {'batch':>5} {'hand':>12} {'fastloop':>12} {'ratio':>6}")
    for row in rows:
        print(
            f"{row['case']:<6} {row['batch']:>5} {row['hand']:>12,.0f} {row['fastloop']:>12,.0f} {row['ratio']:>6.3f}"
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=["gpt", "rn50", "mlp", "all"])
    p.add_argument("side", nargs="?", choices=["hand", "fastloop"])
    p.add_argument("--rounds", type=int, default=1, help="all: rounds of each case (sides alternate)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--tag", default="0")
    p.add_argument("--cases", default=None, help="all: only these cases (mlp,gpt:16,rn50)")
    a = p.parse_args()
    if a.case == "all":
        run_all(a.rounds, a.cases)
        return
    if a.side is None:
        p.error("a case takes a side: hand or fastloop")
    if a.case == "gpt":
        out = (
            gpt_hand(a.batch, a.steps, a.warmup)
            if a.side == "hand"
            else _fastloop(
                "gpt", "tf32,bf16,fused_optimizer,compile", a.steps, a.warmup, {"preset": "gpt2", "batch_size": a.batch}
            )
        )
    elif a.case == "rn50":
        out = (
            rn50_hand(a.batch, a.steps, a.warmup)
            if a.side == "hand"
            else _fastloop(
                "imagenet",
                "cudnn_benchmark,bf16,fused_optimizer,channels_last,compile",
                a.steps,
                a.warmup,
                {"batch_size": a.batch, "loader": "synthetic"},
            )
        )
    else:
        out = mlp_hand(a.steps, a.warmup) if a.side == "hand" else mlp_fastloop(a.steps, a.warmup)
    emit(f"vs_hand_{a.case}_{a.side}_{a.batch}_{a.tag}", {"case": a.case, "side": a.side, "batch": a.batch, **out})


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
