"""How much does StepTimer add to a ~10 ms GPU step? (target: <= 1%)

A fixed GPU workload (bf16 matmuls sized to ~10 ms) is run N steps plain, timed by one pair of
events around the whole loop, and N steps with StepTimer marks around every step; ABAB
interleaved over several rounds. Overhead = median(timed)/median(plain) - 1.
"""

from __future__ import annotations

import statistics

import torch

from benchmarks._common import emit
from fastloop.measure.timer import StepTimer


def main(steps: int = 200, rounds: int = 5) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def work():
        for _ in range(7):  # ~1.4 ms each at ~760 TFLOP/s -> ~10 ms
            a @ b

    def plain() -> float:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(steps):
            work()
        e.record()
        e.synchronize()
        return s.elapsed_time(e) / 1e3 / steps

    def timed() -> float:
        t = StepTimer("cuda", warmup=0)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(steps):
            t.fetch_start()
            t.fetch_end()
            work()
            t.step_end()
        e.record()
        e.synchronize()
        t.result()
        return s.elapsed_time(e) / 1e3 / steps

    for _ in range(20):
        work()
    p, q = [], []
    for _ in range(rounds):
        p.append(plain())
        q.append(timed())
    overhead = statistics.median(q) / statistics.median(p) - 1
    emit(
        "timer_overhead",
        {
            "step_ms_plain": [1e3 * x for x in p],
            "step_ms_timed": [1e3 * x for x in q],
            "overhead_frac": overhead,
            "target": "<= 0.01",
            "pass": overhead <= 0.01,
        },
    )


if __name__ == "__main__":
    main()
