#!/usr/bin/env bash
# Round 9 call 3 ran this with IMNET_S=105 TOTAL_S=195: both A/Bs were cut by their timeouts (cold
# Inductor cache); the ImageNet A/B was then run alone as call 4 (RESULTS.md, round 9, item 6).
# Round 9, device call 3 (the second DALI transfer call, carrying .dali2). Issues 12 and 13:
# 1. ImageNet (synthetic loader) selected set vs the best cumulative rung, interleaved, 3 a side
#    (round 7: 6,915 vs 6,927 img/s from two separate ladders);
# 2. CIFAR ResNet-18 B256 in memory: gpu_resident + bf16 + channels_last + compile + cuda_graph vs
#    fp32, 5 a side, 300 measured steps a run (round 8: 2.85x [2.43, 3.33] with 100 steps a run).
set -u
T0=$SECONDS
mkdir -p /tmp/dw && cp .dali2/* /tmp/dw/
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r9d; mkdir -p $R
FASTLOOP_IMAGENET_LOADER=synthetic timeout ${IMNET_S:-150} python3 -m fastloop.cli ab imagenet --device cuda \
  --a tf32,bf16,fused_optimizer,channels_last,compile,cuda_graph --b bf16,fused_optimizer,channels_last,compile,cuda_graph \
  --repeats 3 --json $R/imagenet_sel_vs_cum.json --quiet > /dev/null 2> $R/imagenet_sel_vs_cum.err
echo "imagenet sel vs cum rc $? [$((SECONDS-T0)) s]"
left=$(( ${TOTAL_S:-300} - (SECONDS-T0) ))
timeout $left python3 -m fastloop.cli ab benchmarks/targets/cifar.py:make --device cuda --a none \
  --b gpu_resident,bf16,channels_last,compile,cuda_graph --repeats 5 --steps 300 --warmup 10 \
  --json $R/cifar_resident_ab.json --quiet > /dev/null 2> $R/cifar_resident_ab.err
echo "cifar resident rc $? [$((SECONDS-T0)) s]"
python3 - "$R" <<'PY'
import json, os, sys
for name in ("imagenet_sel_vs_cum", "cifar_resident_ab"):
    p = f"{sys.argv[1]}/{name}.json"
    if not os.path.exists(p):
        print(name, "no result"); continue
    d = json.load(open(p))
    print(name, d["verdict"])
    for side in ("a", "b"):
        s = d[side]
        print("  ", side, round(s["throughput"]["value"]), s["throughput"]["unit"], "wait", round(s.get("data_wait_frac") or 0, 4),
              "runs", [round(1e3 * m, 3) for m in s.get("run_mean_step_s") or []])
PY
tar -C $OUT -czf $OUT/r9d.tgz r9d && rm -rf $R
echo "total $((SECONDS-T0)) s"
