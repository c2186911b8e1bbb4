#!/usr/bin/env bash
# Ran in round 11 as calls 14 (DALI runs failed: capture in global mode) and 19 (DALI 0.792 of synthetic; RESULTS.md round 11 item 5).
# Round 11, the fifth DALI call. Issue 13, ImageNet: DALI-fed vs synthetic data with the whole
# Lightning step captured (cuda_graph) on top of round 10's bf16,fused_optimizer,channels_last,compile.
# Round 10 (gpu_round10_e.sh, without cuda_graph): 0.925 at DALI's queue depth 2. The JPEGs come from
# a generator started in the background by the first DALI call (/tmp/gen.pid). Run as:
#   bash .dali5/install.sh && export PYTHONPATH=/tmp/site:src:. && bash benchmarks/gpu_round11_f.sh
set -u
T0=$SECONDS
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1 FASTLOOP_IMAGENET_ROOT=/tmp/imnet
COMMON="${COMMON:-bf16,fused_optimizer,channels_last,compile,cuda_graph}"
R=$OUT/r11f; mkdir -p $R
for _ in $(seq 1 ${WAIT_S:-150}); do [ -f /tmp/imnet/MANIFEST ] || [ ! -f /tmp/gen.pid ] || ! kill -0 "$(cat /tmp/gen.pid)" 2>/dev/null && break; sleep 1; done
[ -f /tmp/imnet/MANIFEST ] || timeout 120 python3 -m fastloop.recipes.imagenet.generate --out /tmp/imnet --classes 100 --train 100 --val 2 > $R/generate.txt 2>&1
for i in $(seq 1 ${REPEATS:-2}); do
  FASTLOOP_IMAGENET_LOADER=synthetic timeout 120 python3 -m fastloop.cli run imagenet --device cuda --speedups $COMMON \
    --steps 100 --warmup 10 --json $R/synthetic_$i.json --quiet 2> $R/synthetic_$i.err; echo "synthetic $i rc $? [$((SECONDS-T0)) s]"
  for q in ${DEPTHS:-2}; do
    FASTLOOP_IMAGENET_DALI="hw_decoder_load=0.99,prefetch_queue_depth=$q" timeout 120 python3 -m fastloop.cli run imagenet --device cuda \
      --speedups $COMMON,dali --steps 100 --warmup 10 --json $R/dali_q${q}_$i.json --quiet 2> $R/dali_q${q}_$i.err
    echo "dali q$q $i rc $? [$((SECONDS-T0)) s]"
  done
done
python3 - "$R" <<'PY'
import glob, json, math, sys
r = sys.argv[1]
syn = {p.split("_")[-1]: json.load(open(p)) for p in glob.glob(f"{r}/synthetic_*.json")}
for k, s in sorted(syn.items()):
    print("synthetic", k, round(s["throughput"]["value"]), [(x["name"], x["status"], (x.get("detail") or x.get("reason") or "")[:90]) for x in s["speedups"]])
for q in sorted({p.split("_")[-2] for p in glob.glob(f"{r}/dali_q*_*.json")}):
    ratios = []
    for p in sorted(glob.glob(f"{r}/dali_{q}_*.json")):
        d = json.load(open(p)); s = syn.get(p.split("_")[-1])
        if s:
            ratios.append(s["step_s"]["mean"] / d["step_s"]["mean"])
        print(q, round(d["throughput"]["value"]), "records", [(x["name"], x["status"], (x.get("detail") or x.get("reason") or "")[:90]) for x in d["speedups"]], "wait", round(d["data_wait_frac"], 4), "median ms", round(1e3 * d["step_s"]["median"], 2))
    if ratios:
        print(q, "DALI / synthetic (mean step, paired):", round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3), "goal >= 0.95")
PY
tar -C $OUT -czf $OUT/r11f.tgz r11f && rm -rf $R
echo "total $((SECONDS-T0)) s"
