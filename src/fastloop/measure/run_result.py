"""A measured run's result, typed: :class:`RunResult`, the JSON contract's "measured configuration"
(DESIGN.md) as dataclasses. The runner builds one; :meth:`RunResult.to_dict` writes exactly the
document (``tests/test_ladder_golden.py`` pins its keys and types); :meth:`RunResult.from_dict` reads
one back, where the drivers read a run's figures (the A/B and the ladder compare runs, the doctor
diagnoses them), so a figure is read through one typed field, not a key spelled in each reader.
Imports without torch.

The dataclasses nest where the document nests (``step_s``, ``throughput``, ``loss``, ``mfu_detail``,
``timings``, ...); what a run has only sometimes (the ranks of a multi-GPU run, a paired run's
digests, a loss that was not finite) is written only when it is there. ``extra`` (the speedups'
own statistics) stays an open dict; keys the dataclass does not know (the stamp, the doctor's
diagnosis, a later version's additions) are kept in ``rest`` and written back after the rest.

A number that is not finite has no place in strict JSON: :meth:`RunResult.to_dict` writes a loss
that was NaN or infinite as null, and says which and why under ``losses_not_finite``.

Example:
    >>> doc = {"steps": 3, "step_s": {"median": 0.02, "p25": 0.02, "p75": 0.03, "mean": 0.025},
    ...        "data_wait_frac": 0.25, "kind": "run", "note": "mine"}
    >>> r = RunResult.from_dict(doc)
    >>> r.step_s.mean, r.data_wait_frac, r.peak_mem_bytes, r.kind, r.rest
    (0.025, 0.25, None, 'run', {'note': 'mine'})
    >>> RunResult(steps=2, losses=[1.0, float("nan")]).to_dict()["losses_not_finite"]
    {'1': 'nan'}
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

__all__ = [
    "Loss",
    "MfuDetail",
    "RunInputsRecord",
    "RunResult",
    "SpeedupRecord",
    "StepTimes",
    "Throughput",
    "Timings",
    "TrainerSettings",
    "finite_or_none",
]

D = TypeVar("D", bound="_Document")


def finite_or_none(x: Any) -> Any:
    """``x``, or None where it is a float that is not finite (strict JSON has no NaN or Infinity).

    Example:
        >>> finite_or_none(1.5), finite_or_none(float("inf")), finite_or_none("a")
        (1.5, None, 'a')
    """
    return None if isinstance(x, float) and not math.isfinite(x) else x


def sometimes(default: Any = None) -> Any:
    """A field the document has only when it is not None (written only then)."""
    return field(default=default, metadata={"sometimes": True})


def _rest() -> Any:
    return field(default_factory=dict, metadata={"rest": True})


def _missing() -> Any:
    return field(default=frozenset(), repr=False, compare=False, metadata={"missing": True})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _nested(hint: Any) -> tuple[type | None, bool]:
    """(the document dataclass a field holds, whether it holds a list of them) from its type hint."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _nested(inner[0]) if len(inner) == 1 else (None, False)
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint) or (Any,)
        return (item, True) if isinstance(item, type) and issubclass(item, _Document) else (None, False)
    return (hint, False) if isinstance(hint, type) and issubclass(hint, _Document) else (None, False)


class _Document:
    """A dataclass written as one dict of the document: its fields under their own names, in order
    (a nested document as its dict; a ``sometimes`` field only when not None; a field the document
    it was read from lacked, not at all), then ``rest``."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        rest: dict[str, Any] = {}
        missing = getattr(self, "missing", frozenset())
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.metadata.get("rest"):
                rest = value
            elif not (
                f.metadata.get("missing") or f.name in missing or (f.metadata.get("sometimes") and value is None)
            ):
                out[f.name] = _written(value)
        out.update(rest)
        return out

    @classmethod
    def from_dict(cls: type[D], doc: dict[str, Any] | None) -> D:
        """Read a document back: each field from its key (missing: its default, or None, and not
        written back), a nested document from its dict, the keys no field names into ``rest``."""
        doc = doc or {}
        hints, given, rest_name, missing = _hints(cls), {}, None, set()
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.metadata.get("rest"):
                rest_name = f.name
                continue
            if f.metadata.get("missing"):
                continue
            if f.name not in doc:
                missing.add(f.name)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    given[f.name] = None
                continue
            value, (kind, many) = doc[f.name], _nested(hints[f.name])
            if kind is not None and many and isinstance(value, list):
                value = [kind.from_dict(v) if isinstance(v, dict) else v for v in value]
            elif kind is not None and isinstance(value, dict):
                value = kind.from_dict(value)
            given[f.name] = value
        if rest_name is not None:
            names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
            given[rest_name] = {k: v for k, v in doc.items() if k not in names}
        return cls(**given, missing=frozenset(missing))  # type: ignore[call-arg]


def _written(value: Any) -> Any:
    if isinstance(value, _Document):
        return value.to_dict()
    if isinstance(value, list):
        return [_written(v) for v in value]
    return value


@dataclass(kw_only=True, slots=True)
class SpeedupRecord(_Document):
    """What happened to one requested speedup (``speedups`` entries)."""

    name: str
    status: str
    """``applied``, ``skipped`` or ``fallback``."""
    reason: str = ""
    detail: str = ""
    """For an applied speedup: what it changed."""
    rest: dict[str, Any] = _rest()
    missing: frozenset[str] = _missing()


@dataclass(kw_only=True, slots=True)
class StepTimes(_Document):
    """``step_s``: the measured steps' seconds (None when no step was measured)."""

    median: float | None = None
    p25: float | None = None
    p75: float | None = None
    mean: float | None = None
    rest: dict[str, Any] = _rest()
    missing: frozenset[str] = _missing()


@dataclass(kw_only=True, slots=True)
class Throughput(_Document):
    """``throughput``: items per second over the measured steps."""

    value: float | None = None
    unit: str | None = None
    """``samples/s``, ``tokens/s``, ..."""
    basis: str | None = sometimes()
    """How it was computed (a merged configuration of several runs has none)."""
    rest: dict[str, Any] = _rest()
    missing: frozenset[str] = _missing()


@dataclass(kw_only=True, slots=True)
class Loss(_Document):
    """``loss``: the first and the last loss the measured steps recorded (None: none did)."""

    first: float | None = None
    last: float | None = None
    rest: dict[str, Any] = _rest()
    missing: frozenset[str] = _missing()


@dataclass(kw_only=True, slots=True)
class MfuDetail(_Document):
    """``mfu_detail``: the FLOPs behind ``mfu``, their convention, and the peaks rated against."""

    flops_per_step: float | None = None
    convention: str | None = None
    peak_tflops: float | None = None
    peak_source: str | None = None
    measured_ceiling_tflops: float | None = None
    mfu_vs_measured_ceiling: float | None = None
    ceiling_source: str | None = None
    rest: dict[str, Any] = _rest()
    missing: frozenset[str] = _missing()


@dataclass(kw_only=True, slots=True)
class Timings(_Document):
    """``timings``: where the run's wall time went (a ladder pays it per process)."""

    build_s: float | None = None
    """Building the target."""
    fit_s: float | None = None
    """The whole fit: Trainer setup, warm-up, compile, measured and profiled steps, teardown."""
    pid: int | None = None
    digest_s: float | None = None
    setup_s: float | None = None
    train_s: float | None = None
    teardown_s: float | None = None
    process_s: float | None = sometimes()
    """The process's whole life as the leader saw it (a run in a process of its own)."""
    forked: bool | None = sometimes()
    """Forked from the fork server (False: a new interpreter)."""
    startup_s: float | None = sometimes()
    """Waiting for the fork server's imports (the first run's alone)."""
    rest: dict[str, Any] = _rest()
    missing: frozenset[str] = _missing()


@dataclass(kw_only=True, slots=True)
class RunInputsRecord(_Document):
    """``run_inputs``: what the driver declared to the run's speedups."""

    step_rate: float | None = None
    compile_cache: bool | None = None
    rest: dict[str, Any] = _rest()
    missing: frozenset[str] = _missing()


@dataclass(kw_only=True, slots=True)
class TrainerSettings(_Document):
    """``trainer_settings``: the user's Trainer settings the run used, their callbacks, and what
    it left out (with why)."""

    used: dict[str, str] = field(default_factory=dict)
    callbacks: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    rest: dict[str, Any] = _rest()
    missing: frozenset[str] = _missing()


@dataclass(kw_only=True, slots=True)
class RunResult(_Document):
    """One measured configuration (``fastloop run``'s document without the stamp; each run of a
    ladder's rung or of an A/B side). The fields are the document's keys, in its order."""

    fastloop_version: str | None = sometimes()
    """The stamp every document of the command line carries (DESIGN.md), written first."""
    env: dict[str, Any] | None = sometimes()
    """The environment stamp: GPU, driver, CUDA, torch, Lightning, Python, platform, commit, date."""
    target: str | None = sometimes()
    device: str | None = sometimes()
    kind: str | None = sometimes()
    """``run`` for ``fastloop run``'s document."""
    speedups: list[SpeedupRecord] = field(default_factory=list)
    steps: int | None = None
    """Measured steps."""
    steps_planned: int | None = None
    """Asked for; fewer were measured when ``measure_s`` cut them."""
    measure_s: float | None = None
    measure_window_cut: bool | None = None
    """The window ended on the host's clock: the warm-up underestimated the step."""
    measured_s: float | None = None
    """The window: the measured steps' seconds summed."""
    window_extended_steps: int | None = None
    window_short: Any = None
    """Why the window holds less than ``measure_s`` (None: it does not; a merged configuration:
    each run's reason)."""
    warmup_steps: int | None = None
    one_off_steps: Any = None
    """Measured steps left out: one-off work (a late CUDA graph capture)."""
    warmup_drain_steps: int | None = None
    warmup_extended_steps: int | None = None
    warmup_steady: bool | None = None
    warmup_gc_s: float | None = None
    batch_shapes: dict[str, Any] | None = None
    """How often the batches changed shape: ``steps``, ``distinct``, ``most_common_share``, ``varying``."""
    step_s: StepTimes = field(default_factory=StepTimes)
    step_s_all: list[float] = field(default_factory=list)
    wait_s_all: list[float] = field(default_factory=list)
    throughput: Throughput = field(default_factory=Throughput)
    items_per_step: float | None = None
    data_wait_frac: float | None = None
    """The share of the step spent waiting for its batch."""
    host_wait_frac: float | None = None
    """The host's share of the step getting batches (loader and copy)."""
    host_fetch_s: float | None = None
    host_copy_s: float | None = None
    peak_mem_bytes: int | None = None
    compile_s: float | None = None
    warmup_overhead_s: float | None = None
    mfu: float | None = None
    mfu_detail: MfuDetail = field(default_factory=MfuDetail)
    loss: Loss = field(default_factory=Loss)
    losses: list[float | None] = field(default_factory=list)
    gpu_profile: dict[str, Any] | None = None
    """The GPU's busy share of the step and the host syncs, from the profiled steps (CUDA only)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The speedups' own statistics and what the run learned of its target (open)."""
    warnings: list[str] = field(default_factory=list)
    steady: bool | None = None
    measured_on_steps: int | None = None
    weights_digest: str | None = sometimes()
    timings: Timings | None = sometimes()
    paired: dict[str, Any] | None = sometimes()
    """A paired run's initial weights' digest and each batch's (``fastloop run --seed``)."""
    data_checks: dict[str, str] | None = sometimes()
    built_checks: dict[str, str] | None = sometimes()
    model_checks: dict[str, str] | None = sometimes()
    """Every speedup this run's model, loader or batches rule out, with the reason."""
    run_inputs: RunInputsRecord | None = sometimes()
    trainer_settings: TrainerSettings | None = sometimes()
    loss_definition: str | None = sometimes()
    global_rank: int | None = sometimes()
    world_size: int | None = sometimes()
    strategy: str | None = sometimes()
    ranks: list[dict[str, Any]] | None = sometimes()
    """Each rank's figures (a multi-GPU run)."""
    slowest_rank: int | None = sometimes()
    per_rank_throughput: list[float | None] | None = sometimes()
    speedups_agree_across_ranks: bool | None = sometimes()
    loss_finite: bool | None = sometimes()
    """False when a loss was NaN or infinite (the run diverged: its timings say nothing)."""
    scaling: dict[str, Any] | None = sometimes()
    """``fastloop run --devices N``: the same configuration on one device and on N, and the efficiency."""
    diagnosis: dict[str, Any] | None = sometimes()
    """``fastloop run --devices N``: the doctor's diagnosis of the N-device run."""
    fit_share: dict[str, Any] | None = sometimes()
    """What share of the target's whole fit these step figures cover (the command line's document)."""
    rest: dict[str, Any] = _rest()
    missing: frozenset[str] = _missing()

    STRICT: ClassVar[str] = "losses_not_finite"
    """The key saying which losses were not finite, written as null."""

    @classmethod
    def of(cls, doc: RunResult | dict[str, Any] | None) -> RunResult:
        """``doc`` typed: itself when it is one already, else read back (:meth:`from_dict`)."""
        return doc if isinstance(doc, RunResult) else cls.from_dict(doc)

    def applied(self) -> set[str]:
        """The names of the speedups that applied."""
        return {r.name for r in self.speedups if isinstance(r, SpeedupRecord) and r.status == "applied"}

    def to_dict(self) -> dict[str, Any]:
        """The document, strict: a loss that was not finite is null, and ``losses_not_finite``
        says which (by step) and what it was."""
        out = _Document.to_dict(self)
        bad = {str(i): str(v) for i, v in enumerate(self.losses) if finite_or_none(v) is None and v is not None}
        if bad:
            out["losses"] = [finite_or_none(v) for v in self.losses]
            out[self.STRICT] = {**bad, **out.get(self.STRICT, {})}
        loss = out.get("loss")
        if isinstance(loss, dict):
            out["loss"] = {k: finite_or_none(v) if k in ("first", "last") else v for k, v in loss.items()}
        return out
