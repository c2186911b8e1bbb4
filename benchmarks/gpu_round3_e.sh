#!/usr/bin/env bash
# Device call E (2026-12-01): after the compile fallback keeps compiled kernels without CUDA graphs:
# the demo-Transformer GPU tests, and one run of compile:reduce-overhead on it.
set -u
export PYTHONPATH=src:. PYTHONUNBUFFERED=1
python3 -m pytest -m gpu tests/test_gpu.py -k "demo_transformer or resident" -q -p no:cacheprovider -p no:warnings 2>&1 | grep -v "^W1201" | tee $OUT/gpu_tests_demo.txt | tail -3
python3 -m fastloop.cli run benchmarks/targets/lightning_demo.py:make --speedups compile:reduce-overhead --steps 50 --warmup 5 \
  --json $OUT/demo_compile_ro_fallback.json --quiet 2>&1 | grep -v "^W1201" | tail -3; echo "rc=$?"
python3 -c "
import json; d=json.load(open('$OUT/demo_compile_ro_fallback.json'))
print([(r['name'], r['status'], r['reason'][:160]) for r in d['speedups']], round(d['throughput']['value']), d['throughput']['unit'])"
