#!/usr/bin/env bash
# One device call: GPU tests, then the foundation/speedup benchmarks. Writes JSON under $OUT.
set -u
export PYTHONPATH=src:. PYTHONUNBUFFERED=1
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
python3 -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.txt | tail -25
python3 -m fastloop.cli doctor --json $OUT/doctor.json 2>&1 | tail -20
python3 benchmarks/timer_overhead.py > /dev/null 2>$OUT/timer.err; python3 -c "import json;d=json.load(open('$OUT/timer_overhead.json'));print('timer overhead', d['overhead_frac'], d['step_ms_plain'])"
python3 benchmarks/h2d_feed.py > /dev/null 2>$OUT/h2d.err; python3 -c "import json;d=json.load(open('$OUT/h2d_feed.json'));print('h2d', d['gbs'])"
python3 benchmarks/launch_bound.py > /dev/null 2>$OUT/launch.err; python3 -c "import json;d=json.load(open('$OUT/launch_bound.json'));print('launch', {k:v for k,v in d.items() if k not in ('env',)})"
for f in $OUT/*.err; do tail -n 3 $f; done
