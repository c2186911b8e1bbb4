#!/usr/bin/env bash
# Round 8, last call (issue 12): the GPT recipe's whole default selecting ladder again, with the
# futility stop (a comparison ends once the candidate can be at most 1% faster), to completion
# (call 1's was cut at 440 s during the workers comparison, before its final rung); then, with
# the time left, the ImageNet selected set against the cumulative ladder's best rung (+tf32),
# interleaved (synthetic loader). One tar comes back.
set -u
T0=$SECONDS
TOTAL=${TOTAL_S:-520}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r8e; mkdir -p $R
S0=$SECONDS
timeout ${SELECT_S:-480} python3 -m fastloop.cli ladder gpt --device cuda --out $R/gpt_select > $R/gpt_select.txt 2>&1
echo "gpt select rc $? wall $((SECONDS-S0)) s (the command, start to exit) [$((SECONDS-T0)) s]"
python3 - $R/gpt_select <<'PY'
import json, sys
d = json.load(open(sys.argv[1] + "/report.json"))
print("wall", round(d.get("wall_s") or 0, 1), "runs", d.get("runs"), "partial", d.get("partial"), "selected", d.get("selected_spec"))
for r in d["rungs"]:
    tp = (r.get("throughput") or {}).get("value")
    print(f"  {r['rung'][:40]:40} {str(r.get('rung_status')):9} {tp or 0:10,.0f} n={r.get('repeats')} "
          f"{str(r.get('decision') or r.get('rung_reason') or (r.get('speedup_vs_baseline') or {}).get('verdict') or '')[:120]}")
print(d.get("callbacks_line"))
PY
left=$((TOTAL - (SECONDS-T0)))
if [ $left -gt 90 ]; then
  FASTLOOP_IMAGENET_LOADER=synthetic timeout $left python3 -m fastloop.cli ab imagenet --device cuda --repeats 3 \
    --a tf32,bf16,fused_optimizer,channels_last,compile,cuda_graph --b bf16,fused_optimizer,channels_last,compile,cuda_graph \
    --out $R/imagenet_sel_vs_cum > $R/imagenet_sel_vs_cum.txt 2>&1
  echo "imagenet A/B rc $? [$((SECONDS-T0)) s]"; grep -i "verdict\|faster\|significant" $R/imagenet_sel_vs_cum.txt | tail -3
fi
tar -C $OUT -czf $OUT/r8e.tgz r8e && rm -rf $R
echo "total $((SECONDS-T0)) s"
