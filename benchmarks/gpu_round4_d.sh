#!/usr/bin/env bash
# Round 4, call 7: fused_loss with the loss kept out of the compiled graph (torch.compiler.disable).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
for n in fused_loss:tf32,bf16,fused_optimizer,fused_loss,compile fp8_fused_loss:tf32,bf16,fused_optimizer,fp8,fused_loss,compile; do
  name=${n%%:*}; spec=${n#*:}
  timeout 200 python3 -m fastloop.cli run gpt --device cuda --speedups $spec --steps 50 --warmup 10 --json $OUT/r7_$name.json --quiet 2>$OUT/r7_$name.err || tail -3 $OUT/r7_$name.err
  python3 -c "import json;d=json.load(open('$OUT/r7_$name.json'));print('$name', round(d['throughput']['value']), d['step_s']['median'], [(r['name'],r['status'],r['reason'][:120]) for r in d['speedups'] if r['status']!='applied'], d['extra'].get('compile_counters'))"
done
cd $OUT && tar czf ../r7.tgz . && rm -rf $OUT/* && mv ../r7.tgz $OUT/
