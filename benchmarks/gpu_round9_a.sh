#!/usr/bin/env bash
# Round 9, call 1 (no DALI needed; carry .whl for torchao and liger-kernel). Issues 12 and 13:
# 1. the GPT default selecting ladder's wall time with the feed clock (feed rungs ruled out from
#    the loader's own time, not Lightning's work between steps) and the compiler preload in the
#    fork server (round 8: 453.5 s; goal <= 300 s);
# 2. where the host's time goes in the CIFAR ResNet-18 B256 resident + compute step (round 8:
#    GPU busy 3.8 of 5.8 ms, so host-bound), cProfile over the measured steps;
# 3. CIFAR `--a none --b workers` 3 a side (the step-demand rule, first time on the H200).
set -u
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r9a; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $R/gpu.txt 2>&1
S0=$SECONDS
timeout -s INT ${SELECT_S:-390} python3 -m fastloop.cli ladder gpt --device cuda --out $R/gpt_select > $R/gpt_select.txt 2>&1
echo "gpt select rc $? wall $((SECONDS-S0)) s [$((SECONDS-T0)) s]"; tail -5 $R/gpt_select.txt
T=benchmarks/targets/cifar.py:make
timeout 90 python3 benchmarks/host_profile.py $T gpu_resident,bf16,channels_last,compile,cuda_graph --steps 300 --device cuda \
  --top 40 --json $R/cifar_host_profile.json > $R/cifar_host_profile.txt 2>&1; echo "host profile rc $? [$((SECONDS-T0)) s]"
head -45 $R/cifar_host_profile.txt | cut -c1-150
left=$(( ${TOTAL_S:-570} - (SECONDS-T0) ))
timeout $left python3 -m fastloop.cli ab $T --a none --b workers --repeats 3 --steps 60 --warmup 5 \
  --json $R/cifar_workers_ab.json --quiet > /dev/null 2>&1; echo "cifar workers rc $? [$((SECONDS-T0)) s]"
python3 - "$R" <<'PY'
import json, os, sys
r = sys.argv[1]
p = f"{r}/gpt_select/report.json"
if os.path.exists(p):
    d = json.load(open(p))
    print("gpt wall", round(d["wall_s"], 1), "runs", d["runs"], "selected", d["selected_spec"])
    for g in d["rungs"]:
        t = g.get("timings") or {}
        print(f"  {g['rung'][:34]:34} n={g.get('repeats')} {g.get('rung_status')} {str(g.get('decision') or g.get('rung_reason'))[:110]}")
        if t:
            print("     timings", {k: round(v, 2) for k, v in t.items() if isinstance(v, float)}, "fetch ms", round(1e3 * (g.get("host_fetch_s") or 0), 3), "host", round(g.get("host_wait_frac") or 0, 4))
p = f"{r}/cifar_workers_ab.json"
if os.path.exists(p):
    d = json.load(open(p))
    print("cifar workers", d["verdict"], [(s["name"], s["status"], (s.get("reason") or s.get("detail") or "")[:200]) for s in d["b"]["speedups"]])
else:
    print("cifar workers: no result")
PY
tar -C $OUT -czf $OUT/r9a.tgz r9a && rm -rf $R
echo "total $((SECONDS-T0)) s"
