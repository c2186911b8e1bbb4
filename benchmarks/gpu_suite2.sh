#!/usr/bin/env bash
# Second device call: batch-size GPU test, GPT with batch-size search + 200 steps, GPT profile,
# loaders alone and the synthetic ResNet-50 ceiling (DALI must already be in /tmp/site).
set -u
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1 FASTLOOP_IMAGENET_ROOT=/tmp/imnet
python3 -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider -k batch_size 2>&1 | tail -3 | tee $OUT/gpu_tests_batch.txt
python3 -m fastloop.cli run gpt --speedups batch_size,tf32,bf16,fused_optimizer,compile --steps 200 --warmup 10 \
  --json $OUT/gpt_batch_size.json --quiet 2>&1 | tail -3
python3 -c "
import json; d=json.load(open('$OUT/gpt_batch_size.json')); e=d['extra']['batch_size_search']
print('GPT batch-size', e, 'tok/s', round(d['throughput']['value']), 'steps', d['steps'], 'compile', d['compile_s'])"
python3 benchmarks/gpt_profile.py > /dev/null 2>$OUT/prof.err; python3 -c "
import json; d=json.load(open('$OUT/gpt_profile.json')); print('profile', d['step_ms'], d['gpu_busy_ms'], d['ms_per_family'])"
python3 benchmarks/loader_throughput.py > /dev/null 2>$OUT/loader.err; python3 -c "
import json; d=json.load(open('$OUT/loader_throughput.json')); print('loaders', d['images_per_s'])"
FASTLOOP_IMAGENET_LOADER=synthetic python3 -m fastloop.cli run imagenet --speedups bf16,channels_last,compile --steps 30 \
  --warmup 8 --json $OUT/imagenet_synthetic.json --quiet 2>&1 | tail -3
python3 -c "
import json; d=json.load(open('$OUT/imagenet_synthetic.json')); print('synthetic', round(d['throughput']['value']), d['speedups'])"
for f in $OUT/*.err; do tail -n 3 $f; done
