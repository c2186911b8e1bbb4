"""The ladder: find the fastest *measured* configuration for a model it has never seen.

This module runs the ladder's comparisons and writes its document; the search that decides what
to compare is :mod:`fastloop.drivers.ladder_search` (the default, ``mode="select"``: bottleneck first,
the feed, the compute stack as one bundle and its ablation, the feed again) or
:mod:`fastloop.drivers.ladder_sequential` (``"sequential"``: one rung at a time on top of the best so far;
``"cumulative"``: every rung on top of all before it).

Each comparison interleaves the two configurations in fresh processes, starts with 3 runs a side
(the best configuration's runs so far count again), stops when the answer is clear (kept,
slower, or at most 1% faster: ``MIN_GAIN``; a candidate whose first run is clearly slower than
the best's runs is dropped after that run: ``EARLY_DROP``) and otherwise adds runs up to
``max_repeats`` while the runs and the final comparison fit the ``budget``. Each look uses a
stricter interval (Bonferroni over the looks). A feed speedup is not measured when a faster feed
could gain at most 2% (``ladder_gates.FEED_BUSY``, ``FEED_WAIT``: the GPU busy >= 95% of the step with <= 2%
data wait, or <= 2% of the step waiting and getting batches on the host). Before the last rung, the pick
is checked against the baseline step by step (:mod:`fastloop.drivers.pick_check`; its predicted cost is
kept in the budget from the start): a pick whose losses part falls back. The last rung measures the
selected set against the baseline, interleaved (cut by the budget: all their runs, pooled); the callbacks line names it.

Example:
    >>> default_rungs("cpu")[:3]
    ['workers', 'pad_buckets', 'bf16']
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from fastloop.drivers.ladder_report import join_specs
from fastloop.drivers.ladder_search import StagedSearch
from fastloop.drivers.ladder_sequential import run_sequential, select_order
from fastloop.drivers.ladder_state import MIN_REPEATS, LadderState
from fastloop.drivers.subproc import run_in_subprocess
from fastloop.drivers.targets import recipe_rungs
from fastloop.errors import FastloopError
from fastloop.speedups.base import Context, default_ladder, resolve

__all__ = ["DEFAULT_RUNGS", "default_budget", "default_measure_s", "default_rungs", "run_ladder", "select_order"]

DEFAULT_RUNGS = default_ladder()
"""The registered speedups marked ``in_default_ladder``, in ladder order."""
MODES = ("select", "sequential", "cumulative")
MEASURE_S = {"cuda": 2.0, "cpu": 1.0}
"""Seconds of steady steps each ladder run measures (on a GPU a 16 ms step: ~125 steps, not 30;
on a CPU, whose steps are slow anyway, 1 s keeps the README's main job within 90 s)."""
BUDGET_S = {"cuda": 300.0, "cpu": 80.0}
"""The default budget of a whole ladder: 5 minutes on a GPU; on a CPU the README's main job."""


def default_measure_s(device: str) -> float:
    """Seconds of steady steps a ladder run measures by default on ``device``."""
    return MEASURE_S.get(device, MEASURE_S["cuda"])


def default_budget(device: str) -> float:
    """Seconds the whole ladder may take by default on ``device``."""
    return BUDGET_S.get(device, BUDGET_S["cuda"])


def default_rungs(device: str, target: str | None = None) -> list[str]:
    """The default ladder for a device (and recipe): rungs that cannot apply there are left out."""

    ctx = Context(torch.device(device))
    own, extra = recipe_rungs(target)
    names = own or DEFAULT_RUNGS + extra
    return [s.name for s in resolve(names) if s.why_not(ctx) is None]


def run_ladder(
    target: str,
    rungs: list[str] | None = None,
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
    base: str | list[str] | None = None,
    measure_s: float | None | str = "auto",
) -> dict:
    """Run the ladder; returns its document (without the env stamp).

    ``mode``: ``"select"`` (the default) is the staged search of :mod:`fastloop.drivers.ladder_search`;
    ``"sequential"`` tries one rung at a time on top of the best so far; ``"cumulative"`` adds
    every rung on top of all before it.

    ``measure_s``: each run (a fresh process, unless ``measure`` is given) measures a window of
    this many seconds of steady steps (at least 10 steps), however short or long the step
    (``fastloop run --measure-s``); ``"auto"``: :func:`default_measure_s`; None measures ``steps``. ``budget``: seconds for the
    whole ladder (None: :func:`default_budget` of the device).

    ``base``: speedups every configuration has (the baseline is that set; the candidates are
    tried on top of it). ``on_update(doc)`` is called after every run with the document so far. On Ctrl-C the
    document of what finished is returned with ``"interrupted": True``.
    """
    if mode not in MODES:
        raise FastloopError(f"ladder mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(max_repeats, int) or max_repeats < MIN_REPEATS:
        raise FastloopError(f"--max-repeats must be an integer >= {MIN_REPEATS}, got {max_repeats!r}")
    base_names = [s.spec for s in resolve(base or [])]
    chosen = resolve(rungs if rungs is not None else default_rungs(device, target))
    if rungs is None and mode == "sequential":
        # feed the fast step: data speedups are tried once the step is as fast as the others make
        # it (a loader that keeps up with an fp32 step may be the wall after compile)
        chosen = select_order(chosen, set(recipe_rungs(target)[1]))
    taken = {s.name for s in resolve(base or [])}
    if rungs is None:
        chosen = [s for s in chosen if s.name not in taken]
    clash = [s.name for s in chosen if s.name in taken]
    if clash:
        raise FastloopError(
            f"rung(s) {', '.join(clash)} are already in --base {join_specs(base_names)}: "
            "a rung is tried on top of the base, so list each speedup in one of them"
        )
    resolve(base_names + [s.spec for s in chosen])  # conflicting pairs across base and rungs fail here
    if measure_s == "auto":
        measure_s = default_measure_s(device)
    if measure is None:
        measure = functools.partial(run_in_subprocess, measure_s=measure_s) if measure_s else run_in_subprocess
    if budget is None:
        budget = default_budget(device)
    ladder = LadderState(
        target,
        steps=steps,
        warmup=warmup,
        device=device,
        measure=measure,
        progress=progress,
        on_update=on_update,
        max_repeats=max_repeats,
        budget=budget,
        mode=mode,
        base=base_names,
    )
    ladder.measure_s = measure_s if isinstance(measure_s, (int, float)) else None
    try:
        if mode != "select":
            return run_sequential(ladder, chosen)
        # the default search: bottleneck first, the feed, the compute bundle and its ablation, the feed again
        StagedSearch(ladder).run(chosen, Context(torch.device(device)))
        return ladder.finish()
    except KeyboardInterrupt:
        ladder.interrupted = True
        doc = ladder.document()
        doc["interrupted"] = True
        return doc
