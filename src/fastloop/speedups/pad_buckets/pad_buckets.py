"""``pad_buckets``: batches padded per batch to their own longest row are padded on to a few
bucket lengths, so bf16, compile and CUDA graphs see a few shapes instead of one per batch.

The card (when it helps, when it hurts, what it costs): ``docs/speedups/pad_buckets.md``.

What is padded, and with what, is read from the user's own batches, never assumed. A few batches
of the training loader are read (without workers, the random state put back after). A tensor is
padded along a dimension other than the batch dimension whose size changes from batch to batch
(a short last batch is never filled with fake samples). Its pad value is the one the collate
already pads with, read at the padded end of the shorter rows: the value most rows end with
where at least one row of a batch (the longest) ends otherwise. The side (the tail, or the head
for left-padded causal LMs) is the end where the tensors show that pattern. Ids get the pad id,
masks False/0, labels -100 where that is what they hold. A tensor whose pad value cannot be
established (no padded row seen, several values at the padded end) is left alone, and the record
says why.

Before it applies, the padding is checked: the loss the step computes (``training_step`` under
Lightning, the loop's loss function in a plain loop) in eval mode, without gradients and with the
same random state, must agree on the original and the padded batch within ``PadOptions.rtol``.
A model that does not mask its padding changes its output and is refused: "the model's output
depends on the padding (is the mask used?)".

The padding runs inside the loader's collate function (in its workers, where it has them): its
host cost per batch is measured on the sampled batches and reported.

Example:
    >>> import torch
    >>> rows = [torch.tensor([5, 6, 7, 0, 0]), torch.tensor([5, 6, 7, 8, 9])]
    >>> batches = [{"ids": torch.stack(rows), "mask": torch.stack(rows) != 0},
    ...            {"ids": torch.tensor([[4, 0, 0], [4, 4, 4]]), "mask": torch.tensor([[1, 0, 0], [1, 1, 1]]).bool()}]
    >>> plan = find_padding(batches, multiple=4)
    >>> [(p.name, p.dim, p.side, p.value) for p in plan.pads]
    [('ids', 1, 'tail', 0), ('mask', 1, 'tail', False)]
    >>> plan.buckets()  # multiples of 4 below the longest length seen, then that length (5)
    [4, 5]
    >>> padded = plan.pad(batches[1])
    >>> padded["ids"].tolist(), padded["mask"].shape
    ([[4, 0, 0, 0], [4, 4, 4, 0]], torch.Size([2, 4]))
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from fastloop._torch_private import recompile_limit
from fastloop.data import map_tensors, rebuild_loader, to_device, yields_whole_batches
from fastloop.speedups.base import Context, Skip, Speedup, register
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.options import Options, option
from fastloop.speedups.pad_buckets.check import check_equivalence, tensor_names, tensors_of
from fastloop.speedups.run import Run

__all__ = ["PadBuckets", "PadOptions", "PadPlan", "PaddedCollate", "TensorPad", "find_padding", "tensor_names"]

CLEAR_MODE = 2
"""A pad value is clear when at least this many times as many rows end with it as with any other value."""


@dataclass(frozen=True, kw_only=True)
class PadOptions(Options):
    """Options of ``pad_buckets``."""

    speedup = "pad_buckets"
    multiple: int | None = option(
        None,
        "bucket lengths are multiples of this; none: a quarter of the longest length "
        "seen, rounded up to a multiple of 8 (at least 8, and no more than max_buckets "
        "buckets)",
        low=1,
        high=65536,
    )
    max_buckets: int = option(
        8,
        "at most this many bucket lengths with the default multiple (under torch.compile's recompile limit)",
        low=1,
        high=64,
    )
    sample_batches: int = option(
        32,
        "batches read (collate only, no workers) to find what varies, its pad value and the longest length",
        low=2,
        high=4096,
    )
    check_batches: int = option(
        4, "batches whose loss is compared padded and unpadded (at most sample_batches)", low=1, high=4096
    )
    rtol: float = option(
        1e-4,
        "relative tolerance of that loss comparison (fp32, TF32 off)",
        low=0,
        high=1,
        low_open=True,
        high_open=True,
    )

    def check(self) -> None:
        if self.check_batches > self.sample_batches:
            raise self.refuse("check_batches", self.check_batches, f"at most sample_batches ({self.sample_batches})")


@dataclass(frozen=True)
class TensorPad:
    """How one tensor of the batch is padded: along ``dim``, at ``side``, with ``value``."""

    index: int
    """Its position in :func:`~fastloop.data.map_tensors`'s order."""
    name: str
    dim: int
    side: str
    value: Any


@dataclass
class PadPlan:
    """What :func:`find_padding` found: the tensors to pad and how, the bucket rule, and why any
    varying tensor is left alone."""

    pads: list[TensorPad]
    multiple: int
    top: int = 0
    """The longest length seen in the sampled batches: the last bucket. Nothing is ever padded
    past it (a model's position table may end there); a longer batch is left alone (0: none)."""
    left_alone: dict[str, str] = field(default_factory=dict)
    lengths_seen: list[int] = field(default_factory=list)

    def bucket(self, length: int) -> int | None:
        """The bucket length for ``length`` (None: longer than every length seen, left alone:
        padding it on could pass the end of what the model accepts)."""
        if length > self.top:
            return None
        return min(math.ceil(length / self.multiple) * self.multiple, self.top)

    def buckets(self) -> list[int]:
        """The bucket lengths: multiples of :attr:`multiple` below the longest seen, then it."""
        return sorted({self.bucket(n) or n for n in range(1, self.top + 1)})

    def pad(self, batch: Any, longer: list | None = None) -> Any:
        """``batch`` with each planned tensor padded to its bucket (unchanged past the longest seen;
        each such tensor appends its length to ``longer``)."""
        by_index: dict[int, list[TensorPad]] = {}
        for p in self.pads:
            by_index.setdefault(p.index, []).append(p)
        counter = iter(range(1 << 30))

        def one(t: torch.Tensor) -> torch.Tensor:
            for p in by_index.get(next(counter), []):  # each varying dimension of this tensor
                if t.dim() <= p.dim:
                    continue
                length = t.shape[p.dim]
                target = self.bucket(length)
                if target is None and longer is not None:
                    longer.append(length)
                if target is None or target == length:
                    continue
                widths = [0, 0] * (t.dim() - p.dim - 1) + (
                    [0, target - length] if p.side == "tail" else [target - length, 0]
                )
                if t.dtype == torch.bool:  # F.pad does not take bool tensors
                    t = F.pad(t.to(torch.uint8), widths, value=int(p.value)).bool()
                else:
                    t = F.pad(t, widths, value=p.value)
            return t

        return map_tensors(one, batch)


class PaddedCollate:
    """The user's collate function, then :meth:`PadPlan.pad` (picklable: it runs in loader workers)."""

    def __init__(self, collate: Callable, plan: PadPlan, longer: Any = None) -> None:
        self.collate, self.plan = collate, plan
        self.longer = longer
        """A shared ``multiprocessing.Value`` counting the batches left alone as longer than every
        length sampled (the workers count into it; None: not counted)."""

    def __call__(self, samples: Any) -> Any:
        longer: list[int] = []
        batch = self.plan.pad(self.collate(samples), longer)
        if longer and self.longer is not None:
            with self.longer.get_lock():
                self.longer.value += 1
        return batch


def _end_values(t: torch.Tensor, dim: int, side: str) -> list[Any]:
    """Per row: the value at the ``side`` end along ``dim`` where that end is one value (None where
    not, and for a row that holds one value throughout: a full mask row says nothing of the pad)."""
    end = t.select(dim, -1 if side == "tail" else 0).reshape(t.shape[0], -1)
    flat = t.movedim(dim, 1).reshape(t.shape[0], -1)
    uniform = (end == end[:, :1]).all(dim=1) & ~(flat == flat[:, :1]).all(dim=1)
    firsts = end[:, 0].tolist()
    return [v if u else None for v, u in zip(firsts, uniform.tolist())]


def _pad_value(tensors: list[torch.Tensor], dim: int, side: str) -> tuple[Any, str | None, float]:
    """The value the collate pads with at ``side`` (or None), why not, and how strong the evidence
    is (the share of rows that end with it where some row of the batch ends otherwise)."""
    per_batch = [_end_values(t, dim, side) for t in tensors]
    counts = Counter(v for rows in per_batch for v in rows if v is not None)
    if not counts:
        return None, "no row ends with one value", 0.0
    (value, n), *rest = counts.most_common()
    second = rest[0][1] if rest else 0
    padded_batches = [rows for rows in per_batch if value in rows and any(v != value for v in rows)]
    if not padded_batches:
        return None, "no padded row seen (every row of every batch ends alike)", 0.0
    if n < CLEAR_MODE * second:
        return None, f"more than one value at the padded end ({value!r} in {n} rows, {rest[0][0]!r} in {second})", 0.0
    evidence = sum(sum(v == value for v in rows) for rows in padded_batches) / sum(len(r) for r in padded_batches)
    return value, None, evidence


def _value_where_padded(ts: list[torch.Tensor], d: int, sibs: list[torch.Tensor], sib: TensorPad) -> Any:
    """The one value the tensors ``ts`` hold where their sibling (padded as ``sib``, the same
    length along ``d``) holds its padding at its padded end (``token_type_ids`` all 0 beside
    ``input_ids`` padded with 0); None where that is not one value, or nothing is padded."""
    seen: set = set()
    for t, s in zip(ts, sibs):
        eq = (s == sib.value).movedim(sib.dim, 1).reshape(s.shape[0], s.shape[sib.dim], -1).all(dim=2)
        run = eq.flip(1).cumprod(1).flip(1) if sib.side == "tail" else eq.cumprod(1)  # the padded end's run
        vals = t.movedim(d, 1)[run.bool()]
        seen |= set(vals.reshape(-1).tolist())
        if len(seen) > 1:
            return None
    return next(iter(seen)) if len(seen) == 1 else None


def find_padding(batches: list[Any], *, multiple: int | None = None, max_buckets: int = 8) -> PadPlan:
    """Read ``batches`` (the loader's own, at least two) and plan the padding; raise
    :class:`~fastloop.speedups.base.Skip` when no tensor changes length from batch to batch."""
    per = [tensors_of(b) for b in batches]
    if len({len(p) for p in per}) != 1 or not per[0]:
        raise Skip("the batches do not hold the same tensors each time (or none)")
    names = tensor_names(batches[0])
    found: list[tuple[int, int, list[torch.Tensor]]] = []
    for i in range(len(per[0])):
        ts = [p[i] for p in per]
        if len({t.dim() for t in ts}) != 1:
            continue
        for d in range(1, ts[0].dim()):
            if len({t.shape[d] for t in ts}) > 1:
                found.append((i, d, ts))
    if not found:
        raise Skip("the batches keep one shape apart from the batch dimension: nothing to pad")
    sides = {(i, d, side): _pad_value(ts, d, side) for i, d, ts in found for side in ("tail", "head")}
    tail = sum(sides[(i, d, "tail")][2] for i, d, _ in found)
    head = sum(sides[(i, d, "head")][2] for i, d, _ in found)
    side = "head" if head > tail else "tail"
    pads, alone, lengths = [], {}, []
    for i, d, ts in found:
        value, why, _ = sides[(i, d, side)]
        if why is not None:
            alone[names[i]] = f"{names[i]} (dim {d}) left alone: {why}"
            continue
        pads.append(TensorPad(i, names[i], d, side, value))
        lengths += [t.shape[d] for t in ts]
    if not pads:
        raise Skip("no pad value could be established: " + "; ".join(alone.values()))
    for i, d, ts in found:  # a tensor that changes length with a padded one is padded with it
        sib = next(
            (
                p
                for p in pads
                if p.dim == d
                and all(
                    t.shape[:1] + t.shape[d : d + 1] == q[p.index].shape[:1] + q[p.index].shape[d : d + 1]
                    for t, q in zip(ts, per)
                )
            ),
            None,
        )
        if names[i] not in alone or sib is None:
            continue
        value = _value_where_padded(ts, d, [q[sib.index] for q in per], sib)
        if value is None:  # the check then runs the step on batches of two lengths: refused if it breaks
            alone[names[i]] = (
                f"{names[i]} (dim {d}) left alone: it changes length with {sib.name} but holds more "
                f"than one value where {sib.name} is padded"
            )
            continue
        del alone[names[i]]
        pads.append(TensorPad(i, names[i], d, side, value))
    top = max(lengths)
    m = multiple or max(8, math.ceil(top / 4 / 8) * 8, math.ceil(top / max_buckets / 8) * 8)
    return PadPlan(pads, m, top=top, left_alone=alone, lengths_seen=sorted(set(lengths)))


def _sample(loader: DataLoader, n: int) -> list[Any]:
    """The first ``n`` batches of a worker-less copy of ``loader``, the random state put back."""
    copy = rebuild_loader(loader, num_workers=0)
    gen = loader.generator.get_state() if getattr(loader, "generator", None) is not None else None
    out = []
    with torch.random.fork_rng(devices=[]):
        for b in copy:
            out.append(b)
            if len(out) >= n:
                break
    if gen is not None:
        loader.generator.set_state(gen)
    return out


@register
class PadBuckets(Speedup):
    __doc__ = __doc__
    name = "pad_buckets"
    changes = "data"
    fixes_shapes = True
    order = 11  # before prefetch, which hands the step a BackgroundFeed (no collate left to wrap)
    ladder = LadderTraits(
        in_default=True,  # tried only where the baseline's batches change shape (fastloop.drivers.ladder.search)
        ablation_rank=5,  # padding is more work: taken out to check that it pays
    )
    options_type = PadOptions
    trains = "band"

    def band(self) -> float:
        return self.opts.rtol  # what its own check let a padded batch's loss differ by

    def apply(self, run: Run) -> None:
        run.change_loader(lambda loader: self.apply_loader(loader, run))

    def apply_loader(self, loader: Iterable, run: Run) -> Iterable:
        ctx: Context = run.ctx
        on_device = bool(getattr(loader, "pads_on_device", False))  # gpu_resident's padded samples
        if not on_device and (not isinstance(loader, DataLoader) or yields_whole_batches(loader)):
            raise Skip(
                f"the loader is a {type(loader).__name__} that does not batch samples itself; pad_buckets "
                f"pads the output of a DataLoader's collate_fn"
            )
        o = self.opts
        batches = loader.sample(o.sample_batches) if on_device else _sample(loader, o.sample_batches)
        if len(batches) < 2:
            raise Skip("the loader gave fewer than 2 batches: nothing to compare shapes with")
        plan = find_padding(batches, multiple=o.multiple, max_buckets=o.max_buckets)
        t0 = time.perf_counter()
        for b in batches if not on_device else []:
            plan.pad(b)
        pad_us = 1e6 * (time.perf_counter() - t0) / len(batches)  # on the device: cut at the bucket, no host work
        device = next((p.device for p in run.model.parameters()), ctx.device) if run.model is not None else ctx.device
        padded = [b for b in batches if any(x.shape != y.shape for x, y in zip(tensors_of(b), tensors_of(plan.pad(b))))]
        checked = check_equivalence(
            run, plan, [to_device(b, device) for b in (padded or batches)[: o.check_batches]], o.rtol
        )  # batches the padding lengthens: most of text's may already end at a bucket
        pads = ", ".join(f"{p.name} with {p.value!r}" for p in plan.pads)
        side = plan.pads[0].side
        limit, dynamic = recompile_limit()
        shapes = len(plan.buckets())
        compile_note = (
            ""
            if shapes <= limit
            else (
                f"; {shapes} bucket lengths, more than torch's recompile limit of {limit}: "
                + (
                    "compile marks the length dynamic after its second shape"
                    if dynamic
                    else "compile falls back to eager past the limit: choose a larger multiple (pad_buckets:N)"
                )
            )
        )
        ctx.stats["pad_buckets"] = {
            "buckets": plan.buckets(),
            "multiple": plan.multiple,
            "longest": plan.top,
            "recompile_limit": limit,
            "lengths_seen": plan.lengths_seen,
            "side": side,
            "padded": {p.name: p.value for p in plan.pads},
            "left_alone": plan.left_alone,
            "pad_us_per_batch": round(pad_us, 1),
            "equivalence": checked,
        }
        ctx.describe(
            self.name,
            f"padded {pads} at the {side} to multiples of {plan.multiple} up to {plan.top}, "
            f"the longest length in {len(batches)} sampled batches (lengths seen {plan.lengths_seen[0]}-"
            f"{plan.lengths_seen[-1]}; a longer batch is left alone, never padded past a length seen, and "
            f"counted: pad_buckets_longer_batches); {checked}; "
            + (
                "each batch cut at its bucket from gpu_resident's padded samples on the GPU"
                if on_device
                else f"{pad_us:.0f} us of host time per batch in the collate"
            )
            + compile_note
            + ("; " + "; ".join(plan.left_alone.values()) if plan.left_alone else ""),
        )
        if on_device:
            loader.bucket = plan.bucket
            return loader
        mp = getattr(loader, "multiprocessing_context", None) or multiprocessing.get_context()  # the workers' own
        self.longer = mp.Value("i", 0)
        return rebuild_loader(loader, collate_fn=PaddedCollate(loader.collate_fn, plan, self.longer))

    def run_stats(self) -> dict:
        """The batches left alone as longer than every sampled length, counted in the collate."""
        longer = getattr(self, "longer", None)
        return {"pad_buckets_longer_batches": int(longer.value)} if longer is not None else {}
