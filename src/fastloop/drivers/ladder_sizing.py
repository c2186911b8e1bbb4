"""Sizes measured where they run: a kept speedup that sizes itself in each run from a probe of its
own (the loader's worker count, measured on the loader alone) is measured at the neighbouring
sizes in the whole configuration, the training process doing its real work, and pinned to the
size that trains fastest.

Alone, a loader's rate climbs with every worker up to the core count; in training, each worker
past what the step consumes takes a core the training process needs (its Python, the copy to the
device, the kernels' launches). Round 20's U-Net: 16 workers measured fastest alone (14,328
samples/s), trained at 3.8-4.1k/s with 28-33% data wait, where an expert's 8 ran as fast or
faster. So the search compares the configuration as kept (the probe's size) with the next size
down, in interleaved fresh runs; a smaller size is kept when it is not missed (not significantly
slower, and at most ``ABLATION_LOSS`` slower at the point estimate: fewer processes, less to go
wrong), a size is kept when significantly faster; the next size up is measured only while the
step still waits for data. The report lists each size measured in the configuration, its rate
and its data wait. Where the probe kept the user's own size alone (the speedup skipped itself:
round 25's U-Net, "8 workers would save the main process 9.9% of its time") and the
configuration still waits for data, the larger sizes the probe measured are tried in turn. Where
a feed bundle is not kept with the size its probe chose alone while the step waits for data, the
bundle is measured once more with the next size down (:func:`retry_smaller`).

Example:
    >>> from fastloop.speedups import REGISTRY
    >>> REGISTRY["workers"].sizes_around({"num_workers": 16, "loader_rates": {"0": 1.0, "4": 3.0, "8": 5.0, "16": 6.0}})
    (16, [8])
"""

from __future__ import annotations

from typing import Any

from fastloop.compare import Runs, merge_runs
from fastloop.drivers.ladder_gates import ABLATION_LOSS
from fastloop.speedups import REGISTRY, resolve
from fastloop.speedups.base import name_of

__all__ = ["SIZING_WAIT", "as_sized", "retry_smaller", "size_in_configuration"]

SIZING_WAIT = 0.05
"""The best configuration's data-wait fraction from which a larger size is measured too."""


def as_sized(selected: list[str], members: list[str]) -> list[str]:
    """``members`` as they are now selected (a self-sized one pinned to the size measured fastest).

    Example:
        >>> as_sized(["bf16", "workers:8", "pin_memory"], ["workers", "pin_memory", "prefetch"])
        ['workers:8', 'pin_memory', 'prefetch']
    """
    return [next((s for s in selected if name_of(s) == name_of(m)), m) for m in members]


def _chosen(runs: Runs, stat: str) -> int | None:
    """The size the runs chose (the most common, where the probe's noise made them differ)."""
    sizes = [int(d["extra"][stat]) for d in runs.docs if isinstance((d.get("extra") or {}).get(stat), (int, float))]
    return max(set(sizes), key=sizes.count) if sizes else None


def _best_wait(L: Any) -> float:
    """The data-wait fraction of the best configuration's kept runs (0 where it has none)."""
    now = L.best_runs.get(L.spec_with())
    return (merge_runs(now).get("data_wait_frac") or 0.0) if now is not None and now.docs else 0.0


def size_in_configuration(search: Any, stage: str = "sizes measured in the configuration") -> None:
    """For each kept speedup that sized itself (its spec without an option, a ``sizes_around``),
    measure the neighbouring sizes in the whole configuration and keep the one that trains fastest
    (``search``: the :class:`~fastloop.drivers.ladder_search.StagedSearch` under way)."""
    L = search.L
    for spec in [
        s for s in L.selected if ":" not in s and s in REGISTRY and REGISTRY[s].sized_stat and s not in search.sized
    ]:
        search.sized.add(spec)
        best = L.best_runs.get(L.spec_with())
        if best is None or not best.docs:
            break  # nothing measured in the configuration yet: neither loop can size
        extra = merge_runs(best).get("extra") or {}
        chosen, around = REGISTRY[spec].sizes_around(
            {**extra, REGISTRY[spec].sized_stat: _chosen(best, REGISTRY[spec].sized_stat)}
        )
        if chosen is None:
            continue
        if around:
            search.note(
                stage,
                f"{spec} chose {chosen} measured alone; measured in the configuration: "
                + ", ".join(f"{spec}:{n}" for n in around),
            )
        for i, size in enumerate(around):
            wait = _best_wait(L)
            if size > chosen and wait < SIZING_WAIT:
                search.not_tried([f"{spec}:{size}"], f"the step waits {wait:.0%} for data: a larger size cannot help")
                continue
            search.queue(len(around) - i - 1, 1)
            if _try_size(search, spec, chosen, size):
                break
        _pin(search, spec, chosen, stage)

    for spec in sorted(
        s for s in search.inactive if s in REGISTRY and REGISTRY[s].sized_stat and s not in search.sized
    ):
        search.sized.add(spec)
        _size_kept_alone(search, spec, stage)


def _pin(search: Any, spec: str, chosen: int, stage: str) -> None:
    """A self-sized ``spec`` still kept as it sized itself is pinned to the size its runs in the
    configuration chose (``NAME:N``: no probe in later runs), so the final comparison and the
    user's line train with the size measured here, not a fresh probe's. Round 26's U-Net (H100):
    its probe chose 8 workers, 16 measured no faster in the configuration, and the final run's
    own probe chose 16 and waited 30% for data against 15% with 8. The configuration's runs whose
    probe chose another size are dropped from its kept runs."""
    L = search.L
    if spec not in L.selected:
        return  # a size measured in the configuration already replaced it
    old = L.spec_with()
    L.selected[L.selected.index(spec)] = pinned = f"{spec}:{chosen}"
    new, stat = L.spec_with(), REGISTRY[spec].sized_stat
    runs = L.best_runs.pop(old, None)
    if runs is not None:
        same = [d for d in runs.docs if (d.get("extra") or {}).get(stat) == chosen]
        if same:
            L.best_runs[new] = Runs(new, same, list(runs.failures))
    for costs in (L.spec_s, L.spec_warm):
        if old in costs:
            costs.setdefault(new, list(costs[old]))
    search.note(stage, f"{spec} pinned to {pinned}: the size its runs in the configuration trained with")


def _size_kept_alone(search: Any, spec: str, stage: str) -> None:
    """A self-sized speedup whose probe kept the user's own size alone (it skipped itself, round
    25's U-Net: "8 workers would save the main process 9.9% of its time") while the configuration
    still waits for data: the larger sizes the probe measured are added in turn (``NAME:N``, no
    probe), each kept when it trains significantly faster, until one is not or the wait is gone."""
    L = search.L
    best = L.best_runs.get(L.spec_with())
    if best is None or not best.docs:
        return
    merged = merge_runs(best)
    own, above = REGISTRY[spec].sizes_above_kept(merged.get("extra") or {})
    wait = merged.get("data_wait_frac") or 0.0
    if own is None or not above or wait < SIZING_WAIT:
        return
    search.note(
        stage,
        f"{spec} kept the loader's own {own} measured alone; the step waits {wait:.0%} for data: "
        "measured in the configuration: " + ", ".join(f"{spec}:{n}" for n in above),
    )
    for i, size in enumerate(above):
        wait = _best_wait(L)
        if i and wait < SIZING_WAIT:
            search.not_tried(
                [f"{spec}:{n}" for n in above[i:]], f"the step waits {wait:.0%} for data: a larger size cannot help"
            )
            return
        search.queue(len(above) - i - 1, 1)
        count = len(L.rungs)
        if i:  # in place of the size kept before it
            kept = _try_size(search, spec, above[i - 1], size, current=f"{spec}:{above[i - 1]}")
        else:
            kept = search.try_adding(
                resolve(f"{spec}:{size}"),
                f"+{spec}:{size} (the probe alone kept the loader's own {own})",
                tell_rate=False,
            )
        if len(L.rungs) > count:
            L.rungs[-1]["sized"] = spec
        search.queue(0)
        if not kept:
            return


def _try_size(search: Any, spec: str, chosen: int, size: int, current: str | None = None) -> bool:
    """One size in place of the self-sized spec (``current``: of the size kept before, ``NAME:N``);
    True when it is kept."""
    L = search.L
    sized, current = f"{spec}:{size}", current or spec
    idx = L.selected.index(current)
    base_spec = L.spec_with()
    cand_spec = ",".join(L.base + L.selected[:idx] + [sized] + L.selected[idx + 1 :])
    first = L.first_look(base_spec)
    if not L.fits(first, spec=cand_spec):
        search.not_tried([sized], plan=L.plan(first, cand_spec))
        return False
    fresh, ci, n = L.compare_adaptive(base_spec, cand_spec)
    cand = fresh[cand_spec]
    label = (
        f"{sized} (in place of {spec}, which chose {chosen} alone)"
        if current == spec
        else f"{sized} (in place of {current})"
    )
    than = f"the {chosen} chosen alone" if current == spec else current
    if not cand.docs:
        if cand.failures:
            doc = L.rung_doc(label, cand_spec, cand, "failed", cand.failures[-1])
            doc.update(stage=search.stage, decision=f"kept {current}: {sized} failed")
            L.rungs.append(doc)
        else:
            search.not_tried([sized], plan=L.plan(first, cand_spec))
        return False
    doc = L.rung_doc(label, cand_spec, cand, "applied", "")
    doc.update(vs_spec=base_spec, runs_per_side=n, speedup_vs_prev=ci, stage=search.stage, sized=spec)
    faster = bool(ci and ci["significant"] and ci["ratio"] > 1)
    not_missed = bool(
        ci
        and size < chosen
        and not ci.get("budget")
        and not (ci["significant"] and ci["ratio"] < 1)
        and ci["ratio"] >= 1 - ABLATION_LOSS
    )
    if faster or not_missed:
        why = "faster" if faster else f"fewer, not missed ({ci['verdict']})"
        doc["decision"] = f"kept {sized}: {ci['ratio']:.2f}x {than}, {why}"
        L.selected[idx] = sized
        L.best_runs = {cand_spec: cand}
    else:
        kept = f"{spec} ({chosen})" if current == spec else current
        doc["decision"] = (
            f"kept {kept}: {sized} {ci['ratio']:.2f}x ({ci['verdict']})" if ci else f"kept {kept}: no comparison"
        )
        if ci and ci.get("budget"):
            search.cut_short(sized, len(cand.docs))
    L.rungs.append(doc)
    L.publish()
    return faster or not_missed


def retry_smaller(search: Any, bundle: list, label: str, *, tell_rate: bool) -> bool:
    """A feed bundle just dropped (``L.rungs[-1]``: ``label``, not kept) whose self-sized member
    chose its size alone, while that configuration still waits for data (>= ``SIZING_WAIT``): the
    bundle measured once more with the next size the probe measured below it, in the member's
    place. Round 28's U-Net (H100): alone, 16 workers read 8,350 samples/s against 5,875 with the
    user's 4; in training, the bundle with 16 waited 46% for data and compared 1.18x [0.99, 1.41],
    not significant, so it was dropped and no count was measured where it runs, and the pick waited
    48%. Returns whether the bundle was kept at the smaller size."""
    L = search.L
    doc = L.rungs[-1] if L.rungs else {}
    if (
        doc.get("rung") != label
        or doc.get("rung_status") != "applied"
        or (doc.get("data_wait_frac") or 0.0) < SIZING_WAIT
    ):
        return False
    for member in bundle:
        if ":" in member.spec or not REGISTRY[member.name].sized_stat:
            continue
        chosen, around = REGISTRY[member.name].sizes_around(doc.get("extra") or {})
        below = [n for n in around if chosen is not None and n < chosen]
        if not below:
            continue
        sized = f"{member.name}:{below[0]}"
        search.note(
            search.stage,
            f"{label.lstrip('+')} not kept with {member.name} at the {chosen} chosen alone, "
            f"waiting {doc['data_wait_frac']:.0%} for data: measured again with {sized}",
        )
        again = [resolve(sized)[0] if t is member else t for t in bundle]
        count = len(L.rungs)
        doc["decision"] += f"; measured again with {sized}"
        kept = search.try_adding(
            again, f"{label} with {sized} (in place of the {chosen} chosen alone)", tell_rate=tell_rate
        )
        if len(L.rungs) > count:
            L.rungs[-1]["sized"] = member.name
        if kept:  # the tie the first measurement reported no longer decides anything
            L.ties = [t for t in L.ties if t["other"] != doc["spec"]]
        return kept
    return False
