#!/usr/bin/env bash
# Round 12 calls 11-15 (call 11 failed to start a machine, so DALI's first piece never arrived and the
# DALI runs used the torchvision loader and timed out; see RESULTS.md round 12). The third DALI session: issue 13's ImageNet goal as a user gets it. The fastloop command
# line now sets CUDA_DEVICE_MAX_CONNECTIONS=32 itself (fastloop.cuda_env); nothing is set by hand here.
# ResNet-50 B256 with the whole step captured (bf16,fused_optimizer,channels_last,compile,cuda_graph):
# synthetic data vs the `dali` speedup (DALI's defaults), alternating, REPEATS pairs; then the GPU
# test suite with DALI installed. Run as:
#   bash .dali5/install.sh && export PYTHONPATH=/tmp/site:src:. && bash benchmarks/gpu_round12_c.sh
set -u
T0=$SECONDS
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1 FASTLOOP_IMAGENET_ROOT=/tmp/imnet
unset CUDA_DEVICE_MAX_CONNECTIONS
G="bf16,fused_optimizer,channels_last,compile,cuda_graph"
R=$OUT/r12c; mkdir -p $R
for _ in $(seq 1 ${WAIT_S:-60}); do [ -f /tmp/imnet/MANIFEST ] || [ ! -f /tmp/gen.pid ] || ! kill -0 "$(cat /tmp/gen.pid)" 2>/dev/null && break; sleep 1; done
[ -f /tmp/imnet/MANIFEST ] || timeout 120 python3 -m fastloop.recipes.imagenet.generate --out /tmp/imnet --classes 100 --train 100 --val 2 > $R/generate.txt 2>&1
echo "jpegs ready [$((SECONDS-T0)) s]"
# .dali5/install.sh says "DALI installed" even when the first piece never arrived (round 12 call 11):
python3 -c "import nvidia.dali" || { echo "DALI is not importable: was every .daliK piece copied?"; exit 3; }
for i in $(seq 1 ${REPEATS:-3}); do
  FASTLOOP_IMAGENET_LOADER=synthetic timeout 100 python3 -m fastloop.cli run imagenet --device cuda --speedups $G \
    --steps 100 --warmup 10 --json $R/synthetic_$i.json --quiet 2> $R/synthetic_$i.err; echo "synthetic $i rc $? [$((SECONDS-T0)) s]"
  timeout 100 python3 -m fastloop.cli run imagenet --device cuda --speedups $G,dali \
    --steps 100 --warmup 10 --json $R/dali_$i.json --quiet 2> $R/dali_$i.err; echo "dali $i rc $? [$((SECONDS-T0)) s]"
done
python3 - "$R" <<'PY'
import glob, json, math, sys
r = sys.argv[1]
ratios = []
print("run | img/s | mean ms | median ms | wait % | GPU busy ms | env CUDA_DEVICE_MAX_CONNECTIONS | dali record")
for i in range(1, 10):
    try:
        s, d = json.load(open(f"{r}/synthetic_{i}.json")), json.load(open(f"{r}/dali_{i}.json"))
    except OSError:
        continue
    for name, x in (("synthetic", s), ("dali", d)):
        rec = [(y["status"], y.get("detail")) for y in x["speedups"] if y["name"] == "dali"]
        bad = [(y["name"], y["status"]) for y in x["speedups"] if y["status"] != "applied"]
        print(f"{name} {i} | {x['throughput']['value']:.0f} | {1e3*x['step_s']['mean']:.2f} | {1e3*x['step_s']['median']:.2f} | "
              f"{100*x['data_wait_frac']:.2f} | {(x.get('gpu_profile') or {}).get('gpu_busy_ms_per_step') or 0:.2f} | "
              f"{(x.get('env') or {}).get('cuda_device_max_connections')} | {rec} {bad}")
    ratios.append(s["step_s"]["mean"] / d["step_s"]["mean"])
if ratios:
    g = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print("DALI / synthetic per pair (mean step):", [round(x, 3) for x in ratios], "geometric mean", round(g, 3), "goal >= 0.95")
PY
echo "benchmarks done [$((SECONDS-T0)) s]"
if [ -z "${NO_TESTS:-}" ]; then
  timeout ${TESTS_S:-150} python3 -m pytest -o addopts="" -m gpu -q -p no:cacheprovider tests/ > $R/gpu_tests.txt 2>&1
  echo "gpu tests rc $? [$((SECONDS-T0)) s]"; tail -3 $R/gpu_tests.txt
fi
tar -C $OUT -czf $OUT/r12c.tgz r12c && rm -rf $R
echo "total $((SECONDS-T0)) s"
