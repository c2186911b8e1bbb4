#!/usr/bin/env bash
# Round 5, call 1: the GPU tests; GPT-2 124M through fastloop beside the hand-written loop (the
# recipe now pins its batches); 300 steps bf16 + compile vs + fp8 + fused_loss as an A/B whose
# report plots both losses; a profile of the fp8 step if time is left. Everything under $OUT is
# packed into one tar (the transfer back is limited by file count). Table last.
set -u
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r5a; mkdir -p $R
python3 -m pytest -m gpu tests/ -q -p no:cacheprovider -p no:warnings -rs > $R/gpu_tests.txt 2>&1
echo "gpu tests: $(tail -1 $R/gpu_tests.txt) [$((SECONDS-T0)) s]"
export OUT_SAVE=$OUT; export OUT=$R
CASES="gpt:16" ORDER="hand fastloop fastloop hand" bash benchmarks/gpu_round4_b.sh > $R/vs16.txt 2>&1; cp $R/vs_hand_summary.json $R/vs_hand_summary_16.json 2>/dev/null
echo "vs hand B16 done [$((SECONDS-T0)) s]"; cat $R/vs16.txt
CASES="gpt:32" ORDER="hand fastloop" bash benchmarks/gpu_round4_b.sh > $R/vs32.txt 2>&1; cp $R/vs_hand_summary.json $R/vs_hand_summary_32.json 2>/dev/null
echo "vs hand B32 done [$((SECONDS-T0)) s]"; cat $R/vs32.txt
base=tf32,bf16,fused_optimizer,compile
python3 -m fastloop.cli ab gpt --device cuda --a $base --b $base,fp8,fused_loss --repeats 1 --steps 290 --warmup 10 \
  --out $R/loss300 > $R/loss300.txt 2>&1
echo "loss A/B done [$((SECONDS-T0)) s]"; tail -4 $R/loss300.txt
if [ $((SECONDS-T0)) -lt 470 ]; then
  python3 benchmarks/gpt_profile.py --fp8 tensorwise > $R/profile_fp8.txt 2>&1
  python3 - <<'PY'
import json, glob, os
for p in glob.glob(os.path.join(os.environ["OUT"], "gpt_profile*.json")):
    d = json.load(open(p)); print(os.path.basename(p), f"step {d['step_ms']:.1f} ms busy {d['gpu_busy_ms']:.1f} ms", {k: round(v, 2) for k, v in d["ms_per_family"].items()})
PY
fi
export OUT=$OUT_SAVE
tar -C $OUT -czf $OUT/r5a.tgz r5a && rm -rf $OUT/r5a
echo "total $((SECONDS-T0)) s"
