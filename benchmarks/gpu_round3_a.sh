#!/usr/bin/env bash
# Device call A (2026-12-01): GPU tests, Lightning's demo Transformer with CUDA graphs, and the
# launch-bound MLP (Lightning cuda_graph beside the plain loop's whole-step graph). JSON under $OUT.
set -u
export PYTHONPATH=src:. PYTHONUNBUFFERED=1
python3 -c "import torch, lightning; print(torch.__version__, lightning.__version__, torch.cuda.get_device_name(0))"
python3 -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider -x 2>&1 | tee $OUT/gpu_tests.txt | tail -15
T=benchmarks/targets/lightning_demo.py:make
for s in cuda_graph bf16,cuda_graph compile:reduce-overhead; do
  python3 -m fastloop.cli run $T --speedups $s --steps 50 --warmup 5 --json $OUT/demo_${s//[:,]/_}.json --quiet; echo "rc=$? $s"
done
python3 benchmarks/launch_bound.py > /dev/null 2>$OUT/launch.err; tail -2 $OUT/launch.err
python3 - <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/demo_*.json")):
    d = json.load(open(f))
    print(os.path.basename(f), [(r["name"], r["status"], r["reason"][:110]) for r in d["speedups"]],
          round(d["step_s"]["median"] * 1e3, 2), "ms", round(d["throughput"]["value"]), d["throughput"]["unit"])
d = json.load(open(os.environ["OUT"] + "/launch_bound.json"))
print("launch", {k: v for k, v in d.items() if k not in ("env", "command")})
PY
