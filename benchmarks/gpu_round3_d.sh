#!/usr/bin/env bash
# Device call D (2026-12-01): the selecting ladder on the GPT recipe (GPT-2 124M, T=1024, B16).
set -u
export PYTHONPATH=src:. PYTHONUNBUFFERED=1
/usr/bin/time -f "ladder wall %e s" python3 -m fastloop.cli ladder gpt --rungs ${RUNGS:-tf32,bf16,fused_optimizer,compile} \
  --max-repeats 3 --steps 20 --warmup 5 --out $OUT/gpt_select --quiet 2>&1 | grep -v "^W1201"; echo "rc=$?"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/gpt_select/report.json"))
for r in d["rungs"]:
    tp = (r.get("throughput") or {}).get("value")
    v = r.get("speedup_vs_prev") or r.get("speedup_vs_baseline") or {}
    print(r["rung"], r.get("rung_status"), round(tp) if tp else "-", v.get("ratio"), v.get("ci_low"), v.get("ci_high"), r.get("decision", ""))
print("selected", d["selected"], "wall", round(d["wall_s"]), "s")
PY
