#!/usr/bin/env bash
# Issue 11's regression check: fastloop beside plain PyTorch written by hand, one process per
# side, alternating (hand, fastloop, fastloop, hand). JSON per process under $OUT; table last.
set -u
export PYTHONPATH=${PYTHONPATH:-src:.} PYTHONUNBUFFERED=1
CASES=${CASES:-"gpt:16 gpt:32"}
one() { python3 benchmarks/vs_handwritten.py $1 $2 --batch $3 --steps ${STEPS:-50} --warmup ${WARMUP:-10} --tag $4 \
          >/dev/null 2>$OUT/vs_$1_$2_$3_$4.err || { echo "FAILED $1 $2 $3"; tail -5 $OUT/vs_$1_$2_$3_$4.err; }; }
for c in $CASES; do
  case=${c%%:*}; b=${c##*:}
  i=0; for side in ${ORDER:-hand fastloop fastloop hand}; do one $case $side $b $i; i=$((i+1)); done
done
python3 - <<'PY'
import glob, json, os, statistics
out = os.environ["OUT"]
rows = {}
for p in sorted(glob.glob(os.path.join(out, "vs_hand_*_*_*_*.json"))):
    d = json.load(open(p))
    rows.setdefault((d["case"], d["batch"]), {}).setdefault(d["side"], []).append(d["throughput"])
print(f"{'case':6} {'B':>4} {'hand':>12} {'fastloop':>12} {'ratio':>7}  runs")
summary = []
for (case, b), sides in sorted(rows.items()):
    h, f = sides.get("hand", []), sides.get("fastloop", [])
    if h and f:
        r = statistics.mean(f) / statistics.mean(h)
        summary.append({"case": case, "batch": b, "hand": h, "fastloop": f, "ratio_of_means": r})
        print(f"{case:6} {b:>4} {statistics.mean(h):12,.0f} {statistics.mean(f):12,.0f} {r:7.3f}  {h} {f}")
json.dump(summary, open(os.path.join(out, "vs_hand_summary.json"), "w"), indent=2)
PY
