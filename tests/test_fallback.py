"""Runtime fallback: a speedup that fails while the run is under way is removed, the run goes on
without it (repeated from a fresh build), its record says ``fallback`` with the cause, and the
weights equal those of a run without it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fastloop.drivers.runner import run_configuration
from fastloop.speedups.base import REGISTRY, Speedup, register
from fastloop.speedups.options import Options, option
from fastloop.speedups.run import Run


class Explode(Speedup):
    """Test-only: the model's forward raises at its third call (a kernel missing on this GPU)."""

    name = "explode_at_third_step"
    changes = "model"
    order = 99

    def apply(self, run: Run) -> None:
        run.change_model(self.explode_at_third_call)

    @staticmethod
    def explode_at_third_call(model: torch.nn.Module) -> torch.nn.Module:
        calls = {"n": 0}
        original = model.forward

        def forward(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("explode_at_third_step: no kernel image is available for execution on the device")
            return original(*args, **kwargs)

        model.forward = forward
        return model

    def claims(self, err: BaseException) -> bool:
        return "explode_at_third_step" in str(err)


@pytest.fixture
def explode():
    register(Explode)
    yield Explode.name
    REGISTRY.pop(Explode.name)


def test_a_speedup_failing_at_its_third_step_falls_back(explode):
    doc = run_configuration(
        "tests/targets.py:tiny_mlp", f"fused_optimizer,{explode}", steps=6, warmup=2, device="cpu", steady_warmup=False
    )
    rec = {r["name"]: r for r in doc["speedups"]}
    assert rec[explode]["status"] == "fallback"
    assert "no kernel image" in rec[explode]["reason"] and "repeated without it" in rec[explode]["reason"]
    assert rec["fused_optimizer"]["status"] == "applied"
    assert doc["steps"] == 6
    without = run_configuration(
        "tests/targets.py:tiny_mlp", "fused_optimizer", steps=6, warmup=2, device="cpu", steady_warmup=False
    )  # a fixed step count: the weights must be bitwise equal
    assert doc["weights_digest"] == without["weights_digest"]
    assert doc["losses"] == without["losses"]


def test_an_error_no_speedup_claims_is_the_users(explode):
    from fastloop.errors import UserCodeError

    with pytest.raises(UserCodeError):
        run_configuration("tests/targets.py:step_raises", explode, steps=4, warmup=1, device="cpu")


def test_compile_claims_compiler_errors_only():
    from fastloop.speedups import resolve

    (compile_,) = resolve("compile")
    try:
        raise RuntimeError(
            "Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run."
        )
    except RuntimeError as err:
        assert compile_.claims(err)
    assert not compile_.claims(ValueError("shapes do not match in my_loss"))


def test_compile_with_graphs_falls_back_to_compile_without_them():
    from fastloop.speedups import resolve

    (compile_,) = resolve("compile:reduce-overhead")
    err = RuntimeError("Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run.")
    variant = compile_.fallback_variant(err)
    assert variant is not None and variant.spec == "compile" and not variant.uses_cudagraphs()
    assert resolve("compile:max-autotune")[0].fallback_variant(err).spec == "compile:max-autotune-no-cudagraphs"
    assert resolve("compile")[0].fallback_variant(err) is None  # no graphs to give up: dropped
    assert compile_.fallback_variant(RuntimeError("an Inductor lowering failed")) is None


class ExplodeMild(Explode):
    """Test-only: fails at its third step; its milder variant (a no-op) runs instead."""

    name = "explode_mild"

    def fallback_variant(self, err: BaseException):
        @dataclasses.dataclass(frozen=True, kw_only=True)
        class MildOptions(Options):
            speedup = "explode_mild"
            mode: str = option("full", "how it runs", choices=("full", "mild"))

        class Mild(Speedup):
            name = "explode_mild"
            changes = "model"
            order = 99
            options_type = MildOptions

        return Mild(mode="mild")


def test_a_milder_variant_runs_instead_and_the_record_says_so():
    register(ExplodeMild)
    try:
        doc = run_configuration(
            "tests/targets.py:tiny_mlp", "explode_mild", steps=4, warmup=1, device="cpu", steady_warmup=False
        )
    finally:
        REGISTRY.pop("explode_mild")
    recs = [r for r in doc["speedups"] if r["name"] == "explode_mild"]
    assert len(recs) == 1 and recs[0]["status"] == "fallback"
    assert "repeated as explode_mild:mild" in recs[0]["reason"]
