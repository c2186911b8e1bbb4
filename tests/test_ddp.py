"""Many devices through Lightning's DDP strategy, on the CPU (gloo, 2 processes): the ranks are
started by Lightning, each measures itself, rank 0 reports for all; speedups apply or skip
identically on every rank; a rank that fails ends the run on every rank with one clear error."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.filterwarnings("ignore")

RANK_KEYS = {
    "rank",
    "steps",
    "step_s",
    "step_s_all",
    "wait_s_all",
    "data_wait_frac",
    "items_per_step",
    "peak_mem_bytes",
    "throughput",
    "speedups",
}


def _fastloop(*args: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "fastloop.cli", *args], capture_output=True, text=True, timeout=timeout
    )
    return proc, time.perf_counter() - t0


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_two_ranks_report_per_rank_and_scaling(tmp_path):
    out = tmp_path / "ddp.json"
    proc, _ = _fastloop(
        "run",
        "tests/targets.py:tiny_conv",
        "--devices",
        "2",
        "--strategy",
        "ddp",
        "--device",
        "cpu",
        "--speedups",
        "workers:2,bf16,fused_optimizer,channels_last",
        "--steps",
        "6",
        "--warmup",
        "2",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["world_size"] == 2 and doc["strategy"] == "ddp"
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        assert RANK_KEYS <= set(r), RANK_KEYS - set(r)
        assert r["steps"] == 6 and len(r["step_s_all"]) == 6 and r["throughput"] > 0
    statuses = [[(s["name"], s["status"], s["reason"]) for s in r["speedups"]] for r in doc["ranks"]]
    assert statuses[0] == statuses[1] and doc["speedups_agree_across_ranks"] is True
    assert {s[0]: s[1] for s in statuses[0]} == {
        "workers": "applied",
        "bf16": "applied",
        "fused_optimizer": "applied",
        "channels_last": "applied",
    }
    assert doc["slowest_rank"] in (0, 1)
    slowest = doc["ranks"][doc["slowest_rank"]]
    assert doc["throughput"]["value"] == pytest.approx(2 * slowest["items_per_step"] / slowest["step_s"]["mean"])
    sc = doc["scaling"]
    assert sc["devices"] == 2 and sc["throughput_1"] > 0
    assert sc["efficiency"] == pytest.approx(sc["throughput_n"] / (2 * sc["throughput_1"]))
    assert "2 ranks (ddp)" in proc.stdout and "scaling:" in proc.stdout
    assert sc["step_time_growth"] == pytest.approx(slowest["step_s"]["mean"] / sc["one_device"]["step_s"]["mean"] - 1)
    assert doc["diagnosis"]["bottleneck"]  # on 2 CPU cores the gloo all-reduce dominates: usually communication-bound


def test_doctor_calls_poor_scaling_communication_bound():
    from fastloop.drivers.doctor import diagnose

    cfg = {
        "data_wait_frac": 0.02,
        "step_s": {"median": 0.05},
        "speedups": [],
        "scaling": {"devices": 2, "efficiency": 0.6, "step_time_growth": 0.66},
    }
    d = diagnose(cfg)
    assert (
        d["bottleneck"] == "communication-bound" and "66% longer" in d["evidence"] and "ddp_comm" in d["recommendation"]
    )
    cfg["scaling"]["efficiency"] = 0.95
    assert diagnose(cfg)["bottleneck"] != "communication-bound"


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_measured_worker_count_is_rank_zeros_on_every_rank(tmp_path):
    out = tmp_path / "w.json"
    proc, _ = _fastloop(
        "run",
        "tests/targets.py:sleepy",
        "--devices",
        "2",
        "--device",
        "cpu",
        "--speedups",
        "workers",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--no-scaling",
        "--json",
        str(out),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["speedups_agree_across_ranks"] is True
    recs = [r["speedups"][0] for r in doc["ranks"]]
    assert recs[0] == recs[1], recs  # measured once (rank 0), used by both
    assert recs[0]["status"] == "applied" and " worker processes (measured fastest: " in recs[0]["detail"]


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
@pytest.mark.parametrize("target,failing", [("fails_on_rank_1", 1), ("fails_on_rank_0", 0)])
def test_a_failing_rank_ends_every_rank_with_one_clear_error(target, failing):
    proc, took = _fastloop(
        "run",
        f"tests/targets.py:{target}",
        "--devices",
        "2",
        "--device",
        "cpu",
        "--steps",
        "10",
        "--warmup",
        "1",
        "--no-scaling",
        timeout=180,
    )
    assert proc.returncode == 1
    assert took < 120, f"the ranks took {took:.0f} s to stop"
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("fastloop: error")]
    assert len(errors) == 1 and f"boom on rank {failing} at step 3" in errors[0], proc.stderr[-3000:]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--devices", "0"], "--devices"),
        (["--devices", "2", "--strategy", "fsdp"], "fsdp needs CUDA"),
        (["--strategy", "horovod"], "invalid choice"),
    ],
)
def test_bad_multi_device_input_exits_2(args, message):
    proc, _ = _fastloop("run", "tests/targets.py:tiny_mlp", "--device", "cpu", "--no-scaling", *args, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-1000:]


@pytest.mark.slow  # a CLI process end to end: .ci/run's second step
def test_ddp_comm_tunes_ddp_on_every_rank_and_is_skipped_on_one_device(tmp_path):
    out = tmp_path / "c.json"
    proc, _ = _fastloop(
        "run",
        "tests/targets.py:tiny_mlp",
        "--devices",
        "2",
        "--device",
        "cpu",
        "--speedups",
        "ddp_comm:50",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--no-scaling",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    for r in doc["ranks"]:
        (rec,) = r["speedups"]
        assert rec["status"] == "applied" and rec["detail"] == "gradient_as_bucket_view=True, bucket_cap_mb=50"
    one = tmp_path / "one.json"
    proc, _ = _fastloop(
        "run",
        "tests/targets.py:tiny_mlp",
        "--device",
        "cpu",
        "--speedups",
        "ddp_comm",
        "--steps",
        "2",
        "--warmup",
        "0",
        "--json",
        str(one),
    )
    (rec,) = json.loads(one.read_text())["speedups"]
    assert rec["status"] == "skipped" and "not a multi-rank DDP run" in rec["reason"]
    proc, _ = _fastloop("run", "tests/targets.py:tiny_mlp", "--device", "cpu", "--speedups", "ddp_comm:0")
    assert proc.returncode == 2 and "bucket_mb must be an integer" in proc.stderr
