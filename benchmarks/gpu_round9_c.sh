#!/usr/bin/env bash
# Round 9, device call 2 (the first DALI transfer call, carrying .dali1 and .whl). Issue 12:
# the GPT default selecting ladder with the copy-only feed bound (pin_memory and prefetch weighed
# against the copy's host time) and Lightning's single-device teardown without the move of the
# model and the optimizer to the CPU (1.3-1.6 s a run in call 1). Call 1: 373 s before the cut.
set -u
T0=$SECONDS
mkdir -p /tmp/dw && cp .dali1/* /tmp/dw/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r9c; mkdir -p $R
S0=$SECONDS
timeout -s INT ${SELECT_S:-400} python3 -m fastloop.cli ladder gpt --device cuda --out $R/gpt_select > $R/gpt_select.txt 2>&1
echo "gpt select rc $? wall $((SECONDS-S0)) s [$((SECONDS-T0)) s]"; tail -4 $R/gpt_select.txt
python3 - "$R" <<'PY'
import json, os, sys
p = f"{sys.argv[1]}/gpt_select/report.json"
if os.path.exists(p):
    d = json.load(open(p))
    print("gpt wall", round(d["wall_s"], 1), "runs", d["runs"], "run_s_mean", round(d["run_s_mean"] or 0, 2), "selected", d["selected_spec"])
    for g in d["rungs"]:
        t = g.get("timings") or {}
        print(f"  {g['rung'][:40]:40} n={g.get('repeats')} {g.get('rung_status')} {str(g.get('decision') or g.get('rung_reason'))[:150]}")
        if t:
            print("     ", {k: round(v, 2) for k, v in t.items() if isinstance(v, float)}, "fetch/copy ms", round(1e3 * (g.get("host_fetch_s") or 0), 3), round(1e3 * (g.get("host_copy_s") or 0), 3))
PY
tar -C $OUT -czf $OUT/r9c.tgz r9c && rm -rf $R
echo "total $((SECONDS-T0)) s"
