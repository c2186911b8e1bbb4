"""A/B: two configurations interleaved (A B A B ...), each run a fresh process; the ratio of
mean step times (1 / throughput) with a run-level t-interval, and an honest verdict.

The run is the unit of evidence (fresh processes differ by a few percent); with fewer than
three runs per side the verdict is "too few runs to tell". The default of 5 repeats keeps
A-vs-A "significant" under 5% and finds a true 10% speed-up in ~90% of experiments
(see :data:`fastloop.compare.VERDICT_CONFIDENCE`).

Example:
    >>> fake = lambda t, s, **k: {"step_s_all": [0.010 if s == "none" else 0.005] * 5, "speedups": []}
    >>> doc = run_ab("x", "none", "bf16", repeats=3, measure=fake)
    >>> doc["verdict"]
    'B (bf16) is 2.00x faster than A (none) (97% CI 2.000-2.000)'
"""

from __future__ import annotations

from collections.abc import Callable

from fastloop.compare import Runs, compare, loss_agreement, measure_interleaved, merge_runs, step_rate_of, unsteady_note
from fastloop.drivers.pick_check import PickCheck
from fastloop.drivers.subproc import run_in_subprocess
from fastloop.errors import FastloopError, UserCodeError
from fastloop.speedups.base import resolve

__all__ = ["CHECK_STEPS", "DEFAULT_REPEATS", "run_ab"]

DEFAULT_REPEATS = 5
CHECK_STEPS = 100
"""Steps of each paired run of ``--check`` (the middle of the check's 50-200: an A/B has no budget)."""


def _doc(a: str, b: str, runs: dict[str, Runs], repeats: int, order: list[str] | None = None) -> dict:
    ra, rb = runs[f"a:{a}"], runs[f"b:{b}"]
    sides = {"a": merge_runs(ra), "b": merge_runs(rb)}
    for side, spec in (("a", a), ("b", b)):
        sides[side]["spec"] = spec
    speedup = compare(ra, rb, labels=(f"A ({a})", f"B ({b})"))
    if speedup is None:
        failed = [f"{s.upper()} ({sides[s]['reason']})" for s in ("a", "b") if sides[s].get("failed")]
        verdict = "no verdict: " + ("; ".join(failed) + " failed" if failed else "nothing measured yet")
    else:
        verdict = speedup.pop("verdict")
    first = [r.docs[0].get("losses") if r.docs else None for r in (ra, rb)]
    agreement = loss_agreement(*first)
    items = (speedup or {}).get("items_per_step")  # set by compare() when it compared per item
    if items:  # a batch-size change: compared per item, and the steps see different batches
        ia, ib = (", ".join(map(str, items[side])) for side in ("a", "b"))
        verdict += f"; per item (throughput): B trains on {ib} items per step, A on {ia}"
        agreement = {
            "comparable": False,
            "note": f"not compared: B's steps hold {ib} items and A's {ia}, so their losses are over different batches",
        }
    verdict += unsteady_note(ra, rb)
    return {
        "kind": "ab",
        "a_spec": a,
        "b_spec": b,
        "a": sides["a"],
        "b": sides["b"],
        "repeats": repeats,
        "speedup": speedup,
        "verdict": verdict,
        "loss_agreement": agreement,
        "losses": {"a": first[0], "b": first[1]},
        "run_order": [key.split(":", 1)[0].upper() for key in (order or [])],
        "method": "run-level paired t-interval on the log of mean-step-time ratios (per item when the sides' batch "
        "sizes differ; counterbalanced pairs A B, B A, A B, ... (run_order), "
        "each run a fresh process); fewer than 3 runs per side: too few runs to tell",
    }


def run_ab(
    target: str,
    a: str,
    b: str,
    *,
    repeats: int = DEFAULT_REPEATS,
    steps: int = 30,
    warmup: int = 5,
    device: str = "cpu",
    measure: Callable[..., dict] | None = None,
    progress: Callable[[str], None] | None = None,
    on_update: Callable[[dict], None] | None = None,
    check: bool = False,
) -> dict:
    """Measure A and B interleaved ``repeats`` times; ``on_update(doc)`` after every run.

    ``check``: then check that B trains as A (:class:`~fastloop.drivers.pick_check.PickCheck`: one
    paired run a side of :data:`CHECK_STEPS` steps from the same weights on the same batches, their
    per-step losses within the tolerance of what B changes), in the document's ``"check"``.

    On Ctrl-C the document of the finished runs is returned with ``"interrupted": True``."""

    if not isinstance(repeats, int) or repeats < 1:
        raise FastloopError(f"--repeats must be an integer >= 1, got {repeats!r}")
    resolve(a)
    resolve(b)  # validate both before spending time
    measure = measure or run_in_subprocess
    runs: dict[str, Runs] = {f"a:{a}": Runs(a), f"b:{b}": Runs(b)}

    # B adds only data-pipeline speedups to A: B's runs learn A's step rate (workers weighs its
    # loader against what the step consumes). Not when the sides are the same: telling one side
    # alone would treat them differently, and an A vs A would measure that difference.
    sa, sb = ({s.spec: s.ladder.feeds for s in resolve(x)} for x in (a, b))
    feeds_only = sa != sb and {k for k, f in sa.items() if not f} == {k for k, f in sb.items() if not f}

    def by_side(target_: str, key: str, **kw) -> dict:
        rate = step_rate_of(runs[f"a:{a}"]) if key.startswith("b:") and feeds_only else None
        return measure(target_, key.split(":", 1)[1], **kw, **({"step_rate": rate} if rate else {}))

    order: list[str] = []
    update = (lambda: on_update(_doc(a, b, runs, repeats, order))) if on_update else None
    shown = (lambda text: progress(text.replace("of a:", "of A = ").replace("of b:", "of B = "))) if progress else None
    try:
        measure_interleaved(
            target,
            [f"a:{a}", f"b:{b}"],
            repeats,
            measure=by_side,
            steps=steps,
            warmup=warmup,
            device=device,
            runs=runs,
            progress=shown,
            on_run=update,
            order=order,
        )
    except KeyboardInterrupt:
        doc = _doc(a, b, runs, repeats, order)
        doc["interrupted"] = True
        return doc
    doc = _doc(a, b, runs, repeats, order)
    _raise_side_failure(doc, runs, a, b, on_update)
    if check:
        if progress:
            progress(f"checking that B ({b}) trains as A ({a}): {CHECK_STEPS} paired steps a side")
        doc["check"] = PickCheck(target, measure, device=device, steps=CHECK_STEPS, fallback=False).run(a, b)
        if on_update:
            on_update(doc)
    return doc


def _raise_side_failure(
    doc: dict, runs: dict[str, Runs], a: str, b: str, on_update: Callable[[dict], None] | None
) -> None:
    """The error policy, as ``run`` and ``ladder`` follow it: when the user's code raised on a side
    (exit 1 in its process) or fastloop refused its input (exit 2), the partial report says which
    side failed and the same error is raised here (the CLI exits 1 with the user's frames, or 2)."""
    for side, spec in (("a", a), ("b", b)):
        r = runs[f"{side}:{spec}"]
        rc = r.returncodes[-1] if r.returncodes else None
        if rc not in (1, 2):
            continue
        message = r.failures[-1] if r.failures else f"side {side.upper()} failed"
        doc["failed_side"] = {"side": side.upper(), "spec": spec, "returncode": rc, "reason": message}
        doc["verdict"] = f"no verdict: side {side.upper()} ({spec}) failed: {message}"
        if on_update:
            on_update(doc)
        if rc == 2:
            raise FastloopError(message.split("failed in its process: ", 1)[-1])
        detail = r.details[-1].strip() if r.details else message
        raise UserCodeError(f"side {side.upper()} ({spec}) of the A/B failed, so there is no comparison:\n{detail}")
