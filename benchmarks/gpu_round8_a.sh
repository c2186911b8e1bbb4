#!/usr/bin/env bash
# NOT RUN YET (written at the end of round 7, device time spent). Issue 12, next session:
# MODE=select: the GPT recipe's whole default selecting ladder alone (round 7's was cut at 420 s
# with the prefetch rung and the final rung left; since then the GPT build skips torch's default
# init and report.html is refreshed at most every 15 s). Its wall time is the figure; goal <= 300 s.
# MODE=cumulative: the GPT cumulative ladder over the compute rungs in the selecting ladder's
# order, then the ImageNet selected set against the best cumulative rung, interleaved (round 7:
# 6,915 vs 6,927 img/s from two separate ladders).
set -u
T0=$SECONDS
MODE=${MODE:-select}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1 FASTLOOP_IMAGENET_LOADER=synthetic
R=$OUT/r8a_$MODE; mkdir -p $R
summary() {
python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1] + "/report.json"))
print(sys.argv[1].split("/")[-1], "wall", round(d.get("wall_s") or 0, 1), "s; runs", d.get("runs"), "run_s_mean",
      round(d.get("run_s_mean") or 0, 1), "partial", d.get("partial"), "selected", d.get("selected_spec"), d.get("verdict", ""))
for r in d.get("rungs", []):
    tp = (r.get("throughput") or {}).get("value")
    print(f"  {r['rung'][:44]:44} {str(r.get('rung_status')):9} {tp or 0:10,.0f} n={r.get('repeats')} {str(r.get('decision') or r.get('rung_reason') or '')[:80]}")
PY
}
if [ "$MODE" = select ]; then
  timeout 560 python3 -m fastloop.cli ladder gpt --device cuda --out $R/gpt_select > $R/gpt_select.txt 2>&1
  echo "gpt select rc $? [$((SECONDS-T0)) s]"; summary $R/gpt_select
else
  timeout 330 python3 -m fastloop.cli ladder gpt --device cuda --cumulative --max-repeats 3 \
    --rungs tf32,bf16,fused_optimizer,compile,cuda_graph,fp8,fused_loss --out $R/gpt_cumulative > $R/gpt_cumulative.txt 2>&1
  echo "gpt cumulative rc $? [$((SECONDS-T0)) s]"; summary $R/gpt_cumulative
  left=$((560 - (SECONDS-T0)))
  timeout $left python3 -m fastloop.cli ab imagenet --device cuda --repeats 5 \
    --a tf32,bf16,fused_optimizer,channels_last,compile,cuda_graph --b bf16,fused_optimizer,channels_last,compile,cuda_graph \
    --out $R/imagenet_sel_vs_cum > $R/imagenet_sel_vs_cum.txt 2>&1
  echo "imagenet A/B rc $? [$((SECONDS-T0)) s]"; tail -4 $R/imagenet_sel_vs_cum.txt
fi
tar -C $OUT -czf $OUT/r8a_$MODE.tgz r8a_$MODE && rm -rf $R
echo "total $((SECONDS-T0)) s"
