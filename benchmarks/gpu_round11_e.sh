#!/usr/bin/env bash
# Ran in round 11 as call 9 (ROUNDS=1: DALI 0.875, DALI on a thread 0.844 of synthetic; RESULTS.md round 11 item 4). Issue 13, ImageNet: does DALI's 7% gap to synthetic data close
# when DALI's batches are taken on a background thread? Round 10 (gpu_round10_e.sh): DALI-fed
# ResNet-50 through Lightning at 0.925-0.930 of synthetic, the GPU idle 3.2 ms a step against
# 1.7 ms, and a deeper DALI queue did not help. This runs the plain loop of imagenet_feed.py
# (bf16, channels_last, compile, fused SGD) fed by synthetic tensors, DALI, and DALI through a
# background thread (last: its thread keeps its pipeline until the process ends), twice over.
# Run as the fifth DALI call, with the JPEGs generated in an earlier call (gpu_round10_c.sh does;
# round 11 started the generator in the background in the first DALI call, /tmp/gen.pid):
#   bash .dali5/install.sh && export PYTHONPATH=/tmp/site:src:. && bash benchmarks/gpu_round11_e.sh
set -u
T0=$SECONDS
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1 FASTLOOP_IMAGENET_ROOT=/tmp/imnet
R=$OUT/r11e; mkdir -p $R
for _ in $(seq 1 ${WAIT_S:-150}); do [ -f /tmp/imnet/MANIFEST ] || [ ! -f /tmp/gen.pid ] || ! kill -0 "$(cat /tmp/gen.pid)" 2>/dev/null && break; sleep 1; done
[ -f /tmp/imnet/MANIFEST ] || timeout 150 python3 -m fastloop.recipes.imagenet.generate --out /tmp/imnet --classes 100 --train 100 --val 2 > $R/generate.txt 2>&1
for i in $(seq 1 ${ROUNDS:-2}); do
  OUT=$R timeout 200 python3 benchmarks/imagenet_feed.py --compile default --fused --steps 100 --warmup 12 --profile \
    --feeds synthetic,dali:hw99,dali_thread:hw99 --name feed_$i > $R/feed_$i.txt 2>&1
  echo "feed $i rc $? [$((SECONDS-T0)) s]"; grep "img/s\|failed" $R/feed_$i.txt
done
tar -C $OUT -czf $OUT/r11e.tgz r11e && rm -rf $R
echo "total $((SECONDS-T0)) s"
