"""Where a DALI-fed step loses time: a torch.profiler trace of a few steps, read per stream and thread.

Runs one configuration through fastloop's runner (the same Trainer, callbacks and speedups as
``fastloop run``), and widens the run's own GPU profile (the extra steps after the measured ones,
see ``fastloop.measure.gpu_busy``) to host activity and more steps. Each DALI fetch is marked
``dali_next`` on the host. The trace is saved (``$OUT/<name>.trace.json.gz``) and read:

- per GPU stream: busy time a step and the kernels that fill it; the stream with the most work
  is the training stream, the others are DALI's (and copies);
- the training stream's idle gaps, and how much other streams worked inside them;
- per host thread: the time a step in CUDA calls that wait for the GPU (event/stream/device
  synchronizes) or allocate (cudaMalloc, cudaHostAlloc, ... which can synchronize the device);
- the host's time inside ``dali_next``.

Usage (on the H200, the JPEGs under $FASTLOOP_IMAGENET_ROOT):
    FASTLOOP_IMAGENET_LOADER=dali python benchmarks/dali_trace.py imagenet \\
        bf16,fused_optimizer,channels_last,compile,cuda_graph,dali --name graph
    python benchmarks/dali_trace.py --read out/graph.trace.json.gz   # read a saved trace again
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import sys

WAITS = (
    "cudaEventSynchronize",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaStreamWaitEvent",
    "cudaMalloc",
    "cudaFree",
    "cudaHostAlloc",
    "cudaMallocHost",
    "cudaFreeHost",
    "cudaHostRegister",
    "cudaMallocAsync",
    "cudaFreeAsync",
    "cudaMemcpy",
    "cudaStreamQuery",
    "cudaEventQuery",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
)


def _union(ivs: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(ivs):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(a, b) for a, b in out]


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the intersection of two unions of intervals (each sorted, disjoint)."""
    i = j = 0
    tot = 0.0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            tot += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tot


def read_trace(events: list[dict], steps: int) -> dict:
    """The per-stream, per-thread reading of a Chrome trace (times in microseconds)."""
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    rt = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]
    ann = [e for e in events if e.get("ph") == "X" and e.get("name") == "dali_next"]
    if not gpu:
        return {"error": "no GPU activity in the trace"}
    by_stream: dict[str, list[dict]] = collections.defaultdict(list)
    for e in gpu:
        by_stream[str(e.get("args", {}).get("stream", e.get("tid")))].append(e)
    t0 = min(e["ts"] for e in gpu)
    t1 = max(e["ts"] + e["dur"] for e in gpu)
    unions = {s: _union([(e["ts"], e["ts"] + e["dur"]) for e in evs]) for s, evs in by_stream.items()}
    busy = {s: sum(b - a for a, b in u) for s, u in unions.items()}
    train = max(busy, key=busy.get)
    others = _union([iv for s, u in unions.items() if s != train for iv in u])
    all_busy = _union([iv for u in unions.values() for iv in u])
    streams = {}
    for s, evs in sorted(by_stream.items(), key=lambda kv: -busy[kv[0]]):
        per = collections.Counter()
        cnt = collections.Counter()
        for e in evs:
            per[e["name"][:90]] += e["dur"]
            cnt[e["name"][:90]] += 1
        streams[s] = {
            "training": s == train,
            "ops_per_step": len(evs) / steps,
            "busy_ms_per_step": busy[s] / 1e3 / steps,
            "top": [
                {"name": n, "ms_per_step": round(t / 1e3 / steps, 4), "per_step": cnt[n] / steps}
                for n, t in per.most_common(8)
            ],
        }
    tu = unions[train]
    gaps = [(a[1], b[0]) for a, b in zip(tu, tu[1:]) if b[0] - a[1] > 0]
    big = [g for g in gaps if g[1] - g[0] > 100]
    threads: dict[str, dict] = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))
    for e in rt:
        if e["name"] in WAITS or e["dur"] > 200:
            d = threads[str(e.get("tid"))][e["name"]]
            d[0] += 1
            d[1] += e["dur"]
    main = str(ann[0]["tid"]) if ann else None
    host = {}
    for tid, calls in threads.items():
        host[tid + (" (main)" if tid == main else "")] = {
            n: {"per_step": round(c / steps, 2), "ms_per_step": round(t / 1e3 / steps, 3)}
            for n, (c, t) in sorted(calls.items(), key=lambda kv: -kv[1][1])[:8]
        }
    longest = sorted(rt, key=lambda e: -e["dur"])[:12]
    return {
        "steps": steps,
        "span_ms_per_step": (t1 - t0) / 1e3 / steps,
        "gpu_busy_ms_per_step": sum(b - a for a, b in all_busy) / 1e3 / steps,
        "training_stream": train,
        "training_busy_ms_per_step": busy[train] / 1e3 / steps,
        "training_gap_ms_per_step": sum(b - a for a, b in gaps) / 1e3 / steps,
        "training_gaps_over_100us": {
            "per_step": len(big) / steps,
            "ms_per_step": sum(b - a for a, b in big) / 1e3 / steps,
            "longest_ms": sorted((round((b - a) / 1e3, 3) for a, b in big), reverse=True)[:10],
            "other_streams_busy_inside_ms_per_step": _overlap(_union(big), others) / 1e3 / steps,
        },
        "other_streams_busy_ms_per_step": sum(b - a for a, b in others) / 1e3 / steps,
        "other_streams_overlapping_training_ms_per_step": _overlap(tu, others) / 1e3 / steps,
        "dali_next": {
            "per_step": len(ann) / steps,
            "ms_per_step": sum(e["dur"] for e in ann) / 1e3 / steps,
            "longest_ms": sorted((round(e["dur"] / 1e3, 3) for e in ann), reverse=True)[:8],
        },
        "streams": streams,
        "host_threads": host,
        "longest_cuda_calls": [
            {
                "name": e["name"],
                "ms": round(e["dur"] / 1e3, 3),
                "tid": e.get("tid"),
                "at_ms": round((e["ts"] - t0) / 1e3, 2),
            }
            for e in longest
        ],
    }


def _load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target", nargs="?")
    ap.add_argument("speedups", nargs="?", default="")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--profile-steps", type=int, default=6)
    ap.add_argument("--name", default="trace")
    ap.add_argument("--read", default=None, help="read a saved trace instead of running")
    args = ap.parse_args(argv)
    out_dir = os.environ.get("OUT", ".")
    if args.read:
        steps = int(os.environ.get("TRACE_STEPS", args.profile_steps))
        print(json.dumps(read_trace(_load(args.read), steps), indent=1))
        return 0

    import torch

    import fastloop.drivers.runner as runner
    import fastloop.measure.callback as cbmod
    import fastloop.measure.gpu_busy as gb
    from fastloop.recipes.imagenet import data as imdata

    saved: dict = {}

    class _Traced(gb.GpuProfile):
        def start(self) -> None:
            torch.cuda.synchronize()
            self._prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            )
            self._prof.__enter__()

        def stop(self, steps: int) -> dict:
            torch.cuda.synchronize()
            prof, self._prof = self._prof, None
            prof.__exit__(None, None, None)
            raw = os.path.join(out_dir, f"{args.name}.trace.json")
            prof.export_chrome_trace(raw)
            events = _load(raw)
            with open(raw, "rb") as f, gzip.open(raw + ".gz", "wb") as g:
                g.write(f.read())
            os.remove(raw)
            saved["reading"] = read_trace(events, steps)
            return {"traced_steps": steps}

    gb.GpuProfile = _Traced  # type: ignore[misc]
    orig_iter = imdata.DaliLoader.__iter__

    def marked(self):
        it = orig_iter(self)
        while True:
            with torch.profiler.record_function("dali_next"):
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item

    imdata.DaliLoader.__iter__ = marked  # type: ignore[method-assign]
    made = []

    def make(*a, **kw):
        cb = cbmod.MeasureCallback(*a, **kw)
        cb.profile_steps = args.profile_steps
        made.append(cb)
        return cb

    runner.MeasureCallback = make  # type: ignore[assignment,misc]
    doc = runner.run_configuration(args.target, args.speedups, steps=args.steps, warmup=10, device="cuda")
    res = {
        "name": args.name,
        "speedups": args.speedups,
        "dali": os.environ.get("FASTLOOP_IMAGENET_DALI", ""),
        "loader": os.environ.get("FASTLOOP_IMAGENET_LOADER", ""),
        "measured_mean_step_ms": 1e3 * doc["step_s"]["mean"],
        "data_wait_frac": doc["data_wait_frac"],
        "records": [(s["name"], s["status"]) for s in doc["speedups"]],
        "reading": saved.get("reading"),
    }
    with open(os.path.join(out_dir, f"{args.name}.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    r = res["reading"] or {}
    print(
        f"{args.name}: measured {res['measured_mean_step_ms']:.2f} ms, wait {res['data_wait_frac']:.3f}; traced "
        f"{r.get('steps')} steps: span {r.get('span_ms_per_step', 0):.2f} ms/step, training busy "
        f"{r.get('training_busy_ms_per_step', 0):.2f}, gaps {r.get('training_gap_ms_per_step', 0):.2f}, others busy "
        f"{r.get('other_streams_busy_ms_per_step', 0):.2f} (overlapping training "
        f"{r.get('other_streams_overlapping_training_ms_per_step', 0):.2f}), dali_next {r.get('dali_next')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
