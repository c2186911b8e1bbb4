#!/usr/bin/env bash
# Round 7, call 1: all GPU tests on the code after round 6's CPU-only changes and round 7's
# ladder-speed changes (adaptive final rung, --measure-s); then issue 15's selecting ladder:
# fp8, fused_loss and batch_size on top of tf32,bf16,fused_optimizer,compile (B16 and the
# batch-size search's choice in one run).
set -u
T0=$SECONDS
TOTAL=${TOTAL_S:-540}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r7a; mkdir -p $R
timeout ${TESTS_S:-170} python3 -m pytest -m gpu tests/ -q -p no:cacheprovider -p no:warnings -rs --durations=8 > $R/gpu_tests.txt 2>&1
echo "gpu tests rc $? [$((SECONDS-T0)) s]"; tail -3 $R/gpu_tests.txt; grep -E "FAILED|SKIPPED|Error" $R/gpu_tests.txt | head -5
tar -C $OUT -czf $OUT/r7a.tgz r7a && rm -rf $R
LADDER_S=$((TOTAL - (SECONDS-T0))) SKIP_LIGER=1 bash benchmarks/gpu_round6_c.sh
echo "total $((SECONDS-T0)) s"
