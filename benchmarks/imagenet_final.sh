#!/usr/bin/env bash
# The recipe through fastloop (Lightning): torchvision vs DALI A/B with the same model
# speedups, 250 steps, one fresh process per side. DALI must be in /tmp/site.
#   COMMON=bf16,channels_last,cudnn_benchmark,fused_optimizer,compile FASTLOOP_IMAGENET_DALI=num_threads=12 \
#     bash benchmarks/imagenet_final.sh
set -u
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1 FASTLOOP_IMAGENET_ROOT=/tmp/imnet
export FASTLOOP_IMAGENET_DALI="${FASTLOOP_IMAGENET_DALI:-}"
COMMON="${COMMON:-bf16,channels_last,cudnn_benchmark,fused_optimizer,compile}"
[ -f /tmp/imnet/MANIFEST ] || python3 -m fastloop.recipes.imagenet.generate --out /tmp/imnet --classes 100 --train 200 --val 2
python3 -m fastloop.cli ab imagenet --a workers,pin_memory,prefetch,$COMMON --b workers,pin_memory,prefetch,$COMMON,dali \
  --repeats 1 --steps "${STEPS:-250}" --warmup 10 --out $OUT/imagenet_ab --quiet 2>&1 | tail -4
python3 - <<'PY'
import json, os
d = json.load(open(os.path.join(os.environ["OUT"], "imagenet_ab", "report.json")))
for side in ("a", "b"):
    r = d[side]
    print(side, round(r["throughput"]["value"]), "img/s", "wait", round(r["data_wait_frac"], 3), "warmup", r["warmup_steps"],
          "drain", r.get("warmup_drain_steps"), "compile", r["compile_s"], [(s["name"], s["status"]) for s in r["speedups"]],
          r.get("warnings"))
print("speedup B/A", d["speedup"])
PY
