#!/usr/bin/env bash
# GPT-2 124M (T=1024) on one GPU: the ladder from fp32, then the best configuration at B=32.
# (Round 3: the ladder now selects by default and measures 3 runs a side at least; this script asks
# for the cumulative story it recorded in round 2. The figures of round 2 came from --repeats 1.)
set -u
export PYTHONPATH=src:. PYTHONUNBUFFERED=1
python3 -m fastloop.cli ladder gpt --rungs tf32,bf16,fused_optimizer,compile --steps 20 --warmup 8 --cumulative --max-repeats 3 \
  --out $OUT/gpt_ladder --quiet 2>&1 | tail -5
python3 -c "
import json; d=json.load(open('$OUT/gpt_ladder/report.json'))
for r in d['rungs']: print(r['rung'], round(r['throughput']['value']), 'tok/s', 'mfu', r['mfu'], 'compile', r['compile_s'])"
FASTLOOP_GPT_BATCH=32 python3 -m fastloop.cli run gpt --speedups tf32,bf16,fused_optimizer,compile --steps 30 --warmup 8 \
  --json $OUT/gpt_b32.json --quiet 2>&1 | tail -3
python3 -c "
import json; d=json.load(open('$OUT/gpt_b32.json')); print('B32', round(d['throughput']['value']), 'tok/s mfu', d['mfu'], d['step_s'])"
