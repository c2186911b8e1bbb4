#!/usr/bin/env bash
# Round 8, the fifth call of the DALI transfer (issue 13, then issue 12), after
#   bash .dali5/install.sh && export PYTHONPATH=/tmp/site:src:.
# (torchao/liger wheels arrived with the fourth call in /tmp/whl):
# 1. CIFAR ResNet-18 B256 in memory: fp32 baseline vs gpu_resident + bf16 + channels_last + compile +
#    cuda_graph, 5 a side; workers (chosen by measurement) vs none, 3 a side (gpu_round3_c.sh);
# 2. ImageNet ResNet-50 B256: DALI-fed vs synthetic with the same model speedups, 3 pairs of
#    alternating fresh runs, each with its GPU profile (gpu_round8_b.sh, 10,000 generated JPEGs);
# 3. the GPU tests of DALI and the GPU-resident loader (DALI was never installed for them before);
# 4. issue 12: ImageNet, the selecting ladder's set vs the best cumulative rung (+tf32), interleaved.
set -u
T0=$SECONDS
DEADLINE=${TOTAL_S:-560}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r8d; mkdir -p $R
left() { echo $((DEADLINE - (SECONDS - T0))); }
# the JPEGs first, on their own (the generator uses every core: it would perturb the CIFAR runs)
[ -f /tmp/imnet/MANIFEST ] || timeout 120 python3 -m fastloop.recipes.imagenet.generate --out /tmp/imnet --classes 100 \
  --train 100 --val 2 > $R/generate.txt 2>&1
echo "generate rc $? [$((SECONDS-T0)) s]"
OUT=$R REPEATS=5 WREPEATS=3 timeout 230 bash benchmarks/gpu_round3_c.sh > $R/cifar.txt 2>&1
echo "cifar rc $? [$((SECONDS-T0)) s]"; tail -5 $R/cifar.txt
OUT=$R REPEATS=3 timeout $(( $(left) - 150 )) bash benchmarks/gpu_round8_b.sh > $R/dali.txt 2>&1
echo "dali rc $? [$((SECONDS-T0)) s]"; tail -9 $R/dali.txt
timeout 70 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu -rs tests/test_gpu.py -k "dali or resident" \
  > $R/gpu_tests.txt 2>&1; echo "gpu tests rc $? [$((SECONDS-T0)) s]"; tail -3 $R/gpu_tests.txt
FASTLOOP_IMAGENET_LOADER=synthetic timeout $(( $(left) - 8 )) python3 -m fastloop.cli ab imagenet --device cuda --repeats 3 \
  --a tf32,bf16,fused_optimizer,channels_last,compile,cuda_graph --b bf16,fused_optimizer,channels_last,compile,cuda_graph \
  --out $R/imagenet_sel_vs_cum > $R/imagenet_sel_vs_cum.txt 2>&1
echo "imagenet A/B rc $? [$((SECONDS-T0)) s]"; grep -i "verdict\|faster\|significant" $R/imagenet_sel_vs_cum.txt | tail -3
tar -C $OUT -czf $OUT/r8d.tgz r8d && rm -rf $R
echo "total $((SECONDS-T0)) s"
