#!/usr/bin/env bash
# Ran in round 10 as call 7 (9c5ffa0, `LIMIT_S=110`: GPU-init / CPU-init 1.0002; RESULTS.md, round 10, item 1).
# Round 10, device call 7: does initialising GPT-2's weights on the GPU (the recipe's default
# since round 10) change the step's speed? Round 10's ladder measured tf32 161k and compile 491k
# tokens/s against round 9's 165k and 504k. Alternating fresh runs of tf32,bf16 with the weights
# initialised on the GPU (gpt) and on the CPU (benchmarks/targets/gpt_cpu_init.py:make).
set -u
T0=$SECONDS
export PYTHONPATH=src:. PYTHONUNBUFFERED=1
R=$OUT/r10f; mkdir -p $R
for i in 1 2 3; do
  for side in gpu cpu; do
    t=gpt; [ $side = cpu ] && t=benchmarks/targets/gpt_cpu_init.py:make
    timeout 60 python3 -m fastloop.cli run $t --device cuda --speedups tf32,bf16 --steps 30 --warmup 5 \
      --json $R/${side}_$i.json --quiet > /dev/null 2> $R/${side}_$i.err; echo "$side $i rc $? [$((SECONDS-T0)) s]"
  done
  [ $((SECONDS-T0)) -gt ${LIMIT_S:-150} ] && break
done
python3 - "$R" <<'PY'
import glob, json, math, sys
r = sys.argv[1]; rat = []
for p in sorted(glob.glob(f"{r}/gpu_*.json")):
    q = p.replace("/gpu_", "/cpu_")
    try:
        g, c = json.load(open(p)), json.load(open(q))
    except OSError:
        continue
    rat.append(c["step_s"]["mean"] / g["step_s"]["mean"])
    print(p[-6:-5], "gpu-init", round(g["throughput"]["value"]), "cpu-init", round(c["throughput"]["value"]), "median ms", round(1e3 * g["step_s"]["median"], 2), round(1e3 * c["step_s"]["median"], 2))
if rat:
    print("gpu-init / cpu-init throughput (geo mean of pairs):", round(math.exp(sum(map(math.log, rat)) / len(rat)), 4), [round(x, 4) for x in rat])
PY
tar -C $OUT -czf $OUT/r10f.tgz r10f && rm -rf $R
echo "total $((SECONDS-T0)) s"
