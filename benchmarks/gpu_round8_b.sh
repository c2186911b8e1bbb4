#!/usr/bin/env bash
# NOT RUN YET (written in round 7). Issue 13, ImageNet: DALI-fed throughput against the synthetic
# loader with the same model speedups, in one device call: REPEATS fresh `fastloop run`s a side,
# alternating (synthetic, dali, synthetic, ...), each with its GPU profile (busy share, host syncs).
# Goal: DALI >= 0.95x synthetic, data wait < 5%. Run as the fifth call of the DALI transfer:
#   bash .dali5/install.sh && export PYTHONPATH=/tmp/site:src:. && bash benchmarks/gpu_round8_b.sh
# COMMON: the model speedups (default: the ImageNet ladder's round-7 selection without cuda_graph;
# COMMON=...,cuda_graph tries it with CUDA graphs). FASTLOOP_IMAGENET_DALI: DALI pipeline options.
set -u
T0=$SECONDS
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1 FASTLOOP_IMAGENET_ROOT=/tmp/imnet
export FASTLOOP_IMAGENET_DALI="${FASTLOOP_IMAGENET_DALI:-hw_decoder_load=0.99}"
export COMMON="${COMMON:-bf16,fused_optimizer,channels_last,compile}"
R=$OUT/r8b; mkdir -p $R
[ -f /tmp/imnet/MANIFEST ] || python3 -m fastloop.recipes.imagenet.generate --out /tmp/imnet --classes 100 --train 200 --val 2
for i in $(seq 1 ${REPEATS:-3}); do
  FASTLOOP_IMAGENET_LOADER=synthetic python3 -m fastloop.cli run imagenet --device cuda --speedups $COMMON \
    --steps ${STEPS:-100} --warmup 10 --json $R/synthetic_$i.json --quiet 2> $R/synthetic_$i.err; echo "synthetic $i rc $? [$((SECONDS-T0)) s]"
  python3 -m fastloop.cli run imagenet --device cuda --speedups $COMMON,dali \
    --steps ${STEPS:-100} --warmup 10 --json $R/dali_$i.json --quiet 2> $R/dali_$i.err; echo "dali $i rc $? [$((SECONDS-T0)) s]"
done
python3 - "$R" <<'PY'
import glob, json, math, statistics, sys
r = sys.argv[1]
side = {k: [json.load(open(p)) for p in sorted(glob.glob(f"{r}/{k}_*.json"))] for k in ("synthetic", "dali")}
for k, docs in side.items():
    for d in docs:
        g = d.get("gpu_profile") or {}
        print(k, round(d["throughput"]["value"]), "img/s wait", round(d["data_wait_frac"], 4), "busy", g.get("gpu_busy_frac") and round(g["gpu_busy_frac"], 3),
              "syncs/step", g.get("host_syncs_per_step"), [(s["name"], s["status"]) for s in d["speedups"] if s["status"] != "applied"])
pairs = [math.log(a["step_s"]["mean"] / b["step_s"]["mean"]) for a, b in zip(side["synthetic"], side["dali"])]
ratio = math.exp(statistics.mean(pairs)) if pairs else None
summary = {"dali_vs_synthetic": ratio, "pairs": len(pairs),
           "dali_wait": [d["data_wait_frac"] for d in side["dali"]], "common": __import__("os").environ.get("COMMON", "")}
json.dump(summary, open(f"{r}/summary.json", "w"), indent=1)
print("DALI / synthetic throughput (geometric mean of paired runs):", ratio and round(ratio, 3), "goal >= 0.95")
PY
tar -C $OUT -czf $OUT/r8b.tgz r8b && rm -rf $R
echo "total $((SECONDS-T0)) s"
