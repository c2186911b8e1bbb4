"""The captured-step engine (speedups/cuda_graph/captured_step.py), the same for both adapters, on the CPU:
the optimizer's preparation given the schedulers, and whole runs through FastLoop and the
Lightning callbacks with a stand-in for the CUDA graphs that bakes in what a real graph bakes in
(tests/graph_standin.py). The same runs on the GPU: benchmarks/graph_schedules.py."""

from __future__ import annotations

import functools
import importlib.util
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from fastloop.errors import GraphIneligible
from fastloop.loop import FastLoop
from fastloop.speedups.cuda_graph.captured_step import CHECKED_STEPS, EAGER_STEPS, prepare_for_capture
from fastloop.speedups.cuda_graph.graph_capture import MAX_GRAPHS, batch_key, copy_into
from fastloop.speedups.cuda_graph.graph_guard import Baked, HostDraws
from tests import graph_standin

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    """The GPU benchmark of the same runs (benchmarks/graph_schedules.py): its cases, read from there."""
    spec = importlib.util.spec_from_file_location("graph_schedules", ROOT / "benchmarks" / "graph_schedules.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses resolve their annotations through the module
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench()
_sgd, _steplr, _adamw, _onecycle = BENCH._sgd, BENCH._steplr, BENCH._adamw, BENCH._onecycle
STEPS = 16
WIDTH = 64
"""The cases' models on the CPU (512 on the GPU)."""


def _model():
    torch.manual_seed(0)
    return BENCH._mlp(WIDTH)


def _loader():
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(torch.randn(8 * 64, WIDTH, generator=g), torch.randint(0, 10, (8 * 64,), generator=g))
    return DataLoader(ds, batch_size=64)


def test_an_sgd_planned_for_a_whole_step_graph_keeps_its_lr_as_a_tensor_that_follows_steplr():
    """Plain SGD's lr would stay a Python float after make_capturable, so every replay
    used the capture step's lr. Prepared for a graph with its scheduler, it is fused and its lr is
    a tensor the scheduler fills in place every step (or the whole step is refused)."""
    model = _model()
    opt = _sgd(model.parameters())
    sched = _steplr(opt)
    prepared = prepare_for_capture(opt, [sched])
    lr = opt.param_groups[0]["lr"]
    assert torch.is_tensor(lr) and prepared.fused and opt.param_groups[0]["fused"] is True
    for k in range(1, 4):
        model(torch.randn(4, WIDTH)).sum().backward()
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
            "SGD reads its lr as a Python number (differentiable optimizers cannot be fused), "
            "which a graph would bake in while StepLR changes it",
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


ROWS = [(name, adapter) for name, case in BENCH.CASES.items() for adapter in case.adapters]


@functools.cache
def _row(name: str, adapter: str) -> dict:
    """One case eager and with cuda_graph through one adapter (benchmarks/graph_schedules.py)."""
    return BENCH.run_case(name, adapter, "cpu", width=WIDTH)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name, adapter", ROWS, ids=[f"{a}-{n}" for n, a in ROWS])
def test_each_case_trains_as_eager_replayed_whole_or_one_tier_down_with_its_cause(standin, name, adapter):
    """The must-show on the CPU stand-in (the GPU's: benchmarks/graph_schedules.py): each
    case eager and with cuda_graph on the same weights and batches. The parameters agree with
    eager's within 1e-5 of their scale whatever the tier, the record is "applied", and the tier
    is the one the case expects: the whole step (replayed, a new graph for each new state, the
    change and its step named in the record), or one tier down with the cause named."""
    case = BENCH.CASES[name]
    row = _row(name, adapter)
    assert row["max_abs_diff_over_scale"] <= 1e-5, row
    assert row["status"] == "applied" and row["ok"], row
    if case.whole:
        assert row["tier"] == "whole step" and row["replays"] > 0, row
        assert row["why_not_whole"] is None, row
        for words in case.change:
            assert words in row["detail"], (words, row["detail"])
    else:
        assert row["tier"] == "forward+backward graphed", row
        assert case.why in row["why_not_whole"] and case.why in row["detail"], row
    if not case.change:
        assert row["state_changes"] == [], row


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", sorted(n for n, c in BENCH.CASES.items() if len(c.adapters) == 2))
def test_both_adapters_reach_the_same_tier_for_the_same_cause(standin, name):
    """One engine, two drivers: FastLoop and the Lightning callbacks reach the same tier, replay
    the same number of steps and name the same cause and the same state changes."""
    plain, lit = _row(name, "FastLoop"), _row(name, "Lightning")
    assert plain["tier"] == lit["tier"], (plain, lit)
    assert plain["replays"] == lit["replays"], (plain, lit)
    cause = BENCH.CASES[name].why
    if cause is not None:
        assert cause in plain["why_not_whole"] and cause in lit["why_not_whole"], (plain, lit)
    assert [c.split(":")[0] for c in plain["state_changes"]] == [c.split(":")[0] for c in lit["state_changes"]]


@pytest.mark.filterwarnings("ignore")
def test_a_refusal_before_step_one_replays_nothing_and_asks_compile_for_its_graphs(standin):
    """What the refused case shows, and no more: the whole step is refused before the first step
    (no replay), and both adapters compile the model for compile's CUDA graphs (one tier down);
    on the stand-in compile does nothing, so its parameters compare eager with eager."""
    _, plain = BENCH.plain("adamw_onecycle_betas", "cuda_graph", "cpu", WIDTH)
    _, lit = BENCH.lightning("adamw_onecycle_betas", "cuda_graph", "cpu", WIDTH)
    assert lit["engine"] is None  # the driver was dropped when the whole step was refused
    assert plain["engine"].replays == 0 and plain["engine"].steps == 0, plain["engine"]  # refused at construction
    for got in (plain, lit):
        assert got["why_not_whole"].startswith("OneCycleLR cycles AdamW's betas every step"), got
    assert standin == ["reduce-overhead", "reduce-overhead"], standin


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


def test_a_cpu_tensor_lr_is_moved_to_the_parameters_device_followed_and_given_back():
    """A fused CUDA kernel reads a CPU lr tensor once, on the host, at capture: the group's lr
    becomes a tensor on the parameters' device (here "meta", a device that is not the CPU), a
    scheduler fills it in place, an in-place change of the user's own tensor reaches it before
    the next replay, and after the run the user's tensor is back in the group with the last lr."""
    user_lr = torch.tensor(1e-3)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2, device="meta"))], lr=user_lr)
    prepared = prepare_for_capture(opt)
    graph_lr = opt.param_groups[0]["lr"]
    assert graph_lr.device.type == "meta" and graph_lr is not user_lr
    seen = graph_lr._version
    prepared.sync()
    assert graph_lr._version == seen  # nothing changed: nothing filled
    user_lr.fill_(5e-4)  # the user's tensor changed in place
    prepared.sync()
    assert graph_lr._version > seen and opt.param_groups[0]["lr"] is graph_lr
    cpu = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))], lr=torch.tensor(2e-3))
    prepared = prepare_for_capture(cpu, [torch.optim.lr_scheduler.StepLR(cpu, step_size=1, gamma=0.5)])
    assert cpu.param_groups[0]["lr"] is prepared.lr_pairs[0].tensor  # on the CPU the user's tensor is the device's
    mine = torch.tensor(1e-3)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))], lr=mine)
    prepared = prepare_for_capture(opt)
    prepared.lr_pairs[0].source = mine  # as on a GPU: the graph's tensor is a copy of the user's
    prepared.lr_pairs[0].tensor = opt.param_groups[0]["lr"] = torch.tensor(1e-3)
    opt.param_groups[0]["lr"].fill_(2.5e-4)  # a scheduler's fill
    prepared.restore()
    assert opt.param_groups[0]["lr"] is mine and float(mine) == pytest.approx(2.5e-4)


def test_baked_compares_every_hyperparameter_a_tensor_elsewhere_by_its_version():
    """A tensor hyperparameter on the parameters' device is read by each replay (followed); one
    elsewhere (a CPU tensor beside "meta" parameters) was read once, at capture: an in-place
    change, a replaced tensor and a changed number are each named."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2, device="meta"))], lr=0.1, momentum=0.9)
    opt.param_groups[0]["scale"] = host = torch.tensor(1.0)
    opt.param_groups[0]["pair"] = (torch.tensor(0.9, device="meta"), 0.999)
    baked = Baked(opt)
    assert baked.changed() is None
    opt.param_groups[0]["pair"][0].fill_(0.8)  # on the device: the graph reads it
    assert baked.changed() is None
    host.fill_(2.0)
    assert "param group 0's scale (a tensor on cpu that the graph read once, at capture)" in baked.changed()
    baked = Baked(opt)
    opt.param_groups[0]["scale"] = torch.tensor(2.0)
    assert baked.changed() == "param group 0's scale (a tensor) was replaced by Tensor"
    baked = Baked(opt)
    opt.param_groups[0]["nesterov"] = True
    assert baked.changed() == "param group 0's nesterov (False when captured, True now)"


def test_a_batch_is_keyed_by_its_names_and_leaves_and_copied_into_its_buffers_by_name():
    x, y = torch.zeros(2, 3), torch.ones(2, 3)
    assert batch_key({"a": x, "b": y}) == batch_key({"a": y, "b": x})
    assert batch_key({"a": x, "b": y}) != batch_key({"b": y, "a": x})  # another order: another path
    assert batch_key({"task": "cls", "x": x}) != batch_key({"task": "reg", "x": x})
    assert batch_key([x, 1]) != batch_key([x, True]) and batch_key([x, [1, 2]]) == batch_key([x, [1, 2]])
    static = {"a": torch.zeros(2), "b": torch.zeros(2)}
    copy_into(static, {"b": torch.full((2,), 2.0), "a": torch.ones(2)})
    assert static["a"].tolist() == [1.0, 1.0] and static["b"].tolist() == [2.0, 2.0]


class _Counting(torch.nn.Module):
    """A Python counter its forward updates: a new state every step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = BENCH._mlp(WIDTH)
        self.seen = 0

    def forward(self, x):
        self.seen += 1
        return self.net(x)


@pytest.mark.filterwarnings("ignore")
def test_a_state_that_changes_every_step_steps_down_naming_it(standin):
    """Each new state gets a graph, up to MAX_GRAPHS: past them the whole step is given up with
    the change named (a replayed step would not count), and the run trains as eager."""
    runs = []
    for spec in ("none", "cuda_graph"):
        torch.manual_seed(0)
        model = _Counting()
        loop = FastLoop(
            model,
            _adamw(model.parameters()),
            _loader(),
            loss_fn=torch.nn.functional.cross_entropy,
            speedups=spec,
            device="cpu",
        )
        runs.append((model, loop.train(steps=STEPS)))
    (eager, _), (graphed, res) = runs
    why = res.extra["cuda_graph_why_not_whole"]
    assert "seen" in why and f"more than the {MAX_GRAPHS} graphs kept" in why, why
    assert graphed.seen == eager.seen == STEPS
    assert _max_rel_diff(eager, graphed) <= 1e-5


@pytest.mark.filterwarnings("ignore")
def test_a_draw_in_a_branch_only_a_later_key_takes_ends_the_whole_step_at_its_first_step(standin):
    """The first graph's key was checked; a key first seen later is watched in its first (eager)
    step: there the regression branch draws from a generator in the step's closure, and the whole
    step is given up before that key is captured (its replays would keep the first draw)."""
    rng = np.random.default_rng(0)

    def step(m, batch):
        out = m(batch["x"])
        if batch["task"] == "cls":
            return torch.nn.functional.cross_entropy(out, batch["y"].long())
        return torch.nn.functional.mse_loss(out[:, 0] * float(rng.uniform(0.5, 1.5)), batch["y"])

    g = torch.Generator().manual_seed(1)
    batches = [BENCH._multitask(WIDTH, k, g) for k in (0, 0, 0, 0, 0, 1, 0, 1, 1, 1)]
    model = _model()
    loop = FastLoop(model, _adamw(model.parameters()), batches, step_fn=step, speedups="cuda_graph", device="cpu")
    res = loop.train(steps=10)
    why = res.extra["cuda_graph_why_not_whole"]
    assert why.startswith("the step draws random numbers on the host (step's rng (a numpy Generator))"), why
    assert "step 5, a new batch key or state" in why, why
    assert loop.graphed.engine.replays == 1  # the cls key, captured at step 3, replayed at step 4


def test_host_draws_finds_the_generators_a_step_can_reach():
    """Closures, the globals a function names, a module's attributes (and the items of a list or
    dict attribute), a CPU torch.Generator, random.Random: each found and named."""
    gen, rand = torch.Generator().manual_seed(0), random.Random(0)

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rngs = [np.random.default_rng(1)]

    def step(m, b):
        return gen, rand, _GLOBAL_RNG

    draws = HostDraws([Holder(), step])
    names = [n for n, _ in draws.generators()]
    assert names[:3] == ["torch's CPU generator", "Python's random", "numpy's global generator"]
    assert {"Holder.rngs[0]", "step's gen", "step's rand", f"{__name__}._GLOBAL_RNG"} <= set(names)
    snap = draws.snapshot()
    torch.rand(1, generator=gen)
    rand.random()
    assert draws.changed(snap) == "step's gen (a CPU torch.Generator), step's rand (a random.Random)"


_GLOBAL_RNG = np.random.default_rng(2)
