"""``cuda_graph``: the train step captured as a CUDA graph and replayed, in tiers (the whole
step; forward and backward through compile's CUDA graphs; compiled without graphs where those
would train wrong; eager with the cause).

The card, with when it helps, when it hurts, what each tier costs and which patterns of ordinary
Lightning code reach which tier: ``docs/speedups/cuda_graph.md``. Written once, for both
adapters: the tier policy here (:func:`common_blocker`: what keeps any step from being captured
whole; :func:`tier_below_whole`: where a step that is not captured whole goes, and what the
record says), the capture core in :mod:`fastloop.speedups.cuda_graph.graph_capture` (one graph per batch
shape, one memory pool). The adapters carry out the tier they are given: the plain loop's step
in :mod:`fastloop.adapters.graph_step`, Lightning's patching in
:mod:`fastloop.adapters.lightning_graph` (with the Lightning patterns its
``whole_step_blocker`` finds: gradient accumulation, hooks inside the step, counters read).

The one fallback below the whole step is :func:`below_whole`, which both adapters call with the
facts only they know (:class:`TierFacts`); the whole step itself is the captured-step engine's
(:mod:`fastloop.speedups.cuda_graph.captured_step`).

Example:
    >>> common_blocker(cuda=True, scale_loss=True)
    "fp16's GradScaler checks the gradients for inf/NaN on the host every step"
    >>> tier_below_whole("a sync", compiled_mode=None, graphs_unsafe=None, can_compile=True).name
    'forward+backward graphed'
    >>> tier_below_whole("a sync", compiled_mode=None, graphs_unsafe="2 processes with manual optimization",
    ...                  can_compile=True).status
    'fallback'
"""

from __future__ import annotations

from dataclasses import dataclass

from fastloop.errors import GraphIneligible
from fastloop.speedups.base import Speedup, register
from fastloop.speedups.compile.cache import hold_compile_cache
from fastloop.speedups.compile.compile import CUDAGRAPH_MODES, GRAPHED_BY_COMPILE
from fastloop.speedups.cuda_graph.graph_capture import MAX_GRAPHS
from fastloop.speedups.ladder_traits import LadderTraits
from fastloop.speedups.run import Run
from fastloop.speedups.torch_facts import raised_by_compiler

__all__ = ["CudaGraph", "MAX_GRAPHS", "TIERS", "Tier", "TierFacts", "below_whole", "common_blocker", "tier_below_whole"]

TIERS = ("whole step", GRAPHED_BY_COMPILE, "compiled, no graphs", "eager")
"""cuda_graph's tiers, best first."""


@dataclass(frozen=True)
class Tier:
    """The tier a step reaches below the whole step: its name (one of :data:`TIERS`), what to
    compile the model's children with (None: nothing to compile), the record's status
    (``applied`` or ``fallback``) and its detail."""

    name: str
    compile_mode: str | None
    status: str
    detail: str


@dataclass(frozen=True)
class TierFacts:
    """What an adapter knows that decides the tier below the whole step (see :func:`tier_below_whole`)."""

    compiled_mode: str | None
    """The mode the compile speedup compiled the step with in this run (None: not compiled)."""
    graphs_unsafe: str | None
    """Why compile's CUDA graphs would train wrong here (None: they would not)."""
    can_compile: bool
    """The step has something to compile (a model with parameters; under Lightning a child with them)."""
    user_compiled: bool = False
    """The user's code compiled it (fastloop leaves it alone)."""


def below_whole(run: Run, owner: str, why_not_whole: str) -> Tier:
    """The one fallback below the whole step, for both adapters, at the moment the whole step is
    refused (before the first step, or while the run trains): the tier :func:`tier_below_whole`
    gives for ``run``'s :class:`TierFacts`, compiled through the run
    (``run.compile_for_tier``), its name and ``why_not_whole`` in the statistics
    (``OWNER_tier``, ``OWNER_why_not_whole``: the doctor reads them), and the record: the tier's
    detail, ``fallback`` where it is below compile's graphs."""
    tier = tier_below_whole(why_not_whole, **vars(run.graph_tier_facts()))
    run.compile_for_tier(tier.compile_mode, mark_steps=tier.name == TIERS[1])
    run.ctx.stats[f"{owner}_tier"] = tier.name
    run.ctx.stats[f"{owner}_why_not_whole"] = why_not_whole
    if tier.status == "fallback":
        if run.ctx.applied(owner) or owner not in run.ctx.records:
            run.ctx.record(owner, "fallback", tier.detail)
    else:
        run.ctx.describe(owner, tier.detail)
    return tier


SCALER_BLOCKS = "fp16's GradScaler checks the gradients for inf/NaN on the host every step"
"""Why an fp16 step with a GradScaler is not one graph, in both adapters' words."""


def common_blocker(*, cuda: bool, scale_loss: bool) -> str | None:
    """What keeps the whole step out of one graph in either adapter, known before the first
    step (each adapter adds what only it can see: Lightning's hooks and counters, a step
    function's host draws), or None."""
    if not cuda:
        return "no CUDA"
    if scale_loss:
        return SCALER_BLOCKS
    return None


def tier_below_whole(
    why_not_whole: str,
    *,
    compiled_mode: str | None,
    graphs_unsafe: str | None,
    can_compile: bool,
    user_compiled: bool = False,
) -> Tier:
    """Where a step that is not captured whole goes, the same in both adapters.

    Args:
        why_not_whole: why the whole step is not one graph.
        compiled_mode: the mode the compile speedup compiled with already (None: not compiled).
        graphs_unsafe: why compile's CUDA graphs would train wrong here (None: they would not).
        can_compile: the model has something to compile (a child module with parameters).
        user_compiled: the user's code compiled the model itself (fastloop leaves it alone).
    """
    whole = f"whole step: {why_not_whole}"
    if compiled_mode in CUDAGRAPH_MODES:
        return Tier(TIERS[1], None, "applied", f"{TIERS[1]} ({whole}; captured by compile:{compiled_mode})")
    if user_compiled:
        return Tier(TIERS[3], None, "fallback", f"{whole}; the model is compiled by your code")
    if graphs_unsafe:
        compiled = can_compile or compiled_mode is not None
        return Tier(
            TIERS[2] if compiled else TIERS[3],
            "default" if can_compile and compiled_mode is None else None,
            "fallback",
            f"{whole}; compile's CUDA graphs: {graphs_unsafe}; "
            + ("compiled without graphs" if compiled else "the steps run eagerly"),
        )
    if not can_compile:
        return Tier(
            TIERS[3],
            None,
            "fallback",
            f"{whole}; the model has no child module with parameters for compile's CUDA graphs: the steps run eagerly",
        )
    return Tier(TIERS[1], "reduce-overhead", "applied", f"{TIERS[1]} ({whole})")


@register
class CudaGraph(Speedup):
    __doc__ = __doc__
    name = "cuda_graph"
    trains = "reordered"  # the whole step replays bitwise; graphed forward+backward can round differently
    ladder = LadderTraits(ablation_rank=1, in_default=True)
    compiles = True
    changes = "step"
    order = 60
    warmup_cost = True
    needs_cuda = True

    def apply(self, run: Run) -> None:
        run.graph_step()
        hold_compile_cache(run)  # its tier below the whole step compiles

    def uses_cudagraphs(self) -> bool:
        return True

    def claims(self, err: BaseException) -> bool:
        return raised_by_compiler(err) or isinstance(err, GraphIneligible)
