#!/usr/bin/env bash
# Device call C (2026-12-01): CIFAR ResNet-18 B256, in one interleaved A/B: the plain fp32
# baseline vs GPU-resident data + bf16 + channels_last + compile + cuda_graph; then workers
# (count chosen by measurement, 1.25x rule) vs none. JSON under $OUT.
# REPEATS=5 (default 3) for a tighter interval (round 3: 2.97x [2.58, 3.41] at 3 a side);
# WREPEATS: the workers A/B's runs a side (default REPEATS).
set -u
export PYTHONPATH=src:. PYTHONUNBUFFERED=1
T=benchmarks/targets/cifar.py:make
python3 -m fastloop.cli ab $T --a none --b gpu_resident,bf16,channels_last,compile,cuda_graph --repeats ${REPEATS:-3} --steps 100 \
  --warmup 10 --json $OUT/cifar_resident_graph_ab.json --quiet 2>&1 | grep -v "^W1201"; echo "rc=$?"
python3 -m fastloop.cli ab $T --a none --b workers --repeats ${WREPEATS:-${REPEATS:-3}} --steps 60 --warmup 5 --json $OUT/cifar_workers_ab2.json --quiet; echo "rc=$?"
python3 - <<'PY'
import json, os
o = os.environ["OUT"]
for name in ("cifar_resident_graph_ab", "cifar_workers_ab2"):
    d = json.load(open(f"{o}/{name}.json"))
    for side in ("a", "b"):
        c = d[side]
        print(name, side, d[side + "_spec"], round(c["throughput"]["value"]), "wait", round(c["data_wait_frac"], 3),
              "runs", [round(x * 1e3, 2) for x in c["run_mean_step_s"]], [(r["name"], r["status"], r["reason"][:150]) for r in c["speedups"]])
    print(name, "verdict:", d["verdict"])
PY
