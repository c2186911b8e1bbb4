"""Sizes measured where they run: a kept speedup that sizes itself in each run from a probe of its
own (the loader's worker count, measured on the loader alone) is measured at the neighbouring
sizes in the whole configuration, the training process doing its real work, and pinned to the
size that trains fastest.

Alone, a loader's rate climbs with every worker up to the core count; in training, each worker
past what the step consumes takes a core the training process needs (its Python, the copy to the
device, the kernels' launches). A U-Net's 16 workers measured fastest alone (14,328 samples/s),
trained at 3.8-4.1k/s with 28-33% data wait, where an expert's 8 ran as fast or faster. So the
search compares the configuration as kept (the probe's size) with the next size down, in
interleaved fresh runs; a smaller size is kept when it is not missed (not significantly slower,
and at most ``ABLATION_LOSS`` slower at the point estimate: fewer processes, less to go wrong), a
size is kept when significantly faster; the next size up is measured only while the step still
waits for data. The report lists each size measured in the configuration, its rate and its data
wait. Where the probe kept the user's own size alone (the speedup skipped itself: "8 workers would
save the main process 9.9% of its time") and the configuration still waits for data, the larger
sizes the probe measured are tried in turn. Where a feed bundle is not kept with the size its
probe chose alone while the step waits for data, the bundle is measured once more with the next
size down (:meth:`Sizing.retry_smaller`).

Example:
    >>> self_sized("workers").around({"num_workers": 16, "loader_rates": {"0": 1.0, "4": 3.0, "8": 5.0, "16": 6.0}})
    (16, [8])
"""

from __future__ import annotations

from dataclasses import replace

from fastloop.compare import Runs, merge_runs
from fastloop.drivers.ladder import wording
from fastloop.drivers.ladder.moves import ABLATION_LOSS, Decision, Measured, Moves
from fastloop.drivers.ladder.rung import Rung
from fastloop.drivers.ladder.state import LadderState
from fastloop.measure.run_result import RunResult
from fastloop.speedups import REGISTRY, resolve
from fastloop.speedups.base import Speedup
from fastloop.speedups.ladder_traits import SelfSized

__all__ = ["SIZED_STAGE", "SIZING_WAIT", "Sizing", "self_sized"]

SIZING_WAIT = 0.05
"""The best configuration's data-wait fraction from which a larger size is measured too."""
SIZED_STAGE = "sizes measured in the configuration"


def self_sized(name: str | None) -> SelfSized | None:
    """How the registered speedup ``name`` sizes itself (:attr:`LadderTraits.sized`); None: it does
    not, or no such speedup (a spec with an option, ``workers:8``, names none: it is sized already)."""
    cls = REGISTRY.get(name) if name else None
    return cls.ladder.sized if cls is not None else None


def _chosen(runs: Runs, stat: str) -> int | None:
    """The size the runs chose (the most common, where the probe's noise made them differ)."""
    chosen = [RunResult.from_dict(d).extra.get(stat) for d in runs.docs]
    sizes = [int(n) for n in chosen if isinstance(n, (int, float))]
    return max(set(sizes), key=sizes.count) if sizes else None


class Sizing:
    """The sizes of the kept self-sized speedups, measured in the configuration through ``moves``
    (each size once: :attr:`sized`)."""

    def __init__(self, state: LadderState, moves: Moves) -> None:
        self.state, self.moves = state, moves
        self.sized: set[str] = set()
        """Self-sized speedups measured around their choice in the configuration."""

    def _best_wait(self) -> float:
        """The data-wait fraction of the best configuration's kept runs (0 where it has none)."""
        now = self.state.best()
        return (RunResult.from_dict(merge_runs(now)).data_wait_frac or 0.0) if now is not None and now.docs else 0.0

    def size_in_configuration(self, stage: str = SIZED_STAGE) -> None:
        """For each kept speedup that sized itself (its spec without an option, a :func:`self_sized`),
        measure the neighbouring sizes in the whole configuration and keep the one that trains
        fastest; then the self-sized speedups that kept the user's size alone (:meth:`_size_kept_alone`)."""
        state = self.state
        for spec in [s for s in state.selected if self_sized(s) and s not in self.sized]:
            self.sized.add(spec)
            best = state.best()
            if best is None or not best.docs:
                break  # nothing measured in the configuration yet: neither loop can size
            extra = RunResult.from_dict(merge_runs(best)).extra
            sized = self_sized(spec)
            assert sized is not None
            chosen, around = sized.around({**extra, sized.stat: _chosen(best, sized.stat)})
            if chosen is None:
                continue
            if around:
                state.note_stage(stage, wording.sizes_around(spec, chosen, around))
            for i, size in enumerate(around):
                wait = self._best_wait()
                if size > chosen and wait < SIZING_WAIT:
                    state.not_tried([f"{spec}:{size}"], wording.larger_cannot_help(wait))
                    continue
                state.queue_runs(len(around) - i - 1, 1)
                if self._try_size(spec, chosen, size):
                    break
            self.pin(spec, chosen, stage)

        for spec in sorted(s for s in self.moves.inactive if self_sized(s) and s not in self.sized):
            self.sized.add(spec)
            self._size_kept_alone(spec, stage)

    def pin(self, spec: str, chosen: int, stage: str) -> None:
        """A self-sized ``spec`` still kept as it sized itself is pinned to the size its runs in the
        configuration chose (``NAME:N``: no probe in later runs), so the final comparison and the
        user's line train with the size measured here, not a fresh probe's (a U-Net's probe chose 8
        workers, 16 measured no faster in the configuration, and the final run's own probe chose 16
        and waited 30% for data against 15% with 8). The configuration's runs whose probe chose
        another size are dropped from its kept runs."""
        if spec not in self.state.selected:
            return  # a size measured in the configuration already replaced it
        sized = self_sized(spec)
        assert sized is not None
        pinned, stat = f"{spec}:{chosen}", sized.stat
        self.state.pin(spec, pinned, lambda doc: RunResult.from_dict(doc).extra.get(stat) == chosen)
        self.state.note_stage(stage, wording.pinned(spec, pinned))

    def _size_kept_alone(self, spec: str, stage: str) -> None:
        """A self-sized speedup whose probe kept the user's own size alone (it skipped itself: "8
        workers would save the main process 9.9% of its time") while the configuration still waits
        for data: the larger sizes the probe measured are added in turn (``NAME:N``, no probe), each
        kept when it trains significantly faster, until one is not or the wait is gone."""
        state = self.state
        best = state.best()
        if best is None or not best.docs:
            return
        merged = RunResult.from_dict(merge_runs(best))
        sized = self_sized(spec)
        assert sized is not None
        own, above = sized.above_kept(merged.extra)
        wait = merged.data_wait_frac or 0.0
        if own is None or not above or wait < SIZING_WAIT:
            return
        state.note_stage(stage, wording.sizes_above_kept(spec, own, wait, above))
        for i, size in enumerate(above):
            wait = self._best_wait()
            if i and wait < SIZING_WAIT:
                state.not_tried([f"{spec}:{n}" for n in above[i:]], wording.larger_cannot_help(wait))
                return
            state.queue_runs(len(above) - i - 1, 1)
            if i:  # in place of the size kept before it
                kept = self._try_size(spec, above[i - 1], size, current=f"{spec}:{above[i - 1]}")
            else:
                label = wording.size_above_label(spec, size, own)
                kept = self.moves.try_adding(resolve(f"{spec}:{size}"), label, tell_rate=False, sized=spec)
            state.queue_runs(0)
            if not kept:
                return

    def _try_size(self, spec: str, chosen: int, size: int, current: str | None = None) -> bool:
        """One size in place of the self-sized spec (``current``: of the size kept before, ``NAME:N``);
        True when it is kept."""
        state = self.state
        sized, current = f"{spec}:{size}", current or spec
        base_spec, cand_spec = state.spec_with(), state.spec_replacing(current, sized)
        first = state.first_look(base_spec)
        if not state.fits(first, spec=cand_spec):
            state.not_tried([sized], plan=state.plan(first, cand_spec))
            return False
        move = Measured(base_spec, cand_spec, *state.compare_adaptive(base_spec, cand_spec))
        if not move.cand.docs and not move.cand.failures:
            state.not_tried([sized], plan=state.plan(first, cand_spec))
            return False
        decision = self.decide_size(move, spec, chosen, size, current)
        if decision.keep:
            state.replace_member(current, sized, move.cand)
        if decision.cut_short:
            state.cut_short(*decision.cut_short)
        state.record_rung(decision.rung)
        return bool(decision.keep)

    def decide_size(self, move: Measured, spec: str, chosen: int, size: int, current: str) -> Decision:
        """Keep ``spec`` at ``size`` (in place of ``current``) when significantly faster, or when
        smaller and not missed."""
        cand, ci, sized = move.cand, move.ci, f"{spec}:{size}"
        label = wording.size_label(sized, spec, chosen, current)
        if not cand.docs:
            rung = Rung.of_runs(label, move.cand_spec, cand, "failed", cand.failures[-1])
            failed = replace(rung, stage=self.state.stage, sized=spec, decision=wording.size_failed(current, sized))
            return Decision(failed)
        rung = replace(
            Rung.of_runs(label, move.cand_spec, cand, "applied"),
            compared=True,
            vs_spec=move.base_spec,
            runs_per_side=move.runs_per_side,
            speedup_vs_prev=ci,
            stage=self.state.stage,
            sized=spec,
        )
        faster = bool(ci and ci["significant"] and ci["ratio"] > 1)
        not_missed = bool(
            ci
            and size < chosen
            and not ci.get("budget")
            and not (ci["significant"] and ci["ratio"] < 1)
            and ci["ratio"] >= 1 - ABLATION_LOSS
        )
        if ci and (faster or not_missed):
            return Decision(
                replace(rung, decision=wording.size_kept(sized, spec, chosen, current, ci, faster)), [sized]
            )
        cut = (sized, len(cand.docs)) if ci and ci.get("budget") else None
        return Decision(replace(rung, decision=wording.size_not_kept(sized, spec, chosen, current, ci)), cut_short=cut)

    def retry_smaller(self, bundle: list[Speedup], label: str, *, tell_rate: bool) -> bool:
        """A feed bundle just dropped (the last rung: ``label``, not kept) whose self-sized member
        chose its size alone, while that configuration still waits for data (>= ``SIZING_WAIT``):
        the bundle measured once more with the next size the probe measured below it, in the
        member's place (a U-Net's 16 workers alone read 8,350 samples/s against 5,875 with the
        user's 4; in training, the bundle with 16 waited 46% for data and compared 1.18x [0.99,
        1.41], not significant, so it was dropped and no count was measured where it runs). Returns
        whether the bundle was kept at the smaller size."""
        state = self.state
        last = state.rungs[-1] if state.rungs else None
        if (
            last is None
            or last.label != label
            or last.status != "applied"
            or (last.data_wait_frac or 0.0) < SIZING_WAIT
        ):
            return False
        for member in bundle:
            sized = self_sized(member.spec)
            if sized is None:
                continue
            chosen, around = sized.around(last.extra)
            below = [n for n in around if chosen is not None and n < chosen]
            if not below:
                continue
            sized = f"{member.name}:{below[0]}"
            state.note_stage(state.stage, wording.retry_note(label, member.name, chosen, last.data_wait_frac, sized))
            again = [resolve(sized)[0] if t is member else t for t in bundle]
            state.extend_last_decision(wording.measured_again(sized))
            retry = wording.retry_label(label, sized, chosen)
            kept = self.moves.try_adding(again, retry, tell_rate=tell_rate, sized=member.name)
            if kept:  # the tie the first measurement reported no longer decides anything
                state.untie(last.spec)
            return kept
        return False
