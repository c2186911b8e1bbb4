#!/usr/bin/env bash
# Round 7, calls 2 and 3 (issue 12): one recipe's whole default selecting ladder (its wall time),
# then the cumulative ladder over the compute rungs in the selecting ladder's order (CUM_RUNGS),
# to compare the selected set's throughput with the best cumulative rung. RECIPE=gpt|imagenet
# (ImageNet on the synthetic loader). Each report is valid after every run; one tar comes back.
set -u
T0=$SECONDS
RECIPE=${RECIPE:-gpt}
TOTAL=${TOTAL_S:-550}
CUM_RUNGS=${CUM_RUNGS:-tf32,bf16,fused_optimizer,compile,cuda_graph}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1 FASTLOOP_IMAGENET_LOADER=synthetic
R=$OUT/r7b_$RECIPE; mkdir -p $R
summary() {
python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1] + "/report.json"))
print(sys.argv[1].split("/")[-1], "wall", round(d.get("wall_s") or 0, 1), "s; runs", d.get("runs"), "run_s_mean",
      round(d.get("run_s_mean") or 0, 1), "partial", d.get("partial"), "selected", d.get("selected_spec"))
for r in d["rungs"]:
    tp = (r.get("throughput") or {}).get("value")
    print(f"  {r['rung'][:44]:44} {str(r.get('rung_status')):9} {tp or 0:10,.0f} n={r.get('repeats')} {str(r.get('decision') or r.get('rung_reason') or '')[:80]}")
PY
}
timeout ${SELECT_S:-400} python3 -m fastloop.cli ladder $RECIPE --device cuda --out $R/select > $R/select.txt 2>&1
echo "$RECIPE select rc $? [$((SECONDS-T0)) s]"; summary $R/select
left=$((TOTAL - (SECONDS-T0)))
timeout $left python3 -m fastloop.cli ladder $RECIPE --device cuda --cumulative --max-repeats 3 --rungs $CUM_RUNGS \
  --out $R/cumulative > $R/cumulative.txt 2>&1
echo "$RECIPE cumulative rc $? [$((SECONDS-T0)) s]"; summary $R/cumulative
tar -C $OUT -czf $OUT/r7b_$RECIPE.tgz r7b_$RECIPE && rm -rf $R
echo "total $((SECONDS-T0)) s"
