#!/usr/bin/env bash
# Round 6, call 3 (issue 15): the selecting ladder of fp8, the fused loss and the batch-size
# search on top of bf16 + compile (GPT-2 124M, T=1024, B16; the last call's was cut at the
# batch-size rung), then liger's LayerNorm against nn.LayerNorm, eager and compiled.
set -u
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r6c; mkdir -p $R
timeout ${LADDER_S:-330} python3 -m fastloop.cli ladder gpt --device cuda --base tf32,bf16,fused_optimizer,compile \
  --rungs fp8,fused_loss,batch_size --max-repeats 3 --out $R/gpt_fp8_ladder > $R/gpt_fp8_ladder.txt 2>&1
echo "fp8 ladder rc $? [$((SECONDS-T0)) s]"
python3 - "$R/gpt_fp8_ladder" <<'PY'
import json, sys
d = json.load(open(sys.argv[1] + "/report.json"))
print("wall", round(d.get("wall_s") or 0, 1), "s; runs", d.get("runs"), "partial", d.get("partial"), "selected", d.get("selected_spec"))
for r in d["rungs"]:
    tp = (r.get("throughput") or {}).get("value")
    print(f"  {r['rung'][:44]:44} {str(r.get('rung_status')):9} {tp or 0:10,.0f} {str(r.get('decision') or r.get('rung_reason') or '')[:90]}")
PY
if [ -z "${SKIP_LIGER:-}" ]; then  # measured in round 6: SKIP_LIGER=1 leaves it out
  left=$(( ${TOTAL_S:-500} - (SECONDS-T0) ))
  OUT=$R timeout $left python3 benchmarks/liger_fusions.py --batch 16 --steps 20 > $R/liger.txt 2>&1
  echo "liger rc $? [$((SECONDS-T0)) s]"; grep -E "^(eager|compiled)|Error" $R/liger.txt | head -8
fi
tar -C $OUT -czf $OUT/r6c.tgz r6c && rm -rf $R
echo "total $((SECONDS-T0)) s"
