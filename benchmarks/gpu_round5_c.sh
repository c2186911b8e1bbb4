#!/usr/bin/env bash
# Round 5, call 3: the GPU-profile test; GPT-2 B16 hand vs fastloop after the recipe stopped
# logging its loss with prog_bar=True (Lightning's per-step .item() sync, found with the GPU
# profile); SDPA backends (flash vs cuDNN) on the compiled bf16 step; then the selecting ladder
# over the default rungs of Lightning's demo Transformer until the call's time is up (its
# report is valid after every run).
set -u
T0=$SECONDS
export PYTHONPATH=src:. PYTHONUNBUFFERED=1
R=$OUT/r5c; mkdir -p $R
python3 -m pytest -m gpu tests/test_gpu.py -k "gpu_profile" -q -p no:cacheprovider -p no:warnings > $R/gpu_test_profile.txt 2>&1
echo "profile test: $(tail -1 $R/gpu_test_profile.txt) [$((SECONDS-T0)) s]"
export OUT_SAVE=$OUT; export OUT=$R
CASES="gpt:16" ORDER="hand fastloop fastloop hand" bash benchmarks/gpu_round4_b.sh > $R/vs16.txt 2>&1
cat $R/vs16.txt
python3 - <<'PY'
import glob, json, os
for p in sorted(glob.glob(os.path.join(os.environ["OUT"], "vs_hand_gpt_*.json"))):
    d = json.load(open(p)); g = d.get("gpu_profile") or {}
    print(d["side"], f"{d['throughput']:,.0f}", "busy", g.get("gpu_busy_frac"), "span ms/step", g.get("span_ms_per_step"),
          "syncs/step", g.get("host_syncs_per_step"), g.get("sync_calls"))
PY
echo "[$((SECONDS-T0)) s]"
for b in flash cudnn; do python3 benchmarks/gpt_profile.py --sdpa $b > $R/profile_sdpa_$b.txt 2>&1 || tail -3 $R/profile_sdpa_$b.txt; done
python3 - <<'PY'
import json, glob, os
for p in sorted(glob.glob(os.path.join(os.environ["OUT"], "gpt_profile*.json"))):
    d = json.load(open(p)); print(os.path.basename(p), f"step {d['step_ms']:.2f} ms, {d['tokens_per_s']:,.0f} tok/s", {k: round(v, 2) for k, v in d["ms_per_family"].items() if v > 0.5})
PY
echo "[$((SECONDS-T0)) s]"
left=$((560 - (SECONDS-T0)))
timeout $left python3 -m fastloop.cli ladder benchmarks/targets/lightning_demo.py:make --device cuda --max-repeats 3 \
  --steps 10 --warmup 3 --out $R/demo_ladder > $R/demo_ladder.txt 2>&1
echo "demo ladder rc $? [$((SECONDS-T0)) s]"
python3 - <<'PY'
import json, os
d = json.load(open(os.path.join(os.environ["OUT"], "demo_ladder", "report.json")))
for r in d["rungs"]:
    tp = (r.get("throughput") or {}).get("value")
    print(f"{r['rung'][:60]:60} {r.get('rung_status'):12} {tp or 0:10,.0f} {str(r.get('decision') or r.get('rung_reason') or '')[:90]}")
PY
export OUT=$OUT_SAVE
tar -C $OUT -czf $OUT/r5c.tgz r5c && rm -rf $OUT/r5c
echo "total $((SECONDS-T0)) s"
