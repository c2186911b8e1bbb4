"""fast_validation under Lightning: the fit's validation loop fed, compiled, warmed and graphed as its
training step is (:mod:`fastloop.speedups.fast_validation` says what and why; this module says where).

- **The feed** (``setup``): the validation loaders' source is patched as the training loader's is by
  ``change_loader``: each validation DataLoader, as Lightning prepares it for validation (under DDP this
  rank's ``DistributedSampler``), goes through the change each feed speedup of this fit made to the
  training loader (:func:`note_loader_change` keeps them), where the speedup
  :attr:`~fastloop.speedups.base.Speedup.feeds_validation`, in ladder order. Each change runs with a
  context of its own, so that what it decides and measures for validation is this speedup's to report
  and the training loader's record is left alone.
- **The warm-up** (``on_train_start``: the loaders are set up, the optimizers exist, no step has run):
  a batch of each size of the training loader's epoch through the training step and its backward, and
  of each validation loader's through the validation step, in the mode, grad mode and precision
  Lightning runs them in, inside :class:`~fastloop.speedups.fast_validation.KeptState`, with
  ``self.log`` dropped (a full batch padded per batch also at a second length). Then the short last
  validation batch is timed compiled and eager.
- **While the fit runs**: the compiles after the warm-up are counted
  (:class:`~fastloop.speedups.fast_validation.CompileCount`); on CUDA the validation step's own
  compiled call (compile's CUDA graphs) is swapped in for each validation run and out after it; a new
  step is marked before each graphed validation batch; a short batch measured faster eagerly runs under
  ``torch.compiler.set_stance("force_eager")``.

Every Lightning private it touches is in :mod:`fastloop.adapters._lightning_private`.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from fastloop._compat import LightningModule, Trainer

try:  # pragma: no cover - which branch runs depends on the machine
    from lightning.pytorch.utilities.model_helpers import is_overridden
except ImportError:  # pragma: no cover
    from pytorch_lightning.utilities.model_helpers import is_overridden  # type: ignore[no-redef]
from fastloop._torch_private import (
    compile_call,
    compiled_call,
    recompile_limit,
    recompile_limit_at_least,
    set_compiled_call,
)
from fastloop.adapters._lightning_private import (
    batch_as_the_loop_moves_it,
    evaluation_grad_mode,
    prepare_val_loader,
    set_val_source,
    val_source,
)
from fastloop.adapters.lightning_changes import compilable_children, loader_members, patch_attr
from fastloop.data import first_tensor
from fastloop.speedups.base import Context, RunInputs, Skip
from fastloop.speedups.compile.compile import CUDAGRAPH_MODES, compiled_by_user
from fastloop.speedups.fast_validation import (
    CompileCount,
    FastValidationOptions,
    KeptState,
    batch_of,
    epoch_batch_indices,
    faster_way,
    other_indices,
    recompile_budget,
    shapes_of,
)

__all__ = ["VALIDATION_GRAPH_MODE", "ValidationLikeTraining", "feed_like_training", "note_loader_change"]

VALIDATION_GRAPH_MODE = "reduce-overhead"
"""The compile mode of the validation step's own compiled call on CUDA: compile's CUDA graphs, which eval
can replay where training cannot (no optimizer, no gradients held between batches)."""

_LOADER_CHANGES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Trainer -> the changes its feed speedups made to the training loader: (speedup, its run, the function)."""


def note_loader_change(trainer: Trainer, run: Any, fn: Callable[[Any], Any], undo: list) -> None:
    """Keep, for this fit, that ``run``'s speedup changes the training loader with ``fn`` (called by the
    Lightning run's ``change_loader``); ``undo`` forgets it."""
    entry = (run.speedup, run, fn)
    changes = _LOADER_CHANGES.setdefault(trainer, [])
    changes.append(entry)
    undo.append(lambda: changes.remove(entry) if entry in changes else None)


def feed_like_training(trainer: Trainer, loader: Any, notes: list[dict]) -> Any:
    """``loader`` through each change this fit's feed speedups made to the training loader, where the
    speedup feeds validation and applied, in ladder order; ``notes`` gets each one's outcome (``name``,
    ``status``, ``reason`` or ``detail``). Each change runs with a context of its own (the device, and
    run inputs of its own: ``gpu_resident`` serving this loader from the device tells the CPU feeds
    after it): the feed functions read their run's context when called, so the training record is left
    as it was."""
    inputs: RunInputs | None = None
    for speedup, run, fn in sorted(_LOADER_CHANGES.get(trainer, []), key=lambda e: (e[0].order, e[0].name)):
        if not speedup.feeds_validation or not run.ctx.applied(speedup.name):
            continue
        trained = run.ctx
        inputs = inputs or RunInputs(
            step_rate=trained.inputs.step_rate, compile_cache=trained.inputs.compile_cache, batches_on_device=None
        )
        own = Context(trained.device, inputs=inputs)
        run.ctx = own
        try:
            changed = fn(loader)
        except Skip as why:
            notes.append({"name": speedup.name, "status": why.status, "reason": why.reason})
            continue
        finally:
            run.ctx = trained
        own.record(speedup.name, "applied")
        notes.append({"name": speedup.name, "status": "applied", "detail": own.records[speedup.name].detail})
        loader = changed
    return loader


def _data_loader(loader: Any) -> DataLoader | None:
    """The DataLoader a feed reads (a feed keeps the loader it wraps as ``.loader``), or None."""
    for _ in range(8):
        if isinstance(loader, DataLoader) or loader is None:
            return loader
        loader = getattr(loader, "loader", None)
    return None


def _leaves(loaders: Any) -> list[Any]:
    """The loaders of what ``trainer.train_dataloader`` or ``trainer.val_dataloaders`` hold, in Lightning's order."""
    if loaders is None:
        return []
    if isinstance(loaders, dict):
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]


def _synchronized(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _logs_dropped(module: LightningModule) -> Iterator[None]:
    """While inside, the module's ``self.log`` and ``self.log_dict`` do nothing (a warm-up step's values
    are not the fit's)."""

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    module.log = module.log_dict = nothing  # type: ignore[method-assign]
    try:
        yield
    finally:
        del module.log, module.log_dict


@contextlib.contextmanager
def _validating(trainer: Trainer) -> Iterator[None]:
    """The Trainer in its validation stage while inside (what Lightning's validation loop sets, and what
    a speedup's patched ``batch_to_device`` reads), the stage it was in after."""
    before = trainer.state.stage
    trainer.validating = True
    try:
        yield
    finally:
        trainer.state.stage = before


class ValidationLikeTraining:
    """fast_validation on one fit (see the module's docstring); installed by the Lightning run's
    ``validate_like_training``.

    Args:
        run: the fast_validation callback's Lightning run (its trainer, module, context, undo and hooks).
        options: the speedup's options.
        training_compile: the compile mode of the module's children in this fit, now (None: not compiled by fastloop).
        whole_step: whether cuda_graph replays the whole training step now (its engine captures each shape).
    """

    def __init__(
        self,
        run: Any,
        options: FastValidationOptions,
        *,
        training_compile: Callable[[], str | None],
        whole_step: Callable[[], bool],
    ) -> None:
        self.run, self.opts = run, options
        self.trainer: Trainer = run.trainer
        self.module: LightningModule = run.model
        self.ctx: Context = run.ctx
        self.name: str = run.speedup.name
        self.training_compile, self.whole_step = training_compile, whole_step
        self.count = CompileCount(self._phase)
        self.feed_notes: list[dict] = []
        self.warmup: dict[str, Any] = {"shapes": [], "not_warmed": []}
        self.short: list[dict] = []
        self.eager_sizes: dict[int, int] = {}
        """Validation loader index -> the size of its short last batch, run eagerly (measured faster)."""
        self.graphed = False
        """The validation step replays CUDA graphs (compile's, or its own compiled call's)."""
        self._own_calls: list[tuple[torch.nn.Module, Any]] = []
        self._swapped: list[tuple[torch.nn.Module, Any]] = []
        self._stance: Any = None

    # --- setup ---------------------------------------------------------------------------------
    def install(self) -> None:
        """What happens in ``setup``: the checks, the feed, the recompile limit, the hooks."""
        why = self._why_no_validation()
        if why:
            raise Skip(why)
        if self.opts.feed:
            self._feed_validation()
        children = len(compilable_children(self.module))
        budget = recompile_budget(children, default=recompile_limit()[0])
        self.run.hold(lambda: recompile_limit_at_least(budget))
        hooks = self.run.hooks
        hooks["train_start"].append(self.warm_up)
        hooks["validation_start"].append(self._validation_start)
        hooks["validation_batch_start"].append(self._batch_start)
        hooks["validation_batch_end"].append(self._batch_end)
        hooks["validation_end"].append(self._swap_out)
        hooks["fit_end"].append(self.finish)
        self.run.undo.append(self._end)
        self.ctx.describe(self.name, self._detail())

    def _why_no_validation(self) -> str | None:
        module, trainer = self.module, self.trainer
        if trainer.limit_val_batches == 0:  # first: a step benchmark's Trainer, whatever the module has
            return (
                "limit_val_batches=0: nothing is validated (as in a step benchmark, `fastloop run` or `ab` "
                "without --fit): fast_validation acts in whole fits"
            )
        if not is_overridden("validation_step", module):
            return f"{type(module).__name__} has no validation_step: the fit runs no validation to speed up"
        return None

    def _feed_validation(self) -> None:
        trainer, undo = self.trainer, self.run.undo
        inst = val_source(trainer)

        def fed(loader: Any) -> Any:
            members = loader_members(loader)
            parts = members or {None: loader}
            changed = {}
            for key, part in parts.items():
                changed[key] = feed_like_training(trainer, prepare_val_loader(trainer, part), self.feed_notes)
            self.run.loaders.extend(
                v for k, v in changed.items() if v is not parts[k]
            )  # their workers end with the fit
            self.ctx.describe(self.name, self._detail())
            if members is None:
                return changed[None]
            return changed if isinstance(loader, dict) else type(loader)(changed.values())

        if isinstance(inst, DataLoader) or loader_members(inst) is not None:
            set_val_source(trainer, fed(inst), undo)
        elif inst is not None and is_overridden("val_dataloader", inst):
            original = inst.val_dataloader
            patch_attr(inst, "val_dataloader", lambda: fed(original()), undo)

    # --- the warm-up (on_train_start) ------------------------------------------------------------
    def warm_up(self) -> None:
        """Plan the validation step's graphs, warm every shape (where the step is compiled), then count
        the compiles from here on."""
        started = time.perf_counter()
        warm_count = CompileCount(self._phase)
        warm_count.start()
        try:
            train_why, eval_why, own = self._plan()
            if own:
                children = compilable_children(self.module)
                self._own_calls = [(c, compile_call(c, mode=VALIDATION_GRAPH_MODE)) for _, c in children]
            if self.opts.warm:
                try:
                    self._warm(train_why, eval_why)
                except Exception as err:  # noqa: BLE001 - the user's step, outside its loop: the fit goes on
                    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                    self.warmup["not_warmed"].append(
                        f"the warm-up stopped at {type(err).__name__}: {first[:200]} (everything it ran was put "
                        "back; the shapes left compile when the fit meets them)"
                    )
            else:
                self.warmup["not_warmed"].append("warm=false: the shapes compile when the fit first meets them")
        finally:
            self.warmup["compiles"] = warm_count.stop()
            self.warmup["seconds"] = time.perf_counter() - started
            self.count.start()
            self.ctx.describe(self.name, self._detail())

    def _plan(self) -> tuple[str | None, str | None, bool]:
        """(why the training step is not warmed, why the validation step is not, whether it gets its own
        compiled call for CUDA graphs), from what is compiled now."""
        module, trainer = self.module, self.trainer
        compiled = any(compiled_call(m) is not None or compiled_by_user(m) for m in module.modules())
        whole = self.whole_step()
        mode = self.training_compile()
        children = compilable_children(module)
        own = (
            self.ctx.cuda
            and self.opts.graphs
            and mode not in CUDAGRAPH_MODES
            and (compiled or whole)
            and bool(children)
            and not any(compiled_by_user(c) for _, c in children)
        )
        self.graphed = own or mode in CUDAGRAPH_MODES
        train_why = (
            "nothing in the training step is compiled"
            if not compiled
            else "cuda_graph replays the whole training step: its engine captures each shape at its first step"
            if whole
            else "manual optimization: the training step steps the optimizer itself"
            if not module.automatic_optimization
            else f"{trainer.world_size} processes: a backward outside Lightning's step would reduce gradients "
            "across them"
            if trainer.world_size > 1
            else None
        )
        eval_why = None if (compiled or own) else "nothing in the validation step is compiled: it runs eagerly"
        return train_why, eval_why, own

    def _warm(self, train_why: str | None, eval_why: str | None) -> None:
        trainer, module = self.trainer, self.module
        trains = _leaves(trainer.train_dataloader)
        if train_why is None and len(trains) != 1:
            train_why = f"{len(trains)} training loaders, combined by Lightning: their batches are not one loader's"
        vals = _leaves(self._val_loaders()) if eval_why is None else []
        loaders = [_data_loader(x) for x in trains + vals]
        generators = [
            g
            for dl in loaders
            if dl is not None
            for g in (dl.generator, getattr(dl.sampler, "generator", None))
            if g is not None
        ]
        modes = [(m, m.training) for m in trainer.model.modules()]  # the strategy's wrappers too (DDP's)
        with KeptState(module, generators), _logs_dropped(module):
            if train_why is None:
                self._warm_training(trains[0])
            if eval_why is None:
                if self._own_calls and any(self._varies(loader) for loader in vals):
                    self._own_calls, self.graphed = [], False  # own calls: training's mode records no graphs
                    self.warmup["not_warmed"].append(
                        "validation graphs: its batches change shape beyond the batch size (padded per batch), "
                        "a CUDA graph would be recorded per shape; the validation step is not graphed"
                    )
                with _validating(trainer), evaluation_grad_mode(trainer)():
                    module.on_validation_model_eval()  # the user's override, as Lightning calls it
                    module.on_validation_epoch_start()  # where a step's accumulators are often reset
                    self._swap_in()
                    try:
                        for index, loader in enumerate(vals):
                            self._warm_validation(loader, index, len(vals))
                    finally:
                        self._swap_out()
                        for m, training in modes:
                            m.training = training
        for why, what in ((train_why, "training"), (eval_why, "validation")):
            if why:
                self.warmup["not_warmed"].append(f"{what}: {why}")

    def _val_loaders(self) -> Any:
        """The fit's validation loaders, set up as Lightning sets them up (it does so itself before the
        first epoch that validates; here also before a later one, for the warm-up)."""
        trainer = self.trainer
        if trainer.val_dataloaders is None and not trainer.reload_dataloaders_every_n_epochs:
            with _validating(trainer):
                trainer.fit_loop.epoch_loop.val_loop.setup_data()
        return trainer.val_dataloaders

    def _shapes(self, loader: Any, what: str) -> list[tuple[int, list, bool]]:
        """(size, indices, whether it is the short last batch) for each batch size of ``loader``'s epoch."""
        data = _data_loader(loader)
        shapes = epoch_batch_indices(data) if data is not None else {}
        if not shapes:
            self.warmup["not_warmed"].append(
                f"{what}: a {type(loader).__name__} whose batch sizes are not known before it is read"
            )
        sizes = list(shapes)
        return [(size, shapes[size], i > 0) for i, size in enumerate(sizes)]

    def _second_batch(self, loader: Any, indices: list, tries: int = 4) -> Any | None:
        """Another batch of the same size as the one at ``indices`` whose tensors' shapes differ from that
        one's (text padded per batch: the first of ``tries`` other batches that does), to warm too, so
        that the compiled step is general in what varies (Dynamo makes a dimension dynamic once it has
        seen two sizes of it, as the fit's second batch would); None where they all have its shapes."""
        data = _data_loader(loader)
        if data is None:
            return None
        shapes, taken = shapes_of(batch_of(data, indices)), list(indices)
        for _ in range(tries):
            other = other_indices(data, taken, len(indices))
            if other is None:
                return None
            second = batch_of(data, other)
            if shapes_of(second) != shapes:
                return second
            taken += other
        return None

    def _varies(self, loader: Any) -> bool:
        """Whether ``loader``'s full batches change shape beyond the batch size."""
        data = _data_loader(loader)
        shapes = epoch_batch_indices(data) if data is not None else {}
        return bool(shapes) and self._second_batch(loader, next(iter(shapes.values()))) is not None

    def _repeats(self, graphed: bool) -> int:
        """Calls per shape: one compiles it; compile's CUDA graphs warm up, then record, then replay."""
        return 3 if graphed else 1

    def _warm_training(self, loader: Any) -> None:
        trainer, module = self.trainer, self.module
        graphed = self.training_compile() in CUDAGRAPH_MODES
        for size, indices, short in self._shapes(loader, "training"):
            started = time.perf_counter()
            second = None if short else self._second_batch(loader, indices)
            batches = [batch_of(_data_loader(loader), indices)] + ([second] if second is not None else [])
            for batch in (batch_as_the_loop_moves_it(trainer, b, 0) for b in batches):
                for _ in range(self._repeats(graphed)):
                    if graphed:
                        torch.compiler.cudagraph_mark_step_begin()
                    out = trainer.strategy.training_step(batch, 0)
                    loss = out.get("loss") if isinstance(out, dict) else out
                    if isinstance(loss, torch.Tensor) and loss.requires_grad:
                        loss.backward()
                    for p in module.parameters():
                        p.grad = None
            _synchronized(self.ctx.device)
            self.warmup["shapes"].append(
                {"step": "training", "loader": 0, "batch": size, "seconds": time.perf_counter() - started}
                | ({"shapes": len(batches)} if len(batches) > 1 else {})
            )

    def _warm_validation(self, loader: Any, index: int, loaders: int) -> None:
        trainer = self.trainer
        kwargs = {"dataloader_idx": index} if loaders > 1 else {}

        def step(batch: Any) -> None:
            if self.graphed:
                torch.compiler.cudagraph_mark_step_begin()
            trainer.strategy.validation_step(batch, 0, **kwargs)

        for size, indices, short in self._shapes(loader, f"validation loader {index}"):
            batch = batch_as_the_loop_moves_it(trainer, batch_of(_data_loader(loader), indices), index)
            if short and self.opts.short == "eager":
                self.eager_sizes[index] = size
                self.short.append({"loader": index, "batch": size, "runs": "eager", "rule": "eager"})
                continue
            started = time.perf_counter()
            second = None if short else self._second_batch(loader, indices)
            batches = [batch] + ([batch_as_the_loop_moves_it(trainer, second, index)] if second is not None else [])
            for each in batches:
                for _ in range(self._repeats(self.graphed)):
                    step(each)
            _synchronized(self.ctx.device)
            self.warmup["shapes"].append(
                {"step": "validation", "loader": index, "batch": size, "seconds": time.perf_counter() - started}
                | ({"shapes": len(batches)} if len(batches) > 1 else {})
            )
            if short and self.opts.short == "measure":
                self._measure_short(lambda batch=batch: step(batch), index, size)
            elif short:
                self.short.append({"loader": index, "batch": size, "runs": "compiled", "rule": "compile"})

    def _measure_short(self, step: Callable[[], None], index: int, size: int, repeats: int = 3) -> None:
        """Time the short batch's step compiled and eagerly (the fastest of ``repeats`` each); the faster runs."""

        def fastest() -> float:
            best = float("inf")
            for _ in range(repeats):
                _synchronized(self.ctx.device)
                started = time.perf_counter()
                step()
                _synchronized(self.ctx.device)
                best = min(best, time.perf_counter() - started)
            return best

        compiled_s = fastest()
        with torch.compiler.set_stance("force_eager"):
            eager_s = fastest()
        way = faster_way(compiled_s, eager_s)
        if way == "eager":
            self.eager_sizes[index] = size
        self.short.append(
            {
                "loader": index,
                "batch": size,
                "runs": way,
                "rule": "measure",
                "compiled_s": compiled_s,
                "eager_s": eager_s,
            }
        )

    # --- while the fit runs ----------------------------------------------------------------------
    def _phase(self) -> str:
        trainer = self.trainer
        return "validation" if trainer.sanity_checking or trainer.validating else "train"

    def _validation_start(self) -> None:
        self._swap_in()

    def _swap_in(self) -> None:
        """The validation step's own compiled calls in place of the training step's (CUDA graphs)."""
        if self._swapped:
            return
        for child, call in self._own_calls:
            self._swapped.append((child, compiled_call(child)))
            set_compiled_call(child, call)

    def _swap_out(self) -> None:
        while self._swapped:
            child, before = self._swapped.pop()
            set_compiled_call(child, before)

    def _batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.graphed:
            torch.compiler.cudagraph_mark_step_begin()  # the previous batch's graph outputs are done with
        size = self.eager_sizes.get(dataloader_idx)
        first = first_tensor(batch) if size is not None else None
        if first is not None and first.dim() and first.shape[0] == size:
            self._stance = torch.compiler.set_stance("force_eager")

    def _batch_end(self, *args: Any) -> None:
        if self._stance is not None:
            self._stance.__exit__(None, None, None)
            self._stance = None

    def _end(self) -> None:
        """At teardown (also after an exception): stop counting, put the compiled calls and the stance back."""
        self._batch_end()
        self._swap_out()
        self.count.stop()

    def finish(self) -> None:
        """When the fit ends: the counts and what was done, into the record and its statistics."""
        self.ctx.stats[self.name] = {
            "compiles_after_warmup": self.count.stop(),
            "warmup": dict(self.warmup),
            "short_batch": list(self.short),
            "feed": list(self.feed_notes),
            "graphed": self.graphed,
        }
        self.ctx.describe(self.name, self._detail())

    def _detail(self) -> str:
        """The record's detail: the feed, the warm-up, the short batch, the graphs, the compiles counted."""
        parts = []
        if self.feed_notes:
            parts.append("validation loader: " + "; ".join(_note_text(n) for n in self.feed_notes))
        elif self.opts.feed:
            parts.append("validation loader as given (no feed speedup of this fit applies to it)")
        if "seconds" in self.warmup:
            shapes = self.warmup["shapes"]
            named = ", ".join(
                f"{shape['step']} {shape['batch']}" + (f" at {shape['shapes']} lengths" if "shapes" in shape else "")
                for shape in shapes
            )
            warmed = (
                f"warmed {len(shapes)} shapes ({named}) in {self.warmup['seconds']:.2f} s, "
                f"{self.warmup['compiles']['total']} compiles"
                if shapes
                else "nothing warmed"
            )
            skipped = self.warmup["not_warmed"]
            parts.append(warmed + (f" ({'; '.join(skipped)})" if skipped else ""))
        for s in self.short:
            timed = (
                f" ({1e3 * s['compiled_s']:.2f} ms compiled, {1e3 * s['eager_s']:.2f} ms eager)"
                if "eager_s" in s
                else ""
            )
            parts.append(f"short last validation batch ({s['batch']} samples) runs {s['runs']}{timed}")
        if self.graphed:
            parts.append("validation replays CUDA graphs")
        counted = self.count.summary()
        if counted["eager_frames"] is not None:
            parts.append(
                f"after the warm-up {counted['total']} compiles (training {counted['train']}, validation "
                f"{counted['validation']}), {counted['eager_frames']} frames left eager by Dynamo"
            )
        return "; ".join(parts)


def _note_text(note: dict) -> str:
    if note["status"] == "applied":
        return f"{note['name']} ({note['detail']})" if note.get("detail") else note["name"]
    return f"{note['name']} {note['status']} ({note['reason']})"
