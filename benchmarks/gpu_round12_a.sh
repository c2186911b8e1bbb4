#!/usr/bin/env bash
# Round 12, the fifth DALI call. Issue 13, ImageNet: where does the DALI-fed step lose time, and which
# DALI settings close it? (1) torch.profiler traces of the DALI-fed step with and without the whole-step
# cuda_graph (benchmarks/dali_trace.py); (2) a sweep of DALI settings against synthetic data, each mode
# (with / without cuda_graph) beside its own synthetic run. The JPEGs come from a generator started in
# the background by the first DALI call (/tmp/gen.pid). Run as:
#   bash .dali5/install.sh && export PYTHONPATH=/tmp/site:src:. && bash benchmarks/gpu_round12_a.sh
set -u
T0=$SECONDS
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1 FASTLOOP_IMAGENET_ROOT=/tmp/imnet
G="bf16,fused_optimizer,channels_last,compile,cuda_graph"
E="bf16,fused_optimizer,channels_last,compile"
R=$OUT/r12a; mkdir -p $R
for _ in $(seq 1 ${WAIT_S:-60}); do [ -f /tmp/imnet/MANIFEST ] || [ ! -f /tmp/gen.pid ] || ! kill -0 "$(cat /tmp/gen.pid)" 2>/dev/null && break; sleep 1; done
[ -f /tmp/imnet/MANIFEST ] || timeout 120 python3 -m fastloop.recipes.imagenet.generate --out /tmp/imnet --classes 100 --train 100 --val 2 > $R/generate.txt 2>&1
echo "jpegs ready [$((SECONDS-T0)) s]"
if [ -z "${NO_TRACE:-}" ]; then
  for m in G E; do
    S=${!m}
    OUT=$R FASTLOOP_IMAGENET_LOADER=dali FASTLOOP_IMAGENET_DALI="hw_decoder_load=0.99" timeout 120 python3 benchmarks/dali_trace.py imagenet $S \
      --name trace_$m > $R/trace_$m.txt 2> $R/trace_$m.err; echo "trace $m rc $? [$((SECONDS-T0)) s]"; tail -1 $R/trace_$m.txt
  done
fi
V0="hw_decoder_load=0.99"
V1="hw_decoder_load=0.99,exec_dynamic=false"
V2="hw_decoder_load=0.99,antialias=false"
V3="hw_decoder_load=0.99,exec_dynamic=false,antialias=false,dtype=float16,channels_last=true"
for m in ${MODES:-G E}; do
  S=${!m}
  [ $((SECONDS-T0)) -lt ${BUDGET_S:-520} ] || { echo "budget: $m skipped"; continue; }
  FASTLOOP_IMAGENET_LOADER=synthetic timeout 100 python3 -m fastloop.cli run imagenet --device cuda --speedups $S \
    --steps 100 --warmup 10 --json $R/${m}_synthetic.json --quiet 2> $R/${m}_synthetic.err; echo "$m synthetic rc $? [$((SECONDS-T0)) s]"
  for v in ${VARIANTS:-V0 V1 V2 V3}; do
    [ $((SECONDS-T0)) -lt ${BUDGET_S:-520} ] || { echo "budget: $m $v skipped"; continue; }
    FASTLOOP_IMAGENET_DALI="${!v}" timeout 100 python3 -m fastloop.cli run imagenet --device cuda \
      --speedups $S,dali --steps 100 --warmup 10 --json $R/${m}_dali_$v.json --quiet 2> $R/${m}_dali_$v.err
    echo "$m dali $v (${!v}) rc $? [$((SECONDS-T0)) s]"
  done
done
python3 - "$R" <<'PY'
import glob, json, os, sys
r = sys.argv[1]
rows = []
for p in sorted(glob.glob(f"{r}/[GE]_*.json")):
    d = json.load(open(p)); name = os.path.basename(p)[:-5]; m = name[0]
    syn = f"{r}/{m}_synthetic.json"
    ratio = None
    if os.path.exists(syn) and "synthetic" not in name:
        ratio = json.load(open(syn))["step_s"]["mean"] / d["step_s"]["mean"]
    bad = [(x["name"], x["status"]) for x in d["speedups"] if x["status"] != "applied"]
    gp = d.get("gpu_profile") or {}
    rows.append((name, round(d["throughput"]["value"]), round(1e3 * d["step_s"]["mean"], 2), round(1e3 * d["step_s"]["median"], 2),
                 round(100 * d["data_wait_frac"], 2), round(gp.get("gpu_busy_ms_per_step") or 0, 2), ratio and round(ratio, 3), bad))
print("run | img/s | mean ms | median ms | wait % | GPU busy ms | / synthetic | not applied")
for row in rows:
    print(" | ".join(map(str, row)))
PY
tar -C $OUT -czf $OUT/r12a.tgz r12a && rm -rf $R
echo "total $((SECONDS-T0)) s"
