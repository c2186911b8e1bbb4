"""pad_buckets' check before it applies: on a few batches, unpadded and padded, the model's outputs
on the real positions (where a forward takes the batch) and the step's loss, in eval mode, must
agree within the option's ``rtol``; else the speedup is skipped with "the model's output depends on
the padding (is the mask used?)". The record says which were compared.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from fastloop.data import map_tensors
from fastloop.speedups.records import Skip
from fastloop.speedups.run import Run, eval_call

__all__ = ["check_equivalence", "tensor_names", "tensors_of"]


def tensor_names(batch: Any) -> list[str]:
    """A name for each tensor of ``batch``, in :func:`~fastloop.data.map_tensors`'s order
    (``input_ids``, ``0``, ``inputs.mask``)."""
    names: list[str] = []

    def walk(x: Any, prefix: str) -> None:
        if torch.is_tensor(x):
            names.append(prefix or "batch")
        elif isinstance(x, Mapping):
            for k, v in x.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{prefix}.{i}" if prefix else str(i))
        elif hasattr(x, "__dataclass_fields__") and not isinstance(x, type):
            for f in x.__dataclass_fields__.values():
                walk(getattr(x, f.name), f"{prefix}.{f.name}" if prefix else f.name)

    walk(batch, "")
    return names


def tensors_of(batch: Any) -> list[torch.Tensor]:
    """Every tensor of ``batch``, in its order."""
    found: list[torch.Tensor] = []
    map_tensors(lambda t: found.append(t) or t, batch)
    return found


def _forward(model: Any, batch: Any) -> list[torch.Tensor] | None:
    """The model's outputs on ``batch`` in eval mode (``model(**batch)`` for a dict, its forward's
    keys only, else
    ``model(batch)``, then ``model(batch[0])``), as a list of tensors; None where no such forward
    takes the batch."""
    if isinstance(batch, Mapping):  # the keys its forward names (labels are the loss's, not the forward's)
        try:
            params = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            return None
        takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        args = {k: v for k, v in batch.items() if takes_all or k in params}
    calls = [lambda: model(**args)] if isinstance(batch, Mapping) else [lambda: model(batch)]
    if isinstance(batch, (list, tuple)) and batch:
        calls.append(lambda: model(batch[0]))
    for call in calls:
        try:
            out = tensors_of(eval_call(model, call))
        except Exception:  # noqa: BLE001 - this forward does not take the batch: try the next, else the loss
            continue
        if out and all(t.is_floating_point() for t in out):
            return out
    return None


def _real_part(padded: torch.Tensor, like: torch.Tensor, side: str) -> torch.Tensor | None:
    """``padded`` cut to ``like``'s shape along the one dimension the padding lengthened (the real
    positions, at the tail or the head); None where the shapes differ otherwise."""
    if padded.shape == like.shape:
        return padded
    diff = [d for d in range(padded.dim()) if padded.shape[d] != like.shape[d]] if padded.dim() == like.dim() else []
    if len(diff) != 1 or padded.shape[diff[0]] < like.shape[diff[0]]:
        return None
    d, n = diff[0], like.shape[diff[0]]
    return padded.narrow(d, 0, n) if side == "tail" else padded.narrow(d, padded.shape[d] - n, n)


def _outputs_differ(model: Any, plan: Any, b: Any, padded: Any, rtol: float) -> tuple[bool, float] | None:
    """Compare the model's outputs on the real positions, unpadded against padded: (differ, the
    largest difference relative to the outputs' scale), or None where no forward takes the batch
    or the outputs cannot be lined up."""
    a, p = _forward(model, b), _forward(model, padded)
    if a is None or p is None or len(a) != len(p):
        return None
    side = plan.pads[0].side if plan.pads else "tail"
    worst = 0.0
    for x, y in zip(a, p):
        y = _real_part(y, x, side)
        if y is None:
            return None
        scale = float(x.abs().max()) if x.numel() else 0.0
        rel = float((x.float() - y.float()).abs().max()) / max(scale, 1e-6) if x.numel() else 0.0
        worst = max(worst, rel)
    return worst > rtol, worst


def check_equivalence(run: Run, plan: Any, batches: list[Any], rtol: float) -> str:
    """Compare, on original and padded batches, the model's outputs on the real positions (where a
    forward takes the batch) and the step's loss, in eval mode; the detail line, or :class:`Skip`."""
    worst, compared, out_worst, out_compared = 0.0, 0, 0.0, 0
    for b in batches:
        padded = plan.pad(b)
        if all(x.shape == y.shape for x, y in zip(tensors_of(b), tensors_of(padded))):
            continue  # already a bucket's length: nothing to compare
        try:
            a, p = run.batch_loss(b), run.batch_loss(padded)
            outs = _outputs_differ(run.model, plan, b, padded, rtol)
        except Skip:
            raise
        except Exception as err:  # noqa: BLE001 - the padded batch broke the step: not applied
            raise Skip(
                f"the step failed on a padded batch ({type(err).__name__}: {str(err).splitlines()[0][:160]}); "
                f"padding changes what it can take"
            ) from None
        if outs is not None:
            out_worst, out_compared = max(out_worst, outs[1]), out_compared + 1
            if outs[0]:
                raise Skip(
                    f"the model's output depends on the padding (is the mask used?): its outputs on the real "
                    f"positions differ by {outs[1]:.2g} of their scale (> {rtol:g})"
                )
        a, p = float(a), float(p)
        rel = abs(a - p) / max(abs(a), 1e-12)
        worst, compared = max(worst, rel), compared + 1
        if not rel <= rtol:
            raise Skip(
                f"the model's output depends on the padding (is the mask used?): its loss was {a:.6g} unpadded "
                f"and {p:.6g} padded (relative difference {rel:.2g} > {rtol:g})"
            )
    if not compared:
        raise Skip("every sampled batch already had a bucket's length: the padding could not be checked")
    outs = (
        f"the model's outputs on the real positions (max difference {out_worst:.1e} of their scale) and "
        if out_compared
        else ""
    )
    return (
        f"{outs}the step's loss in eval mode agreed on {compared} batch(es) padded and unpadded (max relative "
        f"difference {worst:.1e})"
        + ("" if out_compared else "; no forward of the model takes the batch: its outputs were not compared")
    )
