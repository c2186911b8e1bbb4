"""``fast_validation``: the validation loop fed, compiled and warmed as the training step is.

Every other speedup targets the training step; the validation loop a fit runs every epoch gets
nothing, or worse: its loader keeps the workers the user gave it (often none) while the training
loader gets 8, and a compiled step recompiles in the middle of the fit, once for eval mode and the
grad mode Lightning validates in, and again for each short last batch (``drop_last=False``, the common
case for validation). With this speedup:

1. **The validation loader is fed as the training loader is.** The run's feed speedups whose change
   holds for any loader (:attr:`~fastloop.speedups.base.Speedup.feeds_validation`: ``workers``,
   ``pin_memory``, ``prefetch``, ``gpu_resident``) are applied to it too, each on its own terms (a
   ``workers`` without a count measures this loader), to the loader as Lightning prepares it for
   validation (under DDP this rank's share). One place per speedup: each feed's change of a loader
   stays in its own module; this one only says that it holds for validation.
2. **Every batch shape of the fit is compiled before its first step.** Where the training step is
   compiled (the ``compile`` speedup, ``cuda_graph``'s compiled tier, or the user's own
   ``torch.compile``), the training step (with its backward) and the validation step are run once on
   a batch of each size an epoch has (the full one and the short last one; the full one at a second
   length too where batches are padded per batch, so that Dynamo makes the length dynamic then), in
   train mode and in the mode and grad mode Lightning validates in, when training starts. Nothing
   the warm-up runs stays: the
   module's buffers (BatchNorm's running statistics), its attributes (a list of outputs, a
   torchmetrics state), the gradients, every random generator and the optimizer are as before it
   (:class:`KeptState`), and what the steps log is dropped.
3. **No compile after the warm-up, counted.** Every compile Dynamo runs after the warm-up (a new
   frame, a recompile, a backward compiled when first run, a CUDA graph recorded) is counted, by
   phase (training or validation), with the frames Dynamo gave up on and left eager
   (:class:`CompileCount`); the record says how many (the goal is 0). Modules compiled in place share
   one of Dynamo's recompile limits (:func:`fastloop._torch_private.recompile_limit_at_least`): the
   limit is raised so that each compiled child keeps torch's own budget.
4. **The short last batch, compiled or eager by measurement.** After the warm-up the short last
   validation batch is timed compiled and eager, and runs the faster way (``short=measure``), or as
   told (``compile``, ``eager``). Every sample is evaluated exactly once: no batch is dropped or
   padded (padding would change what ``validation_step`` averages over).
5. **Graphed where it can be.** On CUDA, where fastloop compiles the step or ``cuda_graph`` replays
   the whole training step, the validation step replays CUDA graphs too (compile's ``reduce-overhead``:
   eval holds no optimizer state and no gradients between batches), one per shape, recorded in the
   warm-up: a compile of its own, or the training's where that already records graphs. The user's own
   ``torch.compile`` keeps the user's mode (warmed and counted, not graphed).

The plain loop (``FastLoop``) has no validation loop: there it is skipped with that reason.

The card (when it helps, when it hurts, what it costs): ``docs/speedups/fast_validation.md``.
The functional core here knows no Lightning; the Lightning side is
:mod:`fastloop.adapters.lightning_validation`.
"""

from __future__ import annotations

import copy
import itertools
import random
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader

from fastloop._torch_private import compile_event_hooks, dynamo_frames
from fastloop.data import map_tensors
from fastloop.speedups.base import Speedup, register
from fastloop.speedups.options import Options, option
from fastloop.speedups.run import Run

__all__ = [
    "SHORT_RULES",
    "CompileCount",
    "FastValidation",
    "FastValidationOptions",
    "KeptState",
    "batch_of",
    "epoch_batch_indices",
    "faster_way",
    "other_indices",
    "recompile_budget",
    "shapes_of",
]

SHORT_RULES = ("measure", "compile", "eager")
"""How the short last validation batch runs: whichever way the warm-up timed faster, compiled, eager."""


@dataclass(frozen=True, kw_only=True)
class FastValidationOptions(Options):
    """Options of ``fast_validation``."""

    speedup = "fast_validation"
    short: str = option(
        "measure",
        "the short last validation batch: measure (compiled or eager, whichever the warm-up timed faster), "
        "compile, eager",
        choices=SHORT_RULES,
    )
    warm: bool = option(True, "compile every batch shape of the fit (train and eval modes) before its first step")
    feed: bool = option(True, "feed the validation loader through the run's feed speedups, as the training loader")
    graphs: bool = option(True, "on CUDA, replay the validation step as CUDA graphs where training is compiled")


def epoch_batch_indices(loader: Any) -> dict[int, list]:
    """The indices of one batch of each size an epoch of ``loader`` has, by size in the order met (the
    full batch, then the short last one where ``drop_last=False`` leaves one); empty for what is not a
    DataLoader with a sized batch sampler (an iterable dataset's batches are known only once read).
    The loader's generators are left as they were; a sampler drawing from torch's global generator
    draws from it (the caller keeps it: :class:`KeptState`).

    Example:
        >>> loader = DataLoader(list(range(37)), batch_size=8)
        >>> {size: indices[:3] for size, indices in epoch_batch_indices(loader).items()}
        {8: [0, 1, 2], 5: [0, 1, 2]}
        >>> epoch_batch_indices(DataLoader(list(range(37)), batch_size=8, drop_last=True)).keys()
        dict_keys([8])
    """
    if not isinstance(loader, DataLoader) or loader.batch_sampler is None:
        return {}
    batches = loader.batch_sampler
    try:
        total = len(batches)
    except TypeError:
        return {}
    generators = [g for g in (loader.generator, getattr(loader.sampler, "generator", None)) if g is not None]
    states = [g.get_state() for g in generators]
    try:
        if isinstance(batches, BatchSampler):  # the sizes from the lengths, a batch's indices from the sampler
            n, size = len(batches.sampler), batches.batch_size
            sizes = [size] * (n >= size) + [n % size] * (not batches.drop_last and n % size > 0)
            first = list(itertools.islice(iter(batches.sampler), max(sizes, default=0)))
            return {s: first[:s] for s in sizes}
        found: dict[int, list] = {}
        for indices in itertools.islice(iter(batches), total):  # a batch sampler of the user's: read its epoch
            found.setdefault(len(indices), list(indices))
        return found
    finally:
        for g, state in zip(generators, states):
            g.set_state(state)


def batch_of(loader: DataLoader, indices: list) -> Any:
    """The batch ``loader`` builds from the samples at ``indices`` (its dataset read in this process, its
    ``collate_fn``): the shapes, dtypes and layout of the loader's own batch of that size.

    Example:
        >>> batch_of(DataLoader(list(range(37)), batch_size=8), [3, 4, 5])
        tensor([3, 4, 5])
    """
    return loader.collate_fn([loader.dataset[i] for i in indices])


def other_indices(loader: DataLoader, exclude: list, count: int) -> list | None:
    """``count`` samples of ``loader``'s dataset, none of them in ``exclude`` (the first ones by
    position), to build another batch of a size; None where the dataset has no length or too few samples.

    Example:
        >>> other_indices(DataLoader(list(range(37))), [0, 1, 2], 3), other_indices(DataLoader([1, 2]), [0], 2)
        ([3, 4, 5], None)
    """
    try:
        n = len(loader.dataset)  # type: ignore[arg-type]
    except TypeError:
        return None
    taken = set(exclude)
    out = list(itertools.islice((i for i in range(n) if i not in taken), count))
    return out if len(out) == count else None


def shapes_of(batch: Any) -> list[tuple[int, ...]]:
    """The shapes of a batch's tensors, in the order met (what a compiled step is specialized to).

    Example:
        >>> shapes_of({"ids": torch.zeros(8, 30, dtype=torch.long), "labels": torch.zeros(8)})
        [(8, 30), (8,)]
    """
    found: list[tuple[int, ...]] = []

    def note(t: torch.Tensor) -> torch.Tensor:
        found.append(tuple(t.shape))
        return t

    map_tensors(note, batch)
    return found


def recompile_budget(compiled_children: int, default: int = 8, calls_per_child: int = 2) -> int:
    """The recompile limit that leaves each module compiled in place torch's own budget (``default``
    entries for each of its ``calls_per_child`` compiled calls: training's and validation's): they all
    run one code object and share one limit.

    Example:
        >>> recompile_budget(3)
        48
    """
    return default * max(1, compiled_children) * max(1, calls_per_child)


def faster_way(compiled_s: float, eager_s: float) -> str:
    """``"eager"`` when the short batch ran faster eagerly than compiled, else ``"compiled"`` (a tie
    keeps the compiled graph, already paid for by the warm-up).

    Example:
        >>> faster_way(compiled_s=0.004, eager_s=0.003), faster_way(compiled_s=0.002, eager_s=0.003)
        ('eager', 'compiled')
    """
    return "eager" if eager_s < compiled_s else "compiled"


def _random_states() -> dict[str, Any]:
    """Every random generator a step may draw from: torch's (the CPU's and each initialized CUDA
    device's), Python's and, where it is imported, NumPy's."""
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
    return states


def _set_random_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])
    if "numpy" in states:
        sys.modules["numpy"].random.set_state(states["numpy"])


_CONTAINERS = (list, dict, set)
_MODULE_TABLES = ("_parameters", "_buffers", "_modules")


def _write_back(tensor: torch.Tensor, saved: torch.Tensor) -> None:
    """``saved``'s values into ``tensor`` in place (an inference tensor, made while Lightning validated,
    can only be written inside inference mode)."""
    with torch.inference_mode() if tensor.is_inference() else torch.no_grad():
        tensor.copy_(saved)


def _refill(container: Any, saved: Any) -> None:
    """Put ``saved``'s items back into ``container`` (the same object: others may hold it)."""
    container.clear()
    if isinstance(container, list):
        container.extend(saved)
    else:
        container.update(saved)


class KeptState:
    """What running a module's steps outside the fit may change, taken when entered and put back
    exactly on exit: every random generator (torch's, CUDA's, Python's, NumPy's, and ``generators``),
    each submodule's attributes (a counter, a list of outputs, a torchmetrics state: containers
    refilled in place, tensors written back in place), its buffers (BatchNorm's running statistics and
    its batch count), its mode, and the parameters' gradients (set aside while inside: a backward
    there writes new ones). The parameters themselves and the optimizer are not touched by a step
    without an optimizer step, and are not copied.

    Example:
        >>> bn = torch.nn.BatchNorm1d(3)
        >>> bn.seen = []
        >>> with KeptState(bn):
        ...     _ = bn(torch.randn(4, 3)); bn.seen.append(1); _ = bn.eval(); _ = torch.rand(1)
        >>> bool(bn.running_mean.eq(0).all()), int(bn.num_batches_tracked), bn.seen, bn.training
        (True, 0, [], True)
    """

    def __init__(self, module: torch.nn.Module, generators: Iterable[torch.Generator] = ()) -> None:
        self.module = module
        self.generators = list(generators)

    def __enter__(self) -> KeptState:
        self._random = _random_states()
        self._generators = [g.get_state() for g in self.generators]
        self._modules = [(m, dict(vars(m)), self._copies(m)) for m in self.module.modules()]
        self._buffers = [(b, b.detach().clone()) for b in self.module.buffers()]
        self._grads = [(p, p.grad) for p in self.module.parameters()]
        for p, _ in self._grads:
            p.grad = None
        return self

    @staticmethod
    def _copies(m: torch.nn.Module) -> dict[str, Any]:
        """Shallow copies of ``m``'s containers and clones of its tensors that are not parameters."""
        out: dict[str, Any] = {}
        for key, value in vars(m).items():
            if isinstance(value, _CONTAINERS):
                out[key] = copy.copy(value)
            elif isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                out[key] = value.detach().clone()
        return out

    def __exit__(self, *exc: Any) -> None:
        for m, attrs, copies in self._modules:
            now = vars(m)
            for key in [k for k in now if k not in attrs]:  # what the steps added
                del now[key]
            for key, value in attrs.items():
                if key in copies and isinstance(value, _CONTAINERS):
                    _refill(value, copies[key])
                elif key in copies:
                    _write_back(value, copies[key])
                now[key] = value
        for buffer, saved in self._buffers:
            _write_back(buffer, saved)
        for p, grad in self._grads:
            p.grad = grad
        _set_random_states(self._random)
        for g, state in zip(self.generators, self._generators):
            g.set_state(state)


class CompileCount:
    """The compiles Dynamo runs between :meth:`start` and :meth:`stop` (each compile event: a new frame
    or a recompile, a backward compiled when first run, a CUDA graph recorded), by the phase
    ``phase()`` names when each begins, and the frames Dynamo tried in that time and left eager (a
    recompile limit reached). Process-wide, as Dynamo's hooks are.

    Example:
        >>> count = CompileCount(lambda: "validation")
        >>> count.start()
        >>> f = torch.compile(lambda x: x * 2, backend="eager")
        >>> _ = f(torch.ones(2)); _ = f(torch.ones(2))
        >>> count.stop()["validation"]
        1
    """

    def __init__(self, phase: Callable[[], str]) -> None:
        self.phase = phase
        self.by_phase: dict[str, int] = {}
        self.triggers: dict[str, int] = {}
        self._undo: Callable[[], None] | None = None
        self._frames = (0, 0)
        self._eager_frames: int | None = None

    @property
    def counting(self) -> bool:
        return self._undo is not None

    def start(self) -> None:
        """Count from now (again from zero)."""
        self.stop()
        self.by_phase, self.triggers, self._eager_frames = {}, {}, None
        self._frames = dynamo_frames()
        self._undo = compile_event_hooks(self._started, lambda args: None)

    def _started(self, args: Any) -> None:
        phase = self.phase()
        self.by_phase[phase] = self.by_phase.get(phase, 0) + 1
        trigger = str(getattr(getattr(args, "callback_trigger", None), "name", None) or "dynamo").lower()
        self.triggers[trigger] = self.triggers.get(trigger, 0) + 1

    def stop(self) -> dict[str, Any]:
        """Stop counting; what was counted (:meth:`summary`)."""
        if self._undo is not None:
            self._undo()
            self._undo = None
            total, ok = dynamo_frames()
            self._eager_frames = (total - ok) - (self._frames[0] - self._frames[1])
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """``{"train", "validation", "total", "triggers", "eager_frames"}`` (``eager_frames``: None while counting)."""
        return {
            "train": self.by_phase.get("train", 0),
            "validation": self.by_phase.get("validation", 0),
            "total": sum(self.by_phase.values()),
            "triggers": dict(self.triggers),
            "eager_frames": self._eager_frames,
        }


@register
class FastValidation(Speedup):
    __doc__ = __doc__
    name = "fast_validation"
    changes = "step"
    order = 68
    compiles = True  # on CUDA it may compile the validation step for graphs
    options_type = FastValidationOptions

    def apply(self, run: Run) -> None:
        run.validate_like_training(self.opts)

    def claims(self, err: BaseException) -> bool:
        """A validation step that keeps an output of a replayed graph past the next batch: torch says the
        graph's next replay overwrote it (the fit is repeated without this speedup)."""
        return isinstance(err, RuntimeError) and "overwritten by a subsequent" in str(err)
