#!/usr/bin/env bash
# Ran in round 10 as call 3 (b208e68, `REPEATS=4 AB_S=230`: 2.97x [2.52, 3.51]; RESULTS.md, round 10, item 2).
# Round 10, device call 2 (carries .dali2). Issue 13: CIFAR-shaped ResNet-18 B256, in-memory data,
# the plain fp32 Lightning baseline vs gpu_resident + bf16 + channels_last + compile + cuda_graph,
# interleaved, REPEATS a side, 100 measured steps a run (round 8: 2.85x [2.43, 3.33], B's runs
# 4.7-6.6 ms); now with a full garbage collection at the end of each warm-up and the cheaper
# FeedClock. Then the host profile of B (cProfile over the measured steps).
set -u
T0=$SECONDS
mkdir -p /tmp/dw && cp .dali2/* /tmp/dw/
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r10b; mkdir -p $R
T=benchmarks/targets/cifar.py:make
timeout ${AB_S:-290} python3 -m fastloop.cli ab $T --device cuda --a none --b gpu_resident,bf16,channels_last,compile,cuda_graph \
  --repeats ${REPEATS:-5} --steps 100 --warmup 10 --json $R/cifar_resident_ab.json --quiet > /dev/null 2> $R/cifar_resident_ab.err
echo "cifar resident rc $? [$((SECONDS-T0)) s]"
timeout 75 python3 benchmarks/host_profile.py $T gpu_resident,bf16,channels_last,compile,cuda_graph --steps 300 --device cuda \
  --top 30 --json $R/cifar_host_profile.json > $R/cifar_host_profile.txt 2>&1; echo "host profile rc $? [$((SECONDS-T0)) s]"
head -3 $R/cifar_host_profile.txt | cut -c1-160
python3 - "$R" <<'PY'
import json, os, sys
p = f"{sys.argv[1]}/cifar_resident_ab.json"
if os.path.exists(p):
    d = json.load(open(p))
    print("cifar", d["verdict"])
    for side in ("a", "b"):
        s = d[side]
        print("  ", side, round(s["throughput"]["value"]), "wait", round(s.get("data_wait_frac") or 0, 4),
              "runs ms", [round(1e3 * m, 3) for m in s.get("run_mean_step_s") or []],
              "busy", (s.get("gpu_profile") or {}).get("gpu_busy_ms_per_step"), "gc", s.get("warmup_gc_s"))
else:
    print("cifar: no result"); os.system(f"tail -5 {sys.argv[1]}/cifar_resident_ab.err")
PY
tar -C $OUT -czf $OUT/r10b.tgz r10b && rm -rf $R
echo "total $((SECONDS-T0)) s"
