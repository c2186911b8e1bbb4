"""The measured configuration as the JSON contract has it: step statistics, throughput, data
wait, memory, compile time, MFU, the dataset's description, the weights' digest, warnings.
Built by :func:`fastloop.runner.run_configuration` from a run's :class:`MeasureCallback`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from typing import Any

import torch

from fastloop.data import fixed_samples, tensor_dataset_parts
from fastloop.errors import FastloopError
from fastloop.measure.callback import WINDOW_OVERRUN, MeasureCallback
from fastloop.measure.flops import load_measured_ceiling, peak_tflops
from fastloop.measure.gpu_busy import per_measured_step
from fastloop.measure.run_result import Loss, MfuDetail, RunResult, SpeedupRecord, StepTimes, Throughput
from fastloop.measure.shapes import graph_shape_check
from fastloop.measure.stats import half_ratio, is_steady
from fastloop.speedups.base import REGISTRY

__all__ = [
    "data_checks",
    "describe_dataset",
    "loader_checks",
    "measured_configuration",
    "model_checks_of",
    "steadiness_warning",
    "tensors_digest",
    "weights_digest",
]


def model_checks_of(module: Any) -> dict[str, str]:
    """Every registered speedup that cannot apply to this model, with its reason (a ladder skips
    such a rung without measuring it: the model was built once already)."""
    out = {}
    for name, cls in REGISTRY.items():
        try:
            reason = cls().why_not_model(module)
        except Exception:  # noqa: BLE001 - a check that cannot run decides nothing here
            reason = None
        if reason:
            out[name] = reason
    return out


def loader_checks(loader: Any) -> dict[str, str]:
    """Every registered speedup that cannot apply to the training loader's data, with its reason
    (:meth:`~fastloop.speedups.base.Speedup.why_not_data`), as :func:`model_checks_of` has them."""
    out = {}
    for name, cls in REGISTRY.items():
        try:
            reason = cls().why_not_data(loader) if loader is not None else None
        except Exception:  # noqa: BLE001 - a check that cannot run decides nothing here
            reason = None
        if reason:
            out[name] = reason
    return out


def data_checks(batch_shapes: dict | None) -> dict[str, str]:
    """Speedups the run's batches rule out, with the reason, as :func:`model_checks_of` has them:
    ``cuda_graph`` where the batches change shape too often to replay one graph
    (:func:`~fastloop.measure.shapes.graph_shape_check`); ``pad_buckets`` where they keep one shape."""
    reason = graph_shape_check(batch_shapes)
    out = {"cuda_graph": reason} if reason else {}
    if batch_shapes and not re.search(r"dim [1-9]", str(batch_shapes.get("varying") or "")):
        out["pad_buckets"] = "the batches keep one shape apart from the batch dimension: nothing to pad"
    return out


def profile_steps() -> int:
    """Extra steps profiled after the measured ones on CUDA (GPU busy fraction, host syncs):
    ``FASTLOOP_PROFILE_STEPS`` (default 3; 0 turns the profile off)."""
    text = os.environ.get("FASTLOOP_PROFILE_STEPS", "3")
    try:
        n = int(text)
    except ValueError:
        raise FastloopError(f"FASTLOOP_PROFILE_STEPS must be a whole number of steps (0 = off), got {text!r}") from None
    if n < 0:
        raise FastloopError(f"FASTLOOP_PROFILE_STEPS must be >= 0, got {n}")
    return n


def prog_bar_warning(keys: list[str]) -> str:
    """Lightning converts every ``prog_bar=True`` value to a Python number after each training
    step (``.item()``, in its logger connector's ``on_batch_end``), whether or not a progress bar
    is shown: on CUDA each is a host-device sync, and the GPU idles while the host then runs the
    next step's Python. Measured on the H200 (GPT-2 124M, B16): 1 sync per step, 4% of the step."""
    return (
        f"self.log(..., prog_bar=True) of {', '.join(keys)}: Lightning reads these to the host (.item()) after "
        f"every step, a sync that leaves the GPU idle while the host prepares the next step; log them without "
        f"prog_bar (the logger still receives them) to let the host run ahead"
    )


def _dtype_name(applied: set[str], conv_tf32: bool = False) -> str:
    """The dtype whose peak MFU is rated against: the lowest precision an applied speedup runs
    its matmuls in (:attr:`Speedup.math_dtype`). cuDNN runs fp32 convolutions in TF32 by
    default (``torch.backends.cudnn.allow_tf32``), so a conv net's "fp32" is rated as tf32."""
    dtypes = {REGISTRY[n].math_dtype for n in applied if n in REGISTRY}
    for dtype in ("bf16", "fp16", "tf32"):
        if dtype in dtypes:
            return dtype
    return "tf32" if conv_tf32 else "fp32"


def describe_dataset(loader: Any) -> dict | None:
    """What the doctor and the ladder need to know of the training data: its type and, for
    in-memory tensors (a TensorDataset or a Subset of one, or a Dataset that holds its samples in
    memory and gives the same values for the same index: :func:`fastloop.data.fixed_samples`),
    their size: such data can live on the GPU (``gpu_resident``)."""
    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        return None
    parts = tensor_dataset_parts(dataset)
    if parts is None:
        found = fixed_samples(dataset)
        if isinstance(found, str):
            return {"type": type(dataset).__name__, "in_memory_tensors": False, "bytes": None, "why_not": found}
        return {
            "type": type(dataset).__name__,
            "in_memory_tensors": True,
            "bytes": found.n * found.item_bytes,
            "read_once": True,
        }
    tensors, indices = parts
    n = len(indices) if indices is not None else len(tensors[0])
    return {
        "type": type(dataset).__name__,
        "in_memory_tensors": True,
        "bytes": n * sum(t[0].numel() * t.element_size() for t in tensors),
    }


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MIX = (0x9E3779B97F4A7C15 - 2**64, 0xC2B2AE3D27D4EB4F - 2**64)  # odd 64-bit constants (golden ratio, xxHash)
_CHUNK = 1 << 24


def weights_digest(module: torch.nn.Module) -> str:
    """A digest of every parameter's exact bits, in order: equal digests mean bitwise-equal weights.

    Computed where the weights are: each parameter's bits, read as integers, are reduced on its
    own device to three 64-bit sums (plain, position-weighted, and of a mixed product; integer
    arithmetic wraps exactly, so the sums do not depend on the reduction order), and SHA-256
    hashes those sums with the names, shapes and dtypes. One host read at the end: copying
    GPT-2 124M's 500 MB to the host and hashing it there took 0.6 s of every ladder run.

    Example:
        >>> m = torch.nn.Linear(3, 2)
        >>> d = weights_digest(m)
        >>> with torch.no_grad():
        ...     m.weight[0, 0] = torch.nextafter(m.weight[0, 0], torch.tensor(9.0))
        >>> weights_digest(m) != d
        True
    """
    return tensors_digest(module.named_parameters())


def tensors_digest(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """:func:`weights_digest` of any named tensors (a batch's, in order): equal digests mean the
    same names, shapes, dtypes and bits.

    Example:
        >>> a = torch.arange(4.0)
        >>> tensors_digest([("x", a)]) == tensors_digest([("x", a.clone())]) != tensors_digest([("x", a + 1)])
        True
    """
    h = hashlib.sha256()
    sums = []
    for name, p in named:
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
        flat = p.detach().reshape(-1)
        if flat.dtype.is_complex:
            flat = torch.view_as_real(flat).reshape(-1)
        bits = flat.view(_INT_OF_SIZE[flat.element_size()]) if flat.dtype != torch.bool else flat.to(torch.uint8)
        acc = torch.zeros(3, dtype=torch.int64, device=p.device)
        for start in range(0, bits.numel(), _CHUNK):
            x = bits[start : start + _CHUNK].to(torch.int64)
            pos = torch.arange(start + 1, start + 1 + x.numel(), dtype=torch.int64, device=p.device)
            acc += torch.stack([x.sum(), (x * (pos * _MIX[0])).sum(), ((x + pos) * (x ^ _MIX[1])).sum()])
        sums.append(acc)
    if sums:
        h.update(str(torch.stack(sums).cpu().tolist()).encode())
    return h.hexdigest()


def steadiness_warning(step_s: list[float], reached: bool | None = None, measured_on: int = 0) -> str | None:
    """A warning when the measured steps never ran at a steady rate. The run measures on until its
    rate is steady (``reached``, from :class:`MeasureCallback`); this says so only where it could
    not (the rate still changed when its window ran out) or did not check (several ranks, or the
    steady warm-up off), with what was measured: nothing for the user to redo.

    Example:
        >>> steadiness_warning([0.01] * 10 + [0.02] * 10, reached=False, measured_on=40)[:59]
        'not steady: after measuring on for 40 more steps, the secon'
    """
    ratio = half_ratio(step_s)
    if reached is True or ratio is None or is_steady(ratio):
        return None
    if reached is False:
        return (
            f"not steady: after measuring on for {measured_on} more steps, the second half of the steps still "
            f"averaged {ratio:.2f}x the first (the rate kept changing: a loader falling behind, clocks "
            f"ramping); its figures are the mean over that window, and a comparison built on it says so"
        )
    return (
        f"not steady: the second half of the steps averaged {ratio:.2f}x the first (a loader buffer filled "
        f"during warm-up draining); this run does not measure on (several ranks stop together, or the steady "
        f"warm-up is off), so its figures are the mean over a changing rate"
    )


def _window_short(measure: MeasureCallback, measured_s: float) -> str | None:
    """Why a ``measure_s`` window holds fewer seconds of measured steps than asked (None: it does not)."""
    if measure.measure_s is None or measured_s >= measure.measure_s:
        return None
    if measure.window_cut:
        return (
            f"the window ended on the host's clock after {WINDOW_OVERRUN:g}x {measure.measure_s:g} s "
            "(the step was slower than the warm-up said, or waited outside its timed span)"
        )
    return measure.window_short_why or "the training ended before the window was full"


def _mean(values: list[float] | None) -> float | None:
    return sum(values) / len(values) if values else None


def measured_configuration(
    measure: MeasureCallback,
    records: list,
    device: torch.device,
    unit: str,
    extra: dict | None = None,
    conv_tf32: bool = False,
) -> RunResult:
    """Turn a finished MeasureCallback into the JSON contract's measured configuration."""
    stats = measure.result()
    summary = stats.summary()
    applied = {r.name for r in records if r.status == "applied"}
    med = summary["median"]
    mean = summary["mean"]
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    dtype = _dtype_name(applied, conv_tf32)
    peak = peak_tflops(gpu, dtype)
    ceiling = load_measured_ceiling(gpu, dtype)
    mfu = mfu_measured = None
    flops = measure.mean_flops_per_step()
    if flops and peak and med:
        mfu = flops / mean / (peak * 1e12)
    if flops and ceiling and med:
        mfu_measured = flops / mean / (ceiling * 1e12)
    losses = measure.loss_values()
    return RunResult(
        speedups=[SpeedupRecord(name=r.name, status=r.status, reason=r.reason, detail=r.detail) for r in records],
        steps=stats.steps,
        steps_planned=measure.steps_planned,
        measure_s=measure.measure_s,
        measure_window_cut=measure.window_cut,
        measured_s=sum(stats.step_s),
        window_extended_steps=measure.window_extended,  # added because the planned count fell short of measure_s
        window_short=_window_short(measure, sum(stats.step_s)),
        warmup_steps=stats.warmup_steps,
        one_off_steps=stats.one_off,
        warmup_drain_steps=measure.drain_steps,  # of warmup_steps: draining the loader's prefetch buffer
        warmup_extended_steps=measure.warmup_extended,  # of warmup_steps: added until step times were steady
        warmup_steady=measure.warmup_steady,
        warmup_gc_s=measure.warmup_gc_s,  # the full garbage collection that ends the warm-up
        batch_shapes=measure.shapes.summary(),
        step_s=StepTimes(**summary),
        step_s_all=stats.step_s,
        wait_s_all=stats.wait_s,
        throughput=Throughput(
            value=(measure.mean_items_per_step() or 0) / mean if mean else None,
            unit=f"{unit}/s",
            basis="items per step (the mean over the measured steps where the module counts them) / mean step time",
        ),
        items_per_step=measure.mean_items_per_step(),
        data_wait_frac=stats.data_wait_frac,
        host_wait_frac=stats.host_wait_frac,
        host_fetch_s=_mean(stats.host_wait_s),  # host seconds a batch: the loader and the copy
        host_copy_s=_mean(stats.host_copy_s),  # of which the copy to the device
        peak_mem_bytes=measure.peak_mem_bytes,
        compile_s=stats.compile_s if any(REGISTRY[n].warmup_cost for n in applied if n in REGISTRY) else None,
        warmup_overhead_s=stats.compile_s,
        mfu=mfu,
        mfu_detail=MfuDetail(
            flops_per_step=flops,
            convention=measure.flops_convention if flops else None,
            peak_tflops=peak,
            peak_source=f"datasheet dense {dtype} for {gpu}" if peak else None,
            measured_ceiling_tflops=ceiling,
            mfu_vs_measured_ceiling=mfu_measured,
            ceiling_source="matmul ceiling measured by `fastloop doctor` on this device"
            if ceiling
            else "none: run `fastloop doctor` once on this machine",
        ),
        loss=Loss(
            first=next((v for v in losses if v is not None), None),
            last=next((v for v in reversed(losses) if v is not None), None),
        ),
        losses=losses,
        gpu_profile=per_measured_step(measure.gpu_profile, mean),
        extra=extra or {},
        warnings=[w for w in [steadiness_warning(stats.step_s, measure.steady_reached, measure.unsteady_steps)] if w],
        steady=measure.steady_reached,  # the rate was steady (after measuring on); None: not checked
        measured_on_steps=measure.unsteady_steps,  # steps moved into the warm-up while the rate still changed
    )
