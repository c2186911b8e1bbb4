#!/usr/bin/env bash
# NOT RUN YET (written at the end of round 5, when the device time was spent). Next session,
# call 1: all GPU tests (torchao/liger wheels in .whl); GPT-2 B32 beside the hand loop after the
# prog_bar fix (issue 11: >= 0.97); the selecting ladder over all default rungs of Lightning's
# demo Transformer (issue 11), now with forked runs, data rungs last and model-ruled-out rungs
# unmeasured. Each report is valid after every run; everything is packed into one tar.
set -u
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r6a; mkdir -p $R
python3 -m pytest -m gpu tests/ -q -p no:cacheprovider -p no:warnings -rs > $R/gpu_tests.txt 2>&1
echo "gpu tests: $(grep -E 'passed|failed' $R/gpu_tests.txt | tail -1) [$((SECONDS-T0)) s]"
export OUT_SAVE=$OUT; export OUT=$R
CASES="gpt:32" ORDER="hand fastloop fastloop hand" bash benchmarks/gpu_round4_b.sh > $R/vs32.txt 2>&1; cat $R/vs32.txt
echo "[$((SECONDS-T0)) s]"
left=$((565 - (SECONDS-T0)))
timeout $left python3 -m fastloop.cli ladder benchmarks/targets/lightning_demo.py:make --device cuda --max-repeats 3 \
  --steps 10 --warmup 3 --out $R/demo_ladder > $R/demo_ladder.txt 2>&1
echo "demo ladder rc $? [$((SECONDS-T0)) s]"; tail -20 $R/demo_ladder.txt
export OUT=$OUT_SAVE
tar -C $OUT -czf $OUT/r6a.tgz r6a && rm -rf $OUT/r6a
echo "total $((SECONDS-T0)) s"
