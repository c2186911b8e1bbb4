#!/usr/bin/env bash
# Round 4, call 1: the GPU test suite (with torchao and liger-kernel carried as wheels in .whl),
# then the launch-bound MLP: fastloop's plain-loop whole-step graph beside a hand capture.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
python3 -c "import torchao, liger_kernel, torch; print('torchao', torchao.__version__, 'torch', torch.__version__)" 2>&1 | tail -1
timeout 400 python3 -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider -p no:warnings -rs 2>&1 | tee $OUT/gpu_tests.txt | tail -20
CASES="mlp:32" STEPS=500 WARMUP=20 ORDER="hand fastloop fastloop hand" bash benchmarks/gpu_round4_b.sh
