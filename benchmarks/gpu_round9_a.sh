#!/usr/bin/env bash
# NOT RUN YET (written at the end of round 8, device time spent). Next session's first call
# (no DALI needed), issues 12 and 13:
# 1. the GPT default selecting ladder's wall time with the step-demand rule (round 8: 453.5 s,
#    workers took 3 runs a side to learn 1.00x; now its first run should skip itself: the step
#    consumes ~490 samples/s of a loader that delivers ~15k/s);
# 2. CIFAR ResNet-18 B256 in memory: `--a none --b workers` (B learns A's step rate; round 8:
#    16 workers applied, 0.904x n.s.; the rule predicts a 5.8% saving, under 10%: skipped),
#    then the resident + compute set vs fp32 with 5 a side (round 8: 2.85x [2.43, 3.33]).
set -u
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r9a; mkdir -p $R
S0=$SECONDS
timeout ${SELECT_S:-400} python3 -m fastloop.cli ladder gpt --device cuda --out $R/gpt_select > $R/gpt_select.txt 2>&1
echo "gpt select rc $? wall $((SECONDS-S0)) s [$((SECONDS-T0)) s]"; tail -4 $R/gpt_select.txt
T=benchmarks/targets/cifar.py:make
timeout 60 python3 -m fastloop.cli ab $T --a none --b workers --repeats 3 --steps 60 --warmup 5 \
  --json $R/cifar_workers_ab.json --quiet > /dev/null 2>&1; echo "cifar workers rc $? [$((SECONDS-T0)) s]"
left=$(( ${TOTAL_S:-550} - (SECONDS-T0) ))
timeout $left python3 -m fastloop.cli ab $T --a none --b gpu_resident,bf16,channels_last,compile,cuda_graph --repeats 5 \
  --steps 100 --warmup 10 --json $R/cifar_resident_ab.json --quiet > /dev/null 2>&1; echo "cifar resident rc $? [$((SECONDS-T0)) s]"
python3 - "$R" <<'PY'
import json, os, sys
r = sys.argv[1]
for name in ("cifar_workers_ab", "cifar_resident_ab"):
    p = f"{r}/{name}.json"
    if not os.path.exists(p):
        print(name, "no result"); continue
    d = json.load(open(p))
    b = d["b"]
    print(name, d["verdict"], [(s["name"], s["status"], (s.get("reason") or s.get("detail") or "")[:160]) for s in b["speedups"]])
PY
tar -C $OUT -czf $OUT/r9a.tgz r9a && rm -rf $R
echo "total $((SECONDS-T0)) s"
