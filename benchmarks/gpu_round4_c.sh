#!/usr/bin/env bash
# Round 4, call 3 (issue 15): GPT-2 124M T=1024 B16 through fastloop: bf16 + compile beside
# fp8 (torchao), fused_loss (liger-kernel) and both, one process each; then 300 steps of the
# embedded corpus, bf16 vs fp8 + fused_loss, for the loss comparison; then the batch-size
# search's choice with both on. JSON per run under $OUT; table last.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src:. PYTHONUNBUFFERED=1
base=tf32,bf16,fused_optimizer
run() { name=$1; shift; python3 -m fastloop.cli run gpt --device cuda --json $OUT/$name.json --quiet "$@" 2>$OUT/$name.err \
          || { echo "FAILED $name"; tail -4 $OUT/$name.err; }; }
run bf16 --speedups $base,compile --steps 50 --warmup 10
run fp8 --speedups $base,fp8,compile --steps 50 --warmup 10
run fused_loss --speedups $base,fused_loss,compile --steps 50 --warmup 10
run fp8_fused_loss --speedups $base,fp8,fused_loss,compile --steps 50 --warmup 10
run loss300_bf16 --speedups $base,compile --steps 298 --warmup 2
run loss300_fp8_fused --speedups $base,fp8,fused_loss,compile --steps 298 --warmup 2
run bs_fp8_fused --speedups $base,fp8,fused_loss,compile,batch_size --steps 30 --warmup 10
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
def load(n):
    p = os.path.join(out, n + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
print(f"{'config':18} {'tokens/s':>10} {'median ms':>10} {'B':>4}  records")
for n in ("bf16", "fp8", "fused_loss", "fp8_fused_loss", "bs_fp8_fused", "loss300_bf16", "loss300_fp8_fused"):
    d = load(n)
    if not d:
        print(f"{n:18} missing"); continue
    c = d.get("configuration", d)
    recs = [(r["name"], r["status"]) for r in c["speedups"] if r["status"] != "applied"]
    b = c.get("items_per_step", 0) // 1024
    print(f"{n:18} {c['throughput']['value']:10,.0f} {1e3*c['step_s']['median']:10.1f} {b:4}  not applied: {recs}")
a, b = load("loss300_bf16"), load("loss300_fp8_fused")
if a and b:
    la, lb = (x.get("configuration", x)["losses"] for x in (a, b))
    rel = [abs(x - y) / abs(x) for x, y in zip(la, lb)]
    tail = lambda l: sum(l[-50:]) / 50
    print(f"300 steps: last-50 mean loss bf16 {tail(la):.4f} fp8+fused {tail(lb):.4f} ({100*(tail(lb)/tail(la)-1):+.2f}%); max rel diff {max(rel):.3f}")
    json.dump({"bf16": la, "fp8_fused_loss": lb}, open(os.path.join(out, "loss300.json"), "w"))
PY
