"""The check of a pick: does the faster configuration train what the baseline trains?

A short paired run of each (:mod:`fastloop.drivers.paired_run`): a fresh process a side, as the
ladder's runs (TF32 switches, compile caches and allocator state must not leak from one to the
other), every generator seeded before the target is built, so both start from the same weights
and see the same batches in the same order, and compiled code draws its random numbers as eager
does. Their per-step losses must agree within a tolerance derived from what the pick changes,
each speedup's :attr:`~fastloop.speedups.base.Speedup.trains`:

- ``exact`` (a feed, pinned memory, the data on the GPU): the same arithmetic on the same batches,
  so the losses are bit-identical (tolerance 0);
- ``reordered`` (compile, CUDA graphs, channels_last, a fused optimizer): fp32 sums in another order.
  One step's loss moves by ~1e-7; training carries it on, and 200 steps of a convolution net in
  channels_last moved it by ~1e-4 on a CPU (``tests/test_pick_check.py`` measures it):
  :data:`REORDERED_TOL`, ten times that;
- ``band`` (bf16, fp16, TF32, fp8, the padding to buckets): the math rounded coarser, by the
  speedup's :meth:`~fastloop.speedups.base.Speedup.band` (a precision's machine epsilon: bf16's
  2^-7). 200 steps in bf16 autocast moved a small net's loss by at most 0.56 of that epsilon:
  :data:`BAND_FACTOR` times the epsilon (bf16: 1.6%);
- ``own_draws`` (GPU augmentation, DALI) and ``workload`` (the batch size): no run without them
  sees the same batches, so they are on both sides, and the check compares the rest. A feed that
  reads the dataset in worker processes (``reads_in_workers``) joins them when the dataset draws
  its augmentation from the global generators (each worker is seeded apart): its reads are then
  not the main process's. A dataset with a state of its own (a cursor that ignores the index, a
  generator it holds) is compared as it is: workers copying that state is a change in what trains.

A loss is measured against the baseline's at the same step, relative to that loss (floored at
:data:`SCALE_FLOOR` of the first loss, so a loss near zero does not make every rounding huge). The
first step past the tolerance is where the losses part. Before a speedup is blamed, the baseline
runs again: a baseline that does not reproduce itself (nondeterministic kernels) widens the
tolerance to :data:`FLOOR_FACTOR` times its own spread. Then the members are taken out one at a
time, the cheapest run first, until the losses agree: that speedup is named.

Example:
    >>> tolerance_for(["workers", "bf16"]).rel
    0.015625
    >>> compare_losses([2.0, 1.5, 1.2], [2.0, 1.5, 1.3], 0.01)["first_parting_step"]
    2
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastloop.speedups.base import REGISTRY, Speedup, resolve

__all__ = [
    "BAND_FACTOR",
    "FLOOR_FACTOR",
    "MAX_STEPS",
    "MIN_STEPS",
    "REORDERED_TOL",
    "SCALE_FLOOR",
    "PickCheck",
    "Tolerance",
    "check_ladder_pick",
    "NOT_FINITE_DEVIATION",
    "compare_losses",
    "predicted_check_s",
    "tolerance_for",
]

MIN_STEPS, MAX_STEPS = 50, 200
"""The paired runs train this many steps: at least 50 (a frozen schedule or a reordered sample
shows within them), at most 200 (more is a fit's question: ``ab --fit`` compares outcomes)."""
REORDERED_TOL = 1e-3
"""Relative loss tolerance for fp32 math summed in another order (ten times what 200 steps of
channels_last convolutions moved a loss by on a CPU)."""
BAND_FACTOR = 2.0
"""A coarser rounding's tolerance in units of its epsilon (200 bf16 steps moved a loss by at most
0.56 of bf16's epsilon)."""
SCALE_FLOOR = 0.1
"""A step's deviation is relative to the baseline's loss there, floored at this share of the first
loss (a loss near zero is not a scale)."""
FLOOR_FACTOR = 10.0
"""A baseline that does not reproduce itself widens the tolerance to this many times its spread."""
SEED = 0
"""The seed of every paired run."""
ON_BOTH_SIDES = {
    "own_draws": "its random draws are its own (augmentation on its own generator, another decoder): "
    "no run without it sees the same batches",
    "workload": "it changes the batches themselves (their size): no run without it sees the same batches",
}
"""Why a member of these kinds is on both sides of the check."""
SEEDED_APART = (
    "the dataset draws its per-sample randomness from the global generators, which each worker process seeds "
    "apart: its reads are not the main process's"
)


@dataclass(frozen=True)
class Tolerance:
    """How far the pick's per-step losses may be from the baseline's (relative, see the module)."""

    rel: float
    kind: str
    """``exact``, ``reordered`` or ``band``: the largest effect among the members."""
    basis: str
    """Why this tolerance, in a sentence."""
    members: dict[str, str] = field(default_factory=dict)
    """Each compared member's spec and what it changes."""

    def to_dict(self) -> dict:
        return {"rel": self.rel, "kind": self.kind, "basis": self.basis, "members": dict(self.members)}


def _member_tolerance(s: Speedup) -> tuple[float, str, str]:
    """(tolerance, kind, what it changes) of one speedup from its ``trains`` trait."""
    if s.trains == "reordered":
        return REORDERED_TOL, "reordered", f"fp32 sums in another order: {REORDERED_TOL:g}"
    if s.trains == "band":
        eps = s.band() or 0.0
        tol = max(REORDERED_TOL, BAND_FACTOR * eps)
        power = math.log2(eps) if eps > 0 else 0.5
        shown = f"2^{int(power)}" if power.is_integer() else f"{eps:.3g}"
        floor = f", at least reordering's {REORDERED_TOL:g}" if BAND_FACTOR * eps < REORDERED_TOL else ""
        return tol, "band", f"rounds its math by up to {shown}: {BAND_FACTOR:g} x {shown}{floor} = {tol:.3g}"
    return 0.0, "exact", "the same arithmetic on the same batches: bit-identical"


def tolerance_for(specs: list[str] | str) -> Tolerance:
    """The tolerance of a pick whose members (not in the baseline) are ``specs``: the largest of
    theirs (the coarsest rounding dominates a step's loss).

    Example:
        >>> t = tolerance_for("workers,compile")
        >>> t.rel, t.kind, t.members["workers"][:5]
        (0.001, 'reordered', 'exact')
        >>> tolerance_for([]).basis
        'nothing differs from the baseline: bit-identical losses'
    """
    members = resolve(specs)
    per = {s.spec: _member_tolerance(s) for s in members}
    if not per:
        return Tolerance(0.0, "exact", "nothing differs from the baseline: bit-identical losses")
    top = max(per, key=lambda k: per[k][0])
    rel, kind, _ = per[top]
    if kind == "exact":
        verb = "changes" if len(per) == 1 else "change"
        basis = f"exact: {', '.join(per)} {verb} no arithmetic, so every step's loss is bit-identical"
    elif kind == "reordered":
        basis = f"{rel:g} of the loss: {top} sums fp32 in another order (exact members add nothing)"
    else:
        basis = f"{rel:.3g} of the loss: {top} {per[top][2]} (the coarsest rounding among the members)"
    return Tolerance(rel, kind, basis, {k: f"{v[1]}: {v[2]}" for k, v in per.items()})


def _deviation(a: Any, b: Any, scale: float) -> float | None:
    """One step's relative deviation; None where neither side has a finite loss (not compared)."""
    fa = a is not None and math.isfinite(a)
    fb = b is not None and math.isfinite(b)
    if not fa and not fb:
        return None
    if fa != fb:  # one side has a loss and the other none, or not finite: they part here
        return math.inf
    return abs(b - a) / max(abs(a), scale)


NOT_FINITE_DEVIATION = "one side's loss was missing or not finite (NaN/inf) where the other's was finite"
"""Why ``max_deviation`` is null: the sides part at a step where only one has a finite loss."""


def compare_losses(a: list, b: list, tol: float) -> dict:
    """Per-step losses of the baseline (``a``) and the pick (``b``) against ``tol``: the steps
    compared, the largest deviation and its step, the first step past ``tol`` (None: they agree)
    and whether they agree.

    Example:
        >>> d = compare_losses([1.0, 0.5, 0.25], [1.0, 0.5, 0.25], 0.0)
        >>> d["passed"], d["max_deviation"], d["first_parting_step"]
        (True, 0.0, None)
    """
    n = min(len(a or []), len(b or []))
    first = next((x for x in (a or []) if x is not None and math.isfinite(x)), None)
    scale = max(SCALE_FLOOR * abs(first), 1e-12) if first is not None else 1e-12
    devs = [_deviation(a[i], b[i], scale) for i in range(n)]
    compared = [(i, d) for i, d in enumerate(devs) if d is not None]
    worst = max(compared, key=lambda x: x[1]) if compared else (None, None)
    parting = next((i for i, d in compared if d > tol), None)
    out = {
        "steps": len(compared),
        "max_deviation": worst[1],
        "max_deviation_step": worst[0],
        "first_parting_step": parting,
        "passed": bool(compared) and parting is None,
    }
    if worst[1] is not None and not math.isfinite(worst[1]):  # strict JSON: null, and why
        out["max_deviation"] = None
        out["max_deviation_why"] = NOT_FINITE_DEVIATION
    return out


def first_difference(a: list | None, b: list | None) -> int | None:
    """The first step whose batch digests differ (None: the same batches, or not recorded)."""
    if not a or not b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def _spec(members: list[Speedup]) -> str:
    return ",".join(s.spec for s in resolve(members)) or "none"


def _names(members: list[Speedup]) -> set[str]:
    return {s.name for s in members}


class PickCheck:
    """The check of one pick against its baseline, its runs made through ``measure`` (the
    ladder's or A/B's: ``measure(target, spec, steps=, warmup=, device=, seed=, ...)``, a fresh
    process each).

    Args:
        target: the target both sides train.
        measure: runs one configuration and returns its document (with ``losses`` and ``paired``).
        device: the device the runs train on.
        steps: steps each paired run trains (:data:`MIN_STEPS` to :data:`MAX_STEPS`).
        fits: whether one more run of a configuration fits the caller's budget (None: always).
        cost: the predicted seconds of a run of a configuration, to take the cheapest first.
        fallback: name the configuration to fall back to when the losses part (the ladder's; an
            A/B only reports).
    """

    def __init__(
        self,
        target: str,
        measure: Callable[..., dict],
        *,
        device: str,
        steps: int,
        fits: Callable[[str], bool] | None = None,
        cost: Callable[[str], float] | None = None,
        fallback: bool = True,
    ) -> None:
        self.target, self.measure, self.device, self.steps = target, measure, device, steps
        self.fallback = fallback
        self.fits = fits or (lambda spec: True)
        self.cost = cost
        self.runs: list[dict] = []
        """Each paired run: its side, configuration and seconds."""

    def _run(self, side: str, spec: str) -> dict:
        """One paired run; a failed one is returned as ``{"failed": reason}``."""
        t = time.perf_counter()
        try:
            doc = self.measure(
                self.target,
                spec,
                steps=self.steps,
                warmup=0,
                device=self.device,
                seed=SEED,
                measure_s=None,
                profile=False,
            )
        except KeyboardInterrupt:
            raise
        except Exception as err:  # noqa: BLE001 - a run's failure is reported, not raised: the check says why
            doc = {"failed": str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}
        self.runs.append({"side": side, "spec": spec, "s": round(time.perf_counter() - t, 2)})
        return doc if isinstance(doc, dict) else {"failed": "the run returned no document"}

    def run(self, base: str | list[str], pick: str | list[str]) -> dict:
        """Check ``pick`` against ``base``; returns the document's ``"check"`` section."""
        t0 = time.perf_counter()
        base_m, pick_m = resolve(base), resolve(pick)
        out: dict = {"baseline_spec": _spec(base_m), "pick_spec": _spec(pick_m), "seed": SEED, "passed": None}
        if not self.fallback:
            out["ab"] = True  # an A/B's check: it reports, nothing falls back
        added = [s for s in pick_m if s.name not in _names(base_m)]
        removed = [s for s in base_m if s.name not in _names(pick_m)]  # A/B: what A has and B not
        both = {s.spec: ON_BOTH_SIDES[s.trains] for s in added + removed if s.trains in ON_BOTH_SIDES}
        sides = {
            "base": base_m + [s for s in added if s.spec in both],
            "pick": pick_m + [s for s in removed if s.spec in both],
        }
        a = self._run("baseline", _spec(sides["base"]))
        reads = (a.get("paired") or {}).get("dataset_reads")
        apart = [s for s in added + removed if s.reads_in_workers and reads == "global_draws" and s.spec not in both]
        both.update({s.spec: SEEDED_APART for s in apart})
        sides["pick"] += [s for s in removed if s in apart]
        if any(s in apart for s in added) and not a.get("failed"):  # the baseline side reads in workers too
            sides["base"] += [s for s in added if s in apart]
            a = self._run("baseline", _spec(sides["base"]))
        compared = [s for s in added + removed if s.spec not in both]
        tol = tolerance_for([s.spec for s in compared])
        out.update(
            on_both_sides=[{"spec": k, "why": v} for k, v in both.items()],
            compared={"baseline": _spec(sides["base"]), "pick": _spec(sides["pick"])},
            steps=self.steps,
            tolerance=tol.to_dict(),
        )
        why_not = self._why_not_checked(a, None, compared)
        b = self._run("pick", _spec(sides["pick"])) if why_not is None else {}
        why_not = why_not or self._why_not_checked(a, b, compared)
        if why_not is not None:
            out["not_checked"] = why_not
        else:
            self._judge(out, a, b, sides, [s for s in compared if s in added], compared, tol)
        out["runs"] = list(self.runs)
        out["seconds"] = round(time.perf_counter() - t0, 2)
        out["verdict"] = verdict(out)
        return out

    def _why_not_checked(self, a: dict, b: dict | None, compared: list[Speedup]) -> str | None:
        """Why the two runs cannot be compared step by step (None: they can)."""
        for side, doc in (("baseline", a), ("pick", b)):
            if doc is None:
                continue
            if doc.get("failed"):
                return f"the {side}'s paired run failed: {doc['failed']}"
            if not isinstance(doc.get("losses"), list):
                return f"the {side}'s run recorded no per-step losses"
        if not compared:
            return "every member of the pick is on both sides: nothing is compared step by step"
        if b is None:
            return None
        wa, wb = ((d.get("paired") or {}).get("initial_weights_digest") for d in (a, b))
        if wa and wb and wa != wb:
            return (
                "the two runs did not start from the same weights under one seed (the target's build draws "
                "from something else: the time, a file, its own unseeded generator)"
            )
        ia, ib = a.get("items_per_step"), b.get("items_per_step")
        if ia and ib and ia != ib:
            return f"the pick's steps hold {ib} items and the baseline's {ia}: their losses are over other batches"
        return None

    def _judge(
        self, out: dict, a: dict, b: dict, sides: dict, candidates: list, compared: list, tol: Tolerance
    ) -> None:
        """Compare, re-run the baseline before blaming a speedup, then find the one to blame."""
        cmp = compare_losses(a["losses"], b["losses"], tol.rel)
        out.update(cmp)
        out["batches"] = _batches(a, b, compared)
        if cmp["passed"]:
            out["passed"] = True
            return
        spread = self._floor(out, a, _spec(sides["base"]))
        if spread:  # the baseline does not reproduce itself: the tolerance takes its spread in
            widened = max(tol.rel, FLOOR_FACTOR * spread)
            out["tolerance"].update(
                rel=widened,
                basis=out["tolerance"]["basis"] + f"; widened to {FLOOR_FACTOR:g} x the baseline's own spread "
                f"({spread:.3g}: it does not reproduce itself, nondeterministic kernels)",
            )
            out.update(compare_losses(a["losses"], b["losses"], widened))
            if out["passed"]:
                return
        out["passed"] = False
        self._bisect(out, a, sides["pick"], candidates, compared, spread)

    def _floor(self, out: dict, a: dict, spec: str) -> float:
        """The baseline run again: its own spread (0: it reproduces itself bit for bit)."""
        if not self.fits(spec):
            out["floor"] = {"measured": False, "why": "the budget left no run to repeat the baseline"}
            return 0.0
        again = self._run("baseline again", spec)
        if again.get("failed") or not isinstance(again.get("losses"), list):
            out["floor"] = {"measured": False, "why": f"the repeated baseline failed: {again.get('failed')}"}
            return 0.0
        again_cmp = compare_losses(a["losses"], again["losses"], 0.0)
        if again_cmp.get("max_deviation_why"):  # no finite spread to widen the tolerance by
            out["floor"] = {
                "measured": True,
                "max_deviation": None,
                "reproducible": False,
                "why": f"the repeated baseline: {again_cmp['max_deviation_why']}",
            }
            return 0.0
        spread = again_cmp["max_deviation"] or 0.0
        out["floor"] = {"measured": True, "max_deviation": spread, "reproducible": spread == 0.0}
        return spread

    def _bisect(self, out: dict, a: dict, pick_m: list, candidates: list, compared: list, spread: float) -> None:
        """Take the pick's own compared members (``candidates``) out one at a time, the cheapest run
        first, until the losses agree: that one is named (the culprit)."""
        out["bisect"], out["culprit"] = [], None
        if len(compared) == 1 and candidates:  # without it, the pick is the baseline side: it agrees with itself
            out["culprit"] = candidates[0].spec
        elif candidates:
            without = {s.spec: _spec([m for m in pick_m if m.name != s.name]) for s in candidates}
            order = sorted(candidates, key=lambda s: self.cost(without[s.spec]) if self.cost else 0.0)
            for s in order:
                if not self.fits(without[s.spec]):
                    out["bisect_note"] = f"not found within the budget (no run left for {without[s.spec]})"
                    break
                doc = self._run(f"without {s.spec}", without[s.spec])
                if doc.get("failed") or not isinstance(doc.get("losses"), list):
                    out["bisect"].append({"removed": s.spec, "spec": without[s.spec], "failed": doc.get("failed")})
                    continue
                rel = tolerance_for([m.spec for m in compared if m.name != s.name]).rel
                found = compare_losses(a["losses"], doc["losses"], max(rel, FLOOR_FACTOR * spread))
                out["bisect"].append({"removed": s.spec, "spec": without[s.spec], **found})
                if found["passed"]:
                    out["culprit"] = s.spec
                    break
            else:
                out["bisect_note"] = "no single speedup's removal closes the gap (two or more part it together)"
        else:
            out["bisect_note"] = "what parts them is the baseline's own speedup (the pick has none the baseline lacks)"
        culprit = out["culprit"]
        if self.fallback:
            out["fallback"] = _spec([m for m in pick_m if m.spec != culprit]) if culprit else out["baseline_spec"]


def _batches(a: dict, b: dict, compared: list[Speedup]) -> dict:
    """Whether the two runs' steps received the same batches (their digests)."""
    if any(REGISTRY[s.name].fixes_shapes for s in compared):
        return {"same": None, "note": "not compared: the pick pads the batches to other shapes"}
    da, db = ((d.get("paired") or {}).get("batch_digests") for d in (a, b))
    if not da or not db:
        return {"same": None, "note": "not recorded"}
    step = first_difference(da, db)
    return {"same": step is None, "first_difference": step}


def verdict(check: dict) -> str:
    """The check in one sentence, for the reports (an A/B's, ``"ab": True``, says A and B).

    Example:
        >>> verdict({"passed": True, "pick_spec": "workers:4", "steps": 60, "max_deviation": 0.0,
        ...          "tolerance": {"rel": 0.0, "basis": "exact"}})
        'passed: workers:4 trained as the baseline for 60 steps (largest deviation 0 of the loss; tolerance 0: exact)'
    """
    tol = check.get("tolerance") or {}
    if check.get("passed") is None:
        return f"not checked: {check.get('not_checked') or 'the check did not run'}"
    pick, base = (f"B ({check['pick_spec']})", "A") if check.get("ab") else (check["pick_spec"], "the baseline")
    if check["passed"]:
        return (
            f"passed: {pick} trained as {base} for {check['steps']} steps (largest deviation "
            f"{check['max_deviation']:.3g} of the loss; tolerance {tol.get('rel', 0):.3g}: {tol.get('basis')})"
        )
    step, dev = check.get("first_parting_step"), check.get("max_deviation")
    dev_text = f"{dev:.3g} of the loss" if isinstance(dev, (int, float)) else "not finite: " + NOT_FINITE_DEVIATION
    batches = check.get("batches") or {}
    seen = (
        f"; its batches differ from {base}'s from step {batches['first_difference']}"
        if batches.get("first_difference") is not None
        else "; the batches were the same, the step's arithmetic differs"
        if batches.get("same")
        else ""
    )
    who = (
        f"taking out {check['culprit']} closes the gap"
        if check.get("culprit")
        else check.get("bisect_note") or "no speedup found that closes the gap"
    )
    then = f"; falls back to {check['fallback']}" if check.get("fallback") else ""
    return (
        f"{'differs' if check.get('ab') else 'refused'}: {pick}'s losses part from {base}'s at step {step} "
        f"(largest deviation {dev_text} > tolerance {tol.get('rel', 0):.3g}: {tol.get('basis')}){seen}; "
        f"{who}{then}"
    )


# -- the ladder's check of its pick -------------------------------------------------------------


class LadderState(Protocol):
    """What the check reads of the ladder's state (:class:`fastloop.drivers.ladder.state.LadderState`),
    and the two changes it asks of it (:meth:`record_check`, :meth:`fall_back`)."""

    target: str
    device: str
    base_spec: str
    budget: Any
    """The ladder's :class:`~fastloop.drivers.ladder.budget.Budget`: ``limit_s``, ``elapsed()``, ``per_run_s(spec)``."""
    untimed_measure: Callable[..., dict]

    @property
    def selected(self) -> list[str]: ...
    @property
    def check(self) -> dict | None: ...
    def runs_of(self, spec: str) -> Any: ...
    def spec_with(self, extra: list[str] | None = None) -> str: ...
    def final_reserve_s(self) -> float: ...
    def say(self, text: str) -> None: ...
    def record_check(self, check: dict) -> None: ...
    def fall_back(self, kept: set[str]) -> None: ...


def _ladder_docs(L: LadderState, spec: str) -> list[dict]:
    runs = L.runs_of(spec)
    return list(runs.docs) if runs is not None else []


def can_check(L: LadderState) -> bool:
    """Whether the ladder's runs record per-step losses (what the check compares)."""
    docs = _ladder_docs(L, L.base_spec)
    return bool(docs) and isinstance(docs[-1].get("losses"), list)


def run_cost(L: LadderState, spec: str, steps: int) -> float:
    """Predicted seconds of a paired run of ``spec`` training ``steps`` steps: a ladder run's warm
    cost (the budget's prediction) with its own steps replaced by ``steps`` at its mean step."""
    per_run = L.budget.per_run_s(spec)
    docs = _ladder_docs(L, spec)
    mean = ((docs[-1].get("step_s") or {}).get("mean") if docs else None) or 0.0
    if not mean:
        return per_run
    trained = (docs[-1].get("steps") or 0) + (docs[-1].get("warmup_steps") or 0)
    return max(0.0, per_run - trained * mean) + steps * mean


def predicted_check_s(L: LadderState, steps: int = MIN_STEPS) -> float:
    """What the check of the ladder's current pick is predicted to cost: one paired run a side
    (what the budget reserves for it before the final comparison: at :data:`MIN_STEPS`)."""
    return run_cost(L, L.base_spec, steps) + run_cost(L, L.spec_with(), steps)


def check_steps(L: LadderState) -> int:
    """The paired runs' steps: as many as what the budget left after the search allows for one run
    a side (with the final comparison's reserve kept), from :data:`MIN_STEPS` to :data:`MAX_STEPS`."""
    if L.budget.limit_s is None:
        return MAX_STEPS
    fixed = run_cost(L, L.base_spec, 0) + run_cost(L, L.spec_with(), 0)
    per_step = (run_cost(L, L.base_spec, 1) + run_cost(L, L.spec_with(), 1)) - fixed
    left = L.budget.limit_s - L.budget.elapsed() - L.final_reserve_s() - fixed
    if per_step <= 0:
        return MIN_STEPS
    return int(min(MAX_STEPS, max(MIN_STEPS, left // per_step)))


def check_ladder_pick(L: LadderState) -> bool:
    """Before the ladder's final comparison: check its pick against the baseline (``L.check``);
    where the losses part, the pick falls back (the configuration without the speedup that parts
    them, else the baseline). Returns whether the selected set changed."""
    if L.check is not None or not L.selected:
        return False
    if not can_check(L):
        unchecked = {"passed": None, "not_checked": "the ladder's runs record no per-step losses"}
        L.record_check({**unchecked, "verdict": verdict(unchecked)})
        return False
    steps, predicted = check_steps(L), predicted_check_s(L)
    L.say(f"checking {L.spec_with()} against {L.base_spec}: {steps} paired steps a side")
    limit = L.budget.limit_s

    def fits(spec: str) -> bool:
        return limit is None or L.budget.elapsed() + run_cost(L, spec, steps) + L.final_reserve_s() <= limit

    check = PickCheck(
        L.target,
        L.untimed_measure,
        device=L.device,
        steps=steps,
        fits=fits,
        cost=lambda spec: run_cost(L, spec, steps),
    ).run(L.base_spec, L.spec_with())
    check["predicted_s"] = round(predicted, 2)
    check["steps_basis"] = (
        f"{steps} steps a side: what the budget left after the search for one run a side (with the final "
        f"comparison's reserve), from {MIN_STEPS} to {MAX_STEPS}; {predicted:.1f} s were reserved for it "
        f"({MIN_STEPS} steps a side)"
    )
    L.record_check(check)
    if check.get("passed") is not False:
        return False
    L.fall_back(_names(resolve(check["fallback"])))
    return True
