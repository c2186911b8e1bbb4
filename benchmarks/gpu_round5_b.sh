#!/usr/bin/env bash
# Round 5, call 2: the GPU-profile test; GPT-2 B16 hand vs fastloop with each side's GPU busy
# fraction and host syncs per step (where the gap goes); a profile of the fp8 step; the
# selecting ladder over fp8, fused_loss and the batch-size search on top of bf16 + compile
# (issue 15), cut off before the call's limit (its report is valid after every run).
set -u
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r5b; mkdir -p $R
python3 -m pytest -m gpu tests/test_gpu.py -k "gpu_profile" -q -p no:cacheprovider -p no:warnings > $R/gpu_test_profile.txt 2>&1
echo "profile test: $(tail -1 $R/gpu_test_profile.txt) [$((SECONDS-T0)) s]"
export OUT_SAVE=$OUT; export OUT=$R
CASES="gpt:16" ORDER="hand fastloop" bash benchmarks/gpu_round4_b.sh > $R/vs16.txt 2>&1
cat $R/vs16.txt
python3 - <<'PY'
import glob, json, os
for p in sorted(glob.glob(os.path.join(os.environ["OUT"], "vs_hand_gpt_*.json"))):
    d = json.load(open(p)); g = d.get("gpu_profile") or {}
    print(d["side"], f"{d['throughput']:,.0f}", "busy", g.get("gpu_busy_frac"), "busy ms/step", g.get("gpu_busy_ms_per_step"),
          "span ms/step", g.get("span_ms_per_step"), "syncs/step", g.get("host_syncs_per_step"), g.get("sync_calls"), g.get("error"))
PY
echo "[$((SECONDS-T0)) s]"
python3 benchmarks/gpt_profile.py --fp8 tensorwise > $R/profile_fp8.txt 2>&1
python3 - <<'PY'
import json, glob, os
for p in glob.glob(os.path.join(os.environ["OUT"], "gpt_profile*.json")):
    d = json.load(open(p)); print(os.path.basename(p), f"step {d['step_ms']:.1f} ms busy {d['gpu_busy_ms']:.1f} ms", {k: round(v, 2) for k, v in d["ms_per_family"].items()})
PY
echo "[$((SECONDS-T0)) s]"
left=$((565 - (SECONDS-T0)))
timeout $left python3 -m fastloop.cli ladder gpt --device cuda --base tf32,bf16,fused_optimizer,compile \
  --rungs fp8,fused_loss,batch_size --max-repeats 3 --steps 10 --warmup 5 --out $R/gpt_fp8_ladder > $R/gpt_fp8_ladder.txt 2>&1
echo "ladder rc $? [$((SECONDS-T0)) s]"; tail -25 $R/gpt_fp8_ladder.txt
export OUT=$OUT_SAVE
tar -C $OUT -czf $OUT/r5b.tgz r5b && rm -rf $OUT/r5b
echo "total $((SECONDS-T0)) s"
