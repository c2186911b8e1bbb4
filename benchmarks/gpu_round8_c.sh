#!/usr/bin/env bash
# Round 8, call 1 (issue 12): the GPT recipe's whole default selecting ladder (its wall time, goal
# <= 300 s; new since round 7: a candidate clearly slower in its first run is dropped after it,
# the feed rungs are not measured when neither clock spends > 2% getting batches, the GPT build
# skips torch's default init), the GPU test of the new host-clock data wait, then the cumulative
# ladder over the compute rungs (CUM_RUNGS) with what time is left. One tar comes back.
set -u
T0=$SECONDS
TOTAL=${TOTAL_S:-550}
CUM_RUNGS=${CUM_RUNGS:-tf32,bf16,fused_optimizer,compile,cuda_graph,fp8,fused_loss}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r8c; mkdir -p $R
summary() {
python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1] + "/report.json"))
print(sys.argv[1].split("/")[-1], "wall", round(d.get("wall_s") or 0, 1), "s; runs", d.get("runs"), "run_s_mean",
      round(d.get("run_s_mean") or 0, 1), "partial", d.get("partial"), "selected", d.get("selected_spec"))
for r in d["rungs"]:
    tp = (r.get("throughput") or {}).get("value")
    t = r.get("timings") or {}
    print(f"  {r['rung'][:40]:40} {str(r.get('rung_status')):9} {tp or 0:10,.0f} n={r.get('repeats')} "
          f"build {t.get('build_s') or 0:.1f} proc {t.get('process_s') or 0:.1f} host_wait {r.get('host_wait_frac')} "
          f"{str(r.get('decision') or r.get('rung_reason') or '')[:110]}")
PY
}
S0=$SECONDS
timeout ${SELECT_S:-420} python3 -m fastloop.cli ladder gpt --device cuda --out $R/gpt_select > $R/gpt_select.txt 2>&1
echo "gpt select rc $? wall $((SECONDS-S0)) s (the command, start to exit) [$((SECONDS-T0)) s]"; summary $R/gpt_select
timeout 60 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu \
  tests/test_gpu.py::test_gpu_profile_splits_the_step_and_counts_host_syncs 2>&1 | tail -3 | tee $R/gpu_test.txt
left=$((TOTAL - (SECONDS-T0)))
timeout $left python3 -m fastloop.cli ladder gpt --device cuda --cumulative --max-repeats 3 --rungs $CUM_RUNGS \
  --out $R/gpt_cumulative > $R/gpt_cumulative.txt 2>&1
echo "gpt cumulative rc $? [$((SECONDS-T0)) s]"; summary $R/gpt_cumulative
tar -C $OUT -czf $OUT/r8c.tgz r8c && rm -rf $R
echo "total $((SECONDS-T0)) s"
