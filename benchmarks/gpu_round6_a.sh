#!/usr/bin/env bash
# Round 6, call 1 (issue 11's must-shows in one H200 run): all GPU tests (torchao/liger wheels
# in .whl); the regression cases beside plain PyTorch written by hand (GPT-2 B16 and B32 after
# the prog_bar fix, ResNet-50 B256 synthetic, the launch-bound MLP's whole-step graph); then the
# selecting ladder over all default rungs of Lightning's demo Transformer (forked runs, data rungs
# last, model-ruled-out rungs unmeasured) until the call's time is up. One tar comes back.
set -u
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r6a; mkdir -p $R
python3 - <<'PY' 2>&1 | tail -3
import time
from fastloop.subproc import run_in_subprocess
for i in range(2):
    t = time.perf_counter()
    d = run_in_subprocess("benchmarks/targets/lightning_demo.py:make", "bf16", steps=10, warmup=3, device="cuda")
    print("forked run", i, d.get("timings"), f"{time.perf_counter() - t:.1f} s", f"{d['throughput']['value']:,.0f}")
PY
timeout 200 python3 -m pytest -m gpu tests/ -q -p no:cacheprovider -p no:warnings -rs --durations=8 > $R/gpu_tests.txt 2>&1
echo "gpu tests: $(grep -E 'passed|failed' $R/gpu_tests.txt | tail -1) [$((SECONDS-T0)) s]"
export OUT_SAVE=$OUT; export OUT=$R
CASES="gpt:16 gpt:32" ORDER="hand fastloop" bash benchmarks/gpu_round4_b.sh > $R/vs_gpt.txt 2>&1
echo "[$((SECONDS-T0)) s]"
CASES="rn50:256" ORDER="hand fastloop" STEPS=40 WARMUP=10 bash benchmarks/gpu_round4_b.sh > $R/vs_rn50.txt 2>&1
echo "[$((SECONDS-T0)) s]"
CASES="mlp:32" ORDER="hand fastloop" STEPS=500 WARMUP=20 bash benchmarks/gpu_round4_b.sh > $R/vs_mlp.txt 2>&1
cat $R/vs_mlp.txt
echo "[$((SECONDS-T0)) s]"
left=$((575 - (SECONDS-T0)))
timeout $left python3 -m fastloop.cli ladder benchmarks/targets/lightning_demo.py:make --device cuda --max-repeats 3 \
  --steps 10 --warmup 3 --out $R/demo_ladder > $R/demo_ladder.txt 2>&1
echo "demo ladder rc $? [$((SECONDS-T0)) s]"
python3 - <<'PY'
import json, os
d = json.load(open(os.path.join(os.environ["OUT"], "demo_ladder", "report.json")))
print("wall", d.get("wall_s"), "runs", d.get("runs"), "run_s_mean", d.get("run_s_mean"), "partial", d.get("partial"))
for r in d["rungs"]:
    tp = (r.get("throughput") or {}).get("value")
    print(f"{r['rung'][:40]:40} {str(r.get('rung_status')):10} {tp or 0:10,.0f} {str(r.get('decision') or r.get('rung_reason') or '')[:100]}")
PY
grep -o '"forked": [a-z]*' $R/demo_ladder/report.json | sort | uniq -c
export OUT=$OUT_SAVE
tar -C $OUT -czf $OUT/r6a.tgz r6a && rm -rf $OUT/r6a
echo "total $((SECONDS-T0)) s"
