#!/usr/bin/env bash
# Ran in round 10 as call 4 (b208e68, `TESTS_S=250`: 28 passed, 1 skipped; RESULTS.md, round 10, item 3).
# Round 10, device call 3 (carries .dali3). The GPU test suite (DALI's tests skip until call 5
# installs DALI), while 10,000 ImageNet-sized JPEGs are generated for call 5 in the background
# (a new session: it outlives this call; the GPU tests check behaviour, not speed).
set -u
T0=$SECONDS
mkdir -p /tmp/dw && cp .dali3/* /tmp/dw/
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r10c; mkdir -p $R
[ -f /tmp/imnet/MANIFEST ] || setsid nohup python3 -m fastloop.recipes.imagenet.generate --out /tmp/imnet --classes 100 \
  --train 100 --val 2 > /tmp/imnet_generate.txt 2>&1 < /dev/null &
timeout ${TESTS_S:-330} python3 -m pytest -m gpu tests/ -q -p no:cacheprovider -p no:warnings -rs --durations=8 \
  > $R/gpu_tests.txt 2>&1; echo "gpu tests rc $? [$((SECONDS-T0)) s]"
tail -22 $R/gpu_tests.txt | cut -c1-180
tar -C $OUT -czf $OUT/r10c.tgz r10c && rm -rf $R
echo "total $((SECONDS-T0)) s"
