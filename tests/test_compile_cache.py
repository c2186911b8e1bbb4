"""The compile cache that outlives the process: a second process compiling the same model
reads Inductor's cache (hits counted) and records ``warm``; ``--no-cache`` records ``cold`` and
leaves the cache untouched; another torch or another version of the model's code gets another
directory; the environment is as before after a run."""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys

import pytest
import torch

import fastloop._torch_private as tp
import fastloop.speedups.compile.cache as cc
from fastloop.speedups.compile.cache import CompileCache, cache_key, compile_cache_dir

CPU = torch.device("cpu")


def _model_from(path, source: str) -> torch.nn.Module:
    """A model whose class is defined in the file ``path`` (written with ``source``)."""
    path.write_text(source)
    name = f"cc_model_{abs(hash((str(path), source)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.Net()


NET = "import torch\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"


def test_the_directory_is_keyed_by_torch_and_the_models_code(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    model = _model_from(tmp_path / "net.py", NET + "        self.a = torch.nn.Linear(2, 2)\n")
    first = cache_key(model, CPU)
    assert cache_key(model, CPU) == first  # stable
    assert compile_cache_dir(first) == tmp_path / "cache" / "compile" / first["key"]
    assert str(tmp_path / "net.py") in first["code_files"]
    edited = _model_from(tmp_path / "net.py", NET + "        self.a = torch.nn.Linear(2, 3)\n")
    assert cache_key(edited, CPU)["key"] != first["key"], "an edit of the model's code kept the directory"
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    other = cache_key(model, CPU)
    assert other["key"] != first["key"] and other["torch"] == "9.9.9"
    assert cache_key(torch.nn.Linear(2, 2), CPU)["code_files"] == []  # torch's own modules: torch's version


def _counting(monkeypatch, after: dict[str, int]) -> None:
    """Inductor's cache counters: zero when the run starts, ``after`` when it ends."""
    calls = []

    def counters():
        calls.append(1)
        base = dict.fromkeys(tp.INDUCTOR_CACHE_COUNTERS, 0)
        return base if len(calls) == 1 else {**base, **after}

    monkeypatch.setattr(cc, "inductor_cache_counters", counters)


@pytest.mark.parametrize(
    "after, state",
    [
        ({"fxgraph_hit": 2, "autograd_hit": 1}, "warm"),
        ({"fxgraph_miss": 2, "autograd_miss": 1}, "cold"),
        ({"fxgraph_hit": 1, "fxgraph_miss": 1}, "partly warm"),
        ({}, "none"),
    ],
)
def test_the_record_says_warm_cold_or_partly_from_torchs_counts(tmp_path, monkeypatch, after, state):
    monkeypatch.setenv("FASTLOOP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    _counting(monkeypatch, after)
    stats: dict = {}
    with CompileCache(torch.nn.Linear(2, 2), CPU, stats=stats):
        pass
    rec = stats["compile_cache"]
    assert rec["state"] == state and rec["used"] is True and rec["chosen_by"] == "fastloop"
    assert rec["hits"] == after.get("fxgraph_hit", 0) + after.get("autograd_hit", 0)
    assert rec["dir"].startswith(str(tmp_path / "compile")) and os.path.isfile(os.path.join(rec["dir"], "key.json"))


def test_inside_the_run_inductor_caches_in_the_projects_directory_and_after_it_the_environment_is_back(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("FASTLOOP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    outer = CompileCache(torch.nn.Linear(2, 2), CPU)
    with outer:
        inside = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        os.environ["TRITON_CACHE_DIR"] = os.path.join(inside, "triton", "0")  # as Inductor does at its first kernel
        with CompileCache(torch.nn.Linear(2, 2), CPU) as nested:  # compile and cuda_graph in one run
            assert nested.directory == inside and os.environ["TORCHINDUCTOR_CACHE_DIR"] == inside
    assert inside == outer.directory and inside.startswith(str(tmp_path / "compile"))
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ and "TRITON_CACHE_DIR" not in os.environ


def test_your_own_inductor_directory_wins_and_inductors_default_does_not(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLOOP_CACHE_DIR", str(tmp_path / "ours"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "yours"))
    with CompileCache(torch.nn.Linear(2, 2), CPU) as held:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "yours")
    assert held.chosen_by == "TORCHINDUCTOR_CACHE_DIR"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", tp.inductor_default_cache_dir())  # set by Inductor itself
    with CompileCache(torch.nn.Linear(2, 2), CPU) as held:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path / "ours"))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == tp.inductor_default_cache_dir()


def test_without_the_cache_a_fresh_directory_is_used_and_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLOOP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    _counting(monkeypatch, {"fxgraph_miss": 1})
    stats: dict = {}
    with CompileCache(torch.nn.Linear(2, 2), CPU, use=False, stats=stats) as held:
        fresh = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        assert os.listdir(fresh) == []
    assert not os.path.exists(fresh) and held.chosen_by == "no-cache"
    assert stats["compile_cache"]["state"] == "cold" and stats["compile_cache"]["used"] is False
    assert not (tmp_path / "compile").exists()  # the project's cache was not touched


def test_the_torch_privates_it_reads_are_where_they_were():
    """Inductor's counters of its cache lookups and its default directory (_torch_private.py)."""
    from torch._functorch._aot_autograd import autograd_cache
    from torch._inductor import codecache

    sources = inspect.getsource(codecache) + inspect.getsource(autograd_cache)
    for group, key in tp.INDUCTOR_CACHE_COUNTERS.values():
        assert f'counters["{group}"]["{key}"]' in sources, f"torch no longer counts {group}/{key}"
    assert set(tp.inductor_cache_counters()) == set(tp.INDUCTOR_CACHE_COUNTERS)
    assert os.path.isabs(tp.inductor_default_cache_dir()) and "torchinductor" in tp.inductor_default_cache_dir()


def _listing(folder) -> dict:
    return {
        os.path.relpath(os.path.join(d, f), folder): os.stat(os.path.join(d, f)).st_mtime_ns
        for d, _, files in os.walk(folder)
        for f in files
    }


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_a_second_process_compiles_warm_and_no_cache_compiles_cold_leaving_the_cache(tmp_path, monkeypatch):
    """Three `fastloop run --speedups compile` processes on the CPU (Inductor's C++ backend): the
    first fills a fresh cache (cold: misses, no hits), the second reads it (warm: hits, no misses,
    less compile time), the third with --no-cache compiles cold and leaves the cache as it was."""
    from fastloop.drivers.subproc import run_in_subprocess

    monkeypatch.setenv("FASTLOOP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    kw = dict(steps=3, warmup=1, device="cpu", timeout=900)
    runs = [run_in_subprocess("tests/targets.py:tiny_mlp", "compile", **kw) for _ in range(2)]
    cold, warm = (r["extra"]["compile_cache"] for r in runs)
    assert cold["state"] == "cold" and cold["misses"] > 0 and cold["hits"] == 0, cold
    assert warm["state"] == "warm" and warm["hits"] > 0 and warm["misses"] == 0, warm
    assert warm["dir"] == cold["dir"] and warm["size_bytes"] > 0
    assert runs[1]["compile_s"] < runs[0]["compile_s"], [r["compile_s"] for r in runs]
    before = _listing(tmp_path)
    off = run_in_subprocess("tests/targets.py:tiny_mlp", "compile", compile_cache=False, **kw)
    assert off["extra"]["compile_cache"]["state"] == "cold" and off["run_inputs"]["compile_cache"] is False
    assert _listing(tmp_path) == before, "--no-cache changed the cache"


def test_the_reports_compile_column_says_what_the_cache_did():
    from fastloop.report.format import compile_cell

    assert compile_cell({"compile_s": 12.5, "extra": {"compile_cache": {"state": "warm"}}}) == "12.50 s (warm cache)"
    assert compile_cell({"compile_s": 40.0, "extra": {"compile_cache": {"state": "cold"}}}) == "40.00 s (cold cache)"
    assert compile_cell({"compile_s": 2.0, "extra": {"compile_cache": {"state": "none"}}}) == "2.00 s"
    assert compile_cell({"compile_s": None, "extra": {"compile_cache": {"state": "warm"}}}) == "-"
