"""Every bad input answered before training with one short line (exit 2), the user's
own error in either side of an A/B exits 1 with their frames, and advice never recommends what
the same report measured as not faster. The CLI cases run the real command in a subprocess and
check the exit status, stderr's lines and their length, and the files left behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fastloop.drivers.doctor import without_measured

ROOT = Path(__file__).resolve().parents[1]
T = "tests/targets.py"


def _cli(*argv: str | bytes, cwd: Path = ROOT, timeout: float = 300) -> tuple[int, list[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    p = subprocess.run(
        [sys.executable, "-m", "fastloop.cli", *argv], cwd=cwd, env=env, capture_output=True, timeout=timeout
    )
    return p.returncode, [ln for ln in p.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]


def _one_short_line(rc: int, lines: list[str], limit: int = 250) -> str:
    assert rc == 2, lines
    assert len(lines) == 1, lines
    assert len(lines[0]) <= limit, len(lines[0])
    assert "Traceback" not in lines[0] and "internal error" not in lines[0]
    return lines[0]


def test_ab_user_error_exits_1_with_their_frames_and_the_report_names_the_side(tmp_path):
    out = tmp_path / "rep"
    rc, lines = _cli(
        "ab",
        f"{T}:step_raises",
        "--a",
        "none",
        "--b",
        "none",
        "--repeats",
        "1",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--device",
        "cpu",
        "--out",
        str(out),
    )
    assert rc == 1, lines
    text = "\n".join(lines)
    assert "targets.py" in text and "shapes do not match in my_loss" in text
    assert "site-packages" not in text and "internal error" not in text
    doc = json.loads((out / "report.json").read_text())
    assert doc["failed_side"]["side"] == "A" and doc["failed_side"]["returncode"] == 1
    assert doc["verdict"].startswith("no verdict: side A")


def test_target_name_not_utf8_is_refused_before_training(tmp_path):
    bad = os.fsdecode(b"my\xfftarget.py")
    shutil.copy(ROOT / T, tmp_path / bad)
    out = tmp_path / "rep"
    rc, lines = _cli("run", f"{bad}:tiny_mlp", "--device", "cpu", "--out", str(out), cwd=tmp_path)
    line = _one_short_line(rc, lines)
    assert "not valid UTF-8" in line
    assert not out.exists()  # nothing half-written


@pytest.mark.parametrize("target", ["a" * 5000 + ".py:make", "pkg." * 1500 + "mod:make"])
def test_very_long_target_name_is_one_short_line(tmp_path, target):
    rc, lines = _cli("run", target, "--device", "cpu", "--out", str(tmp_path / "rep"))
    line = _one_short_line(rc, lines)
    assert "too long" in line and "characters" in line
    assert not (tmp_path / "rep").exists()


def test_target_that_is_a_folder(tmp_path):
    (tmp_path / "pkg.py").mkdir()
    rc, lines = _cli("run", "pkg.py:make", "--device", "cpu", cwd=tmp_path)
    assert "is a folder" in _one_short_line(rc, lines)


@pytest.mark.parametrize("flag", ["--json", "--out"])
def test_very_long_report_path_is_one_short_line(tmp_path, flag):
    rc, lines = _cli("doctor", flag, str(tmp_path / ("d" * 5000)))
    assert "too long" in _one_short_line(rc, lines)


def test_huge_speedup_list_is_not_echoed_whole():
    rc, lines = _cli("run", f"{T}:tiny_mlp", "--speedups", "x" * 20_000, "--device", "cpu")
    line = _one_short_line(rc, lines, limit=400)
    assert "unknown speedup" in line and "20,000 characters" in line


def test_huge_option_is_not_echoed_whole():
    rc, lines = _cli("run", f"{T}:tiny_mlp", "--speedups", "workers:" + "9" * 20_000, "--device", "cpu")
    assert "characters long" in _one_short_line(rc, lines, limit=400)


@pytest.mark.parametrize("value,near", [("NONE", "none"), ("BF16", "bf16"), ("complie", "compile")])
def test_a_wrong_name_says_what_was_wrong(value, near):
    rc, lines = _cli("run", f"{T}:tiny_mlp", "--speedups", value, "--device", "cpu")
    line = _one_short_line(rc, lines, limit=400)
    assert f"unknown speedup {value!r}; did you mean {near!r}?" in line
    assert "cannot be combined" not in line


@pytest.mark.parametrize("value", ["0", "1", "2", "101"])
def test_max_repeats_message_and_check_agree(value):
    rc, lines = _cli("ladder", f"{T}:tiny_mlp", "--max-repeats", value)
    assert "--max-repeats must be an integer from 3 to 100" in _one_short_line(rc, lines)


def test_advice_never_recommends_what_was_measured_not_faster():
    d = {
        "bottleneck": "compute-bound",
        "evidence": "",
        "recommendation": "bf16 autocast, fused optimizer, channels_last for conv nets, compile.",
    }
    out = without_measured(
        d,
        {
            "bf16": "0.99x [0.97, 1.01], no significant difference",
            "fused_optimizer": "1.00x [0.98, 1.02], no significant difference",
        },
    )
    advice, measured = out["recommendation"].split("; measured here", 1)
    assert "bf16" not in advice and "fused" not in advice and "compile" in advice and "channels_last" in advice
    assert "bf16 (0.99x" in measured and out["advice_filtered"] == ["bf16", "fused_optimizer"]
    everything = without_measured(
        {"recommendation": "cuda_graph (whole-step capture) or compile"}, {"cuda_graph": "1.00x", "compile": "0.97x"}
    )
    assert everything["recommendation"].startswith("the usual fixes for this bottleneck were measured here")
    assert without_measured(d, {"workers": "1.0x"}) is d  # nothing it names was measured: unchanged


def test_the_ladder_report_does_not_advise_a_dropped_rung():
    from fastloop.drivers.ladder import run_ladder
    from tests.test_ladder_select import _fake

    effects = {"workers": 1.0, "bf16": 1.0, "fused_optimizer": 1.0}
    doc = run_ladder("x", ["bf16", "fused_optimizer"], measure=_fake(effects), device="cpu")
    assert doc["selected"] == []
    for r in doc["rungs"]:
        rec = (r.get("bottleneck") or {}).get("recommendation", "")
        advice = rec.split("measured here")[0]
        assert "bf16" not in advice and "fused optimizer" not in advice, rec
