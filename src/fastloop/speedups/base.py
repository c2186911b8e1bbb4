"""The Speedup interface and the registry every other part of fastloop works from.

A speedup is a measured change. Each one

1. says whether it applies here (:meth:`Speedup.why_not`), and if not, why;
2. makes its whole change in :meth:`Speedup.apply`, through the one
   :class:`~fastloop.speedups.run.Run` interface that the plain-loop wrapper
   (:mod:`fastloop.adapters.loop`) and the Lightning callbacks (:mod:`fastloop.adapters.lightning`)
   each implement once (they import this module, never the other way round);
3. says which of four things it changes (:attr:`Speedup.changes`): the model, the optimizer, the
   data pipeline or the train step.

Example:
    >>> from fastloop.speedups import resolve
    >>> [s.name for s in resolve("bf16,tf32")]   # ladder order, not typing order
    ['tf32', 'bf16']
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterable, Sequence
from dataclasses import fields as dataclasses_fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from fastloop.errors import FastloopError, shorten
from fastloop.speedups.ladder_traits import MOVED_TO_LADDER, LadderTraits
from fastloop.speedups.options import Options
from fastloop.speedups.records import Context, Fallback, Record, RunInputs, Skip, valid_step_rate

if TYPE_CHECKING:
    from fastloop.speedups.run import Run

__all__ = [
    "Options",
    "REGISTRY",
    "Context",
    "Fallback",
    "Record",
    "RunInputs",
    "Skip",
    "LadderTraits",
    "Speedup",
    "Trains",
    "register",
    "resolve",
    "speedup_names",
    "apply_all",
    "name_of",
    "valid_step_rate",
]

Changes = Literal["model", "optimizer", "data", "step"]
Trains = Literal["exact", "reordered", "band", "own_draws", "workload"]

REGISTRY: dict[str, type[Speedup]] = {}
ALIASES: dict[str, str] = {"amp": "bf16", "fp16_mixed": "fp16", "graphs": "cuda_graph", "fused": "fused_optimizer"}


class Speedup:
    """One optimization. Subclasses set the class attributes and override what they change.

    Every subclass's docstring is its *card*: when it helps, when it hurts, what it costs.
    """

    name: ClassVar[str]
    changes: ClassVar[Changes]
    order: ClassVar[int] = 100
    """Position in the default ladder (data pipeline, precision, layout, compile, graphs)."""
    needs_cuda: ClassVar[bool] = False
    conflicts: ClassVar[tuple[str, ...]] = ()

    math_dtype: ClassVar[str | None] = None
    """When applied, the dtype the matmuls run in (``bf16``, ``fp16``, ``tf32``): MFU is rated
    against that dtype's peak (a lower-precision one wins when several apply)."""
    warmup_cost: ClassVar[bool] = False
    """True when the speedup compiles or captures during warm-up (reported as ``compile_s``)."""
    ladder: ClassVar[LadderTraits] = LadderTraits()
    """How the ladder searches with it (:class:`~fastloop.speedups.ladder_traits.LadderTraits`): its
    group, what its ablation costs, whether it sizes itself. A run never reads it."""
    feeds_validation: ClassVar[bool] = False
    """A feed speedup whose change of the training loader holds for any loader of the same data: it
    changes how batches arrive (processes, pinned memory, a thread, the device's memory), never which
    samples a batch holds or what they are (augmentation, decoding, padding): ``fast_validation``
    feeds the validation loaders through it too, each on its own terms."""
    fixes_shapes: ClassVar[bool] = False
    """It pads batches whose shape changes to a few shapes: the ladder puts it in the compute
    bundle where the baseline's batches change shape, and does not hold the baseline's shape
    checks (``cuda_graph``) against a configuration with it; the check of a pick compares its
    batches by their real rows."""
    compiles: ClassVar[bool] = False
    """Its runs call ``torch.compile`` (or may): the fork server preloads the compiler for them."""
    advice_pattern: ClassVar[str | None] = None
    """How advice names it (a regular expression); None: its name as a word."""
    trains: ClassVar[Trains] = "exact"
    """What it changes in what trains, read by the check of a pick against the baseline
    (:mod:`fastloop.drivers.pick_check`): ``"exact"``, the same arithmetic on the same batches
    (bit-identical losses); ``"reordered"``, the same math with its float sums in another order or
    another kernel (fp32 rounding); ``"band"``, the math rounded coarser (:meth:`band` says how
    much); ``"own_draws"``, random draws of its own (augmentation on its own generator, another
    decoder), so no run without it sees the same batches; ``"workload"``, other batches (their size)."""
    fit_phase: ClassVar[str | None] = None
    """The phase of a fit it shortens instead of the training step (a ``fastloop fit`` phase:
    ``validation``, ``checkpoint``, ``host_syncs``); None: it speeds up the step. The ladder's step
    runs turn validation, checkpoints and loggers off, so it measures such a speedup only when it
    aims at the fit (``--objective fit``): on short fits, where the target has what it speeds up."""
    reads_in_workers: ClassVar[bool] = False
    """It reads the dataset in worker processes, each seeded apart from the main process: a dataset
    that draws from the global generators per read draws other numbers with it."""

    def band(self) -> float | None:
        """With ``trains == "band"``: the relative size of one rounding of the math it changes (a
        precision's machine epsilon, a padding's checked tolerance), from which the check derives
        how far its losses may be from the baseline's; None otherwise."""
        return None

    options_type: ClassVar[type[Options] | None] = None
    """This speedup's options (None: it takes none): a keyword-only frozen dataclass of
    :class:`~fastloop.speedups.options.Options`, each field made with ``option()`` (its type,
    default, what it accepts, its doc), from which the parsing, the checks, the help and the spec
    are derived."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a ladder trait set as a class attribute of its own (``feeds = True``): the ladder
        reads only :attr:`ladder`, so the attribute would be ignored without a word."""
        super().__init_subclass__(**kwargs)
        stray = sorted(MOVED_TO_LADDER & set(vars(cls)))
        if stray:
            raise TypeError(
                f"{cls.__name__}: {', '.join(stray)} belong in its ladder traits, e.g. "
                f"ladder = LadderTraits(feeds=True, ablation_rank=7) (fastloop.speedups.ladder_traits), "
                "not class attributes of their own"
            )

    def __init__(self, **options: Any) -> None:
        """The speedup with ``options``, keyword by keyword (``Compile(mode="max-autotune",
        shapes="static")``, ``Workers(count=4)``); a name it does not have or a value it does not
        accept raises FastloopError saying what is accepted."""
        if self.options_type is None:
            if options:
                raise FastloopError(f"{self.name!r} takes no option, got {', '.join(options)}")
            self.opts: Any = None
            return
        known = [f.name for f in dataclasses_fields(self.options_type)]
        unknown = [k for k in options if k not in known]
        if unknown:
            raise FastloopError(f"{self.name} has no option {unknown[0]!r}; its options: {', '.join(known)}")
        self.opts = self.options_type(**options)
        """The typed options (an instance of :attr:`options_type`), None for a speedup without any."""

    @property
    def options(self) -> dict[str, Any]:
        """The options given that are not their defaults (what :attr:`spec` writes)."""
        return self.opts.non_default() if self.opts is not None else {}

    @classmethod
    def from_text(cls, text: str) -> Speedup:
        """The speedup with the options typed after its name (``max-autotune:shapes=static``)."""
        if cls.options_type is None:
            raise FastloopError(f"{cls.name!r} takes no option, got {shorten(f'{cls.name}:{text}', 40)}")
        opts = cls.options_type.parse(text)
        return cls(**{f.name: getattr(opts, f.name) for f in dataclasses_fields(opts)})

    @classmethod
    def options_help(cls) -> str:
        """How this speedup's options are typed and what each accepts (derived from its fields)."""
        return cls.options_type.usage() if cls.options_type is not None else f"{cls.name} takes no option"

    def why_not(self, ctx: Context) -> str | None:
        """Reason this speedup cannot apply here, or None if it can."""
        if self.needs_cuda and not ctx.cuda:
            return "no CUDA"
        return None

    def why_not_model(self, model: torch.nn.Module) -> str | None:
        """Reason this speedup cannot apply to ``model`` (no convolutions, ...), or None."""
        return None

    def why_not_data(self, loader: Any) -> str | None:
        """Reason this speedup cannot apply to the training loader's data (read by the run, so
        the ladder skips the rung without measuring it), or None."""
        return None

    def run_context(self, ctx: Context) -> contextlib.AbstractContextManager:
        """Held while the run trains (global switches such as TF32, restored on exit)."""
        return contextlib.nullcontext()

    def apply(self, run: Run) -> None:
        """Make this speedup's whole change through ``run`` (:class:`~fastloop.speedups.run.Run`:
        the model, the optimizers, the loader, the batch, the step's autocast, the step's graph);
        raise :class:`Skip` (or :class:`Fallback`) with the reason when it cannot apply here. The
        default changes nothing (the batch-size search, which runs before training)."""
        return None

    prepares_run: ClassVar[bool] = False
    """True for a speedup the run driver applies before training (the batch-size search)."""

    def prepare_run(
        self, module: Any, data: Any, others: list[Speedup], device: torch.device, *, precision: str | None = None
    ) -> tuple[Any, Record, dict]:
        """Before training (only when :attr:`prepares_run`; ``precision``: the user's Trainer's):
        returns the data to train on, this speedup's record and statistics for the report."""
        raise NotImplementedError

    def compile_mode(self) -> str | None:
        """The ``torch.compile`` mode this speedup compiles the model with (None: it does not).
        An adapter whose step calls the module's children compiles those children."""
        return None

    def run_stats(self) -> dict:
        """Statistics to add to the report after a run in which this speedup applied."""
        return {}

    def uses_cudagraphs(self) -> bool:
        """True when this speedup replays CUDA graphs through ``torch.compile`` (the adapter then
        marks the start of every step, so a step's outputs are not overwritten by the next)."""
        return False

    def fallback_variant(self, err: BaseException) -> Speedup | None:
        """After this speedup claimed ``err``: a milder form of it to repeat the run with (None:
        the run is repeated without it)."""
        return None

    def claims(self, err: BaseException) -> bool:
        """True when ``err``, raised while training, is this speedup's failure (then the run falls
        back: it is repeated without this speedup, and its record says ``fallback``)."""
        return False

    @property
    def spec(self) -> str:
        """The name with every option that is not its default, as :func:`resolve` reads it back:
        ``compile:max-autotune:shapes=static``, ``workers:8``, ``bf16``."""
        text = self.opts.spec() if self.opts is not None else ""
        return f"{self.name}:{text}" if text else self.name

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.opts == self.opts  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self.name, self.opts))

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({given})"


def register(cls: type[Speedup]) -> type[Speedup]:
    """Class decorator: add a speedup to the registry under ``cls.name``."""
    if cls.name in REGISTRY:
        raise RuntimeError(f"speedup {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def advice_pattern(cls: type[Speedup]) -> str:
    """The regular expression by which a recommendation names ``cls``.

    Example:
        >>> from fastloop.speedups import REGISTRY
        >>> print(advice_pattern(REGISTRY["bf16"]), advice_pattern(REGISTRY["fused_optimizer"]))
        \\bbf16\\b fused[ _]optimizer
    """
    return cls.advice_pattern or rf"\b{cls.name}\b"


def speedup_names() -> list[str]:
    """All registered speedup names, in ladder order."""
    return [n for n, _ in sorted(REGISTRY.items(), key=lambda kv: (kv[1].order, kv[0]))]


def _unknown(item: str, key: str) -> str:
    """'unknown speedup 'X'; did you mean 'y'?' (names are lower-case, exact) and the valid names."""
    known = speedup_names() + ["none"]
    lower = {n.lower(): n for n in known + list(ALIASES)}
    near = lower.get(key.lower()) or next(iter(difflib.get_close_matches(key.lower(), known, n=1, cutoff=0.75)), None)
    hint = f"; did you mean {near!r}?" if near else ""
    case = " (names are lower-case)" if near and near.lower() == key.lower() else ""
    return f"unknown speedup {shorten(item, 40)!r}{hint}{case}; valid names: {', '.join(speedup_names())}, or none"


def resolve(spec: str | Iterable[str | Speedup] | None) -> list[Speedup]:
    """Turn ``"bf16,compile"`` (or a list) into speedup objects in ladder order.

    ``"none"``/``""``/``None`` mean the baseline. Unknown names, duplicates and conflicting
    pairs raise :class:`FastloopError` with a one-line reason.
    """
    if spec is None:
        return []
    items: list[str | Speedup]
    if not isinstance(spec, (str, list, tuple)):
        raise TypeError(
            f"speedups must be a comma-separated string, a list of names or None; got {type(spec).__name__}"
        )
    if not isinstance(spec, str) and not all(isinstance(i, (str, Speedup)) for i in spec):
        bad = next(i for i in spec if not isinstance(i, (str, Speedup)))
        raise TypeError(f"each speedup must be a name or a Speedup object; got {type(bad).__name__} {bad!r}")
    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",")]
        if any(not s for s in items) and spec.strip() not in ("",):
            raise FastloopError(
                f"malformed speedup list {shorten(spec)!r}: use comma-separated names, e.g. 'bf16,compile'"
            )
        items = [s for s in items if s]
    else:
        items = list(spec)
    if items in (["none"], []):
        return []
    out: list[Speedup] = []
    for item in items:
        if isinstance(item, Speedup):
            out.append(item)
            continue
        key, _, opt = item.partition(":")
        key = ALIASES.get(key.strip(), key.strip())
        if key == "none":
            raise FastloopError(
                "'none' means the baseline and cannot be combined with other speedups "
                f"(got {shorten(','.join(map(str, items)))!r})"
            )
        if key not in REGISTRY:
            raise FastloopError(_unknown(item, key))
        cls = REGISTRY[key]
        if ":" in item and not opt.strip():
            raise FastloopError(f"empty option in {shorten(item)!r}: {cls.options_help()}")
        if len(opt) > 64:
            raise FastloopError(
                f"the option in {shorten(item, 40)!r} is {len(opt):,} characters long: {cls.options_help()}"
            )
        out.append(cls.from_text(opt.strip()) if opt else cls())
    names = [s.name for s in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise FastloopError(f"speedup given twice: {', '.join(dupes)}")
    for s in out:
        clash = [c for c in s.conflicts if c in names]
        if clash:
            raise FastloopError(f"{s.name!r} cannot be combined with {clash[0]!r}: choose one")
    return sorted(out, key=lambda s: (s.order, s.name))


def name_of(spec: str) -> str | None:
    """The name of the one speedup ``spec`` names (``compile:max-autotune`` -> ``compile``), the
    parsed speedup's attribute (its options checked on the way); None where ``spec`` names no
    registered speedup or not exactly one.

    Example:
        >>> name_of("compile:max-autotune:shapes=static"), name_of("graphs"), name_of("warp")
        ('compile', 'cuda_graph', None)
    """
    try:
        found = resolve([spec.strip()])
    except (FastloopError, TypeError):
        return None
    return found[0].name if len(found) == 1 else None


def apply_all(speedups: Sequence[Speedup], run: Run) -> None:
    """Apply each speedup through ``run`` in order and record each one: ``applied``; ``skipped``
    or ``fallback`` with the reason its ``why_not``/``why_not_model`` gave or its
    :class:`~fastloop.speedups.base.Skip` said; ``fallback`` with the error when it broke. A
    speedup that did not apply changes nothing: what it had changed is put back (``ctx.undo``).
    """
    ctx = run.ctx
    for s in speedups:
        reason = s.why_not(ctx) or (s.why_not_model(run.model) if run.model is not None else None)
        if reason:
            ctx.record(s.name, "skipped", reason)
            continue
        run.speedup = s
        mark = len(ctx.undo)
        try:
            s.apply(run)
        except Exception as err:  # Skip: the reason is its record; anything else: it broke, it falls back
            while len(ctx.undo) > mark:
                ctx.undo.pop()()
            if isinstance(err, Skip):
                ctx.record(s.name, err.status, err.reason)
            else:
                ctx.record(s.name, "fallback", f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            continue
        if s.name not in ctx.records:
            ctx.record(s.name, "applied")
