"""``run_ladder``: the ladder's entry. It checks its inputs, parses the speedups once into speedup
objects, gives a :class:`~fastloop.drivers.ladder.state.LadderState` its budget, runs the search
the mode names on it, and ends with the state's :meth:`~fastloop.drivers.ladder.state.LadderState.finish`.
Aimed at the fit (``objective="fit"``), the fit's short fits come around the search
(:class:`~fastloop.drivers.ladder.fit_objective.FitObjective`: the plain one before it, the fit
speedups' after it, the prediction after the final comparison).

Example:
    >>> default_rungs("cpu")[:3]
    ['workers', 'pad_buckets', 'bf16']
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from fastloop.drivers.ladder.budget import Budget
from fastloop.drivers.ladder.candidates import fit_phase_of, join_specs, select_order, split_fit
from fastloop.drivers.ladder.fit_objective import Fit, FitObjective
from fastloop.drivers.ladder.search import Search, StagedSearch
from fastloop.drivers.ladder.sequential import SequentialSearch
from fastloop.drivers.ladder.state import MIN_REPEATS, LadderState
from fastloop.drivers.subproc import run_in_subprocess
from fastloop.drivers.targets import recipe_rungs
from fastloop.errors import FastloopError
from fastloop.speedups.base import REGISTRY, Context, Speedup, resolve, speedup_names

__all__ = [
    "DEFAULT_RUNGS",
    "MODES",
    "OBJECTIVES",
    "default_ladder",
    "default_budget",
    "default_measure_s",
    "default_rungs",
    "run_ladder",
]


def default_ladder() -> list[str]:
    """The default ladder's rungs, in order: the registered speedups whose ladder traits say
    ``in_default`` (:class:`~fastloop.speedups.ladder_traits.LadderTraits`).

    Example:
        >>> default_ladder()[:2]
        ['gpu_augment', 'gpu_resident']
    """
    return [n for n in speedup_names() if REGISTRY[n].ladder.in_default]


DEFAULT_RUNGS = default_ladder()
"""The registered speedups marked ``in_default``, in ladder order."""
SEARCHES: dict[str, Callable[[], Search]] = {
    "select": StagedSearch,
    "sequential": SequentialSearch,
    "cumulative": SequentialSearch,
}
"""The search each mode runs (the cumulative ladder is the sequential search keeping every rung)."""
MODES = tuple(SEARCHES)
MEASURE_S = {"cuda": 2.0, "cpu": 1.0}
"""Seconds of steady steps each ladder run measures (on a GPU a 16 ms step: ~125 steps, not 30;
on a CPU, whose steps are slow anyway, 1 s keeps the README's main job within 90 s)."""
BUDGET_S = {"cuda": 300.0, "cpu": 80.0}
"""The default budget of a whole ladder: 5 minutes on a GPU; on a CPU the README's main job."""


def default_measure_s(device: str) -> float:
    """Seconds of steady steps a ladder run measures by default on ``device``.

    Example:
        >>> default_measure_s("cpu"), default_measure_s("cuda")
        (1.0, 2.0)
    """
    return MEASURE_S.get(device, MEASURE_S["cuda"])


def default_budget(device: str) -> float:
    """Seconds the whole ladder may take by default on ``device``.

    Example:
        >>> default_budget("cpu")
        80.0
    """
    return BUDGET_S.get(device, BUDGET_S["cuda"])


OBJECTIVES = ("step", "fit")
"""What the ladder makes fast: the training step, or the whole fit (:mod:`~fastloop.drivers.ladder.fit_objective`)."""


def _default_speedups(device: str, target: str | None, objective: str = "step") -> list[Speedup]:
    ctx = Context(torch.device(device))
    own, extra = recipe_rungs(target)
    # the fit's own speedups, by their trait: a new one is a rung of the fit objective once registered
    fit = [n for n in speedup_names() if fit_phase_of(REGISTRY[n]) is not None] if objective == "fit" else []
    names = own or DEFAULT_RUNGS + extra
    return [s for s in resolve(names + [n for n in fit if n not in names]) if s.why_not(ctx) is None]


def default_rungs(device: str, target: str | None = None, objective: str = "step") -> list[str]:
    """The default ladder for a device (and recipe): rungs that cannot apply there are left out.

    Args:
        device: ``cpu`` or ``cuda``.
        target: a recipe's short name, whose own rungs (or extra rungs) count; None for any other.
        objective: ``step``, or ``fit``: the fit speedups (those with a ``fit_phase``) are rungs too.

    Returns:
        The rungs' names, in ladder order.

    Example:
        >>> sorted(set(default_rungs("cpu", objective="fit")) - set(default_rungs("cpu")))
        ['async_checkpoint', 'deferred_logging']
    """
    return [s.name for s in _default_speedups(device, target, objective)]


def _candidates(
    device: str,
    target: str,
    rungs: list[str] | list[Speedup] | str | None,
    base: list[Speedup],
    mode: str,
    objective: str = "step",
) -> list[Speedup]:
    """The speedups to try, parsed once: ``rungs`` (or the default ladder, less what ``base`` has);
    a rung that is also in the base, or a pair across them that conflicts, is bad input."""
    chosen = resolve(rungs) if rungs is not None else _default_speedups(device, target, objective)
    if rungs is None and mode == "sequential":
        # feed the fast step: data speedups are tried once the step is as fast as the others make
        # it (a loader that keeps up with an fp32 step may be the wall after compile)
        chosen = select_order(chosen, set(recipe_rungs(target)[1]))
    taken = {s.name for s in base}
    if rungs is None:
        chosen = [s for s in chosen if s.name not in taken]
    clash = [s.name for s in chosen if s.name in taken]
    if clash:
        raise FastloopError(
            f"rung(s) {', '.join(clash)} are already in --base {join_specs([s.spec for s in base])}: "
            "a rung is tried on top of the base, so list each speedup in one of them"
        )
    resolve(base + chosen)  # conflicting pairs across base and rungs fail here
    return chosen


def run_ladder(
    target: str,
    rungs: list[str] | list[Speedup] | None = None,
    *,
    steps: int = 30,
    warmup: int = 5,
    max_repeats: int = 6,
    budget: float | None = None,
    mode: str = "select",
    device: str = "cpu",
    measure: Callable[..., dict] | None = None,
    progress: Callable[[str], None] | None = None,
    on_update: Callable[[dict], None] | None = None,
    base: str | list[str] | list[Speedup] | None = None,
    measure_s: float | None | str = "auto",
    objective: str = "step",
    fit: Fit | None = None,
) -> dict:
    """Run the ladder: keep what measurably helps ``target``, each step a measured comparison.

    Args:
        target: the model to speed up (``FILE.py:FUNCTION``, ``package.module:FUNCTION`` or a recipe).
        rungs: the speedups to try (names, specs or speedup objects); None: the default ladder.
        steps: measured steps of each run where ``measure_s`` is None; ``warmup``: steps before.
        max_repeats: the most runs a side of one comparison (at least 3).
        budget: seconds for the whole ladder (None: :func:`default_budget` of the device).
        mode: ``"select"`` (the default) is the staged search
            (:class:`~fastloop.drivers.ladder.search.StagedSearch`); ``"sequential"`` tries one
            rung at a time on top of the best so far; ``"cumulative"`` adds every rung on top of
            all before it.
        device: ``cpu`` or ``cuda``.
        measure: runs one configuration and returns its document (default: a fresh process).
        progress: told what runs now; ``on_update(doc)``: called after every run with the
            document so far.
        base: speedups every configuration has (the baseline is that set; the candidates are
            tried on top of it).
        measure_s: each run (a fresh process, unless ``measure`` is given) measures a window of
            this many seconds of steady steps (at least 10 steps), however short or long the step
            (``fastloop run --measure-s``); ``"auto"``: :func:`default_measure_s`; None measures
            ``steps``.
        objective: ``"step"`` (the default) makes the training step fast; ``"fit"`` the whole fit:
            short fits measure its phases, the fit speedups are rungs measured on them, and the
            document's ``fit`` section predicts the fit's time plain vs pick beside the step's
            (:mod:`~fastloop.drivers.ladder.fit_objective`).
        fit: with ``objective="fit"``, runs one fit and returns its document (default: a fresh process).

    Returns:
        The ladder's document (without the env stamp); on Ctrl-C the document of what finished,
        with ``"interrupted": True``.
    """
    if mode not in MODES:
        raise FastloopError(f"ladder mode must be one of {', '.join(MODES)}, got {mode!r}")
    if objective not in OBJECTIVES:
        raise FastloopError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if not isinstance(max_repeats, int) or max_repeats < MIN_REPEATS:
        raise FastloopError(f"--max-repeats must be an integer >= {MIN_REPEATS}, got {max_repeats!r}")
    base_speedups = resolve(base or [])
    chosen = _candidates(device, target, rungs, base_speedups, mode, objective)
    fit_rungs: list[Speedup] = []
    if objective == "fit":  # the fit speedups are measured on short fits, the rest on the step
        chosen, fit_rungs = split_fit(chosen)
    if measure_s == "auto":
        measure_s = default_measure_s(device)
    if measure is None:
        measure = functools.partial(run_in_subprocess, measure_s=measure_s) if measure_s else run_in_subprocess
    state = LadderState(
        target,
        steps=steps,
        warmup=warmup,
        device=device,
        measure=measure,
        budget=Budget(budget if budget is not None else default_budget(device)),
        max_repeats=max_repeats,
        mode=mode,
        base=[s.spec for s in base_speedups],
        measure_s=measure_s if isinstance(measure_s, (int, float)) else None,
        progress=progress,
        on_update=on_update,
        objective=objective,
    )
    ctx = Context(torch.device(device))
    aim = FitObjective(state, fit_rungs, ctx, step_candidates=len(chosen), fit=fit) if objective == "fit" else None
    try:
        if aim is not None:
            aim.start()
        SEARCHES[mode]().run(state, chosen, ctx)
        if aim is None:
            return state.finish()
        aim.measure_rungs()
        state.record_fit(aim.section(state.finish()))
        return state.document()
    except KeyboardInterrupt:
        return state.interrupt()
