"""The ladder's words: every sentence its document says (a rung's decision, why something was not
measured, a stage's action, the feed line, the answer lines, the method), written here from the
numbers the search and the gates decide on, so that the search reads as decisions and the report's
wording changes in one place. It sits in the drivers' layer with the ladder: the advice filter it
applies is the doctor's (:func:`~fastloop.drivers.doctor.without_measured`).

Example:
    >>> kept_faster(1.5, "none")
    'kept: 1.50x faster than none'
    >>> dropped({"verdict": "no significant difference"}) + budget_ended(2)
    'dropped: no significant difference (the budget ended the comparison after 2 run(s) of it)'
"""

from __future__ import annotations

from fastloop.compare import VERDICT_CONFIDENCE
from fastloop.drivers.doctor import without_measured
from fastloop.measure.run_result import RunResult
from fastloop.measure.stats import MIN_EFFECT
from fastloop.speedups.base import name_of

__all__ = [
    "ALONE_BUDGET",
    "BUNDLE_NOT_FASTER",
    "NOTHING_KEPT",
    "KEPT_CUMULATIVE",
    "TIE_WHY",
    "ablation_action",
    "ablation_budget_ended",
    "ablation_failed",
    "ablation_kept",
    "ablation_removed",
    "ablation_waits",
    "answer_lines",
    "baseline_label",
    "budget_ended",
    "comparison_failed",
    "compute_action",
    "compute_feed_note",
    "dropped",
    "dropped_after_one_run",
    "dropped_futile",
    "dropped_inactive",
    "feed_action",
    "feed_busy_gpu",
    "feed_host_bound",
    "feed_line",
    "FIT_ASSUMES",
    "FIT_NOT_RECORDED",
    "fit_budget",
    "fit_callbacks_line",
    "fit_method_why",
    "fit_nothing_to_shorten",
    "fit_predicted_for",
    "fit_rung_decision",
    "filter_advice",
    "in_progress",
    "pick_refused",
    "inactive_in_run",
    "inactive_member",
    "inactive_reasons",
    "kept_faster",
    "larger_cannot_help",
    "measured_again",
    "measured_not_faster",
    "method",
    "model_rules_out",
    "moved_head",
    "one_at_a_time",
    "pinned",
    "pooled_verdict",
    "retry_label",
    "retry_note",
    "shapes_padded",
    "size_above_label",
    "size_failed",
    "size_kept",
    "size_label",
    "size_not_kept",
    "sizes_above_kept",
    "sizes_around",
    "tie_text",
]

TIE_WHY = "the simpler (fewer speedups, less to go wrong)"
"""Why a tie keeps the configuration it keeps (the ``why`` of each entry of ``ties``)."""


# -- a rung's decision ---------------------------------------------------------------------------
def kept_faster(ratio: float, base_spec: str, per: str | None = None) -> str:
    """A candidate kept: how much faster than the configuration it was added to."""
    per_item = " per item (throughput; its batch size differs)" if per == "item" else ""
    return f"kept: {ratio:.2f}x faster than {base_spec}{per_item}"


def dropped(ci: dict | None) -> str:
    """A candidate not kept: the comparison's verdict."""
    return "dropped: " + (ci["verdict"] if ci else "no comparison")


def budget_ended(runs: int) -> str:
    """Said after a decision the budget ended before its interval could call it."""
    return f" (the budget ended the comparison after {runs} run(s) of it)"


KEPT_CUMULATIVE = "kept (cumulative ladder)"


def dropped_after_one_run(ci: dict, base_runs: int, base_spec: str) -> str:
    return (
        f"dropped after one run: {ci['verdict']}, against the spread of "
        f"{base_runs} runs of {base_spec} (prediction interval)"
    )


def dropped_futile(ci: dict, min_gain: float, runs: int) -> str:
    return (
        f"dropped: {ci['verdict']}; at most {ci['ci_high']:.3f}x faster "
        f"(below {min_gain}x), so no more runs after {runs} a side"
    )


def dropped_inactive(record: dict) -> str:
    """A candidate that skipped itself or fell back inside its process (``record``: its own record)."""
    return f"dropped: {record['status']} inside its process ({record['reason']})"


def inactive_in_run(name: str, status: str) -> str:
    """Why a configuration is not run again: its candidate skipped itself or fell back in a run."""
    return f"{name} {status} inside its process"


def inactive_member(record: dict) -> str:
    """What a member that did nothing inside its process did (its own record: status, reason)."""
    return f"{record['status']}: {record['reason']}"


def inactive_reasons(inactive: dict[str, str]) -> str:
    """A rung whose every member was inactive: each member and what it did."""
    return "; ".join(f"{n} {v}" for n, v in inactive.items())


def comparison_failed(cand_failures: list[str], base_failures: list[str]) -> str:
    """Why a comparison has no verdict: the candidate's failure, else its base's, else no run."""
    if cand_failures:
        return cand_failures[-1]
    if base_failures:
        return f"its comparison base failed: {base_failures[-1]}"
    return "no run finished"


def tie_text(kept: str, other: str, negligible: bool) -> str:
    """Appended to a decision whose comparison could not tell the two configurations apart."""
    how = f"are apart by less than {100 * MIN_EFFECT:g}%" if negligible else "tie within the noise"
    return f"; {kept} and {other} {how}: the simpler, {kept}, is kept"


def moved_head(label: str, now: str, evidence: str, feed: str | None) -> str:
    """The bottleneck's move after a kept rung, before its advice (the advice is the rung's own,
    filtered when the document is written: :func:`filter_advice`)."""
    feed_part = f" ({feed})" if now == "data-bound" and feed else ""
    return f"after {label}: {now}: {evidence}{feed_part}"


# -- an ablation's decision ----------------------------------------------------------------------
def ablation_failed(spec: str) -> str:
    return f"kept {spec}: the configuration without it failed"


def ablation_budget_ended(spec: str, runs: int, ratio: float | None) -> str:
    point = f" ({ratio:.2f}x without it at the point estimate)" if ratio else ""
    return f"kept {spec}: the budget ended its ablation after {runs} run(s)" + point


def ablation_kept(spec: str, ci: dict, loss: float) -> str:
    """A member missed: significantly slower without it, or more than ``loss`` at the point estimate."""
    significant = ci["significant"] and ci["ratio"] < 1
    why = "" if significant else f"; kept as more than {100 * loss:.0f}% slower without it at the point estimate"
    return f"kept {spec}: without it {ci['ratio']:.2f}x ({ci['verdict']}{why})"


def ablation_removed(spec: str, ci: dict | None) -> str:
    return f"removed {spec}: not missed ({ci['verdict'] if ci else 'no comparison'})"


# -- sizes measured in the configuration ---------------------------------------------------------
def size_label(sized: str, spec: str, chosen: int, current: str) -> str:
    """The rung of one size in place of the self-sized ``spec`` (``current``: what it replaces)."""
    return (
        f"{sized} (in place of {spec}, which chose {chosen} alone)"
        if current == spec
        else f"{sized} (in place of {current})"
    )


def size_failed(current: str, sized: str) -> str:
    return f"kept {current}: {sized} failed"


def size_kept(sized: str, spec: str, chosen: int, current: str, ci: dict, faster: bool) -> str:
    than = f"the {chosen} chosen alone" if current == spec else current
    why = "faster" if faster else f"fewer, not missed ({ci['verdict']})"
    return f"kept {sized}: {ci['ratio']:.2f}x {than}, {why}"


def size_not_kept(sized: str, spec: str, chosen: int, current: str, ci: dict | None) -> str:
    kept = f"{spec} ({chosen})" if current == spec else current
    return f"kept {kept}: {sized} {ci['ratio']:.2f}x ({ci['verdict']})" if ci else f"kept {kept}: no comparison"


def sizes_around(spec: str, chosen: int, around: list[int]) -> str:
    return f"{spec} chose {chosen} measured alone; measured in the configuration: " + ", ".join(
        f"{spec}:{n}" for n in around
    )


def sizes_above_kept(spec: str, own: int, wait: float, above: list[int]) -> str:
    return (
        f"{spec} kept the loader's own {own} measured alone; the step waits {wait:.0%} for data: "
        "measured in the configuration: " + ", ".join(f"{spec}:{n}" for n in above)
    )


def size_above_label(spec: str, size: int, own: int) -> str:
    return f"+{spec}:{size} (the probe alone kept the loader's own {own})"


def larger_cannot_help(wait: float) -> str:
    """Why a larger size is not measured."""
    return f"the step waits {wait:.0%} for data: a larger size cannot help"


def pinned(spec: str, pinned_spec: str) -> str:
    return f"{spec} pinned to {pinned_spec}: the size its runs in the configuration trained with"


def retry_note(label: str, name: str, chosen: int, wait: float, sized: str) -> str:
    return (
        f"{label.lstrip('+')} not kept with {name} at the {chosen} chosen alone, "
        f"waiting {wait:.0%} for data: measured again with {sized}"
    )


def retry_label(label: str, sized: str, chosen: int) -> str:
    return f"{label} with {sized} (in place of the {chosen} chosen alone)"


def measured_again(sized: str) -> str:
    """Appended to the decision of a feed bundle measured once more at a smaller size."""
    return f"; measured again with {sized}"


# -- the stages' actions and what was not measured -----------------------------------------------
def model_rules_out(reason: str) -> str:
    return f"not measured: {reason}"


def feed_busy_gpu(spec: str, busy: float, wait: float, bound: float) -> str:
    return (
        f"not measured: the best configuration so far ({spec}) keeps the GPU busy {100 * busy:.0f}% "
        f"of its step and waits for data {100 * wait:.1f}%; a faster feed could gain at most {bound:.3f}x"
    )


def feed_host_bound(spec: str, host: float, wait: float, bound: float, *, copy_share: bool, copy_speedup: bool) -> str:
    """A feed speedup not measured on a step that hardly waits and spends little of the host's time
    getting batches (``copy_share``: ``host`` is the copy's share alone; ``copy_speedup``: the
    speedup makes only the copy faster)."""
    part = "copying batches to the device" if copy_share else "getting batches (loader + copy)"
    return (
        f"not measured: the best configuration so far ({spec}) spends {100 * host:.1f}% of its "
        f"step's host time {part} and the step waits for them {100 * wait:.1f}%; "
        f"{'a faster copy' if copy_speedup else 'a faster feed'} could gain at most {bound:.3f}x"
    )


def feed_action(specs: list[str], blocked: list[str]) -> str:
    """The feed stage's action: the feed measured, or why not (the first reason)."""
    return ("feed: " + ", ".join(specs)) if specs else "feed not measured: " + blocked[0]


def compute_action(specs: list[str], note: str) -> str:
    return "compute bundle: " + ",".join(specs) + note


def compute_feed_note(wait: float, feeds: list[str], feed_first_wait: float) -> str:
    """What the compute rungs are measured on, for the report: the feed fixed first (a data-bound
    baseline), or the user's feed, and how much of the best step waits for it."""
    if feeds and wait < feed_first_wait:
        return f"; measured on the feed fixed first ({','.join(feeds)}; the step waits {wait:.0%} for data)"
    if feeds:
        return (
            f"; measured on the feed chosen first ({','.join(feeds)}), which still leaves the step waiting "
            f"{wait:.0%} for data, so a faster step may not show"
        )
    if wait >= feed_first_wait:
        return (
            f"; measured on the user's feed, which no feed rung improved: the step waits {wait:.0%} for data, "
            f"so a faster step may not show"
        )
    return ""


def shapes_padded(spec: str) -> str:
    return (
        f"the batches change shape: padded to a few lengths ({spec}), so compile and "
        f"CUDA graphs are measured on its few shapes"
    )


def ablation_waits(wait: float) -> str:
    return (
        f"its ablation waits until the feed is checked: the faster step waits {wait:.0%} "
        f"for data, and a member taken out would be hidden behind the wait"
    )


BUNDLE_NOT_FASTER = "the bundle was not faster: each compute speedup alone"
ALONE_BUDGET = "alone: budget (measured in the compute bundle, which was not faster)"
"""Why a member of a compute bundle measured and not faster was not tried alone."""


def ablation_action(members: list[str]) -> str:
    return "ablation: " + ",".join(members)


def one_at_a_time(specs: list[str]) -> str:
    return "one at a time: " + ",".join(specs)


# -- the document ----------------------------------------------------------------------------------
def feed_line(doc: dict) -> str:
    """The loader's rate against the step's demand, from one rung's measurement, and the host's
    time getting each batch where it was timed apart (``host_fetch_s``).

    Example:
        >>> feed_line({"step_s": {"mean": 0.1}, "data_wait_frac": 0.5, "items_per_step": 10})
        'the loader delivers ~100 items/s and the step alone would consume ~200/s'
    """
    run = RunResult.from_dict(doc)
    mean, wait, items = run.step_s.mean, run.data_wait_frac or 0.0, run.items_per_step
    if not (mean and items):
        return ""
    demand = items / (mean * (1 - wait)) if wait < 1 else float("inf")
    line = f"the loader delivers ~{items / mean:,.0f} items/s and the step alone would consume ~{demand:,.0f}/s"
    return line + _fetch_clause(run)


def _fetch_clause(run: RunResult) -> str:
    """'; getting a batch takes X ms of the host's time (copy Y ms)' where the feed clock timed it."""
    fetch, copy = run.host_fetch_s, run.host_copy_s
    if not fetch:
        return ""
    return f"; getting a batch takes {1e3 * fetch:.2f} ms of the host's time" + (
        f" (the copy to the device {1e3 * copy:.2f} ms of it)" if copy else ""
    )


def measured_not_faster(rungs: list[dict]) -> dict[str, str]:
    """Speedups this ladder measured and found not faster (a rung of one speedup dropped, or a
    member the ablation found not missed): name -> what was measured."""
    out: dict[str, str] = {}
    for r in rungs:
        ci = r.get("speedup_vs_prev")
        names = r.get("measured_not_faster")
        if (
            names is None
            and str(r.get("rung", "")).startswith("+")
            and str(r.get("decision", "")).startswith("dropped")
        ):
            names = [name_of(r["rung"][1:].partition(" (")[0])] if "," not in r["rung"] else []
        if not names or not ci or ci.get("ratio") is None:
            continue
        span = (
            f" [{ci['ci_low']:.2f}, {ci['ci_high']:.2f}]"
            if ci.get("ci_low") is not None and ci.get("ci_high") is not None
            else ""
        )
        what = "without it " if r.get("ablation") else ""
        sig = (
            ("slower" if ci["ratio"] < 1 else "faster")
            if ci.get("significant")
            else f"less than {100 * MIN_EFFECT:g}%, no meaningful difference"
            if ci.get("negligible")
            else "no significant difference"
        )
        for name in names:
            out[name] = f"{what}{ci['ratio']:.2f}x{span}, {sig}"
    return out


def filter_advice(rungs: list[dict], moved: list[str | None]) -> None:
    """No rung's advice recommends a speedup that this ladder measured as not faster; each rung's
    ``bottleneck_moved`` (``moved``: its head, :func:`moved_head`, or None) ends in its advice as
    filtered."""
    measured = measured_not_faster(rungs)
    for r, head in zip(rungs, moved):
        if measured and r.get("bottleneck"):
            r["bottleneck"] = without_measured(r["bottleneck"], measured)
        if head is not None:
            r["bottleneck_moved"] = f"{head} next: {r['bottleneck']['recommendation']}"


def answer_lines(spec: str, selected: bool, measured: bool, not_tried: int) -> dict[str, str]:
    """The ladder's answer as the lines a user pastes: the callbacks and the plain-loop line for a
    set measured against the baseline, else a comment that says why there is none.

    Example:
        >>> answer_lines("", False, False, 3)["callbacks_line"][:47]
        '# no speedup helped measurably in the budget; 3'
    """
    if selected and measured:
        return {
            "callbacks_line": f'Trainer(..., callbacks=fastloop.lightning.callbacks("{spec}"))',
            "loop_line": f'FastLoop(model, optimizer, loader, loss_fn=..., speedups="{spec}")',
        }
    if selected:
        return {"callbacks_line": "# the selected set was not measured against the baseline (interrupted or failed)"}
    if not_tried:
        return {
            "callbacks_line": f"# no speedup helped measurably in the budget; {not_tried} not tried or not finished "
            f"(see 'Not tried'; a larger --budget measures them)"
        }
    return {"callbacks_line": "# no speedup helped measurably on this model and machine"}


def method(min_repeats: int, max_repeats: int, early_drop: float, min_gain: float) -> str:
    """How each comparison was made, for the document's ``method``."""
    return (
        f"each comparison: interleaved fresh-process runs, {min_repeats} to {max_repeats} a side; "
        f"paired t-interval on log mean-step-time ratios at {100 * VERDICT_CONFIDENCE:g}% overall "
        "confidence (Bonferroni over the looks); in the selecting ladder a candidate's first run is "
        f"a look too, and one {100 * (1 - early_drop):g}% or more slower than the best configuration, "
        "outside the prediction interval of that configuration's runs, is dropped there; a comparison "
        f"whose interval's upper end falls below {min_gain}x stops (at most {100 * (min_gain - 1):g}% "
        "faster: not worth keeping)"
    )


def pooled_verdict(verdict: str, cut_ratio: float) -> str:
    """The verdict of a final comparison the budget cut, called on every run of both pooled."""
    return verdict + (
        f" (every run of both in the ladder, Welch: the interleaved final comparison was cut by the "
        f"budget at {cut_ratio:.2f}x, not significant)"
    )


def in_progress(state: str, spec: str, runs: int) -> tuple[str, str]:
    """The label and reason of a comparison's runs that finished before it ended."""
    return f"{state}: {spec}", f"{runs} run(s) finished before the comparison ended"


def baseline_label(base_spec: str, has_base: bool) -> str:
    return f"baseline ({base_spec})" if has_base else "baseline"


NOTHING_KEPT = "nothing was kept: the baseline"


def pick_refused(pick_spec: str) -> str:
    """The callbacks line when the check refused the pick and nothing passed."""
    return f"# the pick ({pick_spec}) trained differently from the baseline (the check): none is recommended"


# -- the fit objective (fit_objective.py) -------------------------------------------------------------
FIT_ASSUMES = (
    "the step's measured speedup shortens the training phase alone (its interval gives the prediction's); "
    "validation, checkpoint saves, logging syncs, epoch edges and start-up stay as in the plain fit unless a kept "
    "fit speedup shortens them (its phase as measured in the fit with it); the pick's compile is its step runs' "
    "compile seconds; the short fit's phases are scaled to a whole epoch by batches (steady steps, validation and "
    "logging syncs per batch)"
)
"""What the fit objective's prediction takes as given (the document's ``fit.assumes``)."""
FIT_NOT_RECORDED = "the fit with it has no record of it (it did not run)"
PART_WORDS = {
    "validates": "validation loop",
    "checkpoints": "checkpoint save",
    "logs": "logger",
    "progress_bar": "progress bar",
}
"""How the fit objective names what a target's fit has (the keys of ``fit_parts``)."""


def fit_nothing_to_shorten(phase: str | None, needs: tuple[str, ...]) -> str:
    """Why a fit speedup is not measured: the target's fit has nothing in its phase.

    Example:
        >>> fit_nothing_to_shorten("host_syncs", ("logs", "progress_bar"))
        "the target's fit has no logger or progress bar (read off the target, not run): no host_syncs to shorten"
    """
    has = " or ".join(PART_WORDS.get(n, n) for n in needs)
    return f"the target's fit has no {has} (read off the target, not run): no {phase} to shorten"


def fit_budget(plan: dict) -> str:
    """Why the fit with the fit speedups was not measured: the budget."""
    return (
        f"not tried: budget (the fit with it is predicted at {plan['predicted_s']:g} s and {plan['left_s']:g} s "
        "were left, the final comparison's reserve to keep)"
    )


def fit_rung_decision(phase: str, before: float, after: float, kept: bool, gain: float, least_s: float) -> str:
    """A fit speedup's decision from its phase's seconds in the plain fit and in the fit with it
    (kept where at least ``gain`` shorter and ``least_s`` seconds saved).

    Example:
        >>> fit_rung_decision("checkpoint", 2.0, 0.2, True, 0.1, 0.4)
        'kept: checkpoint 2.00 s -> 0.20 s in a whole epoch of the fit (10.0x shorter; one short fit a side)'
        >>> fit_rung_decision("host_syncs", 0.11, 0.07, False, 0.1, 0.4)[:80]
        'dropped: host_syncs 0.11 s -> 0.07 s in a whole epoch of the fit (it saves 0.04 '
    """
    change = f"{phase} {before:.2f} s -> {after:.2f} s in a whole epoch of the fit"
    if kept:
        shorter = f"{before / after:.1f}x shorter" if after > 0 else "gone"
        return f"kept: {change} ({shorter}; one short fit a side)"
    if before <= 0:
        return f"dropped: the plain fit spent no time in {phase}"
    if after > before * (1 - gain):
        return f"dropped: {change} (not {100 * gain:g}% shorter; one short fit a side)"
    return (
        f"dropped: {change} (it saves {before - after:.2f} s, less than {least_s:.2f} s, the least that counts "
        "against one short fit a side)"
    )


def fit_method_why(fit_cost_s: float | None, candidates: int, runs_a_side: int, budget_s: float | None) -> str:
    """Why the fit objective predicts from measured phases rather than measuring each candidate as
    fits: what measuring them would cost (``runs_a_side`` fits for the baseline and for each of the
    ``candidates``) against the budget.

    Example:
        >>> fit_method_why(20.0, 3, 3, 300.0)[:96]
        'a short fit of this target cost 20.0 s; measuring the candidates as fits (12 fits, 3 a side for '
    """
    fits = (candidates + 1) * runs_a_side
    cost = f"a short fit of this target cost {fit_cost_s:.1f} s" if fit_cost_s else "a fit pays its start-up"
    need = f"{fits} fits, {runs_a_side} a side for the baseline and each of {candidates} candidates"
    total = f", about {fits * fit_cost_s:.0f} s" if fit_cost_s else ""
    budget = f" against a budget of {budget_s:.0f} s" if budget_s else ""
    return (
        f"{cost}; measuring the candidates as fits ({need}{total}{budget}) would leave the step's search no room, "
        "so two short fits are measured (plain, and with the fit speedups) and the pick's fit is predicted from "
        "their phases and the step's measured speedup"
    )


def fit_predicted_for(train_batches: int | None, val_batches: int | None) -> str:
    """What fit the prediction is for.

    Example:
        >>> fit_predicted_for(64, 16)
        "one whole epoch of the target's fit (64 training batches; validation runs of 16 batches) and each further one"
    """
    train = f"{train_batches} training batches" if train_batches else "its training batches"
    val = f"; validation runs of {val_batches} batches" if val_batches else ""
    return f"one whole epoch of the target's fit ({train}{val}) and each further one"


def fit_callbacks_line(spec: str) -> str:
    """The line to paste for the fit's pick (the step's pick and the kept fit speedups)."""
    if spec == "none":
        return "# nothing measured helped the fit: train as before"
    return f'Trainer(..., callbacks=fastloop.lightning.callbacks("{spec}"))'
