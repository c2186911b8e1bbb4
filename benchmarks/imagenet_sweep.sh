#!/usr/bin/env bash
# ResNet-50 B256 bf16 + channels_last, plain PyTorch loop: what the step costs (eager, cuDNN
# benchmark, compile, fused SGD) on synthetic data, then each way of feeding it real JPEGs.
# Needs DALI in /tmp/site (../shared/gpu/dali_chunks.sh). JSON per run under $OUT.
set -u
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1 FASTLOOP_IMAGENET_ROOT=/tmp/imnet
[ -f /tmp/imnet/MANIFEST ] || python3 -m fastloop.recipes.imagenet.generate --out /tmp/imnet --classes 100 --train 200 --val 2
F=benchmarks/imagenet_feed.py
run() { name=$1; shift; echo "== $name $*"; python3 $F --name $name "$@" 2>$OUT/$name.err | grep -E "img/s|failed"; tail -n 2 $OUT/$name.err; }
run rn50_eager --compile none
run rn50_eager_bench --compile none --cudnn-benchmark
run rn50_compile --compile default
run rn50_compile_bench --compile default --cudnn-benchmark
run rn50_feeds --compile default --cudnn-benchmark --fused --profile \
  --feeds synthetic,dali:base,dali:gpu_labels,dali:threads12,dali:no_affine,dali:hw99,dali:hw0,dali:nhwc_fp16,torchvision
python3 - <<'PY'
import json, os
for n in ("rn50_eager", "rn50_eager_bench", "rn50_compile", "rn50_compile_bench", "rn50_feeds"):
    p = os.path.join(os.environ["OUT"], n + ".json")
    if not os.path.exists(p):
        print(n, "no result"); continue
    for feed, r in json.load(open(p))["feeds"].items():
        if "error" in r:
            print(f"{n:20} {feed:18} ERROR {r['error'][:80]}"); continue
        print(f"{n:20} {feed:18} {r['images_per_s']:7.0f} img/s  step {r['step_ms_median']:.1f} ms "
              f"[{r['step_ms_p25']:.1f}, {r['step_ms_p75']:.1f}]  wait {r['host_wait_frac']:.1%}  "
              f"alone {r.get('loader_alone_images_per_s', 0):.0f}  {r.get('gpu_ms_per_step', '')}")
PY
