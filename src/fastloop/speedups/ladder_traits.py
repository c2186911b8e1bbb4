"""What the ladder reads of a speedup to search with it, in one value: :class:`LadderTraits`, the
class attribute ``ladder`` of every :class:`~fastloop.speedups.base.Speedup`. A run never reads it:
a speedup applies the same way whether the ladder tried it or a user named it.

The ladder decides by these traits, never by a speedup's name: which group it is searched in (the
feed, the compute bundle, the workload), whether a busy step can gain from it, what its ablation
costs, and whether it sizes itself (:class:`SelfSized`).

Example:
    >>> from fastloop.speedups import REGISTRY
    >>> workers = REGISTRY["workers"].ladder
    >>> workers.feeds, workers.ablation_rank, workers.sized.stat
    (True, 7, 'num_workers')
    >>> REGISTRY["tf32"].ladder.sized is None
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

__all__ = ["MOVED_TO_LADDER", "LadderTraits", "SelfSized", "no_sizes"]

Sizes = Callable[[dict], tuple[int | None, list[int]]]
"""From a run's statistics (its ``extra``): the size it chose (None: none) and the sizes to measure."""


def no_sizes(stats: dict) -> tuple[int | None, list[int]]:
    """No size chosen, none to measure (a speedup that sizes itself one way only).

    Example:
        >>> no_sizes({"num_workers": 4})
        (None, [])
    """
    return None, []


@dataclass(frozen=True, kw_only=True, slots=True)
class SelfSized:
    """A speedup that, without an option, sizes itself in each run (a probe of its own: the loader's
    worker count) and reports the size in the run's statistics: the ladder measures the sizes
    around it in the whole configuration (``NAME:N``) and keeps the fastest
    (:mod:`fastloop.drivers.ladder.sizing`)."""

    stat: str
    """The key of the run's statistics (``extra``) holding the size the probe chose."""
    around: Sizes
    """The size chosen and the sizes to measure around it in the configuration (the next smaller first)."""
    above_kept: Sizes = no_sizes
    """When the probe kept the user's own size (the speedup skipped itself): that size and the larger
    sizes the probe measured (the smallest first)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LadderTraits:
    """How the ladder searches with a speedup (the defaults: a compute speedup, not in the default
    ladder, never ablated). The A/B reads :attr:`feeds` too (a B that adds only feeds to A is told
    A's step rate), and the doctor :attr:`replaces_loader` (no loader advice for a GPU feed)."""

    in_default: bool = False
    """A rung of the default ladder (in the speedup's ``order``)."""
    feeds: bool = False
    """It makes the input pipeline deliver batches sooner (it does not change the step's work): it
    can only give back time the step spends waiting for data, so the ladder does not measure it
    when the GPU is already busy nearly the whole step."""
    feeds_copy_only: bool = False
    """A feed that only makes the copy to the device cheaper or hidden (``pin_memory``,
    ``prefetch``): the most it can give back is the copy's host time or the GPU's wait for the
    batch, not the loader's own work (which stays in the main process)."""
    replaces_loader: bool = False
    """A feed serving batches on the GPU in place of the loader: with it, the CPU feed has nothing to do."""
    needs_in_memory_tensors: bool = False
    """It applies only to a dataset of in-memory tensors (the ladder reads the run's dataset)."""
    stored_on_device: bool = False
    """It serves the dataset's stored tensors from the device's memory (``gpu_resident``,
    ``gpu_augment``): where the run's data checks let it apply, the ladder measures the compute
    stack with it (an expert's first move: the step is then measured without waiting on the CPU)."""
    changes_workload: bool = False
    """It changes the step's work (the batch size): the ladder tries it alone, after the rest."""
    ablation_rank: int | None = None
    """It costs something when it does not help (compile, capture, precision, layout, processes):
    the ladder's ablation takes it out to check, lowest rank first; None: never ablated."""
    sized: SelfSized | None = None
    """How it sizes itself in each run, when it does (None: it does not)."""


MOVED_TO_LADDER = frozenset(f.name for f in fields(LadderTraits)) | {
    "in_default_ladder",
    "sized_stat",
    "sizes_around",
    "sizes_above_kept",
}
"""The names of the ladder's traits, which a :class:`~fastloop.speedups.base.Speedup` subclass sets in
its ``ladder`` value, never as class attributes of its own (such an attribute would be ignored)."""
