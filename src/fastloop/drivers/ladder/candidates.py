"""The ladder's candidates and configurations: which group a speedup is searched in, the order an
ablation takes members out, and a configuration as its spec string. The search decides by these
traits of a :class:`~fastloop.speedups.base.Speedup`, never by a speedup's name.

Example:
    >>> from fastloop.speedups import resolve
    >>> [[s.name for s in g] for g in split_groups(resolve("workers,bf16,compile,batch_size"))]
    [['workers'], ['bf16', 'compile'], ['batch_size']]
"""

from __future__ import annotations

from fastloop.speedups.base import REGISTRY, Speedup, name_of

__all__ = [
    "ablation_order",
    "as_sized",
    "fit_phase_of",
    "join_specs",
    "replaces_loader",
    "select_order",
    "spec_names",
    "split_fit",
    "split_groups",
]


def join_specs(specs: list[str]) -> str:
    """A configuration's spec string: its speedups' specs joined, ``none`` for the baseline.

    Example:
        >>> join_specs([]), join_specs(["bf16", "compile"])
        ('none', 'bf16,compile')
    """
    return ",".join(specs) or "none"


def spec_names(specs: list[str]) -> set[str]:
    """The speedup names of ``specs`` (``compile:max-autotune`` -> ``compile``)."""
    return {n for n in map(name_of, specs) if n is not None}


def split_groups(speedups: list[Speedup]) -> tuple[list[Speedup], list[Speedup], list[Speedup]]:
    """(feed, compute, the rest): the data pipeline, everything that changes the step, and the
    speedups that change the workload itself (``batch_size``). A speedup that pads batches to a
    few shapes (``fixes_shapes``) changes the data but goes with the compute stack: compile and
    CUDA graphs pay only with it (it is ruled out where the baseline's batches keep one shape)."""
    feed = [s for s in speedups if s.changes == "data" and not s.ladder.changes_workload and not s.fixes_shapes]
    compute = [s for s in speedups if (s.changes != "data" or s.fixes_shapes) and not s.ladder.changes_workload]
    rest = [s for s in speedups if s.ladder.changes_workload]
    return feed, compute, rest


def fit_phase_of(speedup: Speedup | type[Speedup]) -> str | None:
    """The phase of the fit ``speedup`` shortens (:attr:`Speedup.fit_phase`; None: it speeds up the
    step): the ladder reads this trait here alone.

    Example:
        >>> from fastloop.speedups import REGISTRY
        >>> fit_phase_of(REGISTRY["async_checkpoint"]), fit_phase_of(REGISTRY["bf16"]())
        ('checkpoint', None)
    """
    return speedup.fit_phase


def split_fit(speedups: list[Speedup]) -> tuple[list[Speedup], list[Speedup]]:
    """(step, fit): the speedups the step's runs measure, and those that shorten another phase of the
    fit (:func:`fit_phase_of`), which short fits measure.

    Example:
        >>> from fastloop.speedups import resolve
        >>> [[s.name for s in part] for part in split_fit(resolve("workers,deferred_logging,bf16"))]
        [['workers', 'bf16'], ['deferred_logging']]
    """
    return [s for s in speedups if fit_phase_of(s) is None], [s for s in speedups if fit_phase_of(s) is not None]


def select_order(speedups: list[Speedup], recipe: set[str]) -> list[Speedup]:
    """The order the sequential ladder tries its default rungs in: the general compute rungs, then
    the recipe's own (fp8, fused_loss: made for the compiled step, so tried once compile is in),
    then the data rungs (feed the fast step). Within each group, the registry's order.

    Example:
        >>> from fastloop.speedups import resolve
        >>> [s.name for s in select_order(resolve(["workers", "bf16", "fused_loss", "compile"]), {"fused_loss"})]
        ['bf16', 'compile', 'fused_loss', 'workers']
    """
    return (
        [s for s in speedups if s.changes != "data" and s.name not in recipe]
        + [s for s in speedups if s.changes != "data" and s.name in recipe]
        + [s for s in speedups if s.changes == "data"]
    )


def ablation_order(members: list[str]) -> list[str]:
    """The members (specs) an ablation takes out, costliest first (:attr:`LadderTraits.ablation_rank`:
    compile time, capture and memory, precision, layout, processes); members that cost nothing
    when they do not help are left out.

    Example:
        >>> ablation_order(["tf32", "bf16", "compile", "workers:4"])
        ['compile', 'bf16', 'workers:4']
    """
    ranked = [(REGISTRY[n].ladder.ablation_rank, i, m) for i, m in enumerate(members) if (n := name_of(m)) in REGISTRY]
    return [m for rank, _, m in sorted((r, i, m) for r, i, m in ranked if r is not None)]


def as_sized(selected: list[str], members: list[str]) -> list[str]:
    """``members`` as they are now selected (a self-sized one pinned to the size measured fastest).

    Example:
        >>> as_sized(["bf16", "workers:8", "pin_memory"], ["workers", "pin_memory", "prefetch"])
        ['workers:8', 'pin_memory', 'prefetch']
    """
    return [next((s for s in selected if name_of(s) == name_of(m)), m) for m in members]


def replaces_loader(names: set[str]) -> bool:
    """Does one of ``names`` replace the training loader (a GPU pipeline such as dali)?"""
    return any(REGISTRY[n].ladder.replaces_loader for n in names if n in REGISTRY)
