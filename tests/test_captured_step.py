"""The captured-step engine (speedups/captured_step.py), the same for both adapters, on the CPU:
the optimizer's preparation given the schedulers, and whole runs through FastLoop and the
Lightning callbacks with a stand-in for the CUDA graphs that bakes in what a real graph bakes in
(tests/graph_standin.py). The same runs on the GPU: benchmarks/graph_schedules.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from fastloop.errors import GraphIneligible
from fastloop.loop import FastLoop
from fastloop.speedups.captured_step import CHECKED_STEPS, EAGER_STEPS, prepare_for_capture
from tests import graph_standin

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    """The GPU benchmark of the same runs (benchmarks/graph_schedules.py): its cases, read from there."""
    spec = importlib.util.spec_from_file_location("graph_schedules", ROOT / "benchmarks" / "graph_schedules.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench()
STEPS, _sgd, _steplr, _adamw, _onecycle = BENCH.STEPS, BENCH._sgd, BENCH._steplr, BENCH._adamw, BENCH._onecycle

CASES = {
    "sgd_momentum_steplr": (_sgd, _steplr, "whole step", None),
    "adamw_onecycle": (_adamw, _onecycle, "forward+backward graphed", "OneCycleLR cycles AdamW's betas"),
}
assert set(CASES) == set(BENCH.CASES)


_model, _loader = BENCH._model, BENCH._loader


def test_an_sgd_planned_for_a_whole_step_graph_keeps_its_lr_as_a_tensor_that_follows_steplr():
    """Issue 63: plain SGD's lr stayed a Python float after make_capturable, so every replay
    used the capture step's lr. Prepared for a graph with its scheduler, it is fused and its lr is
    a tensor the scheduler fills in place every step (or the whole step is refused)."""
    model = _model()
    opt = _sgd(model.parameters())
    sched = _steplr(opt)
    prepared = prepare_for_capture(opt, [sched])
    lr = opt.param_groups[0]["lr"]
    assert torch.is_tensor(lr) and prepared.fused and opt.param_groups[0]["fused"] is True
    for k in range(1, 4):
        model(torch.randn(4, BENCH.WIDTH)).sum().backward()
        opt.step()
        sched.step()
        prepared.sync()
        assert opt.param_groups[0]["lr"] is lr  # the tensor the graph reads, refilled in place
        assert float(lr) == pytest.approx(0.1 * 0.5**k)
    prepared.restore()
    assert isinstance(opt.param_groups[0]["lr"], float)


@pytest.mark.parametrize(
    "make_opt, make_sched, words",
    [
        (_adamw, _onecycle, "OneCycleLR cycles AdamW's betas every step (cycle_momentum=True)"),
        (_sgd, lambda o: torch.optim.lr_scheduler.CyclicLR(o, 0.01, 0.1), "CyclicLR cycles SGD's momentum"),
        (
            lambda p: torch.optim.SGD(p, lr=0.1, differentiable=True),
            _steplr,
            "SGD reads its lr as a Python number (differentiable optimizers cannot be fused), which a graph would bake in "
            "while StepLR changes it",
        ),
        (lambda p: torch.optim.LBFGS(p), lambda o: None, "LBFGS has no capturable implementation"),
    ],
)
def test_a_graph_that_could_not_follow_the_schedulers_is_refused_naming_them(make_opt, make_sched, words):
    model = _model()
    opt = make_opt(model.parameters())
    sched = make_sched(opt)
    inner = torch.optim.lr_scheduler.SequentialLR(opt, [sched], milestones=[]) if sched is not None else None
    with pytest.raises(GraphIneligible, match=__import__("re").escape(words)):
        prepare_for_capture(opt, [inner] if inner is not None else [])


def _plain(make_opt, make_sched, spec: str, *, by_hand=None):
    model = _model()
    opt = make_opt(model.parameters())
    loop = FastLoop(
        model,
        opt,
        _loader(),
        loss_fn=torch.nn.functional.cross_entropy,
        speedups=spec,
        scheduler=make_sched(opt),
        device="cpu",
    )
    if by_hand is not None:  # a hyperparameter changed by the user's own code after a step
        step = loop._step_scheduler

        def stepped() -> None:
            step()
            by_hand(loop.optimizer, loop)

        loop._step_scheduler = stepped
    result = loop.train(steps=STEPS)
    return model, result


def _max_rel_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    scale = max(p.abs().max().item() for p in a.parameters())
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters())) / scale


@pytest.fixture
def standin(monkeypatch):
    graph_standin.install(monkeypatch)
    compiled: list[str | None] = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **kw: compiled.append(kw.get("mode")))
    return compiled


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("case", sorted(CASES))
def test_both_adapters_graph_follow_the_scheduler_or_step_down_with_the_same_tier_and_reason(standin, case):
    """Issue 63's must-show on the CPU stand-in (the GPU's in benchmarks/graph_schedules.py): 16
    steps eager and with cuda_graph on the same weights and batches, (a) SGD(momentum=0.9) +
    StepLR(step_size=1, gamma=0.5): the whole step is replayed, its lr follows the scheduler; (b)
    AdamW + OneCycleLR: refused the whole step for the betas, one tier down. The weights agree
    with eager's, and both adapters reach the same tier for the same reason."""
    _, _, tier, why = CASES[case]
    eager, _ = BENCH.plain(case, "none", device="cpu")
    graphed, got = BENCH.plain(case, "cuda_graph", device="cpu")
    assert got["status"] == "applied" and got["tier"] == tier, got
    assert _max_rel_diff(eager, graphed) <= 1e-5
    lit_eager, _ = BENCH.lightning(case, "none", accelerator="cpu")
    lit_graphed, lit = BENCH.lightning(case, "cuda_graph", accelerator="cpu")
    assert lit["status"] == "applied" and lit["tier"] == tier, lit
    assert lit["why_not_whole"] == got["why_not_whole"]
    assert _max_rel_diff(lit_eager, lit_graphed) <= 1e-5
    res, rec = got["extra"], got
    if why is None:
        assert res["cuda_graph_shapes"]["graphs"] == 1 and "replays" in rec["detail"], rec
        assert (
            f"{STEPS - EAGER_STEPS - 2} replays" in rec["detail"]
        )  # two eager, one checked, the capture, then replays
    else:
        assert why in res["cuda_graph_why_not_whole"] and why in rec["detail"], rec
        assert standin.count("reduce-overhead") == 2  # each adapter compiled the step for compile's graphs


@pytest.mark.filterwarnings("ignore")
def test_a_hyperparameter_changed_by_hand_ends_the_replays_and_the_run_trains_as_eager(standin):
    """No scheduler names it, so it is found before the replay after the change: the guard compares
    what the graph baked in, the steps from there run one tier down, and the weights are eager's."""

    def by_hand(opt, loop):
        loop.stepped = getattr(loop, "stepped", 0) + 1
        if loop.stepped == 8:
            opt.param_groups[0]["momentum"] = 0.5

    eager, _ = _plain(_sgd, lambda o: None, "none", by_hand=by_hand)
    graphed, res = _plain(_sgd, lambda o: None, "cuda_graph", by_hand=by_hand)
    assert res.extra["cuda_graph_tier"] == "forward+backward graphed", res.extra
    why = res.extra["cuda_graph_why_not_whole"]
    assert why.startswith("param group 0's momentum (0.9 when captured, 0.5 now)"), why
    assert _max_rel_diff(eager, graphed) <= 1e-5


@pytest.mark.filterwarnings("ignore")
def test_a_host_draw_in_a_checked_step_fails_at_once_and_a_sync_free_run_captures_after_the_warm_up(standin):
    """The warm-up written once: EAGER_STEPS eager steps, a checked step, then the capture; a draw
    on the host in the checked step fails the whole step at once (the stand-in sees draws)."""
    import random

    model = _model()

    def drawing(m, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(m(x * (1 + 0.01 * random.random())), y)

    step_fn = drawing  # the source check would see this draw first: hide it behind a name it cannot follow
    loop = FastLoop(
        model,
        _adamw(model.parameters()),
        _loader(),
        step_fn=lambda m, b: step_fn(m, b),
        speedups="cuda_graph",
        device="cpu",
    )
    res = loop.train(steps=6)
    assert res.extra["cuda_graph_tier"] == "forward+backward graphed"
    assert "draws random numbers on the host (Python's random)" in res.extra["cuda_graph_why_not_whole"]
    assert loop.graphed.engine.steps == EAGER_STEPS + 1  # failed in its first checked step
    assert CHECKED_STEPS == 2
