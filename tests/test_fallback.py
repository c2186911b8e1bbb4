"""Runtime fallback: a speedup that fails while the run is under way is removed, the run goes on
without it (repeated from a fresh build), its record says ``fallback`` with the cause, and the
weights equal those of a run without it."""

from __future__ import annotations

import pytest
import torch

from fastloop.runner import run_configuration
from fastloop.speedups.base import REGISTRY, Context, Speedup, register


class Explode(Speedup):
    """Test-only: the model's forward raises at its third call (a kernel missing on this GPU)."""

    name = "explode_at_third_step"
    changes = "model"
    order = 99

    def apply_model(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
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
    doc = run_configuration("tests/targets.py:tiny_mlp", f"fused_optimizer,{explode}", steps=6, warmup=2, device="cpu", steady_warmup=False)
    rec = {r["name"]: r for r in doc["speedups"]}
    assert rec[explode]["status"] == "fallback"
    assert "no kernel image" in rec[explode]["reason"] and "repeated without it" in rec[explode]["reason"]
    assert rec["fused_optimizer"]["status"] == "applied"
    assert doc["steps"] == 6
    without = run_configuration("tests/targets.py:tiny_mlp", "fused_optimizer", steps=6, warmup=2, device="cpu",
                                steady_warmup=False)  # a fixed step count: the weights must be bitwise equal
    assert doc["weights_sha256"] == without["weights_sha256"]
    assert doc["losses"] == without["losses"]


def test_an_error_no_speedup_claims_is_the_users(explode):
    from fastloop.errors import UserCodeError

    with pytest.raises(UserCodeError):
        run_configuration("tests/targets.py:step_raises", explode, steps=4, warmup=1, device="cpu")


def test_compile_claims_compiler_errors_only():
    from fastloop.speedups import resolve

    compile_, = resolve("compile")
    try:
        raise RuntimeError("Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run.")
    except RuntimeError as err:
        assert compile_.claims(err)
    assert not compile_.claims(ValueError("shapes do not match in my_loss"))
