"""What a LightningModule's ``training_step`` reads that a captured step would freeze: the
Trainer's step counters and the batch index, found in its source (and in the module's own
methods it calls), for the whole-step graph's blocker (:mod:`fastloop.adapters.lightning_graph`).

Example:
    >>> from tests.targets import graph_pattern
    >>> step_reads_counters(graph_pattern("anneal")[0])
    'self.global_step'
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

from fastloop._compat import LightningModule

__all__ = ["COUNTERS", "host_draws", "step_reads_counters"]

COUNTERS = ("global_step", "current_epoch")
"""Trainer counters a training step may read (a warm-up factor, an annealed weight)."""


def _own_classes(cls: type) -> list[type]:
    """The user's classes in ``cls``'s MRO (not Lightning's, torch's or fastloop's), most derived first."""
    return [
        k
        for k in cls.__mro__
        if k.__module__.split(".")[0] not in ("lightning", "pytorch_lightning", "torch", "builtins", "fastloop")
    ]


def _method(classes: list[type], name: str, after: type | None = None) -> tuple[Any, type] | None:
    """The user's function ``name`` as ``self.name`` finds it (or ``super().name`` from ``after``)."""
    seen = after is None
    for klass in classes:
        if not seen:
            seen = klass is after
            continue
        fn = vars(klass).get(name)
        if callable(fn):
            return fn, klass
    return None


def _chain(node: Any) -> list[str]:
    """``np.random.beta`` -> ["np", "random", "beta"]; [] for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return []
    return [node.id, *reversed(parts)]


def _parse(fn: Any) -> Any:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    node = tree.body[0] if tree.body else None
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


_TORCH_DRAWS = ("rand", "randn", "randint", "randperm")


def _host_draw(call: ast.Call) -> str | None:
    """A draw on the host: Python's or numpy's generator, or a torch draw that names no device (a
    CPU tensor; ``torch.rand_like(x)`` and ``device=x.device`` draw on the GPU, which a graph replays)."""
    chain = _chain(call.func)
    host = chain[:1] == ["random"] or chain[:2] in (["np", "random"], ["numpy", "random"])
    if len(chain) == 2 and chain[0] == "torch" and chain[1] in _TORCH_DRAWS:
        host = not any(kw.arg == "device" for kw in call.keywords)
    if host:
        return f"{'.'.join(chain)}() (a draw on the host: the replay would reuse the value drawn at capture)"
    return None


def host_draws(fn: Any, model: Any = None) -> str | None:
    """What a plain step function (the plain loop's ``step_fn(model, batch)``) does that a captured
    step would freeze: a draw on the host (Python's or numpy's generator, a torch draw with no
    device) in its own source, or, in a method of ``model``'s own classes that it calls on its
    first argument (``model.training_step(batch, 0)``), what Lightning's check finds in
    ``training_step`` (:func:`step_reads_counters`: a draw, a counter, a Python number it updates),
    followed the same two levels down. None if none is found or the source cannot be read.

    Example:
        >>> from tests.targets import mixup_step
        >>> host_draws(mixup_step)[:16]
        'np.random.beta()'
    """
    node = _parse(fn)
    if node is None:
        return None
    direct = next((why for sub in ast.walk(node) if isinstance(sub, ast.Call) and (why := _host_draw(sub))), None)
    if direct or model is None or not node.args.args:
        return direct
    first = node.args.args[0].arg
    classes = _own_classes(type(model))
    for sub in ast.walk(node):
        f = sub.func if isinstance(sub, ast.Call) else None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == first:
            found = _method(classes, f.attr)
            callee = _parse(found[0]) if found else None
            what = _reads(callee, found[1], classes, None, 2, model) if callee is not None else None
            if what:
                return f"{what} (in {f.attr})"
    return None


def _reads(node: Any, klass: type, classes: list[type], index: str | None, depth: int, module: Any) -> str | None:
    """What the parsed method ``node`` (defined on ``klass``) reads of the counters or of its
    argument ``index``; a call of ``self.m(...)`` or ``super().m(...)`` is followed ``depth``
    levels, the index into the parameter it is passed as (passing it along is not reading it)."""
    passed: set[int] = set()
    calls: list[tuple[str, bool, int | str | None]] = []  # (method, via super(), where the index is passed)
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            for k, arg in enumerate(sub.args):
                if index and isinstance(arg, ast.Name) and arg.id == index:
                    passed.add(id(arg))
                    at: int | str | None = k
                    break
            else:
                at = None
            for kw in sub.keywords:
                if index and isinstance(kw.value, ast.Name) and kw.value.id == index:
                    passed.add(id(kw.value))
                    at = kw.arg  # passed by keyword: the callee's parameter of that name
            f = sub.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                calls.append((f.attr, False, at))
            elif (
                isinstance(f, ast.Attribute)
                and isinstance(f.value, ast.Call)
                and isinstance(f.value.func, ast.Name)
                and f.value.func.id == "super"
            ):
                calls.append((f.attr, True, at))
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in COUNTERS:
            base = sub.value
            if isinstance(base, ast.Name) and base.id == "self":
                return f"self.{sub.attr}"
            if (
                isinstance(base, ast.Attribute)
                and base.attr == "trainer"
                and isinstance(base.value, ast.Name)
                and base.value.id == "self"
            ):
                return f"self.trainer.{sub.attr}"
        if (
            index
            and isinstance(sub, ast.Name)
            and sub.id == index
            and isinstance(sub.ctx, ast.Load)
            and id(sub) not in passed
        ):
            return index
        if isinstance(sub, ast.Call):
            drawn = _host_draw(sub)
            if drawn:
                return drawn
            if _chain(sub.func) == ["self", "lr_schedulers"]:
                return "self.lr_schedulers() (a scheduler stepped in the step would step once, at capture)"
        target = sub.target if isinstance(sub, ast.AugAssign) else None
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            value = getattr(module, target.attr, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool):  # a tensor's += is captured
                return f"self.{target.attr} (a Python number it updates every step)"
    if depth <= 0:
        return None
    for name, via_super, at in calls:
        if name in ("log", "log_dict"):
            continue
        found = _method(classes, name, after=klass if via_super else None)
        if found is None:
            continue
        callee, owner = found
        callee_node = _parse(callee)
        if callee_node is None:
            continue
        params = [a.arg for a in callee_node.args.args]
        inner = at if isinstance(at, str) else params[at + 1] if at is not None and at + 1 < len(params) else None
        what = _reads(callee_node, owner, classes, inner, depth - 1, module)
        if what:
            return f"{what} (in {name})"
    return None


def step_reads_counters(pl_module: LightningModule) -> str | None:
    """What ``training_step`` (and the module's own methods it calls, two levels down) reads that
    a captured step would freeze at its capture-time value: ``self.global_step``,
    ``self.current_epoch`` (also through ``self.trainer``), its ``batch_idx`` argument (passing
    it on to another call is not reading it; the callee is followed), a Python number of its
    own that it updates (``self.seen += 1``: the replay would not count), a draw from Python's or
    numpy's generator (a mixup weight), or its scheduler stepped by hand (``self.lr_schedulers()``).
    None when it reads none of them, or when the source cannot be read (then nothing is claimed).

    Example:
        >>> from tests.targets import graph_pattern
        >>> step_reads_counters(graph_pattern("anneal")[0])  # weight = min(1.0, (self.global_step + 1) / 8)
        'self.global_step'
        >>> print(step_reads_counters(graph_pattern("plain")[0]))
        None
    """
    classes = _own_classes(type(pl_module))
    found = _method(classes, "training_step")
    if found is None:
        return None
    fn, owner = found
    node = _parse(fn)
    if node is None:
        return None
    params = [a.arg for a in node.args.args]
    return _reads(
        node, owner, classes, params[2] if len(params) > 2 else None, 2, pl_module
    )  # (self, batch, batch_idx)
