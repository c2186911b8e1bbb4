"""What feeds ResNet-50 fastest, and how fast can its step go: one bf16 + channels_last ResNet-50
(B256, 224 px, SGD Nesterov) in a plain PyTorch loop, fed in turn by synthetic on-GPU tensors,
the torchvision ImageFolder loader, and DALI with each pipeline setting in ``DALI_CONFIGS``.

    FASTLOOP_IMAGENET_ROOT=/tmp/imnet python3 benchmarks/imagenet_feed.py \\
        --compile default --cudnn-benchmark --fused --feeds synthetic,dali:base,dali:tuned,torchvision

Each feed is timed over ``--steps`` steps after ``--warmup`` (compile happens in the first feed's
warm-up and is reported apart): images/s from wall time between two synchronizes, the median
step from CUDA events, and the host's share of time spent waiting in ``next(loader)``.
For DALI settings also the loader alone (no model) and, with ``--profile``, how much GPU time
per step DALI's own kernels take next to the model's. ``dali_thread:SETTING`` takes DALI's batches
on a background thread (see :func:`threaded`).
"""

from __future__ import annotations

import argparse
import collections
import os
import queue
import statistics
import threading
import time

import torch
import torchvision

from benchmarks._common import emit
from fastloop.recipes.imagenet.data import DaliLoader, ImageData

# name -> DaliLoader options; "base" is the recipe's pipeline as it was first measured
DALI_CONFIGS: dict[str, dict] = {
    "base": {"num_threads": 8, "gpu_labels": False},
    "gpu_labels": {"num_threads": 8},
    "threads12": {"num_threads": 12, "prefetch_queue_depth": 3},
    "no_affine": {"num_threads": 12, "prefetch_queue_depth": 3, "affine": False},
    "hw99": {"num_threads": 12, "prefetch_queue_depth": 3, "affine": False, "hw_decoder_load": 0.99},
    "hw0": {"num_threads": 12, "prefetch_queue_depth": 3, "affine": False, "hw_decoder_load": 0.0},
    "nhwc_fp16": {
        "num_threads": 12,
        "prefetch_queue_depth": 3,
        "affine": False,
        "channels_last": True,
        "dtype": torch.float16,
    },
}


def build(args, num_classes: int):
    model = torchvision.models.resnet50(num_classes=num_classes).cuda().to(memory_format=torch.channels_last)
    decay = [p for p in model.parameters() if p.dim() > 1]
    rest = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD(
        [{"params": decay, "weight_decay": 5e-5}, {"params": rest, "weight_decay": 0.0}],
        lr=0.1,
        momentum=0.9,
        nesterov=True,
        fused=args.fused or None,
    )
    if args.compile != "none":
        model.compile(mode=None if args.compile == "default" else args.compile)
    crit = torch.nn.CrossEntropyLoss(label_smoothing=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x.cuda(non_blocking=True).contiguous(memory_format=torch.channels_last)
        y = y.cuda(non_blocking=True).long()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = crit(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def feed_loader(name: str, data: ImageData, args, num_classes: int):
    if name == "synthetic":
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 3, 224, 224, generator=g).cuda()
        y = torch.randint(0, num_classes, (256,), generator=g).cuda()
        return iter(lambda: (x, y), None)
    if name == "torchvision":
        loader = data.torchvision_loader(True)
        loader = torch.utils.data.DataLoader(
            loader.dataset,
            batch_size=256,
            shuffle=True,
            drop_last=True,
            num_workers=args.workers,
            pin_memory=True,
            persistent_workers=True,
        )
        return _forever(loader)
    kind, _, setting = name.partition(":")
    cfg = DALI_CONFIGS[setting]
    loader = _forever(DaliLoader(data.files, data.labels, 256, device_id=0, **cfg))
    return threaded(loader) if kind == "dali_thread" else loader


def _forever(loader):
    while True:
        yield from loader


def threaded(it, depth: int = 2):
    """``it``'s items, taken by a background thread (``dali_thread:SETTING``): DALI's wait for its
    outputs and the iterator's Python run off the training thread. The iterator copies each batch
    on the thread's current stream, which is the device's default stream in every thread, the
    training thread's too: stream order makes the handover safe without an event. Not yet measured
    on a GPU (round 10 left DALI 7% behind synthetic data with the GPU idle 1.5 ms more a step).

    >>> list(zip(range(3), threaded(iter(range(10)))))
    [(0, 0), (1, 1), (2, 2)]
    """
    box: queue.Queue = queue.Queue(maxsize=depth)

    def work() -> None:
        for item in it:
            box.put(item)

    threading.Thread(target=work, daemon=True, name="dali-feed").start()
    while True:
        yield box.get()


def time_feed(step, it, steps: int, warmup: int) -> dict:
    t0 = time.perf_counter()
    for _ in range(warmup):
        step(*next(it))
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    wait = 0.0
    t0 = time.perf_counter()
    for s, e in events:
        t1 = time.perf_counter()
        batch = next(it)
        wait += time.perf_counter() - t1
        s.record()
        step(*batch)
        e.record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    ms = [s.elapsed_time(e) for s, e in events]
    q = statistics.quantiles(ms, n=4)
    return {
        "images_per_s": 256 * steps / wall,
        "step_ms_median": statistics.median(ms),
        "step_ms_p25": q[0],
        "step_ms_p75": q[2],
        "host_wait_frac": wait / wall,
        "warmup_s": warm_s,
        "steps": steps,
    }


def loader_alone(it, batches: int = 30) -> float:
    for _ in range(3):
        next(it)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    torch.cuda.synchronize()
    return 256 * batches / (time.perf_counter() - t0)


def dali_share(step, it, steps: int = 8) -> dict:
    """GPU time per step in DALI/nvJPEG kernels vs all others (CUPTI sees every stream)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(*next(it))
        torch.cuda.synchronize()
    fam: dict[str, float] = collections.defaultdict(float)
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if not ev.key or not t or ev.key.startswith("ProfilerStep"):
            continue
        k = ev.key.lower()
        dali = any(w in k for w in ("dali", "nvjpeg", "jpeg", "huffman", "idct", "resampl"))
        fam["dali_ms" if dali else "model_ms"] += t / 1e3 / steps
    return dict(fam)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", default="default")
    ap.add_argument("--cudnn-benchmark", action="store_true")
    ap.add_argument("--fused", action="store_true")
    ap.add_argument("--feeds", default="synthetic")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--tv-steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=12)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--name", default="imagenet_feed")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    root = os.environ.get("FASTLOOP_IMAGENET_ROOT")
    feeds = args.feeds.split(",")
    data = ImageData(root, loader="torchvision", batch_size=256) if feeds != ["synthetic"] else None
    num_classes = data.num_classes if data else 100
    step = build(args, num_classes)
    results, first = {}, True
    for name in feeds:
        steps = args.tv_steps if name == "torchvision" else args.steps
        try:
            it = feed_loader(name, data, args, num_classes)
            r = time_feed(step, it, steps, args.warmup)
        except Exception as err:  # noqa: BLE001 - one failing setting must not lose the others
            results[name] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
            print(f"{name:>18}: failed: {results[name]['error']}", flush=True)
            continue
        if first:
            r["includes_compile"] = args.compile != "none"
            first = False
        if name.startswith(("dali:", "dali_thread:")):
            if args.profile:
                r["gpu_ms_per_step"] = dali_share(step, it)
            r["loader_alone_images_per_s"] = loader_alone(it)
        results[name] = r
        print(
            f"{name:>18}: {r['images_per_s']:8.0f} img/s  step {r['step_ms_median']:.1f} ms  "
            f"host wait {r['host_wait_frac']:.1%}"
            + (f"  alone {r['loader_alone_images_per_s']:.0f}" if "loader_alone_images_per_s" in r else ""),
            flush=True,
        )
        del it
    emit(
        args.name,
        {
            "compile": args.compile,
            "cudnn_benchmark": args.cudnn_benchmark,
            "fused_sgd": args.fused,
            "batch": 256,
            "crop": 224,
            "feeds": results,
        },
    )


if __name__ == "__main__":
    main()
