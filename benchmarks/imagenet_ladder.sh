#!/usr/bin/env bash
# ResNet-50 B256 on real JPEGs (generated, ImageNet-sized): the ladder from a plain torchvision
# (Round 3: the ladder now selects by default and measures 3 runs a side at least; this script asks
# for the cumulative story it recorded in round 2. The figures of round 2 came from --repeats 1.)
# loader through workers, pinned memory, bf16, channels_last and compile to DALI as the last rung
# (rungs run in ladder order whatever the order here). Needs ~6-8 minutes on an H200: the
# baseline rung alone decodes at ~250 img/s.
set -u
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
export FASTLOOP_IMAGENET_ROOT=/tmp/imnet
[ -f /tmp/imnet/MANIFEST ] || python3 -m fastloop.recipes.imagenet.generate --out /tmp/imnet --classes 100 --train 100 --val 2
python3 -m fastloop.cli ladder imagenet --rungs "${RUNGS:-workers,pin_memory,prefetch,bf16,channels_last,cudnn_benchmark,compile,dali}" \
  --steps "${STEPS:-30}" --warmup 8 --cumulative --max-repeats 3 --out $OUT/imagenet_ladder --quiet 2>&1 | tail -5
python3 -c "
import json; d=json.load(open('$OUT/imagenet_ladder/report.json'))
for r in d['rungs']: print(r['rung'], r['rung_status'], round(r['throughput']['value']), 'img/s wait', round(r['data_wait_frac'],3), 'compile', r['compile_s'], r['speedup_vs_prev'])"
