"""Every registered speedup through both adapters (the Lightning callbacks, via the runner, and
the plain loop) on the same model and data: the same status, reason and cuda_graph tier, and the
loss trajectories within the speedup's stated tolerance (tests/speedup_settings.py). Two adapters
that drive one engine agree whatever the engine does, so on the CPU each adapter's run is also
compared with the same adapter's eager run (no speedup: :data:`EAGER_RTOL`). On the CPU, the
speedups that apply there and cuda_graph on a stand-in for the device; on the GPU every CUDA-only
speedup and the combinations."""

from __future__ import annotations

import functools

import pytest
import torch

from fastloop.drivers.runner import run_configuration
from fastloop.loop import FastLoop
from fastloop.speedups import REGISTRY
from tests import graph_standin
from tests.speedup_settings import PARITY
from tests.targets import augmented_images, masked_text, tiny_conv, tiny_mlp

STEPS, WARMUP = 6, 2
BUILD = {
    "tests/targets.py:tiny_mlp": tiny_mlp,
    "tests/targets.py:tiny_conv": tiny_conv,
    "tests/targets.py:masked_text": masked_text,
    "tests/targets.py:augmented_images": augmented_images,
}


def test_every_registered_speedup_has_parity_settings():
    missing = sorted(set(REGISTRY) - set(PARITY))
    assert not missing, f"speedups without parity settings in tests/speedup_settings.py: {missing}"
    assert not set(PARITY) - set(REGISTRY), "settings for speedups that are not registered"


def _plain(target: str, spec: str, device: str = "cpu"):
    module, loader = BUILD[target]()
    conf = module.configure_optimizers()
    loop = FastLoop(
        module,
        conf["optimizer"],
        loader,
        step_fn=lambda m, b: m.training_step(b, 0)["loss"],
        scheduler=conf["lr_scheduler"]["scheduler"],
        speedups=spec,
        device=device,
    )
    return loop.train(steps=STEPS, warmup=WARMUP)


def _close(a: list[float], b: list[float], rtol: float, what: str = "the adapters' losses") -> float:
    """The largest relative difference of two loss trajectories (the steps both trained), which
    must be within ``rtol``."""
    n = min(len(a), len(b))
    assert n >= STEPS, (len(a), len(b))
    diff = max(abs(x - y) / max(abs(x), 1e-8) for x, y in zip(a[:n], b[:n]))
    assert diff <= rtol, f"{what} differ by {diff:.2e} > {rtol}"
    return diff


STANDIN = {"cuda_graph"}
"""CUDA-only speedups whose decisions the CPU half checks on a stand-in for the device
(tests/graph_standin.py: a graph that bakes in what a CUDA graph bakes in)."""


def _cases():
    for name in sorted(PARITY):
        p = PARITY[name]
        if not (p.cpu or name in STANDIN):
            continue  # on a CPU both adapters only read the same "no CUDA": nothing of theirs to compare
        marks = [pytest.mark.slow] if p.slow else []
        yield pytest.param(name, marks=marks, id=name)


EAGER_RTOL = {
    "workers": 0.0,
    "bf16": 5e-2,
    "fused_optimizer": 1e-5,
    "channels_last": 1e-5,
    "compile": 1e-4,
    "cuda_graph": 1e-5,
    "pad_buckets": 1e-5,
    "batch_size": None,
    "deferred_logging": 0.0,  # reads the same tensors later: the same math
    "async_checkpoint": 0.0,  # changes how checkpoints are written, not a step
}
"""Largest relative loss difference on the CPU from the same adapter's eager run (no speedup): a
speedup does not change what trains (cuda_graph on the stand-in: the fused optimizer it switches
to rounds differently). Every speedup the CPU half runs has an entry; None where the speedup
changes the workload itself (batch_size trains another batch size)."""


@functools.cache
def _eager(target: str) -> tuple[list[float], list[float]]:
    """The eager losses of ``target`` through Lightning and through the plain loop (once per target)."""
    lit = run_configuration(target, "none", steps=STEPS, warmup=WARMUP, device="cpu", steady_warmup=False)
    return lit["losses"], _plain(target, "none").losses


def _tier(extra: dict) -> tuple:
    return extra.get("cuda_graph_tier"), extra.get("cuda_graph_why_not_whole")


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", list(_cases()))
def test_both_adapters_agree(name, monkeypatch):
    """On the CPU: the status, reason, cuda_graph's tier and the loss trajectory of each speedup
    that applies here (cuda_graph on the stand-in), the same through both adapters."""
    p = PARITY[name]
    if torch.cuda.is_available() and not p.cpu:
        pytest.skip(
            "on a GPU machine this speedup's parity runs on CUDA: "
            "tests/test_parity.py::test_both_adapters_agree_on_the_gpu"
        )
    if name in STANDIN:
        graph_standin.install(monkeypatch)
        monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **kw: None)
    spec = f"{name}:{p.option}" if p.option else name
    lit = run_configuration(p.target, spec, steps=STEPS, warmup=WARMUP, device="cpu", steady_warmup=False)
    lit_rec = next(r for r in lit["speedups"] if r["name"] == name)
    if p.step_skip:  # it acts only in a whole fit (its own tests): the step run says why not
        assert (lit_rec["status"], lit_rec["reason"]) == ("skipped", p.step_skip), lit_rec
        return
    assert lit_rec["status"] == "applied", lit_rec
    eager_rtol = EAGER_RTOL[name]
    if eager_rtol is not None:
        _close(_eager(p.target)[0], lit["losses"], eager_rtol, "Lightning's losses with and without it")
    if not p.plain_loop:
        return
    plain = _plain(p.target, spec)
    if eager_rtol is not None:
        _close(_eager(p.target)[1], plain.losses, eager_rtol, "FastLoop's losses with and without it")
    plain_rec = next(r for r in plain.records if r.name == name)
    assert (lit_rec["status"], lit_rec["reason"]) == (plain_rec.status, plain_rec.reason)
    assert _tier(lit["extra"]) == _tier(plain.extra), (lit["extra"], plain.extra)
    if name in STANDIN:
        assert lit["extra"]["cuda_graph_tier"] == "whole step", lit["extra"]
    # the Lightning run may train more warm-up steps (draining a worker loader's buffer): compare
    # the steps both trained
    _close(lit["losses"], plain.losses, p.rtol)


GPU_RTOL = {"bf16": 2e-2, "fp16": 2e-2, "compile": 1e-4, "fp8": 5e-2, "gpu_augment": 1e-4}
"""Largest relative loss difference between the adapters on CUDA (1e-5 where the math is the same:
cuBLAS may pick other kernels for the two processes' first calls)."""


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", sorted(n for n in PARITY if not PARITY[n].cpu and PARITY[n].plain_loop))
def test_both_adapters_agree_on_the_gpu(name):
    """Every CUDA-only speedup through the Lightning callbacks and the plain loop on the GPU: the
    same status, reason and cuda_graph tier (whatever the status: two adapters that skip for
    different reasons fail), and where it applied the same loss trajectory within GPU_RTOL."""
    p = PARITY[name]
    spec = f"{name}:{p.option}" if p.option else name
    lit = run_configuration(p.target, spec, steps=STEPS, warmup=WARMUP, device="cuda", steady_warmup=False)
    lit_rec = next(r for r in lit["speedups"] if r["name"] == name)
    plain = _plain(p.target, spec, device="cuda")
    plain_rec = next(r for r in plain.records if r.name == name)
    assert (lit_rec["status"], lit_rec["reason"]) == (plain_rec.status, plain_rec.reason), (lit_rec, plain_rec)
    assert _tier(lit["extra"]) == _tier(plain.extra), (lit["extra"], plain.extra)
    if lit_rec["status"] == "applied":
        _close(lit["losses"], plain.losses, GPU_RTOL.get(name, 1e-5))


class _Counted(torch.nn.Module):
    """A wrapper that returns a new object (as activation checkpointing's ``checkpoint_wrapper``
    does) and counts its forward calls."""

    calls = 0

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        type(self).calls += 1
        return self.inner(*args, **kwargs)


@pytest.mark.filterwarnings("ignore")
def test_change_model_returning_a_wrapper_means_the_same_in_both_adapters(monkeypatch):
    """A speedup whose change_model returns a new object trains through that wrapper
    under FastLoop and under Lightning (on the module's children there), both recorded applied,
    with the same losses; never applied-but-dropped."""
    from fastloop.speedups.base import REGISTRY, Speedup

    class Wrap(Speedup):
        name, changes = "test_wrap", "model"

        def apply(self, run):
            run.change_model(_Counted)

    monkeypatch.setitem(REGISTRY, "test_wrap", Wrap)
    _Counted.calls = 0
    lit = run_configuration(
        "tests/targets.py:tiny_mlp", "test_wrap", steps=STEPS, warmup=WARMUP, device="cpu", steady_warmup=False
    )
    lit_calls, _Counted.calls = _Counted.calls, 0
    module, loader = tiny_mlp()
    conf = module.configure_optimizers()
    plain = FastLoop(
        module,
        conf["optimizer"],
        loader,
        loss_fn=torch.nn.functional.cross_entropy,  # calls model(x)
        scheduler=conf["lr_scheduler"]["scheduler"],
        speedups="test_wrap",
        device="cpu",
    ).train(steps=STEPS, warmup=WARMUP)
    rec = next(r for r in lit["speedups"] if r["name"] == "test_wrap")
    assert rec["status"] == "applied" and "children were changed" in rec["detail"], rec
    assert plain.records[0].status == "applied"
    assert lit_calls >= STEPS + WARMUP and _Counted.calls == STEPS + WARMUP
    assert _close(lit["losses"], plain.losses, 0.0) == 0.0


COMBOS = {"cuda_graph,fp16": 2e-2, "cuda_graph,compile": 1e-4, "channels_last,cuda_graph": 1e-4}
"""Combinations both adapters must take to the same tier, with the largest relative loss difference."""


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("spec", sorted(COMBOS))
def test_both_adapters_reach_the_same_cuda_graph_tier_in_combinations(spec):
    """fp16 + cuda_graph, compile + cuda_graph, channels_last + cuda_graph through the
    callbacks and FastLoop: the same statuses, the same cuda_graph tier, the losses within COMBOS."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    target = "tests/targets.py:tiny_conv" if "channels_last" in spec else "tests/targets.py:tiny_mlp"
    lit = run_configuration(target, spec, steps=STEPS, warmup=WARMUP, device="cuda", steady_warmup=False)
    plain = _plain(target, spec, device="cuda")
    lit_st = {r["name"]: (r["status"], r["reason"]) for r in lit["speedups"]}
    assert lit_st == {r.name: (r.status, r.reason) for r in plain.records}, (lit["speedups"], plain.records)
    assert _tier(lit["extra"]) == _tier(plain.extra), (lit["extra"], plain.extra)
    _close(lit["losses"], plain.losses, COMBOS[spec])


@pytest.mark.filterwarnings("ignore")
def test_compile_that_compiled_nothing_is_the_same_fallback_in_both_adapters():
    """The 'compiled nothing' check is the compile speedup's (compiled_nothing), so
    FastLoop records what the callbacks record: fallback, with torch's first graph-break reason."""
    from tests.targets import untraceable

    lit = run_configuration(
        "tests/targets.py:untraceable", "compile", steps=3, warmup=1, device="cpu", steady_warmup=False
    )
    module, loader = untraceable()
    plain = FastLoop(
        module,
        torch.optim.SGD(module.parameters(), lr=0.01),
        loader,
        loss_fn=torch.nn.functional.cross_entropy,
        speedups="compile",
        device="cpu",
    ).train(steps=3, warmup=1)
    lit_rec = next(r for r in lit["speedups"] if r["name"] == "compile")
    rec = plain.records[0]
    assert lit_rec["status"] == rec.status == "fallback", (lit_rec, rec)
    assert "compiled no graph" in rec.reason and rec.reason.split(":")[0] == lit_rec["reason"].split(":")[0]


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore")
def test_a_step_that_draws_on_the_host_drops_one_tier_in_the_plain_loop_as_under_lightning():
    """A whole step that cannot be captured (a host draw) drops to forward+backward
    through compile's CUDA graphs in the same run, in FastLoop as in the callbacks; not to eager."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import random

    module, loader = tiny_mlp()

    def step(m, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(m(x * (1 + 0.01 * random.random())), y)

    res = FastLoop(
        module,
        torch.optim.AdamW(module.parameters(), lr=1e-3),
        loader,
        step_fn=step,
        speedups="cuda_graph",
        device="cuda",
    ).train(steps=8, warmup=3)
    rec = res.records[0]
    assert rec.status == "applied" and res.extra["cuda_graph_tier"] == "forward+backward graphed", (rec, res.extra)
    assert "random" in rec.detail or "draw" in rec.detail, rec.detail
