#!/usr/bin/env bash
# Round 11, device call 1 (carries .whl). Issue 13: the Lightning whole-step CUDA graph.
# 1. Its GPU tests (tests/test_lightning_graph.py, and Lightning's demo Transformer).
# 2. CIFAR-shaped ResNet-18 B256, in-memory data: the plain fp32 Lightning baseline vs
#    gpu_resident + bf16 + channels_last + compile + cuda_graph (now the whole step captured),
#    interleaved, REPEATS a side, 100 measured steps a run. Round 10: 2.97x [2.52, 3.51], B's
#    runs 5.15-5.93 ms, host-bound (GPU busy 3.8 ms a step).
# 3. The host profile of B (cProfile over the measured steps).
set -u
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
R=$OUT/r11a; mkdir -p $R
timeout ${TESTS_S:-150} python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_lightning_graph.py \
  "tests/test_gpu.py::test_lightning_demo_transformer_with_cuda_graphs_ends_cleanly" > $R/tests.txt 2>&1
echo "tests rc $? [$((SECONDS-T0)) s]"; grep -E "passed|failed|Error|assert" $R/tests.txt | head -12 | cut -c1-300
T=benchmarks/targets/cifar.py:make
timeout ${AB_S:-260} python3 -m fastloop.cli ab $T --device cuda --a none --b gpu_resident,bf16,channels_last,compile,cuda_graph \
  --repeats ${REPEATS:-5} --steps 100 --warmup 10 --json $R/cifar_resident_ab.json --quiet > /dev/null 2> $R/cifar_resident_ab.err
echo "cifar resident rc $? [$((SECONDS-T0)) s]"
timeout 75 python3 benchmarks/host_profile.py $T gpu_resident,bf16,channels_last,compile,cuda_graph --steps 300 --device cuda \
  --top 30 --json $R/cifar_host_profile.json > $R/cifar_host_profile.txt 2>&1; echo "host profile rc $? [$((SECONDS-T0)) s]"
head -3 $R/cifar_host_profile.txt | cut -c1-160
python3 - "$R" <<'PY'
import json, os, sys
p = f"{sys.argv[1]}/cifar_resident_ab.json"
if os.path.exists(p):
    d = json.load(open(p))
    print("cifar", d["verdict"])
    for side in ("a", "b"):
        s = d[side]
        print("  ", side, round(s["throughput"]["value"]), "wait", round(s.get("data_wait_frac") or 0, 4),
              "runs ms", [round(1e3 * m, 3) for m in s.get("run_mean_step_s") or []],
              "busy", (s.get("gpu_profile") or {}).get("gpu_busy_ms_per_step"), "loss", s.get("loss"))
        for r in s.get("speedups") or []:
            print("     ", r.get("name"), r.get("status"), (r.get("detail") or r.get("reason") or "")[:200])
else:
    print("cifar: no result"); os.system(f"tail -5 {sys.argv[1]}/cifar_resident_ab.err")
PY
tar -C $OUT -czf $OUT/r11a.tgz r11a && rm -rf $R
echo "total $((SECONDS-T0)) s"
