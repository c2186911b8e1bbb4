#!/usr/bin/env bash
# Which compile mode feeds best from DALI through fastloop (Lightning): default vs
# reduce-overhead (CUDA graphs: the host launches one graph instead of ~1000 kernels, so DALI's
# CPU threads cannot slow the launches), on synthetic data and on DALI; then the final A/B
# (imagenet_final.sh) with the faster mode. DALI must be in /tmp/site.
set -u
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1 FASTLOOP_IMAGENET_ROOT=/tmp/imnet
[ -f /tmp/imnet/MANIFEST ] || python3 -m fastloop.recipes.imagenet.generate --out /tmp/imnet --classes 100 --train 200 --val 2
mkdir -p $OUT/pick
B=bf16,channels_last,cudnn_benchmark,fused_optimizer
for mode in compile:reduce-overhead compile; do
  for feed in synthetic dali; do
    n=$(echo $mode | tr ':' '_')_$feed
    if [ $feed = synthetic ]; then L=synthetic; S=$B,$mode; else L=torchvision; S=$B,$mode,dali; fi
    FASTLOOP_IMAGENET_LOADER=$L python3 -m fastloop.cli run imagenet --speedups $S --steps 250 --warmup 10 \
      --json $OUT/pick/$n.json --quiet >/dev/null 2>$OUT/pick/$n.err
    python3 -c "
import json; d=json.load(open('$OUT/pick/$n.json')); s=d['step_s']
print('$n', round(d['throughput']['value']), 'img/s med', round(s['median']*1e3,1), 'p25', round(s['p25']*1e3,1),
      'p75', round(s['p75']*1e3,1), 'wait', round(d['data_wait_frac'],3), [(r['name'], r['status']) for r in d['speedups'] if r['status']!='applied'])" \
      || tail -n 3 $OUT/pick/$n.err
  done
done
BEST=$(python3 -c "
import json
r = {m: json.load(open('$OUT/pick/' + m.replace(':','_') + '_dali.json'))['throughput']['value'] for m in ('compile:reduce-overhead','compile')}
print(max(r, key=r.get))" 2>/dev/null || echo compile)
echo "A/B with $BEST"
COMMON=$B,$BEST bash benchmarks/imagenet_final.sh
