"""The ladder's searches share one protocol, :class:`Search`: ``run(state, candidates, ctx)`` measures
candidates on a :class:`~fastloop.drivers.ladder.state.LadderState` and leaves the ending (the
final comparison, the document) to the state. The default is :class:`StagedSearch`, what an expert
does, written down and measured; :class:`~fastloop.drivers.ladder.sequential.SequentialSearch`
tries one candidate at a time.

An expert looks at the bottleneck, fixes the feed when the GPU waits for data, turns on the whole
compute stack that applies, checks what each piece bought by taking it away, and looks at the
feed again. The staged search does the same, each move a measured comparison (interleaved fresh
processes, run-level intervals: :mod:`~fastloop.drivers.ladder.moves`):

1. **Baseline**, and its bottleneck.
2. **Feed first** when the baseline is data-bound (data wait >= ``FEED_FIRST_WAIT``): the data
   on the GPU (``gpu_resident``, ``gpu_augment``) where the dataset's checks allow, else a GPU
   pipeline (``dali``), else the CPU feed as one bundle (``workers``, ``pin_memory``,
   ``prefetch``), ablated once the compute bundle has been measured (the budget reaches the
   larger lever first).
3. **The compute bundle**: every applicable compute speedup (tf32, bf16, fused_optimizer,
   channels_last, compile, cuda_graph, and the padding to a few shapes where the batches change
   shape) as one candidate on top of the best so far, kept when significantly faster, then
   **ablated** (each member out in turn, left out when not significantly missed). A bundle that
   is not faster (or fails) is tried one speedup at a time instead. Where the faster step now
   waits for data (>= ``FEED_FIRST_WAIT``), the ablation waits until the feed is checked (a
   member taken out would hide behind the wait) and then takes the feed kept since with it,
   costliest first (:func:`~fastloop.drivers.ladder.candidates.ablation_order`: what the budget
   leaves untried is the cheapest).
4. **The feed again**: a faster step needs more data. A feed rung dropped before the bottleneck
   moved is tried again after it moved. A kept rung that sized itself alone (the worker count) is
   measured at the sizes around it in the configuration (:mod:`~fastloop.drivers.ladder.sizing`)
   before it is ablated (the user's count faces the size that trains fastest).
5. Whatever is left (``batch_size``), one at a time.

The budget bounds the whole search: what does not fit with the final comparison's reserve is
listed ``not tried: budget``, with the prediction and the reserve.
"""

from __future__ import annotations

from typing import Protocol

from fastloop.compare import Runs, merge_runs
from fastloop.drivers.ladder import wording
from fastloop.drivers.ladder.candidates import ablation_order, as_sized, replaces_loader, spec_names, split_groups
from fastloop.drivers.ladder.gates import feed_cannot_help, model_says_no
from fastloop.drivers.ladder.moves import Moves
from fastloop.drivers.ladder.rung import Rung
from fastloop.drivers.ladder.sizing import Sizing
from fastloop.drivers.ladder.state import LadderState
from fastloop.measure.run_result import RunResult
from fastloop.speedups import REGISTRY
from fastloop.speedups.base import Context, Speedup, name_of

__all__ = ["FEED_FIRST_WAIT", "Search", "StagedSearch"]

FEED_FIRST_WAIT = 0.2
"""The baseline's data-wait fraction from which the feed is fixed before the compute stack."""


class Search(Protocol):
    """A way to search: measure ``candidates`` (speedups, checked against ``ctx``) on ``state``,
    through its methods. The ladder then ends with :meth:`LadderState.finish`."""

    def run(self, state: LadderState, candidates: list[Speedup], ctx: Context) -> None: ...


def skip_unusable(state: LadderState, candidates: list[Speedup], ctx: Context) -> list[Speedup]:
    """The candidates that can apply here; each one that cannot is a skipped rung with its reason."""
    usable = []
    for s in candidates:
        reason = s.why_not(ctx)
        if reason:
            state.record_rung(Rung.of_runs(f"+{s.spec}", state.spec_with([s.spec]), None, "skipped", reason))
        else:
            usable.append(s)
    return usable


class StagedSearch:
    """The default search (:class:`Search`): bottleneck first, the feed, the compute stack as one
    bundle and its ablation, the feed again, the workload."""

    def run(self, state: LadderState, candidates: list[Speedup], ctx: Context) -> None:
        _Stages(state).run(skip_unusable(state, candidates, ctx))


class _Stages:
    """One staged search under way: its moves, its sizing, and the ablations it put off."""

    def __init__(self, state: LadderState) -> None:
        self.state = state
        self.moves = Moves(state)
        self.sizing = Sizing(state, self.moves)
        self.deferred: list[str] = []
        """Feed bundle members kept feed-first whose ablation waits until the compute bundle was measured."""
        self.deferred_compute: list[str] = []
        """Compute bundle members kept whose ablation waits until the feed was checked."""

    def _wait(self) -> float:
        """The best configuration's data-wait fraction."""
        return RunResult.from_dict(merge_runs(self.state.best())).data_wait_frac or 0.0

    def _dataset(self) -> dict:
        """What the runs said of the dataset (``in_memory_tensors``, ...)."""
        best = self.state.best()
        return (RunResult.from_dict(merge_runs(best)).extra.get("dataset") or {}) if best else {}

    def run(self, usable: list[Speedup]) -> None:
        state = self.state
        feed, compute, rest = split_groups(usable)
        fresh: dict[str, Runs] = {}
        # one run tells the bottleneck; the first comparison tops the baseline up, interleaved
        state.measure_runs([state.base_spec], 1, fresh)
        state.set_baseline(fresh[state.base_spec])
        state.start_from_baseline()
        state.note_stage("baseline", "measured")
        if self._wait() >= FEED_FIRST_WAIT:
            self.feed_first(feed, compute)
        else:
            data = self._dataset()
            resident = [
                s
                for s in feed
                if s.ladder.stored_on_device
                and not model_says_no(state.base_runs, s)
                and (data.get("in_memory_tensors") or not s.ladder.needs_in_memory_tensors)
            ]
            # stored tensors the checks let the GPU serve (as they are, or augmented per batch) go
            # in with the compute stack: an expert's first move, and the compute rungs are then
            # measured without waiting on the CPU feed (it costs nothing when it does not help)
            state.queue_runs(1 if feed else 0)  # the feed's first look is kept out of the bundle's extensions
            stage = "compute stack" + (" with the data on the GPU" if resident else "")
            self.compute(resident + compute, stage, feed_next=bool(feed))
            state.queue_runs(0)
            self.feed(feed, "feed checked for the faster step")
        self.sizing.size_in_configuration()  # the feed's sizes in the configuration, then what hid behind its wait
        if self.deferred_compute:  # with the feed kept after it, costliest first (compile ... processes, prefetch)
            both = self.deferred_compute + as_sized(state.selected, self.deferred)
            state.note_stage("compute bundle ablated after the feed", wording.ablation_action(ablation_order(both)))
            self.moves.ablate(both)
        if rest:
            state.note_stage("the workload", wording.one_at_a_time([s.spec for s in rest]))
            self.singles(rest)

    def feed_first(self, feed: list[Speedup], compute: list[Speedup]) -> None:
        """A data-bound baseline: the feed bundle first, its ablation after the compute bundle's
        (the larger lever on a GPU), the feed checked again after the compute stack."""
        state = self.state
        state.queue_runs(1 if compute else 0)  # the compute bundle's first look is kept for
        self.feed(feed, "feed first (the baseline waits for data)", defer_ablation=True)
        state.queue_runs(0)
        self.compute(compute, "compute stack", feed_next=bool(feed))
        if self.deferred:
            self.sizing.size_in_configuration()  # as in feed(): sized where it runs before it is taken out
            done, self.deferred = as_sized(state.selected, self.deferred), []
            state.note_stage("feed bundle ablated after the compute stack", wording.ablation_action(done))
            self.moves.ablate(done)
        self.feed(feed, "feed re-checked after the compute stack")

    def _feed_todo(self, feed: list[Speedup]) -> list[Speedup]:
        """The feed speedups still to measure: not chosen, not inactive, not dropped under the
        bottleneck of now, and (where one needs them) on a dataset of in-memory tensors."""
        chosen, now = spec_names(self.state.selected), self.state.bottleneck_kind()
        dropped_under = self.moves.dropped_under
        todo = [
            s
            for s in feed
            if s.name not in chosen
            and s.name not in self.moves.inactive
            and (s.name not in dropped_under or dropped_under[s.name] != now)
        ]
        if not todo:
            return []
        data = self._dataset()
        return [s for s in todo if not s.ladder.needs_in_memory_tensors or data.get("in_memory_tensors")]

    def feed(self, feed: list[Speedup], stage: str, *, defer_ablation: bool = False) -> None:
        """Fix the feed: a GPU feed where one applies, else the CPU feed bundle, ablated (with
        ``defer_ablation``, its members are noted in :attr:`deferred` and ablated later: the
        compute bundle's comparison comes first, as it is where most of the budget should go)."""
        state = self.state
        if replaces_loader(spec_names(state.selected)):
            return
        todo = self._feed_todo(feed)
        if not todo:  # nothing left, or what is left needs a dataset of in-memory tensors
            return
        blocked = {
            s.name: model_says_no(state.base_runs, s) or feed_cannot_help(state.best(), state.spec_with(), s)
            for s in todo
        }
        todo = [s for s in todo if not blocked[s.name]]
        state.note_stage(stage, wording.feed_action([s.spec for s in todo], [v for v in blocked.values() if v]))
        if not todo:
            return
        first_time = state.base_runs is not None and state.best() is state.base_runs
        tell = not first_time  # feed-first: size the feed for the step the model will reach, not today's
        for s in [s for s in todo if s.ladder.replaces_loader]:
            if self.moves.try_adding([s], f"+{s.spec}", tell_rate=tell):
                return
        bundle = [s for s in todo if not s.ladder.replaces_loader]
        if len(bundle) == 1:
            self.moves.try_adding(bundle, f"+{bundle[0].spec}", tell_rate=tell)
            return
        label = "+" + ",".join(s.spec for s in bundle) + " (feed bundle)"
        if bundle and (
            self.moves.try_adding(bundle, label, tell_rate=tell)
            or self.sizing.retry_smaller(bundle, label, tell_rate=tell)
        ):
            kept = [s for s in as_sized(state.selected, [s.spec for s in bundle]) if s in state.selected]
            if defer_ablation or self.deferred_compute:  # later: after the compute bundle, or with its ablation
                self.deferred = kept
            else:  # a count sized alone is measured where it runs before it is taken out
                self.sizing.size_in_configuration()
                self.moves.ablate(as_sized(state.selected, kept))

    def _ruled_out(self, todo: list[Speedup]) -> dict[str, str | None]:
        """Why the model rules out each of ``todo`` (None: it does not). A padding to a few shapes in
        the bundle (or kept), itself not ruled out by the baseline's batches (one shape: nothing to
        pad), means the baseline's shape checks of the others do not hold."""
        base = self.state.base_runs
        ruled_out = {s.name: model_says_no(base, s) for s in todo if s.fixes_shapes}
        shaped = any(s.fixes_shapes and not ruled_out[s.name] for s in todo) or any(
            REGISTRY[n].fixes_shapes for n in spec_names(self.state.selected) if n in REGISTRY
        )
        ruled_out.update({s.name: model_says_no(base, s, shapes_fixed=shaped) for s in todo if not s.fixes_shapes})
        return ruled_out

    def compute(self, compute: list[Speedup], stage: str, *, feed_next: bool = False) -> None:
        """The whole applicable compute stack as one candidate, then its ablation; one at a time
        when the bundle is not faster. With ``feed_next`` (the feed is checked after this stage),
        a kept bundle whose faster step now waits for data has its ablation deferred
        (:attr:`deferred_compute`): the feed is measured first, and a member taken out is then not
        hidden behind the wait (a data-bound step looks no slower without compile)."""
        state = self.state
        todo = [s for s in compute if s.name not in spec_names(state.selected)]
        ruled_out = self._ruled_out(todo)
        shaper = next((s for s in todo if s.fixes_shapes and not ruled_out[s.name]), None)
        if shaper is not None:
            state.note_stage(stage, wording.shapes_padded(shaper.spec))
        for s in todo:
            reason = ruled_out[s.name]
            if reason:
                state.record_rung(Rung.of_runs(f"+{s.spec}", state.spec_with([s.spec]), None, "skipped", reason))
        todo = [s for s in todo if not ruled_out[s.name]]
        if not todo:
            return
        feeds = [n for n in map(name_of, state.selected) if n in REGISTRY and REGISTRY[n].ladder.feeds]
        note = wording.compute_feed_note(self._wait() if state.best() else 0.0, feeds, FEED_FIRST_WAIT)
        state.note_stage(stage, wording.compute_action([s.spec for s in todo], note))
        if len(todo) > 1:
            label = "+" + ",".join(s.spec for s in todo) + " (compute bundle)"
            if self.moves.try_adding(todo, label, tell_rate=False):
                kept = [s.spec for s in todo if s.spec in state.selected]
                wait = self._wait()
                if feed_next and wait >= FEED_FIRST_WAIT:
                    state.note_stage(stage, wording.ablation_waits(wait))
                    self.deferred_compute = kept
                else:
                    self.moves.ablate(kept)
                return
            state.note_stage(stage + ": one at a time", wording.BUNDLE_NOT_FASTER)
            self.moves.in_bundle |= {s.name for s in todo}
        for i, s in enumerate(todo):
            if s.name not in spec_names(state.selected):
                state.queue_runs(len(todo) - i - 1)
                self.moves.try_adding([s], f"+{s.spec}", tell_rate=False)
        state.queue_runs(0)

    def singles(self, rest: list[Speedup]) -> None:
        for i, s in enumerate(rest):
            self.state.queue_runs(len(rest) - i - 1)
            self.moves.try_adding([s], f"+{s.spec}", tell_rate=False)
        self.state.queue_runs(0)
