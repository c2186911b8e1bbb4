"""What share of the fit a step figure covers: the note ``run``, ``ladder`` and ``ab`` print.

Their step figures leave out what the target's fit also does (validation, checkpoint saves,
start-up, epoch edges, logging). The note costs nothing to make: each run records what the target's
fit has beside its steps (:func:`~fastloop.drivers.fit_parts.fit_parts`: a validation loop,
checkpoints, a progress bar, a logger: read off the module, its data and its Trainer settings,
nothing run); when ``--out`` holds the document of a plain fit of the same target on the same
device (``fit.json``, which ``fastloop fit --out`` keeps there), the note gives that fit's measured
shares; otherwise it names what is left out and the command that measures it.

Example:
    >>> doc = {"kind": "run", "target": "demo", "device": "cpu", "fit_parts": {"validates": True, "checkpoints": True}}
    >>> fit_share(doc, None)["note"][:59]
    'These step figures leave out what the fit of demo also does'
"""

from __future__ import annotations

import json
from pathlib import Path

from fastloop.drivers.fit import FIT_RECORD
from fastloop.drivers.fit_parts import fit_parts

__all__ = ["fit_parts", "fit_share", "keep_fit_record"]


def _parts_of(doc: dict) -> dict | None:
    """What a run recorded of its target's fit (``extra.fit_parts``): the run's, a ladder's first
    rung that has it, an A/B's side A."""

    def parts(config: dict) -> dict | None:
        return (config.get("extra") or {}).get("fit_parts") or config.get("fit_parts")

    if doc.get("kind") == "ladder":
        return next((parts(r) for r in doc.get("rungs") or [] if parts(r)), None)
    if doc.get("kind") == "ab":
        return parts(doc.get("a") or {})
    return parts(doc)


def _plain_fit(doc: dict, out: str | None) -> tuple[dict, str] | None:
    """The plain fit of the same target and device kept in ``out`` (its document and path)."""
    if not out:
        return None
    path = Path(out) / FIT_RECORD
    try:
        fit = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    same = fit.get("target") == doc.get("target") and fit.get("device") == doc.get("device")
    plain = (fit.get("settings") or {}).get("speedups_asked") in ("none", "", None)
    return (fit, str(path)) if same and plain and not fit.get("failed") and fit.get("wall_s") else None


def _measured_note(fit: dict, path: str) -> str:
    wall = fit["wall_s"]
    shares = sorted(((k, v / wall) for k, v in fit["phases"].items() if k != "train" and v > 0), key=lambda x: -x[1])
    covers = (fit.get("step_only") or {}).get("covers_frac")
    rest = ", ".join(f"{k} {100 * f:.0f}%" for k, f in shares if f >= 0.005)
    epochs = len(fit.get("epochs") or [])
    return (
        f"These step figures cover the training steps only: in a plain fit of this target ({path}, {epochs} "
        f"epoch{'s' if epochs != 1 else ''}, {wall:.1f} s) the steps took {100 * fit['phases']['train'] / wall:.0f}% "
        f"of the wall clock"
        + (f" (batches x the median step: {100 * covers:.0f}%)" if covers else "")
        + (f"; the rest: {rest}" if rest else "")
        + "."
    )


def fit_share(doc: dict, out: str | None) -> dict | None:
    """The note for a ``run``, ``ladder`` or ``ab`` document whose target validates or checkpoints
    (None when its runs did not record what the fit has, or it has neither)."""
    parts = _parts_of(doc)
    if not parts or not (parts.get("validates") or parts.get("checkpoints")):
        return None
    found = _plain_fit(doc, out)
    if found is not None:
        return {**parts, "measured": found[1], "note": _measured_note(*found)}
    left = [w for w, k in (("validation", "validates"), ("checkpoint saves", "checkpoints")) if parts.get(k)]
    target = doc.get("target")
    return {
        **parts,
        "measured": None,
        "note": f"These step figures leave out what the fit of {target} also does ({', '.join(left)}, start-up, "
        f"compiles, epoch edges, logging): `fastloop fit {target} --epochs N --out DIR` measures the share of "
        "the fit they cover, and a report written to the same DIR then quotes it.",
    }


def keep_fit_record(doc: dict, out: str | None) -> None:
    """Keep a fit's document in ``out`` as ``fit.json`` (a later run's note reads it)."""
    if not out:
        return
    from fastloop.report.files import atomic_write, to_json

    Path(out).mkdir(parents=True, exist_ok=True)
    atomic_write(Path(out) / FIT_RECORD, to_json(doc))
