"""Where the host's time goes during the measured steps of one configuration (cProfile).

A step the GPU finishes before the host has issued the next one is host-bound: its time is the
host's. This runs one configuration through fastloop's runner (same Trainer, callbacks and
speedups as ``fastloop run``) with cProfile on for the measured steps only (warm-up, compile and
capture excluded), and prints the functions with the most own time and the most cumulative time
per step. cProfile slows Python code down, so read shares, not absolute times; the step time
measured without it is printed beside it.

Usage (on the H200, after warm-up the CIFAR target's host time per step):
    python benchmarks/host_profile.py benchmarks/targets/cifar.py:make \
        gpu_resident,bf16,channels_last,compile,cuda_graph --steps 300 --json out.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time

import fastloop.drivers.runner as runner
from fastloop.measure.callback import MeasureCallback


class _Profiled(MeasureCallback):
    """MeasureCallback with cProfile on from the first measured step to the last."""

    prof: cProfile.Profile | None = None
    profiled_steps = 0
    profiled_s = 0.0
    _t = 0.0
    _done = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[override]
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        n = self.timer.recorded_steps if self.timer is not None else 0
        if self._done:
            return
        if self.prof is None and n > self.warmup:
            self.prof, self._t, self._start_n = cProfile.Profile(), time.perf_counter(), n
            self.prof.enable()
        elif self.prof is not None and self._measured_end is not None:
            self.prof.disable()
            self.profiled_s = time.perf_counter() - self._t
            self.profiled_steps = n - self._start_n
            self._done = True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target")
    ap.add_argument("speedups")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    made: list[_Profiled] = []

    def make(*a, **kw):
        cb = _Profiled(*a, **kw)
        made.append(cb)
        return cb

    runner.MeasureCallback = make  # type: ignore[assignment,misc]
    doc = runner.run_configuration(args.target, args.speedups, steps=args.steps, warmup=10, device=args.device)
    cb = made[-1]
    if cb.prof is None or not cb.profiled_steps:
        print("nothing was profiled", file=sys.stderr)
        return 1
    out = io.StringIO()
    st = pstats.Stats(cb.prof, stream=out)
    per = 1e3 / cb.profiled_steps
    rows = []
    for (file, line, fn), (_cc, nc, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "fn": f"{'/'.join(file.rsplit('/', 2)[-2:])}:{line}({fn})",
                "calls_per_step": nc / cb.profiled_steps,
                "own_ms_per_step": tt * per,
                "cum_ms_per_step": ct * per,
            }
        )
    own = sorted(rows, key=lambda r: -r["own_ms_per_step"])[: args.top]
    cum = sorted(rows, key=lambda r: -r["cum_ms_per_step"])[: args.top]
    res = {
        "target": args.target,
        "speedups": args.speedups,
        "measured_mean_step_ms": 1e3 * doc["step_s"]["mean"],
        "profiled_steps": cb.profiled_steps,
        "profiled_ms_per_step": 1e3 * cb.profiled_s / cb.profiled_steps,
        "applied": [s["name"] for s in doc["speedups"] if s["status"] == "applied"],
        "gpu_profile": doc.get("gpu_profile"),
        "top_own": own,
        "top_cumulative": cum,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    print(
        f"measured mean step {res['measured_mean_step_ms']:.3f} ms; "
        f"under cProfile {res['profiled_ms_per_step']:.3f} ms ({cb.profiled_steps} steps); "
        f"applied: {','.join(res['applied'])}"
    )
    print("own ms/step  calls/step  function")
    for r in own:
        print(f"{r['own_ms_per_step']:10.3f} {r['calls_per_step']:10.1f}  {r['fn']}")
    print("cum ms/step  calls/step  function")
    for r in cum:
        print(f"{r['cum_ms_per_step']:10.3f} {r['calls_per_step']:10.1f}  {r['fn']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
