#!/usr/bin/env bash
# Device call B (2026-12-01): a CIFAR-shaped ResNet-18 (Lightning tutorial style, in-memory
# data, B256): the plain fp32 baseline vs GPU-resident data + bf16 + channels_last + compile,
# interleaved; then workers (count chosen by measurement) vs none. JSON under $OUT.
set -u
export PYTHONPATH=src:. PYTHONUNBUFFERED=1
T=benchmarks/targets/cifar.py:make
python3 -m fastloop.cli ab $T --a none --b gpu_resident,bf16,channels_last,compile --repeats 3 --steps 60 --warmup 10 \
  --json $OUT/cifar_resident_ab.json --quiet; echo "rc=$?"
python3 -m fastloop.cli ab $T --a none --b workers --repeats 3 --steps 60 --warmup 5 --json $OUT/cifar_workers_ab.json --quiet; echo "rc=$?"
python3 -m fastloop.cli run $T --speedups gpu_resident,bf16,channels_last,compile,cuda_graph --steps 60 --warmup 10 \
  --json $OUT/cifar_resident_graph.json --quiet; echo "rc=$?"
python3 - <<'PY'
import json, os
o = os.environ["OUT"]
for name in ("cifar_resident_ab", "cifar_workers_ab"):
    d = json.load(open(f"{o}/{name}.json"))
    for side in ("a", "b"):
        c = d[side]
        print(name, side, d[side + "_spec"], round(c["throughput"]["value"]), c["throughput"]["unit"], "wait",
              round(c["data_wait_frac"], 3), [(r["name"], r["status"], r["reason"][:120]) for r in c["speedups"]], c.get("extra", {}).get("loader_rates"))
    print(name, "verdict:", d["verdict"])
d = json.load(open(f"{o}/cifar_resident_graph.json"))
print("resident+graph", round(d["throughput"]["value"]), "wait", round(d["data_wait_frac"], 3), [(r["name"], r["status"], r["reason"][:100]) for r in d["speedups"]])
PY
