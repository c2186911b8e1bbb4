"""The error policy: bad input to fastloop exits 2 with one line; the user's own code exits 1 with
their frames only; nothing of the user's is overwritten; Python callers get TypeError/ValueError
naming the argument. No fastloop-internal traceback anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastloop.cli import main

ROOT = Path(__file__).resolve().parents[1]
T = "tests/targets.py"


def _run(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code
    out = capsys.readouterr()
    return rc, out.err


BAD_CLI = [  # (argv, what the one line says)
    (["run"], "required"),
    (["frobnicate"], "invalid choice"),
    (["run", f"{T}:tiny_mlp", "--bogus"], "unrecognized arguments"),
    (["run", T], "malformed target"),
    (["run", ":make"], "malformed target"),
    (["run", "a:b:c"], "malformed target"),
    (["run", "missing.py:make"], "target file not found"),
    (["run", f"{T}:nope"], "has no function 'nope'"),
    (["run", "no_such_module_xyz:make"], "not found"),
    (["run", f"{T}:wrong_type"], "must return (LightningModule"),
    (["run", f"{T}:tiny_mlp", "--speedups", "bf16,,x"], "malformed speedup list"),
    (["run", f"{T}:tiny_mlp", "--speedups", "turbo"], "unknown speedup 'turbo'"),
    (["run", f"{T}:tiny_mlp", "--speedups", "none,bf16"], "cannot be combined"),
    (["run", f"{T}:tiny_mlp", "--speedups", "bf16,bf16"], "given twice"),
    (["run", f"{T}:tiny_mlp", "--speedups", "bf16,fp16"], "cannot be combined"),
    (["run", f"{T}:tiny_mlp", "--speedups", "workers:abc"], "must be an integer"),
    (["run", f"{T}:tiny_mlp", "--speedups", "workers:0"], "from 1 to 256"),
    (["run", f"{T}:tiny_mlp", "--speedups", "compile:warp"], "compile: mode must be one of default,"),
    (["run", f"{T}:tiny_mlp", "--speedups", "tf32:foo"], "takes no option"),
    (["run", f"{T}:tiny_mlp", "--speedups", "workers:"], "empty option"),
    (["run", f"{T}:tiny_mlp", "--steps", "-3"], "--steps must be an integer from 1"),
    (["run", f"{T}:tiny_mlp", "--steps", "0"], "--steps must be an integer from 1"),
    (["run", f"{T}:tiny_mlp", "--steps", str(10**12)], "--steps must be an integer from 1 to 1,000,000"),
    (["run", f"{T}:tiny_mlp", "--steps", "ten"], "must be an integer"),
    (["run", f"{T}:tiny_mlp", "--warmup", "-1"], "--warmup must be an integer from 0"),
    (["run", f"{T}:tiny_mlp", "--device", "tpu"], "invalid choice"),
    (["ab", f"{T}:tiny_mlp", "--a", "none", "--b", "bf16", "--repeats", "0"], "--repeats must be an integer from 1"),
    (["ab", f"{T}:tiny_mlp", "--a", "none"], "required"),
    (["ab", f"{T}:tiny_mlp", "--a", "none", "--b", "turbo"], "unknown speedup"),
    (["ladder", f"{T}:tiny_mlp", "--rungs", "bf16,warp"], "unknown speedup"),
    (["ladder", f"{T}:tiny_mlp", "--max-repeats", "0"], "--max-repeats must be an integer from 3 to 100"),
    (["ladder", f"{T}:tiny_mlp", "--max-repeats", "2"], "--max-repeats must be an integer from 3 to 100"),
    (["ladder", f"{T}:tiny_mlp", "--budget", "-5"], "--budget must be seconds"),
    (["ladder", f"{T}:tiny_mlp", "--measure-s", "0"], "--measure-s must be seconds"),
    (["run", f"{T}:tiny_mlp", "--measure-s", "x"], "--measure-s must be seconds"),
    (["batch-size", f"{T}:tiny_mlp", "--margin", "1.5"], "--margin must be a number in (0, 1]"),
    (["batch-size", f"{T}:tiny_mlp", "--max", "0"], "--max must be an integer from 1"),
    (["doctor", "--json", "/nonexistent/dir/x.json"], "does not exist"),
    (["doctor", "--json", ""], "needs a non-empty path"),
    (["doctor", "--json", "/proc/fastloop.json"], "cannot write"),
    (["doctor", "--json", "x" * 300 + ".json"], "at most 255"),
    (["doctor", "--json", "tests"], "is a folder"),
    (["doctor", "--out", "README.md"], "is a file"),
    (["doctor", "--out", "README.md/sub"], "is a file, so no folder can be made"),
    (["doctor", "--out", "tests"], "already holds files fastloop did not write"),
    (["run", f"{T}:tiny_mlp", "--json", T], "is an input of this run"),
    (["run", f"{T}:tiny_mlp", "--json", "README.md"], "was not written by fastloop"),
]


@pytest.mark.parametrize("argv,msg", BAD_CLI, ids=[" ".join(a)[:60] for a, _ in BAD_CLI])
def test_bad_cli_input_exits_2_with_one_line(argv, msg, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    before = {p: p.read_bytes() for p in (ROOT / T, ROOT / "README.md")}
    rc, err = _run(argv, capsys)
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and msg in lines[0], err
    assert "Traceback" not in err
    assert {p: p.read_bytes() for p in before} == before  # nothing of the user's touched


def test_non_utf8_path_is_refused(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    rc, err = _run(["doctor", "--json", os.fsdecode(b"bad\xff.json")], capsys)
    assert rc == 2 and "not valid UTF-8" in err and "Traceback" not in err


def test_read_only_report_file_left_byte_identical(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    ro = tmp_path / "old.json"
    ro.write_text(json.dumps({"fastloop_version": "0.0", "kind": "run"}))
    ro.chmod(0o444)
    before = ro.read_bytes()
    rc, err = _run(["run", f"{T}:tiny_mlp", "--steps", "2", "--warmup", "0", "--json", str(ro), "--quiet"], capsys)
    assert rc == 2 and "read-only" in err
    assert ro.read_bytes() == before


USER_ERRORS = [  # (target, what the last line says)
    ("raises", "raises() at targets.py"),
    ("step_raises", "training_step() at targets.py"),
    ("no_train_dataloader", "train_dataloader"),
    ("empty_dataset", "no step was trained"),
    ("yields_strings", "training_step() at targets.py"),
    ("no_parameters", "configure_optimizers() at targets.py"),
    ("exits_0", "called sys.exit(0)"),
    ("exits_3", "called sys.exit(3)"),
]


@pytest.mark.parametrize("name,msg", USER_ERRORS)
def test_user_code_errors_exit_1_with_their_frames_only(name, msg, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc, err = _run(["run", f"{T}:{name}", "--steps", "3", "--warmup", "1", "--device", "cpu"], capsys)
    assert rc == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("fastloop: error") and msg in last, err
    files = [ln for ln in err.splitlines() if ln.strip().startswith("File ")]
    assert all("tests/targets.py" in f for f in files), err  # no fastloop / Lightning / torch frame


@pytest.mark.parametrize(
    "cmd",
    [["batch-size", f"{T}:step_raises", "--max", "32"], ["doctor", f"{T}:step_raises", "--quick", "--steps", "2"]],
)
def test_batch_size_and_doctor_follow_the_policy(cmd, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc, err = _run(cmd + ["--device", "cpu"], capsys)
    assert rc == 1, err
    assert "training_step() at targets.py" in err.strip().splitlines()[-1]
    assert all("tests/targets.py" in ln for ln in err.splitlines() if ln.strip().startswith("File "))


def test_nan_loss_is_a_warning_and_the_json_is_standard(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "nan.json"
    rc, err = _run(
        ["run", f"{T}:nan_loss", "--steps", "3", "--warmup", "1", "--device", "cpu", "--json", str(out), "--quiet"],
        capsys,
    )
    assert rc == 0, err
    text = out.read_text()
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON token {c}"))
    assert doc["loss_finite"] is False and doc["loss"]["first"] is None
    assert any("not finite" in w for w in doc["warnings"])
    # each loss that was NaN is null in the run's own document, the reason beside it, so the
    # report's writer had nothing left to replace
    assert doc["losses"] == [None] * len(doc["losses"]) and set(doc["losses_not_finite"].values()) == {"nan"}
    assert sorted(map(int, doc["losses_not_finite"])) == list(range(len(doc["losses"])))
    assert "report_warnings" not in doc


def test_bad_input_is_answered_before_torch_is_imported():
    code = (
        "import sys; from fastloop.cli import main; rc = main(['run', 'x.py:f', '--steps', 'abc']) "
        "if False else None\n"
        "try:\n    main(['run', 'x.py:f', '--steps', 'abc'])\nexcept SystemExit as e:\n    rc = e.code\n"
        "print(rc, 'torch' in sys.modules)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.stdout.split() == ["2", "False"], p.stdout + p.stderr


# --- the Python API ---------------------------------------------------------------------------
def _model_opt():
    m = torch.nn.Linear(4, 2)
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


@pytest.mark.parametrize(
    "make,exc,msg",
    [
        (lambda: __import__("fastloop.lightning", fromlist=["x"]).SpeedupCallback(3), TypeError, "got int"),
        (lambda: __import__("fastloop.lightning", fromlist=["x"]).SpeedupCallback(None), TypeError, "got NoneType"),
        (
            lambda: __import__("fastloop.lightning", fromlist=["x"]).SpeedupCallback("turbo"),
            ValueError,
            "unknown speedup",
        ),
        (lambda: __import__("fastloop.lightning", fromlist=["x"]).callbacks(5), TypeError, "got int"),
        (lambda: __import__("fastloop.lightning", fromlist=["x"]).callbacks([1, 2]), TypeError, "got int"),
        (
            lambda: __import__("fastloop.lightning", fromlist=["x"]).callbacks("compile:warp"),
            ValueError,
            "compile: mode must be one of",
        ),
        (
            lambda: __import__("fastloop.lightning", fromlist=["x"]).BatchSizeSearch(objective="min"),
            ValueError,
            "objective",
        ),
        (lambda: __import__("fastloop.lightning", fromlist=["x"]).BatchSizeSearch(margin=0), ValueError, "margin"),
        (
            lambda: __import__("fastloop.lightning", fromlist=["x"]).BatchSizeSearch(max_size="big"),
            ValueError,
            "max_size",
        ),
        (
            lambda: __import__("fastloop.lightning", fromlist=["x"]).BatchSizeSearch(speedups="turbo"),
            ValueError,
            "unknown",
        ),
        (
            lambda: __import__("fastloop.loop", fromlist=["x"]).FastLoop(*_model_opt(), None, loss_fn=len),
            TypeError,
            "loader must be",
        ),
        (
            lambda: __import__("fastloop.loop", fromlist=["x"]).FastLoop("m", _model_opt()[1], [], loss_fn=len),
            TypeError,
            "model must be",
        ),
        (
            lambda: __import__("fastloop.loop", fromlist=["x"]).FastLoop(_model_opt()[0], "adam", [], loss_fn=len),
            TypeError,
            "optimizer must be",
        ),
        (
            lambda: __import__("fastloop.loop", fromlist=["x"]).FastLoop(*_model_opt(), [], loss_fn=3),
            TypeError,
            "loss_fn must be callable",
        ),
        (
            lambda: __import__("fastloop.measure.stats", fromlist=["x"]).bootstrap_ratio_ci([0.0, 0.1], [0.1, 0.1]),
            ValueError,
            "> 0",
        ),
        (
            lambda: __import__("fastloop.measure.stats", fromlist=["x"]).bootstrap_ratio_ci([-1.0], [0.1]),
            ValueError,
            "> 0",
        ),
        (
            lambda: __import__("fastloop.measure.stats", fromlist=["x"]).bootstrap_ratio_ci([float("nan")], [0.1]),
            ValueError,
            "finite",
        ),
        (
            lambda: __import__("fastloop.measure.stats", fromlist=["x"]).bootstrap_ratio_ci([0.1], [0.1], n_boot=0),
            ValueError,
            "n_boot",
        ),
        (
            lambda: __import__("fastloop.measure.stats", fromlist=["x"]).bootstrap_ratio_ci([], [0.1]),
            ValueError,
            "at least one",
        ),
        (
            lambda: __import__("fastloop.measure.stats", fromlist=["x"]).run_ratio_ci([[0.1]], [[float("inf")]]),
            ValueError,
            "finite",
        ),
        (
            lambda: __import__("fastloop.measure.stats", fromlist=["x"]).run_ratio_ci("abc", [[0.1]]),
            TypeError,
            "list of runs",
        ),
        (
            lambda: __import__("fastloop.measure.stats", fromlist=["x"]).run_ratio_ci([[0.1]], [[0.1]], confidence=1.5),
            ValueError,
            "confidence",
        ),
    ],
)
def test_python_api_rejects_bad_arguments_by_name(make, exc, msg):
    with pytest.raises(exc, match=None) as info:
        make()
    assert msg in str(info.value)


def test_fastloop_with_no_loader_records_nothing():
    from fastloop.loop import FastLoop

    m, opt = _model_opt()
    with pytest.raises(TypeError, match="loader must be"):
        FastLoop(m, opt, None, loss_fn=torch.nn.functional.cross_entropy, speedups="workers")


def test_one_step_per_side_is_never_significant():
    from fastloop.measure.stats import run_ratio_ci, verdict

    ci = run_ratio_ci([[0.010]], [[0.012]])
    assert not ci.significant and ci.too_few and verdict(ci).startswith("too few runs to tell")
    ci = run_ratio_ci([[0.010]] * 5, [[0.012]] * 5)  # five runs of one step each: too few steps
    assert not ci.significant and ci.too_few
