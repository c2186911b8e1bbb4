#!/usr/bin/env bash
# Round 12, the second DALI session. Round 12 call 5's traces (results/round12/a) showed two things that tie
# DALI's pipeline to the training stream:
#  - nvJPEG's small colour-conversion kernels (14 decoder streams) sometimes wait behind the whole
#    captured step: with CUDA's default 8 hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS) some of
#    DALI's streams share a queue with the training stream (a false dependency);
#  - a DALI thread calls cudaDeviceSynchronize twice a step (DALI's deferred deallocation of the
#    buffers handed to torch), which waits for the training stream's queued work.
# This run tries CUDA_DEVICE_MAX_CONNECTIONS=32 (C32) and DALI's older executor (exec_dynamic=false),
# with traces, against synthetic data in the same environment. Run as:
#   bash .dali5/install.sh && export PYTHONPATH=/tmp/site:src:. && bash benchmarks/gpu_round12_b.sh
set -u
T0=$SECONDS
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1 FASTLOOP_IMAGENET_ROOT=/tmp/imnet
G="bf16,fused_optimizer,channels_last,compile,cuda_graph"
E="bf16,fused_optimizer,channels_last,compile"
R=$OUT/r12b; mkdir -p $R
for _ in $(seq 1 ${WAIT_S:-60}); do [ -f /tmp/imnet/MANIFEST ] || [ ! -f /tmp/gen.pid ] || ! kill -0 "$(cat /tmp/gen.pid)" 2>/dev/null && break; sleep 1; done
[ -f /tmp/imnet/MANIFEST ] || timeout 120 python3 -m fastloop.recipes.imagenet.generate --out /tmp/imnet --classes 100 --train 100 --val 2 > $R/generate.txt 2>&1
echo "jpegs ready [$((SECONDS-T0)) s]"
# name | speedups | environment | DALI options ("-": synthetic data)
RUNS=${RUNS:-"
trace_G_v1_c32|G|CUDA_DEVICE_MAX_CONNECTIONS=32|hw_decoder_load=0.99,exec_dynamic=false
G_synthetic_c32|G|CUDA_DEVICE_MAX_CONNECTIONS=32|-
G_v0_c32|G|CUDA_DEVICE_MAX_CONNECTIONS=32|hw_decoder_load=0.99
G_v1_c32|G|CUDA_DEVICE_MAX_CONNECTIONS=32|hw_decoder_load=0.99,exec_dynamic=false
G_v1aa_c32|G|CUDA_DEVICE_MAX_CONNECTIONS=32|hw_decoder_load=0.99,exec_dynamic=false,antialias=false
E_synthetic_c32|E|CUDA_DEVICE_MAX_CONNECTIONS=32|-
E_v0_c32|E|CUDA_DEVICE_MAX_CONNECTIONS=32|hw_decoder_load=0.99
E_v1_c32|E|CUDA_DEVICE_MAX_CONNECTIONS=32|hw_decoder_load=0.99,exec_dynamic=false
E_v1aa_c32|E|CUDA_DEVICE_MAX_CONNECTIONS=32|hw_decoder_load=0.99,exec_dynamic=false,antialias=false
G_v0_c32_malloc_async|G|CUDA_DEVICE_MAX_CONNECTIONS=32 DALI_USE_CUDA_MALLOC_ASYNC=1|hw_decoder_load=0.99
trace_E_v1_c32|E|CUDA_DEVICE_MAX_CONNECTIONS=32|hw_decoder_load=0.99,exec_dynamic=false
"}
while IFS='|' read -r name mode envs opts; do
  [ -n "$name" ] || continue
  [ $((SECONDS-T0)) -lt ${BUDGET_S:-520} ] || { echo "budget: $name skipped"; continue; }
  S=${!mode}
  if [ "$opts" = "-" ]; then L=synthetic; S1=$S; else L=dali; S1=$S,dali; fi
  if [ "${name#trace_}" != "$name" ]; then
    env $envs OUT=$R FASTLOOP_IMAGENET_LOADER=dali FASTLOOP_IMAGENET_DALI="$opts" timeout 120 python3 benchmarks/dali_trace.py imagenet $S \
      --name $name > $R/$name.txt 2> $R/$name.err; echo "$name rc $? [$((SECONDS-T0)) s]"; tail -1 $R/$name.txt
  else
    env $envs FASTLOOP_IMAGENET_LOADER=$L FASTLOOP_IMAGENET_DALI="${opts#-}" timeout 100 python3 -m fastloop.cli run imagenet --device cuda \
      --speedups $S1 --steps 100 --warmup 10 --json $R/$name.json --quiet 2> $R/$name.err; echo "$name rc $? [$((SECONDS-T0)) s]"
  fi
done <<< "$RUNS"
python3 - "$R" <<'PY'
import glob, json, os, sys
r = sys.argv[1]
print("run | img/s | mean ms | median ms | wait % | GPU busy ms | / synthetic (same mode) | not applied")
for p in sorted(glob.glob(f"{r}/[GE]_*.json")):
    d = json.load(open(p)); name = os.path.basename(p)[:-5]; m = name[0]
    syn = glob.glob(f"{r}/{m}_synthetic*.json")
    ratio = json.load(open(syn[0]))["step_s"]["mean"] / d["step_s"]["mean"] if syn and "synthetic" not in name else None
    gp = d.get("gpu_profile") or {}
    print(" | ".join(map(str, (name, round(d["throughput"]["value"]), round(1e3 * d["step_s"]["mean"], 2), round(1e3 * d["step_s"]["median"], 2),
          round(100 * d["data_wait_frac"], 2), round(gp.get("gpu_busy_ms_per_step") or 0, 2), ratio and round(ratio, 3),
          [(x["name"], x["status"]) for x in d["speedups"] if x["status"] != "applied"]))))
for p in sorted(glob.glob(f"{r}/trace_*.json")):
    t = json.load(open(p)); rd = t.get("reading") or {}
    dev = {k: v.get("cudaDeviceSynchronize") for k, v in (rd.get("host_threads") or {}).items() if v.get("cudaDeviceSynchronize")}
    ev = {k: v.get("cudaEventSynchronize") for k, v in (rd.get("host_threads") or {}).items() if v.get("cudaEventSynchronize")}
    print(os.path.basename(p), "measured", round(t["measured_mean_step_ms"], 2), "wait", round(t["data_wait_frac"], 3), "gaps ms/step",
          round(rd.get("training_gap_ms_per_step", 0), 2), "others busy", round(rd.get("other_streams_busy_ms_per_step", 0), 2),
          "overlapping", round(rd.get("other_streams_overlapping_training_ms_per_step", 0), 2), "device syncs", dev, "event syncs", ev)
PY
tar -C $OUT -czf $OUT/r12b.tgz r12b && rm -rf $R
echo "total $((SECONDS-T0)) s"
