#!/usr/bin/env bash
# NOT RUN YET (written at the end of round 6, device time spent). Next session, call 1:
# all GPU tests on the code after round 6's CPU-only changes (per-item comparison, Speedup.feeds,
# recipe rungs after compile, one profile per configuration, busy share of the measured step);
# then issue 15's ladder with the fixed batch-size rung: fp8, fused_loss and batch_size on top of
# tf32,bf16,fused_optimizer,compile in one selecting ladder (B16 and the search's choice in one run).
# Then call 2: `RECIPE=gpt SELECT_S=560 bash benchmarks/gpu_round6_b.sh` (the default GPT ladder's
# wall time; goal <= 300 s), call 3: the cumulative GPT ladder and the ImageNet ones.
set -u
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r7a; mkdir -p $R
timeout 200 python3 -m pytest -m gpu tests/ -q -p no:cacheprovider -p no:warnings -rs --durations=8 > $R/gpu_tests.txt 2>&1
echo "gpu tests rc $? [$((SECONDS-T0)) s]"; head -1 $R/gpu_tests.txt; grep -E "FAILED|SKIPPED|Error" $R/gpu_tests.txt | head -5
tar -C $OUT -czf $OUT/r7a.tgz r7a && rm -rf $R
LADDER_S=$((560 - (SECONDS-T0))) SKIP_LIGER=1 bash benchmarks/gpu_round6_c.sh
echo "total $((SECONDS-T0)) s"
