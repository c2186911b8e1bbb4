"""FLOP counting, peak rates and MFU.

Conventions (always reported with the number):
- ``count_train_flops`` counts one forward + backward with ``torch.utils.flop_counter``
  (matmul/conv FLOPs, 2 per multiply-add; elementwise ops are not counted).
- Peaks come from a measured matmul ceiling on this device when available
  (``measure_matmul_tflops``), else from :data:`PEAK_TFLOPS`, the vendors' dense (no sparsity)
  datasheet rates.

Example:
    >>> import torch
    >>> m = torch.nn.Linear(64, 32, bias=False)
    >>> count_train_flops(m, torch.randn(8, 64))  # fwd 2*8*64*32; bwd: weight grad only (input needs none)
    65536
    >>> round(mfu(1e12, 1.0, 10.0), 2)  # 1 TFLOP per step at 1 step/s on a 10 TFLOP/s device
    0.1
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

__all__ = [
    "PEAK_TFLOPS",
    "count_train_flops",
    "load_measured_ceiling",
    "measure_matmul_tflops",
    "mfu",
    "peak_tflops",
    "save_measured_ceilings",
]

# Dense datasheet rates, TFLOP/s, by device-name family and dtype. Order matters: first match wins
# (so "H200" and "H100" are tried before a bare "H1").
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 66.9}),
    ("GH200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("T4", {"fp16": 65.0, "fp32": 8.1}),
]


def peak_tflops(device_name: str | None, dtype: str) -> float | None:
    """Datasheet dense peak for a device name as CUDA reports it (``"NVIDIA H200"``), or None."""
    if not device_name:
        return None
    name = device_name.upper()
    for family, rates in PEAK_TFLOPS:
        if family.upper() in name:
            return rates.get(dtype)
    return None


def _ceiling_file():
    import os
    from pathlib import Path

    return Path(os.environ.get("FASTLOOP_CACHE", Path.home() / ".cache" / "fastloop")) / "ceilings.json"


def save_measured_ceilings(device_name: str, tflops_by_dtype: dict[str, float]) -> None:
    """Remember this device's measured matmul ceilings (``fastloop doctor`` calls this)."""
    import json

    path = _ceiling_file()
    data = json.loads(path.read_text()) if path.exists() else {}
    data[device_name] = {**data.get(device_name, {}), **tflops_by_dtype}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def load_measured_ceiling(device_name: str | None, dtype: str) -> float | None:
    """The matmul ceiling ``fastloop doctor`` measured on this device, if it has run here."""
    import json

    path = _ceiling_file()
    if not device_name or not path.exists():
        return None
    try:
        return json.loads(path.read_text()).get(device_name, {}).get(dtype)
    except (OSError, ValueError):
        return None


def count_train_flops(model: torch.nn.Module, *inputs, loss_fn: Callable | None = None) -> int:
    """FLOPs of one forward + backward of ``model(*inputs)`` (the module is left unchanged)."""
    from torch.utils.flop_counter import FlopCounterMode

    was_training = model.training
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(*inputs)
        loss = loss_fn(out) if loss_fn is not None else (out.float().sum() if torch.is_tensor(out) else out)
        loss.backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return int(counter.get_total_flops())


def mfu(flops_per_step: float, step_s: float, peak_tflops_: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the peak (a fraction, not a percent)."""
    if step_s <= 0 or peak_tflops_ <= 0:
        raise ValueError("step_s and peak must be positive")
    return flops_per_step / step_s / (peak_tflops_ * 1e12)


def measure_matmul_tflops(
    dtype: torch.dtype = torch.bfloat16, n: int = 8192, iters: int = 20, device: str = "cuda"
) -> float:
    """Measured dense matmul rate (TFLOP/s) on random data: ``n``³ products timed with events."""
    if device == "cpu":
        a = torch.randn(n, n, dtype=dtype)
        b = torch.randn(n, n, dtype=dtype)
        a @ b
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        return 2 * n**3 * iters / (time.perf_counter() - t0) / 1e12
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return 2 * n**3 / times[len(times) // 2] / 1e12
