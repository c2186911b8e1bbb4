"""The one interface through which every speedup changes a training run.

A speedup's :meth:`~fastloop.speedups.base.Speedup.apply` makes all of its change through a
:class:`Run`: the model, the optimizers (and what steps them), the loader, the batch once it is
on the device, the step's autocast, a wrapper around the step. Each adapter implements
:class:`Run` once: the plain loop (:class:`fastloop.adapters.loop.LoopRun`) makes each change at
once; the Lightning callbacks (:class:`fastloop.adapters.lightning_run.LightningRun`) make it at
the hook where Lightning lets it happen and put it back at teardown. :func:`apply_all` is the one
place both adapters apply speedups and write their records.

Example:
    >>> import torch
    >>> from fastloop.speedups import resolve
    >>> from fastloop.speedups.base import Context, apply_all
    >>> class Shown(Run):  # a run that only says what it was asked
    ...     def __init__(self):
    ...         self.ctx, self.model, self.asked = Context(torch.device("cpu")), torch.nn.Linear(2, 2), []
    ...     def autocast(self, dtype, *, scale_loss=False):
    ...         self.asked.append(f"autocast {dtype}")
    >>> run = Shown()
    >>> apply_all(resolve("bf16,channels_last"), run)
    >>> run.asked, [(r.name, r.status, r.reason) for r in run.ctx.records.values()]
    (['autocast torch.bfloat16'], [('bf16', 'applied', ''), ('channels_last', 'skipped', 'model has no Conv2d layers')])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch

from fastloop.speedups.records import Context, Skip

__all__ = ["Run", "eval_loss"]


def eval_loss(model: torch.nn.Module, loss: Callable[[], Any], seed: int = 0) -> torch.Tensor:
    """``loss()`` as :meth:`Run.batch_loss` computes it: ``model`` in eval mode, no gradients,
    fp32 matmuls (TF32 off), the random state seeded with ``seed`` and put back after; a dict
    result gives its ``"loss"``."""
    out = eval_call(model, loss, seed)
    if isinstance(out, dict):
        out = out.get("loss")
    if not torch.is_tensor(out):
        raise TypeError(f"the step returned {type(out).__name__}, not a loss tensor")
    return out.detach().float()


def eval_call(model: torch.nn.Module, fn: Callable[[], Any], seed: int = 0) -> Any:
    """``fn()`` with ``model`` in eval mode, no gradients, fp32 matmuls (TF32 off, no autocast),
    the random state seeded with ``seed`` and put back after (what :func:`eval_loss` and a
    speedup's output comparison run under)."""
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    was_training = model.training
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        model.eval()
        with torch.random.fork_rng(devices=devices), torch.no_grad(), torch.autocast("cpu", enabled=False):
            torch.manual_seed(seed)
            out = fn()
    finally:
        model.train(was_training)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    return out


class Run:
    """What one training run lets a speedup change. Every method either makes the change now or
    arranges it at the point of the run where it can happen; a change the run cannot make raises
    :class:`~fastloop.speedups.base.Skip` with the reason (the defaults here do).

    Attributes:
        ctx: the run's :class:`~fastloop.speedups.base.Context` (device, declared inputs, records).
        model: the model a speedup's ``why_not_model`` looks at (the LightningModule under Lightning).
        speedup: the speedup being applied (set by :func:`apply_all`): a change that fails later,
            while the run trains, is recorded against it.
    """

    ctx: Context
    model: Any = None
    speedup: Any = None  # the Speedup (speedups/base.py imports this module)

    def _cannot(self, what: str) -> Skip:
        return Skip(f"this run ({type(self).__name__}) cannot {what}")

    def change_model(self, fn: Callable[[torch.nn.Module], torch.nn.Module]) -> None:
        """``fn(model)`` returns the model to train (it may change it in place and return it).
        One meaning in both adapters: the plain loop trains what ``fn`` returns; Lightning, which
        cannot swap its LightningModule, keeps the module when ``fn`` changes it in place, and
        where ``fn`` returns a new object (a wrapper) applies ``fn`` to each child with parameters
        and trains those wrappers (skipped, with the reason, where there are none)."""
        raise self._cannot("change the model")

    def compile_step(self, mode: str, shapes: str = "auto") -> None:
        """``torch.compile`` (in ``mode``, with the ``shapes`` rule of
        :data:`fastloop.speedups.compile.compile.SHAPES`) what the train step calls: the model in a plain
        loop, the LightningModule's children with parameters under Lightning (it calls ``training_step``)."""
        raise self._cannot("compile the step")

    def change_optimizers(self, fn: Callable[[torch.optim.Optimizer], Any]) -> None:
        """``fn(optimizer)`` changes each optimizer in place, as soon as it exists; a
        :class:`Skip` it raises for one optimizer is that speedup's record, the others still change."""
        raise self._cannot("change the optimizers")

    def change_loader(self, fn: Callable[[Iterable], Iterable]) -> None:
        """``fn(loader)`` returns the training loader to use (when the run asks for it)."""
        raise self._cannot("change the loader")

    def change_batch(self, fn: Callable[[Any], Any]) -> None:
        """``fn(batch)`` transforms each batch once it is on the device, before the step sees it."""
        raise self._cannot("change the batch")

    def batches_arrive_on_device(self) -> None:
        """The loader now delivers batches already on the device: the run does not copy them."""
        raise self._cannot("take batches already on the device")

    def autocast(self, dtype: torch.dtype, *, scale_loss: bool = False) -> None:
        """Run the step's forward and loss under autocast to ``dtype``; ``scale_loss``: with a
        GradScaler (fp16), whose skipped steps do not advance a scheduler."""
        raise self._cannot("autocast the step")

    def graph_step(self) -> None:
        """Replay the train step as CUDA graphs: the whole step where it can be captured, else
        the next tier, and the tier that ran in the statistics (``cuda_graph_tier``)."""
        raise self._cannot("capture the step")

    def graph_tier_facts(self) -> Any:
        """What decides the tier below the whole step here
        (:class:`~fastloop.speedups.cuda_graph.cuda_graph.TierFacts`), for
        :func:`~fastloop.speedups.cuda_graph.cuda_graph.below_whole`."""
        raise self._cannot("say what the step could compile")

    def compile_for_tier(self, mode: str | None, *, mark_steps: bool) -> None:
        """Compile what the step calls in ``mode`` for a tier below the whole step (None: nothing
        to compile), in place of a mode the compile speedup set (compile is lazy); ``mark_steps``:
        compile's CUDA graphs replay, so each step is marked as a new one."""
        raise self._cannot("compile the step for a graph tier")

    def batch_loss(self, batch: Any) -> torch.Tensor:
        """The loss the train step computes on ``batch`` (already on the model's device) in eval
        mode, without gradients, TF32 or autocast, from the same random state each call, changing
        nothing (the model's mode and the random state are put back)."""
        raise self._cannot("compute a batch's loss outside the step")

    def defer_logging(self, every: int | None, seconds: float | None) -> None:
        """Keep what the step logs on the device and read it to the host at most every ``every``
        steps or ``seconds`` seconds, whichever first (a :class:`~fastloop.speedups.deferred_logging.Cadence`),
        in one transfer, instead of after each step: every value still reaches the logger, at its step."""
        raise self._cannot("defer the reads of logged values")

    def validate_like_training(self, options: Any) -> None:
        """The run's validation loop treated as its training step is (``fast_validation``, with its
        :class:`~fastloop.speedups.fast_validation.FastValidationOptions`): the validation loaders fed
        through the run's feed speedups that hold for any loader, each batch shape of training and
        validation compiled before the first step with nothing it ran kept, the compiles after that
        counted, the short last validation batch compiled or eager, the validation step graphed on CUDA
        where training is compiled."""
        raise self._cannot("change how it validates")

    def save_checkpoints_with(self, writer: Any) -> None:
        """The run's checkpoint saves go through ``writer`` (an
        :class:`~fastloop.speedups.async_checkpoint.CheckpointWriter`): Lightning's saves and
        deletions (``trainer.save_checkpoint``, ``ModelCheckpoint``), ``FastLoop.save_checkpoint``;
        the writer's last write ends (or, after Ctrl-C, is abandoned) when the run ends."""
        raise self._cannot("save checkpoints")

    def hold(self, context: Callable[[], AbstractContextManager]) -> None:
        """Hold ``context()`` while the run trains (a global switch such as TF32, put back on exit)."""
        raise self._cannot("hold a context while it trains")
