#!/usr/bin/env bash
# NOT RUN YET. Next session, call 2 (issue 12): the whole default selecting ladder of the GPT
# recipe (goal <= 5 min; its report gives the run count and mean run time), then the ImageNet
# recipe's selecting ladder on the synthetic loader; call 3: the cumulative ladders of both
# (CUMULATIVE=1), to compare the selected set with the best cumulative rung.
set -u
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r6b; mkdir -p $R
mode=${CUMULATIVE:+--cumulative}
tag=${CUMULATIVE:+cumulative}; tag=${tag:-select}
timeout 300 python3 -m fastloop.cli ladder gpt --device cuda $mode --out $R/gpt_$tag > $R/gpt_$tag.txt 2>&1
echo "gpt ladder rc $? [$((SECONDS-T0)) s]"; tail -16 $R/gpt_$tag.txt
left=$((565 - (SECONDS-T0)))
FASTLOOP_IMAGENET_LOADER=synthetic timeout $left python3 -m fastloop.cli ladder imagenet --device cuda $mode \
  --out $R/imagenet_$tag > $R/imagenet_$tag.txt 2>&1
echo "imagenet ladder rc $? [$((SECONDS-T0)) s]"; tail -16 $R/imagenet_$tag.txt
tar -C $OUT -czf $OUT/r6b.tgz r6b && rm -rf $R
echo "total $((SECONDS-T0)) s"
