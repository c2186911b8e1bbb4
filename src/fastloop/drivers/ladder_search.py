"""The ladder's search: what an expert does, written down and measured.

An expert looks at the bottleneck, fixes the feed when the GPU waits for data, turns on the
whole compute stack that applies, checks what each piece bought by taking it away, and looks at
the feed again. The search does the same, each move a measured comparison (interleaved fresh
processes, run-level intervals):

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
   costliest first (:func:`ablation_order`: what the budget leaves untried is the cheapest).
4. **The feed again**: a faster step needs more data. A feed rung dropped before the bottleneck
   moved is tried again after it moved. A kept rung that sized itself alone (the worker count) is
   measured at the sizes around it in the configuration (:mod:`~fastloop.drivers.ladder_sizing`)
   before it is ablated (the user's count faces the size that trains fastest).
5. Whatever is left (``batch_size``), one at a time.

The budget bounds the whole search: what does not fit with the final comparison's reserve is
listed ``not tried: budget``, with the prediction and the reserve.

Example:
    >>> from fastloop.speedups import resolve
    >>> [[s.name for s in g] for g in split_groups(resolve("workers,bf16,compile,batch_size"))]
    [['workers'], ['bf16', 'compile'], ['batch_size']]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastloop.compare import Runs, merge_runs
from fastloop.drivers.doctor import diagnose
from fastloop.drivers.ladder_gates import (
    ABLATION_LOSS,
    ablation_order,
    compute_feed_note,
    feed_cannot_help,
    model_says_no,
    replaces_loader,
    spec_names,
    split_groups,
)
from fastloop.drivers.ladder_sizing import as_sized, retry_smaller, size_in_configuration
from fastloop.measure.stats import MIN_EFFECT
from fastloop.speedups import REGISTRY
from fastloop.speedups.base import name_of

if TYPE_CHECKING:
    from fastloop.drivers.ladder_state import LadderState

__all__ = ["FEED_FIRST_WAIT", "StagedSearch", "ablation_order", "split_groups"]

FEED_FIRST_WAIT = 0.2
"""The baseline's data-wait fraction from which the feed is fixed before the compute stack."""


class StagedSearch:
    """One staged search over a :class:`~fastloop.drivers.ladder_state.LadderState`'s public machinery (its measurement,
    rung documents and selected set)."""

    def __init__(self, ladder: LadderState) -> None:
        self.L = ladder
        self.stage = "baseline"
        self.inactive: set[str] = set()
        """Speedups that skipped themselves or fell back inside a run: never tried again."""
        self.deferred: list[str] = []
        """Feed bundle members kept feed-first whose ablation waits until the compute bundle was measured."""
        self.deferred_compute: list[str] = []
        """Compute bundle members kept whose ablation waits until the feed was checked."""
        self.dropped_under: dict[str, str] = {}
        """Feed speedup -> the bottleneck under which it was dropped (tried again once it moved)."""
        self.in_bundle: set[str] = set()  # measured in a compute bundle that was not faster
        self.sized: set[str] = set()  # self-sized speedups measured around their choice in the configuration

    # -- helpers -----------------------------------------------------------------------------
    def best(self) -> Runs | None:
        return self.L.best_runs.get(self.L.spec_with())

    def bottleneck(self) -> dict:
        runs = self.best()
        return diagnose(merge_runs(runs)) if runs is not None and runs.docs else {}

    def _kind(self) -> str:
        return (self.bottleneck().get("bottleneck") or "unknown").split()[0]

    def note(self, stage: str, action: str) -> None:
        """A line of the story: the stage, the bottleneck of the best configuration then, what was done."""
        self.stage = stage
        b = self.bottleneck()
        self.L.stages.append(
            {
                "stage": stage,
                "configuration": self.L.spec_with(),
                "bottleneck": b.get("bottleneck"),
                "evidence": b.get("evidence"),
                "action": action,
            }
        )
        self.L.publish()

    def not_tried(self, names: list[str], why: str = "budget", plan: dict | None = None) -> None:
        """List what was not measured, and why; a budget entry carries the arithmetic (the
        prediction, the reserve for the final comparison and the seconds that were left)."""
        for n in names:
            if not any(t["name"] == n for t in self.L.not_tried):
                self.L.not_tried.append({"name": n, "stage": self.stage, "why": why, **(plan or {})})

    def cut_short(self, what: str, runs: int) -> None:
        """A comparison that was measured, but ended by the budget before its interval could call it."""
        self.L.cut_short.append({"name": what, "stage": self.stage, "runs": runs})

    def _starts(self, specs: list[str]) -> bool:
        """Does a comparison of the best with ``specs`` fit: its first look (the candidate's runs
        and the base's top-up), predicted at the candidate's cost where it ran before, and the
        final comparison's reserve? Where it does not, the rung is listed not tried, with the plan."""
        L = self.L
        base = L.best_runs.get(L.spec_with())
        runs = L.min_repeats + max(0, L.min_repeats - (len(base.docs) if base is not None else 0))
        cand = L.spec_with(specs)
        if L.fits(runs, spec=cand):
            return True
        # a member of a bundle that was measured and not faster was tried: only not alone
        why = (
            "alone: budget (measured in the compute bundle, which was not faster)"
            if spec_names(specs) <= self.in_bundle
            else "budget"
        )
        self.not_tried(specs, why, plan=L.plan(runs, cand))
        return False

    def queue(self, comparisons: int, runs_each: int | None = None) -> None:
        """The search has ``comparisons`` more comparisons planned after the current one in this
        stage: keep their first looks' runs (``runs_each`` each, default 3) out of its extensions."""
        self.L.queued = [(runs_each or self.L.min_repeats, None)] * max(0, comparisons)

    def _own_records(self, runs: Runs, specs: list[str]) -> dict[str, dict]:
        doc = runs.docs[-1] if runs.docs else {}
        names = spec_names(specs)
        return {r["name"]: r for r in doc.get("speedups", []) if r["name"] in names}

    # -- one measured move ---------------------------------------------------------------------
    def try_adding(self, add: list, label: str, *, tell_rate: bool) -> bool:
        """Measure the best configuration with ``add`` against the best; keep what applied when it
        is significantly faster. Returns whether it was kept."""
        L = self.L
        specs = [s.spec for s in add]
        if not self._starts(specs):
            return False
        base_spec, cand_spec = L.spec_with(), L.spec_with(specs)
        fresh, ci, n = L.compare_adaptive(
            base_spec, cand_spec, own=specs[0] if len(specs) == 1 else None, tell_rate=tell_rate
        )
        if L.base_runs is None:
            L.set_baseline(fresh[L.base_spec])
        cand, base = fresh[cand_spec], fresh[base_spec]
        if cand.failures or base.failures or not cand.docs:
            why = (
                cand.failures[-1]
                if cand.failures
                else f"its comparison base failed: {base.failures[-1]}"
                if base.failures
                else "no run finished"
            )
            doc = L.rung_doc(label, cand_spec, cand, "failed", why)
            doc.update(stage=self.stage, members=specs)
            L.rungs.append(doc)
            L.publish()
            return False
        own = self._own_records(cand, specs)
        inactive = {n: r for n, r in own.items() if r["status"] != "applied"}
        doc = L.rung_doc(label, cand_spec, cand, "applied", "")
        doc.update(vs_spec=base_spec, runs_per_side=n, speedup_vs_prev=ci, stage=self.stage, members=specs)
        if inactive:
            doc["inactive"] = {n: f"{r['status']}: {r['reason']}" for n, r in inactive.items()}
        active = [s for s in specs if name_of(s) not in inactive]
        self.inactive.update(inactive)  # skipped or fell back inside its process: not tried again
        kept = bool(active) and bool(ci and ci["significant"] and ci["ratio"] > 1)
        if kept:
            doc["decision"] = f"kept: {ci['ratio']:.2f}x faster than {base_spec}"
            before = self._kind()
            L.selected.extend(active)
            L.best_runs = {L.spec_with(): cand}  # members that did nothing change nothing: the same runs
            if base_spec == L.base_spec:
                L.vs_baseline = ({L.base_spec: base, L.spec_with(): cand}, ci)
            self._moved(doc, before)
        else:
            if not active:
                doc["rung_status"] = "skipped"
                doc["rung_reason"] = "; ".join(f"{n} {v}" for n, v in doc["inactive"].items())
            doc["decision"] = "dropped: " + (ci["verdict"] if ci else "no comparison")
            if ci and ci.get("budget"):
                doc["decision"] += f" (the budget ended the comparison after {len(cand.docs)} run(s) of it)"
                self.cut_short(label.lstrip("+"), len(cand.docs))
            if ci and ci.get("ratio") is not None and len(specs) == 1 and active:
                doc["measured_not_faster"] = [name_of(specs[0])]
            if active:
                self._tie(doc, base_spec, cand_spec, ci)
            for s in specs:
                self.dropped_under[name_of(s)] = self._kind()
        L.rungs.append(doc)
        L.publish()
        return kept

    def _moved(self, doc: dict, before: str) -> None:
        now = doc.get("bottleneck", {}).get("bottleneck")
        if now and before and now.split()[0] != before:
            feed = f" ({doc['feed']})" if now == "data-bound" and doc.get("feed") else ""
            doc["bottleneck_moved"] = (
                f"after {doc['rung'].lstrip('+')}: {now}: {doc['bottleneck']['evidence']}{feed} "
                f"next: {doc['bottleneck']['recommendation']}"
            )

    def ablate(self, members: list[str]) -> None:
        """Take each kept member that costs something out in turn (compile time, capture, precision,
        layout: :func:`ablation_order`); leave it out when the configuration without it is not slower.
        Members that cost nothing when they do not help (TF32, a fused optimizer, the data on the
        GPU) stay without a comparison: the budget goes where a removal can matter."""
        L = self.L
        order = ablation_order(members)
        for i, spec in enumerate(order):
            if spec not in L.selected or len(L.selected) <= 1:
                continue
            without, first = [s for s in L.selected if s != spec], L.first_look(L.spec_with())
            base_spec, cand_spec = L.spec_with(), L.spec_without(spec)
            # the ablations after it: their first looks at their own predicted cost (a cold compile)
            L.queued = [(first, L.spec_without(m)) for m in order[i + 1 :] if m in L.selected]
            fresh = L.compare_adaptive(base_spec, cand_spec) if L.fits(first, spec=cand_spec) else None
            if fresh is None or not (fresh[0][cand_spec].failures or fresh[0][cand_spec].docs):
                self.not_tried([f"ablation of {spec}"], plan=L.plan(first, cand_spec))  # the budget stopped it
                continue
            (fresh, ci, n), label = fresh, f"-{spec}"
            cand = fresh[cand_spec]
            if cand.failures:
                doc = L.rung_doc(label, cand_spec, cand, "failed", cand.failures[-1])
                doc.update(stage=self.stage, decision=f"kept {spec}: the configuration without it failed")
                L.rungs.append(doc)
                L.publish()
                continue
            doc = L.rung_doc(label, cand_spec, cand, "applied", "")
            doc.update(vs_spec=base_spec, runs_per_side=n, speedup_vs_prev=ci, stage=self.stage, ablation=spec)
            # left out only when not missed: not significantly slower without it AND no more than
            # ABLATION_LOSS slower at the point estimate (a wide interval is not evidence of no effect)
            slower = bool(ci and ((ci["significant"] and ci["ratio"] < 1) or ci["ratio"] < 1 - ABLATION_LOSS))
            if ci and ci.get("budget") and not (ci["significant"] and ci["ratio"] < 1):  # too few runs to tell
                doc["decision"] = f"kept {spec}: the budget ended its ablation after {len(cand.docs)} run(s)" + (
                    f" ({ci['ratio']:.2f}x without it at the point estimate)" if ci.get("ratio") else ""
                )
                self.cut_short(f"ablation of {spec}", len(cand.docs))
            elif slower:
                why = (
                    ""
                    if ci["significant"] and ci["ratio"] < 1
                    else f"; kept as more than {100 * ABLATION_LOSS:.0f}% slower without it at the point estimate"
                )
                doc["decision"] = f"kept {spec}: without it {ci['ratio']:.2f}x ({ci['verdict']}{why})"
            else:
                verdict = ci["verdict"] if ci else "no comparison"
                doc["decision"] = f"removed {spec}: not missed ({verdict})"
                doc["measured_not_faster"] = [name_of(spec)]
                self._tie(doc, cand_spec, base_spec, ci)
                L.selected = without
                L.best_runs = {cand_spec: cand}
                if cand_spec == L.base_spec:
                    L.vs_baseline = None
            L.rungs.append(doc)
            L.publish()

    def _tie(self, doc: dict, kept: str, other: str, ci: dict | None) -> None:
        """Two configurations the comparison could not tell apart (an interval straddling 1, or
        apart by less than ``MIN_EFFECT``; not cut by the budget): the simpler one is kept, and the
        report says they tie."""
        if not ci or ci.get("significant") or ci.get("budget") or ci.get("ratio") is None:
            return
        self.L.ties.append(
            {
                "kept": kept,
                "other": other,
                "ratio": ci["ratio"],
                "ci_low": ci.get("ci_low"),
                "ci_high": ci.get("ci_high"),
                "why": "the simpler (fewer speedups, less to go wrong)",
                "negligible": bool(ci.get("negligible")),
            }
        )
        how = f"are apart by less than {100 * MIN_EFFECT:g}%" if ci.get("negligible") else "tie within the noise"
        doc["decision"] += f"; {kept} and {other} {how}: the simpler, {kept}, is kept"

    # -- the stages ------------------------------------------------------------------------------
    def feed(self, feed: list, stage: str, *, defer_ablation: bool = False) -> None:
        """Fix the feed: a GPU feed where one applies, else the CPU feed bundle, ablated (with
        ``defer_ablation``, its members are noted in :attr:`deferred` and ablated later: the
        compute bundle's comparison comes first, as it is where most of the budget should go)."""
        L = self.L
        chosen = spec_names(L.selected)
        if replaces_loader(chosen):
            return
        now = self._kind()
        todo = [
            s
            for s in feed
            if s.name not in chosen
            and s.name not in self.inactive
            and (s.name not in self.dropped_under or self.dropped_under[s.name] != now)
        ]
        if not todo:
            return
        data = ((merge_runs(self.best()).get("extra") or {}).get("dataset") or {}) if self.best() else {}
        todo = [s for s in todo if not s.needs_in_memory_tensors or data.get("in_memory_tensors")]
        if not todo:  # what is left needs a dataset of in-memory tensors, and this one is not
            return
        blocked = {s.name: model_says_no(L, s) or feed_cannot_help(L, s) for s in todo}
        todo = [s for s in todo if not blocked[s.name]]
        self.note(
            stage,
            ("feed: " + ", ".join(s.spec for s in todo))
            if todo
            else "feed not measured: " + next(v for v in blocked.values() if v),
        )
        if not todo:
            return
        first_time = L.base_runs is not None and self.best() is L.base_runs
        tell = not first_time  # feed-first: size the feed for the step the model will reach, not today's
        for s in [s for s in todo if s.replaces_loader]:
            if self.try_adding([s], f"+{s.spec}", tell_rate=tell):
                return
        bundle = [s for s in todo if not s.replaces_loader]
        if len(bundle) == 1:
            self.try_adding(bundle, f"+{bundle[0].spec}", tell_rate=tell)
        elif bundle and (
            self.try_adding(bundle, label := "+" + ",".join(s.spec for s in bundle) + " (feed bundle)", tell_rate=tell)
            or retry_smaller(self, bundle, label, tell_rate=tell)
        ):
            kept = [s for s in as_sized(L.selected, [s.spec for s in bundle]) if s in L.selected]
            if defer_ablation or self.deferred_compute:  # later: after the compute bundle, or with its ablation
                self.deferred = kept
            else:  # a count sized alone is measured where it runs before it is taken out
                size_in_configuration(self)
                self.ablate(as_sized(L.selected, kept))

    def compute(self, compute: list, stage: str, *, feed_next: bool = False) -> None:
        """The whole applicable compute stack as one candidate, then its ablation; one at a time
        when the bundle is not faster. With ``feed_next`` (the feed is checked after this stage),
        a kept bundle whose faster step now waits for data has its ablation deferred
        (:attr:`deferred_compute`): the feed is measured first, and a member taken out is then not
        hidden behind the wait (a data-bound step looks no slower without compile)."""
        L = self.L
        todo = [s for s in compute if s.name not in spec_names(L.selected)]
        # a padding to a few shapes in the bundle (or kept), itself not ruled out by the baseline's
        # batches (one shape: nothing to pad): the baseline's shape checks of the others do not hold
        ruled_out = {s.name: model_says_no(L, s) for s in todo if s.fixes_shapes}
        shaped = any(s.fixes_shapes and not ruled_out[s.name] for s in todo) or any(
            REGISTRY[n].fixes_shapes for n in spec_names(L.selected) if n in REGISTRY
        )
        ruled_out.update({s.name: model_says_no(L, s, shapes_fixed=shaped) for s in todo if not s.fixes_shapes})
        shaper = next((s for s in todo if s.fixes_shapes and not ruled_out[s.name]), None)
        if shaper is not None:
            self.note(
                stage,
                f"the batches change shape: padded to a few lengths ({shaper.spec}), so compile and "
                f"CUDA graphs are measured on its few shapes",
            )
        for s in todo:
            if ruled_out[s.name]:
                L.rungs.append(L.rung_doc(f"+{s.spec}", L.spec_with([s.spec]), None, "skipped", ruled_out[s.name]))
        todo = [s for s in todo if not ruled_out[s.name]]
        if not todo:
            return
        self.note(
            stage,
            "compute bundle: "
            + ",".join(s.spec for s in todo)
            + compute_feed_note(self.best(), L.selected, FEED_FIRST_WAIT),
        )
        if len(todo) > 1:
            label = "+" + ",".join(s.spec for s in todo) + " (compute bundle)"
            if self.try_adding(todo, label, tell_rate=False):
                kept = [s.spec for s in todo if s.spec in L.selected]
                wait = merge_runs(self.best()).get("data_wait_frac") or 0.0
                if feed_next and wait >= FEED_FIRST_WAIT:
                    self.note(
                        stage,
                        f"its ablation waits until the feed is checked: the faster step waits {wait:.0%} "
                        f"for data, and a member taken out would be hidden behind the wait",
                    )
                    self.deferred_compute = kept
                else:
                    self.ablate(kept)
                return
            self.note(stage + ": one at a time", "the bundle was not faster: each compute speedup alone")
            self.in_bundle |= {s.name for s in todo}
        for i, s in enumerate(todo):
            if s.name not in spec_names(L.selected):
                self.queue(len(todo) - i - 1)
                self.try_adding([s], f"+{s.spec}", tell_rate=False)
        self.queue(0)

    def singles(self, rest: list) -> None:
        for i, s in enumerate(rest):
            self.queue(len(rest) - i - 1)
            self.try_adding([s], f"+{s.spec}", tell_rate=False)
        self.queue(0)

    def run(self, candidates: list, ctx: Any) -> None:
        L = self.L
        usable = []
        for s in candidates:
            reason = s.why_not(ctx)
            if reason:
                L.rungs.append(L.rung_doc(f"+{s.spec}", L.spec_with([s.spec]), None, "skipped", reason))
            else:
                usable.append(s)
        feed, compute, rest = split_groups(usable)
        fresh: dict[str, Runs] = {}
        # one run tells the bottleneck; the first comparison tops the baseline up, interleaved
        L.measure_runs([L.base_spec], 1, fresh)
        L.set_baseline(fresh[L.base_spec])
        L.best_runs = {L.base_spec: fresh[L.base_spec]}
        self.note("baseline", "measured")
        if (merge_runs(self.best()).get("data_wait_frac") or 0.0) >= FEED_FIRST_WAIT:
            # the feed bundle first, its ablation after the compute bundle's (the larger lever on a GPU)
            self.queue(1 if compute else 0)  # the compute bundle's first look is kept for
            self.feed(feed, "feed first (the baseline waits for data)", defer_ablation=True)
            self.queue(0)
            self.compute(compute, "compute stack", feed_next=bool(feed))
            if self.deferred:
                size_in_configuration(self)  # as in feed(): sized where it runs before it is taken out
                done, self.deferred = as_sized(L.selected, self.deferred), []
                self.note("feed bundle ablated after the compute stack", "ablation: " + ",".join(done))
                self.ablate(done)
            self.feed(feed, "feed re-checked after the compute stack")
        else:
            data = (merge_runs(self.best()).get("extra") or {}).get("dataset") or {}
            resident = [
                s
                for s in feed
                if s.stored_on_device
                and not model_says_no(L, s)
                and (data.get("in_memory_tensors") or not s.needs_in_memory_tensors)
            ]
            # stored tensors the checks let the GPU serve (as they are, or augmented per batch) go
            # in with the compute stack: an expert's first move, and the compute rungs are then
            # measured without waiting on the CPU feed (it costs nothing when it does not help)
            self.queue(1 if feed else 0)  # the feed's first look is kept out of the bundle's extensions
            self.compute(
                resident + compute,
                "compute stack" + (" with the data on the GPU" if resident else ""),
                feed_next=bool(feed),
            )
            self.queue(0)
            self.feed(feed, "feed checked for the faster step")
        size_in_configuration(self)  # the feed's sizes in the configuration, then what hid behind its wait
        if self.deferred_compute:  # with the feed kept after it, costliest first (compile ... processes, prefetch)
            both = self.deferred_compute + as_sized(L.selected, self.deferred)
            self.note("compute bundle ablated after the feed", "ablation: " + ",".join(ablation_order(both)))
            self.ablate(both)
        if rest:
            self.note("the workload", "one at a time: " + ",".join(s.spec for s in rest))
            self.singles(rest)
