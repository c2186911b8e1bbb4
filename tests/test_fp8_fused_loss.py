"""fp8 and fused_loss on a CPU: skipped with their reasons (with and without the optional
packages), options checked, and the parts that run without a GPU: the GPT model's fused-loss
hook and fp8's layer selection and undo."""

from __future__ import annotations

import pytest
import torch

import fastloop.speedups.fp8 as fp8_module
import fastloop.speedups.fused_loss as fused_module
from fastloop.drivers.runner import run_configuration
from fastloop.errors import FastloopError
from fastloop.recipes.gpt.model import GPT, GPTConfig
from fastloop.speedups import resolve
from fastloop.speedups.base import Context


@pytest.mark.filterwarnings("ignore")
def test_skipped_on_cpu_with_the_reason():
    doc = run_configuration("gpt", "fp8,fused_loss", steps=2, warmup=0, device="cpu", steady_warmup=False)
    rec = {r["name"]: r for r in doc["speedups"]}
    assert rec["fp8"]["status"] == rec["fused_loss"]["status"] == "skipped"
    for name, package in (("fp8", "torchao"), ("fused_loss", "liger")):
        reason = rec[name]["reason"]
        assert "no CUDA" in reason or f"{package}" in reason, reason


@pytest.mark.parametrize("name,package", [("fp8", "torchao"), ("fused_loss", "liger_kernel")])
def test_without_the_package_it_says_not_installed(name, package, monkeypatch):
    module = fp8_module if name == "fp8" else fused_module
    real = module.importlib.util.find_spec
    monkeypatch.setattr(module.importlib.util, "find_spec", lambda n, *a: None if n == package else real(n, *a))
    (s,) = resolve(name)
    reason = s.why_not(Context(torch.device("cpu")))
    assert reason and "not installed" in reason and "pip install 'fastloop[" in reason


def test_fp8_options_are_checked():
    assert resolve("fp8:rowwise")[0].opts.recipe == "rowwise"
    with pytest.raises(FastloopError, match="fp8: recipe must be one of tensorwise, rowwise, got 'fast'"):
        resolve("fp8:fast")


def test_fp8_layer_selection_skips_the_output_layer_and_odd_shapes():
    model = GPT(GPTConfig.preset("tiny"))
    chosen = [n for n, m in model.named_modules() if fp8_module.fp8_eligible(m, n)]
    assert chosen and all(not n.endswith("lm_head") for n in chosen)
    assert not fp8_module.fp8_eligible(torch.nn.Linear(10, 16), "x")
    (s,) = resolve("fp8")
    assert "nothing suits fp8" in s.why_not_model(torch.nn.Sequential(torch.nn.Linear(10, 3)))


def test_fp8_conversion_is_undone():
    pytest.importorskip("torchao")
    model = GPT(GPTConfig.preset("tiny"))
    originals = {n: m for n, m in model.named_modules() if type(m) is torch.nn.Linear}
    ctx = Context(torch.device("cpu"))
    resolve("fp8")[0].apply_model(model, ctx)
    swapped = {n for n, m in model.named_modules() if n in originals and m is not originals[n]}
    assert swapped and "lm_head" not in swapped
    assert all(model.get_submodule(n).weight is originals[n].weight for n in swapped)  # the same parameters
    ctx.undo.pop()()
    assert all(model.get_submodule(n) is m for n, m in originals.items())


def test_gpt_fused_loss_hook_replaces_lm_head_and_cross_entropy():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny"))
    x = torch.randint(0, 256, (2, 16))
    y = torch.randint(0, 256, (2, 16))
    _, ref = model(x, y)
    model.fused_loss = lambda w, h, t: torch.nn.functional.cross_entropy((h @ w.T).float(), t)
    logits, fused = model(x, y)
    assert logits is None and torch.allclose(fused, ref, rtol=1e-6)
    (s,) = resolve("fused_loss")
    assert s.why_not_model(model) is None
    assert "no fused-loss hook" in s.why_not_model(torch.nn.Linear(4, 4))
