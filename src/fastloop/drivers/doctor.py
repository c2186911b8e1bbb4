"""``fastloop doctor``: this machine's ceilings, and (given a target) its bottleneck.

Machine part: matmul TFLOP/s per dtype, device copy bandwidth, host->device pageable vs pinned,
kernel launch overhead (on a CPU: what it can, the matmul rate, and says what it cannot).

Diagnosis: from a measured baseline configuration:
- data-bound: the step waits for its batch >= 20% of the time (>= 10% where the whole step replays
  as one CUDA graph);
- host-bound (CUDA, with the run's GPU profile): the GPU is busy for less than 85% of the step
  outside data wait; it idles while the host works (the profile also counts host syncs);
- launch-bound (CUDA, no profile): the GPU is idle between kernels: step time far above the time its
  FLOPs need at the measured ceiling, and small steps (< 5 ms), unless the whole step is one graph;
- memory-bound: peak memory above 90% of the device;
- compute-bound: otherwise.

Example:
    >>> diagnose({"data_wait_frac": 0.6, "step_s": {"median": 0.03}, "peak_mem_bytes": None, "mfu": None})["bottleneck"]
    'data-bound'
"""

from __future__ import annotations

import functools
import re
import time

import torch

from fastloop.measure.flops import measure_matmul_tflops, save_measured_ceilings
from fastloop.measure.run_result import RunResult
from fastloop.speedups import REGISTRY
from fastloop.speedups.base import advice_pattern
from fastloop.speedups.cuda_graph.cuda_graph import TIERS

__all__ = [
    "COMM_BOUND_EFFICIENCY",
    "DATA_BOUND_WAIT",
    "GRAPHED_DATA_WAIT",
    "HOST_BOUND_BUSY",
    "data_advice",
    "diagnose",
    "join_advice",
    "machine_ceilings",
    "without_measured",
]

DATA_BOUND_WAIT = 0.2
"""A step that waits for its batch this share of the time or more is called data-bound."""

GRAPHED_DATA_WAIT = 0.1
"""Where the whole step replays as one CUDA graph (no launches left to cut), a wait of this share
or more is called data-bound too: the feed is what is left between the graph's replays."""

HOST_BOUND_BUSY = 0.85
"""With a GPU profile: when GPU busy + data wait cover less than this share of the step, the rest
is the GPU idling while the host works, and the run is called host-bound."""

COMM_BOUND_EFFICIENCY = 0.8
"""Below this scaling efficiency (N-device throughput / N x 1-device, same per-device batch) and
without a data wait, a multi-rank step is called communication-bound. A proxy: the step-time
growth from 1 to N devices is the all-reduce (and rank skew) not overlapped with compute; a
profile would split the two."""


def _events_time(fn, iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def machine_ceilings(quick: bool = False) -> dict:
    """Measure this machine's ceilings; every figure names how it was measured."""

    out: dict = {"measured": {}, "not_measured": {}}
    m = out["measured"]
    if not torch.cuda.is_available():
        n = 1024 if quick else 2048
        m["cpu_matmul_fp32_tflops"] = {
            "value": measure_matmul_tflops(torch.float32, n=n, iters=3, device="cpu"),
            "how": f"{n}^3 fp32 matmul on CPU, {torch.get_num_threads()} threads",
        }
        for k in ("gpu_matmul", "device_copy", "host_to_device", "launch_overhead"):
            out["not_measured"][k] = "no CUDA device on this machine"
        return out
    n = 4096 if quick else 8192
    for name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)):
        m[f"matmul_{name}_tflops"] = {
            "value": measure_matmul_tflops(dt, n=n, iters=10 if quick else 20),
            "how": f"{n}^3 {name} matmul, random data, median of CUDA-event timings",
        }
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    m["matmul_tf32_tflops"] = {
        "value": measure_matmul_tflops(torch.float32, n=n, iters=10 if quick else 20),
        "how": f"{n}^3 fp32 matmul with TF32 allowed",
    }
    torch.backends.cuda.matmul.allow_tf32 = prev

    save_measured_ceilings(
        torch.cuda.get_device_name(0), {d: m[f"matmul_{d}_tflops"]["value"] for d in ("bf16", "fp16", "fp32", "tf32")}
    )
    nbytes = (1 if quick else 4) * 2**30
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = _events_time(functools.partial(dst.copy_, src), 10)
    m["device_copy_tbs"] = {
        "value": 2 * nbytes / t / 1e12,
        "how": f"{nbytes >> 20} MiB device copy, bytes read + written",
    }
    del src, dst  # free 2 x nbytes before the next measurement
    size = 256 * 2**20
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    for label, host in (
        ("pageable", torch.empty(size, dtype=torch.uint8)),
        ("pinned", torch.empty(size, dtype=torch.uint8, pin_memory=True)),
    ):
        host.fill_(1)
        t = _events_time(functools.partial(dev.copy_, host, non_blocking=True), 10)
        m[f"h2d_{label}_gbs"] = {"value": size / t / 1e9, "how": f"256 MiB host->device copy from {label} memory"}
    x = torch.zeros(1, device="cuda")
    iters = 2000
    x.add_(1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        x.add_(1)
    torch.cuda.synchronize()
    m["launch_overhead_us"] = {
        "value": (time.perf_counter() - t0) / iters * 1e6,
        "how": f"{iters} back-to-back tiny kernels (x.add_(1)), host wall time per launch",
    }
    return out


def join_advice(clauses: list[tuple[str | None, str]]) -> str:
    """Advice clauses (speedup or None, text) as one recommendation line.

    Example:
        >>> join_advice([("workers", "workers (more loader processes)"), (None, "cache decoded data")])
        'workers (more loader processes); cache decoded data.'
    """
    return "; ".join(text for _, text in clauses) + "."


_FEED_CLAUSES = (
    ("workers", "workers (more loader processes)"),
    ("pin_memory", "pin_memory (pinned host batches)"),
    ("prefetch", "prefetch (the next batches built on a background thread while the step runs)"),
)


def data_advice(
    applied: set[str], cuda: bool = True, stamp: dict | None = None, checks: dict | None = None
) -> list[tuple[str | None, str]]:
    """The next data-pipeline fixes as clauses, each the speedup it advises (None: prose that
    names none), so a ladder that measured one of them drops that clause and keeps the rest.
    ``stamp``: the run's environment stamp, when it has one (what CUDA_DEVICE_MAX_CONNECTIONS was).
    ``checks``: speedup -> why it cannot apply to this loader's data (the run document's
    ``model_checks``): a GPU feed path ruled out there is not advised.

    Example:
        >>> checks = {"dali": "not a folder", "gpu_augment": "no transform"}
        >>> for name, text in data_advice({"pin_memory"}, checks=checks):  # doctest: +NORMALIZE_WHITESPACE
        ...     print(name, "|", text)
        workers | workers (more loader processes)
        prefetch | prefetch (the next batches built on a background thread while the step runs)
        None | this loader's data cannot be decoded or augmented on the GPU by fastloop (no transform); cache decoded
        data, or make per-sample work cheaper (one transform on the whole batch instead of each sample in __getitem__)
    """
    if not cuda:
        if "workers" in applied:
            return [
                (
                    None,
                    "the loader's workers are the limit: more of them (workers:N, when the loader waits on "
                    "storage rather than the CPU), or cheaper per-sample work (cache parsed samples, batch the "
                    "transform)",
                )
            ]
        return [("workers", "workers (several loader processes prepare batches while the step runs)")]
    if "dali" in applied and stamp is not None and "cuda_device_max_connections" in stamp:
        from fastloop.cuda_env import CUDA_QUEUES_VAR, cuda_queues_note

        value = stamp["cuda_device_max_connections"]
        note = cuda_queues_note({CUDA_QUEUES_VAR: value} if value else {})
        if note:
            return [(None, f"first, CUDA's hardware queues: {note}")]
    if "dali" in applied:
        return [
            (
                None,
                "DALI itself is the limit (its reader threads and the GPU's JPEG decoders): smaller images on "
                "disk, lighter augmentation, or a larger batch (fewer steps per image)",
            )
        ]
    checks = checks or {}
    todo = [(n, text) for n, text in _FEED_CLAUSES if n not in applied]
    paths = [(n, text) for n, text in _GPU_FEEDS if n not in checks]
    limit = [] if todo else [(None, "the CPU pipeline is at its limit with workers, pinned memory and prefetch")]
    if not paths:  # neither GPU path reads this loader's data: said without naming them
        why = checks.get("gpu_augment") or checks.get("dali")
        return (
            todo
            + limit
            + [
                (
                    None,
                    f"this loader's data cannot be decoded or augmented on the GPU by fastloop "
                    f"({why}); cache decoded data, or make per-sample work cheaper (one transform on "
                    "the whole batch instead of each sample in __getitem__)",
                )
            ]
        )
    return todo + limit + paths + ([] if todo else [(None, "cache decoded data, or make per-sample work cheaper")])


_GPU_FEEDS = (
    ("dali", "for JPEG data in an ImageFolder, decode and augment on the GPU (dali)"),
    (
        "gpu_augment",
        "for in-memory images with a torchvision crop/resized-crop/flip/normalize pipeline, "
        "augment each batch on the GPU (gpu_augment)",
    ),
)
"""The GPU feed paths the doctor advises, each where the loader's data check does not rule it out."""


def _sync_clause(run: RunResult) -> list[tuple[str | None, str]]:
    """Where the step syncs every step (``prog_bar`` values, a counted sync): remove it (no speedup's clause)."""
    pbar = run.extra.get("prog_bar_keys")
    syncs = (run.gpu_profile or {}).get("host_syncs_per_step") or 0.0
    then = ", so the host builds the next batch only once the GPU is done"
    if pbar:  # Lightning's .item() on each
        return [
            (None, f"log {', '.join(pbar)} without prog_bar=True: Lightning reads them to the host every step{then}")
        ]
    return (
        [(None, f"remove the step's {syncs:.1f} host syncs a step (.item(), .cpu(), print){then}")]
        if syncs >= 0.5
        else []
    )


def _feed_rates(run: RunResult, wait: float) -> str:
    """'; the feed delivers N items/s, the step alone would take M/s: the feed must reach M'."""
    mean, items = run.step_s.mean, run.items_per_step
    if not (mean and items) or wait >= 1:
        return ""
    demand = items / (mean * (1 - wait))
    fetch = run.host_fetch_s
    host = f" (getting a batch takes {1e3 * fetch:.2f} ms of the host's time)" if fetch else ""
    return (
        f"; the feed delivers {items / mean:,.0f} items/s{host} and the step alone would consume {demand:,.0f}/s: "
        f"the feed must reach {demand:,.0f}/s"
    )


def _host_sync_note(prof: dict) -> str:
    """'; the host waits for the GPU N times per step (...)' and the user's lines that synchronize, from the
    step's GPU profile; empty under half a sync a step.

    Example:
        >>> prof = {"host_syncs_per_step": 2.0, "sync_calls": {"item": 2},
        ...         "sync_sites": [{"site": "train.py:12 in training_step", "per_step": 2.0}]}
        >>> print(_host_sync_note(prof))  # doctest: +NORMALIZE_WHITESPACE
        ; the host waits for the GPU 2.0 times per step (item: .item(), .cpu(), print of a tensor, a copy from
        pageable memory); it synchronizes at train.py:12 in training_step (2 a step)
        >>> _host_sync_note({"host_syncs_per_step": 0.25})
        ''
    """
    syncs = prof.get("host_syncs_per_step") or 0.0
    if syncs < 0.5:
        return ""
    note = (
        f"; the host waits for the GPU {syncs:.1f} times per step ({', '.join(sorted(prof.get('sync_calls') or {}))}"
        ": .item(), .cpu(), print of a tensor, a copy from pageable memory)"
    )
    sites = [s for s in prof.get("sync_sites") or [] if s.get("site") != "outside your code"]
    if sites:
        note += "; it synchronizes at " + "; ".join(f"{s['site']} ({s['per_step']:g} a step)" for s in sites)
    return note


def diagnose(cfg: dict | RunResult, ceilings: dict | None = None) -> dict:
    """Name the bottleneck of a measured configuration (a run's document, or the runs of a
    configuration merged) and the next fix to try."""
    run = RunResult.of(cfg)
    wait = run.data_wait_frac or 0.0
    med = run.step_s.median or 0.0
    mem = run.peak_mem_bytes
    total = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    mfu = run.mfu
    applied = run.applied()
    scaling = run.scaling or {}
    if wait < 0.2 and scaling.get("efficiency") is not None and scaling["efficiency"] < COMM_BOUND_EFFICIENCY:
        growth = scaling.get("step_time_growth")
        return {
            "bottleneck": "communication-bound",
            "evidence": (
                f"on {scaling['devices']} devices each step takes "
                f"{'?' if growth is None else f'{100 * growth:.0f}%'} longer than on one (same per-device "
                f"batch, data wait {100 * wait:.0f}%): scaling efficiency {100 * scaling['efficiency']:.0f}%; "
                f"the gradient all-reduce is not hidden behind the backward pass."
            ),
            "recommendation": (
                "ddp_comm (gradient_as_bucket_view; try ddp_comm:50 or :100 for larger buckets), a "
                "larger batch per device (more compute to overlap), compile (shorter backward, but "
                "measure: it also shrinks the window the all-reduce hides in)."
            ),
        }
    whole = "cuda_graph" in applied and run.extra.get("cuda_graph_tier") == TIERS[0]
    if wait >= DATA_BOUND_WAIT or (whole and wait >= GRAPHED_DATA_WAIT):
        cuda = run.peak_mem_bytes is not None or torch.cuda.is_available()
        data = run.extra.get("dataset") or {}
        checks = run.model_checks or {}
        refused = {r.name for r in run.speedups if r.status in ("skipped", "fallback")}
        advice = data_advice(applied, cuda=cuda, stamp=run.env, checks=checks)
        if cuda and data.get("in_memory_tensors") and "gpu_resident" not in applied | refused | set(checks):
            advice = [
                (
                    "gpu_resident",
                    f"gpu_resident: the dataset is {data['bytes'] / 2**20:,.0f} MiB of in-memory "
                    f"tensors ({data['type']}); keep it on the GPU and serve batches there (no "
                    "loader, no copies)",
                )
            ]
        advice = [(n, t) for n, t in advice if n not in refused] + _sync_clause(run)  # never what this run refused
        return {
            "bottleneck": "data-bound",
            "evidence": f"the step waits for its batch {100 * wait:.0f}% of the time{_feed_rates(run, wait)}.",
            "recommendation": join_advice(advice),
            "advice": advice,
        }
    if mem and total and mem > 0.9 * total:
        return {
            "bottleneck": "memory-bound",
            "evidence": f"peak memory {mem / 2**30:.1f} GiB of {total / 2**30:.0f} GiB.",
            "recommendation": "bf16 autocast, activation checkpointing, or a smaller batch (batch_size search).",
        }
    prof = run.gpu_profile or {}
    busy = prof.get("gpu_busy_frac")
    if busy is not None and busy + wait < HOST_BOUND_BUSY:
        syncs = prof.get("host_syncs_per_step") or 0.0
        sync_note = _host_sync_note(prof)
        pbar = run.extra.get("prog_bar_keys")
        on_device = any(REGISTRY[n].ladder.replaces_loader for n in applied if n in REGISTRY)
        fix = (
            (
                "remove the per-step host syncs first ("
                + (
                    f"self.log of {', '.join(pbar)} with prog_bar=True is one: "
                    "Lightning calls .item() on it every step; "
                    if pbar
                    else ""
                )
                + "keep losses on the GPU"
                + ("" if on_device else ", pin_memory for batches")
                + "), then "
            )
            if syncs >= 0.5
            else ""
        )
        return {
            "bottleneck": "host-bound",
            "evidence": (
                f"the GPU is busy {100 * busy:.0f}% of the step and idle "
                f"{100 * max(0.0, 1 - busy - wait):.0f}% while the host works (Python, framework hooks, "
                f"kernel launches){sync_note}; data wait {100 * wait:.0f}% (profile of "
                f"{prof.get('profiled_steps')} steps)."
            ),
            "recommendation": (fix.removesuffix(", then ") + "; " if fix and whole else fix)
            + _launch_fix(run, applied)
            + "; a larger batch (more GPU work per host step).",
        }
    if torch.cuda.is_available() and med and med < 0.005 and (mfu is None or mfu < 0.1) and not whole:
        # a whole step replayed as one CUDA graph launches no kernels one by one: not this
        return {
            "bottleneck": "launch-bound",
            "evidence": f"short steps ({1e3 * med:.2f} ms) with low FLOP utilisation "
            f"({'unknown' if mfu is None else f'{100 * mfu:.1f}%'}): the GPU idles between kernel launches.",
            "recommendation": _launch_fix(run, applied) + "; a larger batch.",
        }
    user_half = _user_half_precision(run)
    if (
        torch.cuda.is_available()
        and not user_half
        and not any(REGISTRY[n].math_dtype for n in applied if n in REGISTRY)
    ):
        return {
            "bottleneck": "compute-bound (fp32)",
            "evidence": f"data wait {100 * wait:.0f}%; matmuls run in plain fp32, the slowest path on this GPU.",
            "recommendation": "tf32, then bf16 autocast: tensor cores run bf16 ~15x faster than fp32 on Hopper.",
        }
    ev = f"data wait {100 * wait:.0f}%" + (f", MFU {100 * mfu:.1f}%" if mfu is not None else "")
    return {
        "bottleneck": "compute-bound",
        "evidence": ev + ": the step is busy computing.",
        "recommendation": _compute_fixes(applied | ({"bf16"} if user_half else set()), run.model_checks or {})
        if (mfu or 0) < 0.4
        else "already near the ceiling: only algorithmic changes will help much.",
    }


def _launch_fix(cfg: dict | RunResult, applied: set[str] | frozenset[str] = frozenset()) -> str:
    """Fewer launches, given what the configuration already has: a whole-step graph, unless the
    run's batches (or model) rule graphs out; where a graph runs, what keeps it from the whole step
    (the tier and its reason, ``extra.cuda_graph_tier`` and ``extra.cuda_graph_why_not_whole`` as
    both adapters record them); where it holds the whole step, that nothing is left to cut there.

    Example:
        >>> _launch_fix({})
        'cuda_graph (whole-step capture) or compile (fewer launches)'
        >>> _launch_fix({"model_checks": {"cuda_graph": "the batches change shape (...)"}})
        'compile (fewer launches; a CUDA graph cannot help here: the batches change shape (...))'
        >>> _launch_fix({"extra": {"cuda_graph_tier": "whole step"}}, {"cuda_graph"})[:64]
        'the whole step already replays as one CUDA graph: the host time '
    """
    run = RunResult.of(cfg)
    extra = run.extra
    graphed = "cuda_graph" in applied
    if graphed and extra.get("cuda_graph_tier") == TIERS[0]:
        # no speedup's name in the text: advice filtering reads them (without_measured)
        return (
            "the whole step already replays as one CUDA graph: the host time left is outside it (the loader, the "
            "framework's hooks and logging between steps)"
        )
    part = _graph_in_part(run, applied)
    if part:
        return part
    why = (run.model_checks or {}).get("cuda_graph")
    # no "cuda_graph" in the text: advice filtering reads speedup names (without_measured)
    if why:
        return (
            f"compile (fewer launches; a CUDA graph cannot help here: {why})"
            if "compile" not in applied
            else f"fewer, larger kernels (a larger batch; a CUDA graph cannot help here: {why})"
        )
    return "cuda_graph (whole-step capture) or compile (fewer launches)"


def _graph_in_part(cfg: dict | RunResult, applied: set[str] | frozenset[str]) -> str | None:
    """Where the step's graph covers less than the whole step, what keeps the rest out (the tier
    and reason the adapters record as ``extra.cuda_graph_tier`` / ``extra.cuda_graph_why_not_whole``),
    as advice; None where no graph runs or it holds the whole step.

    Example:
        >>> cfg = {"extra": {"cuda_graph_tier": "forward+backward graphed", "cuda_graph_why_not_whole":
        ...        "OneCycleLR cycles AdamW's betas every step (cycle_momentum=True), which a graph would bake in"}}
        >>> print(_graph_in_part(cfg, {"cuda_graph"}))  # doctest: +NORMALIZE_WHITESPACE
        the whole step in one CUDA graph: the graph holds only forward+backward (whole step: OneCycleLR cycles
        AdamW's betas every step (cycle_momentum=True), which a graph would bake in); change that in the module and
        the whole step is captured
    """
    extra = RunResult.of(cfg).extra
    tier, why = extra.get("cuda_graph_tier"), extra.get("cuda_graph_why_not_whole")
    if "cuda_graph" not in applied or tier in (None, TIERS[0]) or not why or why.startswith("not captured"):
        return None
    held = f"the graph holds only {tier.removesuffix(' graphed')}" if tier == TIERS[1] else f"the step runs {tier}"
    # no speedup's name in the text: advice filtering reads them (without_measured)
    return (
        f"the whole step in one CUDA graph: {held} (whole step: {why}); "
        "change that in the module and the whole step is captured"
    )


def _user_half_precision(cfg: dict | RunResult) -> bool:
    """Whether the user's own Trainer settings (the target's) train in 16-bit: bf16-mixed, 16-mixed,
    bf16-true, ... (the run document keeps each setting as its repr).

    Example:
        >>> _user_half_precision({"trainer_settings": {"used": {"precision": "'bf16-mixed'"}}})
        True
    """
    settings = RunResult.of(cfg).trainer_settings
    return "16" in str((settings.used if settings is not None else {}).get("precision", ""))


_COMPUTE_FIXES = (
    ("bf16", "bf16 autocast"),
    ("fused_optimizer", "fused optimizer"),
    ("channels_last", "channels_last"),
    ("compile", "compile"),
)


def _compute_fixes(applied: set[str], model_checks: dict[str, str]) -> str:
    """The usual fixes of a compute-bound step that this configuration lacks and this model can take
    (``model_checks``: speedup -> why it cannot apply to the model, as the run document has them).

    Example:
        >>> _compute_fixes({"bf16"}, {"channels_last": "model has no Conv2d layers"})
        'fused optimizer, compile.'
    """
    low_precision = any(REGISTRY[n].math_dtype in ("bf16", "fp16") for n in applied if n in REGISTRY)
    todo = [
        text
        for name, text in _COMPUTE_FIXES
        if name not in applied and name not in model_checks and not (name == "bf16" and low_precision)
    ]
    if todo:
        return ", ".join(todo) + "."
    have = [name for name, _ in _COMPUTE_FIXES if name in applied or (name == "bf16" and low_precision)]
    cannot = [f"{name}: {model_checks[name]}" for name, _ in _COMPUTE_FIXES if name in model_checks]
    return (
        "the usual compute fixes are "
        + (f"applied ({', '.join(have)})" if have else "not for this model")
        + (
            f" or do not apply ({'; '.join(cannot)})"
            if cannot and have
            else (f" ({'; '.join(cannot)})" if cannot else "")
        )
        + ": profile the step (fastloop run --out DIR shows its GPU profile), or a larger batch (batch_size)."
    )


def without_measured(diagnosis: dict, measured: dict[str, str]) -> dict:
    """``diagnosis`` whose recommendation no longer advises a speedup that the same report measured
    as not faster on this model (``measured``: name -> what was measured, e.g. "0.99x, no
    significant difference"); it says what was measured instead.

    Example:
        >>> d = {"bottleneck": "compute-bound", "evidence": "", "recommendation": "bf16 autocast, compile."}
        >>> without_measured(d, {"bf16": "1.00x, no significant difference"})["recommendation"]
        'compile; measured here and not faster, so not advised again: bf16 (1.00x, no significant difference).'
    """
    rec = diagnosis.get("recommendation") or ""
    if diagnosis.get("advice"):  # clauses, each naming the speedup it advises: drop the measured ones, keep the prose
        clauses = [tuple(c) for c in diagnosis["advice"]]
        dropped = [n for n, _ in clauses if n in measured]
        if not dropped:
            return diagnosis
        kept = [(n, t) for n, t in clauses if n not in measured]
        said = "; ".join(f"{n} ({measured[n]})" for n in dropped)
        text = (
            join_advice(kept)[:-1] + "; " if kept else ""
        ) + f"measured here and not faster, so not advised again: {said}."
        return {**diagnosis, "recommendation": text, "advice": kept, "advice_filtered": dropped}
    named = [
        cls.name
        for cls in sorted(REGISTRY.values(), key=lambda c: c.order)
        if re.search(advice_pattern(cls), rec, re.IGNORECASE)
    ]
    dropped = [n for n in named if n in measured]
    if not dropped:
        return diagnosis
    rest = [n for n in named if n not in measured]
    said = "; ".join(f"{n} ({measured[n]})" for n in dropped)
    if rest:
        text = f"{', '.join(rest)}; measured here and not faster, so not advised again: {said}."
    else:
        text = (
            f"the usual fixes for this bottleneck were measured here and were not faster: {said}; "
            "profile the step (fastloop run --out DIR shows its GPU profile) to find what holds it."
        )
    return {**diagnosis, "recommendation": text, "advice_filtered": dropped}
