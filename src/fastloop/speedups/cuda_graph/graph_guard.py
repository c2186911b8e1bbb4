"""What a whole-step graph's Python decided at capture, and the cheap checks that it still holds.

A CUDA graph replays the kernels one run of the step's Python launched, with the numbers that
run passed them. Whatever that Python read and branched on is decided for every replay. The
captured-step engine (:mod:`fastloop.speedups.cuda_graph.captured_step`) replays only while these say the
decisions still hold:

- :class:`Baked`: every hyperparameter of every param group, whatever its type (a number, a
  tuple, a tensor the graph does not read from memory: a CPU tensor a fused kernel read on the
  host is compared by its version counter); a change ends the replays (one tier down).
- :class:`StepState`: the param groups (how many, which dicts, which parameter lists, how long),
  which parameters require grad, and every module's public Python scalars (``training``,
  dropout's ``p``, BatchNorm's ``track_running_stats``, a ``scale`` of the user's). A change is a
  new steady state: the engine captures a new graph for it (keyed by it, within
  :data:`~fastloop.speedups.cuda_graph.graph_capture.MAX_GRAPHS`) and names the change and its step.
- :class:`HostDraws`: the host generators a step could draw from, the global ones and those
  reachable from the model and the step function (attributes, closures, the globals their code
  names), watched at the checked steps and at a new state's first step.

Not covered (said in docs/speedups/cuda_graph.md): attributes whose name starts with ``_``,
attributes that are lists, dicts, tensors or objects (a tensor replaced by another), modules
added or replaced after the capture, generators reached only through other code's globals or
created inside the step (``step_source`` refuses a step whose source calls ``np.random``,
``random`` or a device-less ``torch.rand`` directly).

The per-step cost is O(param groups + module attributes + parameters), each a C-level map over
lists built once (``benchmarks/run.py graph-guard`` measures it).

Example:
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1))
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> state = StepState(opt, model)
    >>> before = state.now()
    >>> model[1].p = 0.2
    >>> model[0].weight.requires_grad_(False)
    Parameter containing:
    ...
    >>> state.describe(before, state.now())
    '1.p 0.1 -> 0.2; 0.weight no longer requires grad'
"""

from __future__ import annotations

import operator
import random
import types
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["Baked", "HostDraws", "StepState", "global_generators", "plain_value"]

_PLAIN = (bool, int, float, complex, str, bytes, type(None))
_REQUIRES_GRAD = operator.attrgetter("requires_grad")
_GET = dict.__getitem__
"""``_GET(mapping, key)``: mapped over (dicts, keys), one C-level map over every attribute watched."""


def plain_value(value: Any) -> bool:
    """A Python value a step may branch on and a graph bakes in: a number, a string, None, or a
    tuple of them (hashable, and compared without touching a tensor).

    Example:
        >>> plain_value((3, 3)), plain_value(0.1), plain_value([1]), plain_value(torch.ones(1))
        (True, True, False, False)
    """
    if isinstance(value, _PLAIN):
        return True
    return isinstance(value, tuple) and all(plain_value(v) for v in value)


def _tensors_in(value: Any) -> list[torch.Tensor] | None:
    """The tensors a hyperparameter holds (itself, or the members of a tuple or list), or None."""
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, (tuple, list)):
        found = [v for v in value if torch.is_tensor(v)]
        return found or None
    return None


class Baked:
    """What a graph baked in of an optimizer: every hyperparameter of every param group whatever
    its type. A number, a string or a tuple of them is compared by value; a tensor by identity
    (a tensor on the parameters' device is read from memory by each replay, so a change made in
    place is followed), and a tensor elsewhere (a CPU tensor, read on the host at capture) also by
    its version counter, which any in-place change moves. The lr tensors the engine follows
    (``followed``) are left to :meth:`PreparedOptimizer.sync`. :meth:`changed` names the first
    that differs now.

    Example:
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1, momentum=0.9)
        >>> baked = Baked(opt)
        >>> print(baked.changed())
        None
        >>> opt.param_groups[0]["momentum"] = 0.8
        >>> baked.changed()
        "param group 0's momentum (0.9 when captured, 0.8 now)"
    """

    def __init__(self, optimizer: torch.optim.Optimizer, followed: Iterable[torch.Tensor] = ()) -> None:
        skip = {id(t) for t in followed}
        device = next((p.device for g in optimizer.param_groups for p in g["params"]), None)
        self.groups: list[tuple[int, dict, tuple, Any, Any, list]] = []
        for i, g in enumerate(optimizer.param_groups):
            keys: list[str] = []
            tensors: list[tuple[str, Any, torch.Tensor, int, bool]] = []
            for k, v in g.items():
                if k == "params":
                    continue
                held = _tensors_in(v)
                if held is None:
                    keys.append(k)
                    continue
                tensors += [(k, v, t, t._version, t.device == device) for t in held if id(t) not in skip]
                if any(id(t) in skip for t in held):
                    tensors.append((k, v, held[0], 0, True))  # followed: only its identity in the group
            getter = operator.itemgetter(*keys) if keys else None
            self.groups.append((i, g, tuple(keys), getter, getter(g) if getter else None, tensors))

    def changed(self) -> str | None:
        for i, g, keys, getter, values, tensors in self.groups:
            if getter is not None:
                try:
                    now = getter(g)
                except KeyError:
                    return f"param group {i} lost one of {', '.join(keys)}"
                if now != values:
                    return _first_change(i, keys, values, now)
            for k, held, t, version, on_device in tensors:
                if g.get(k) is not held:
                    return f"param group {i}'s {k} (a tensor) was replaced by {type(g.get(k)).__name__}"
                if not on_device and t._version != version:
                    return (
                        f"param group {i}'s {k} (a tensor on {t.device} that the graph read once, at capture) "
                        f"was changed in place"
                    )
        return None


def _first_change(i: int, keys: tuple, before: Any, now: Any) -> str:
    if len(keys) == 1:
        before, now = (before,), (now,)
    k, v, n = next((k, v, n) for k, v, n in zip(keys, before, now) if v != n)
    return f"param group {i}'s {k} ({v!r} when captured, {n!r} now)"


class StepState:
    """The fingerprint of what a step's Python reads besides its batch and the hyperparameters:
    the optimizer's param groups (their dicts and parameter lists, by identity, and their
    lengths), which parameters require grad, and each module's public attributes that are Python
    scalars or tuples of them (``training`` included), as the modules held them when this was
    built. :meth:`now` is cheap (C-level maps over lists built here: no Python loop per parameter
    or attribute) and hashable; :meth:`describe` says what differs between two fingerprints (only
    when one changed).

    Args:
        optimizer: the optimizer the step updates.
        model: the module the step runs (None: only the param groups and their parameters).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> None:
        self.optimizer = optimizer
        named = list(model.named_parameters()) if model is not None else []
        seen = {id(p) for _, p in named}
        for i, g in enumerate(optimizer.param_groups):  # what the optimizer holds outside the model
            named += [(f"param group {i}[{j}]", p) for j, p in enumerate(g["params"]) if id(p) not in seen]
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.attr_names: list[str] = []
        """Each module attribute watched, as ``path.name``."""
        self.attr_dicts: list[dict] = []
        self.attr_keys: list[str] = []
        for name, m in model.named_modules() if model is not None else ():
            for k, v in vars(m).items():
                if not k.startswith("_") and plain_value(v):
                    self.attr_names.append(f"{name}.{k}" if name else k)
                    self.attr_dicts.append(vars(m))
                    self.attr_keys.append(k)
        self._held: tuple = ()

    def now(self) -> tuple:
        """The fingerprint now (raises KeyError where a module lost an attribute it had)."""
        groups = self.optimizer.param_groups
        lists = [g["params"] for g in groups]
        self._held = (groups, lists)  # keeps the objects whose ids are compared alive
        return (
            tuple(map(id, groups)),
            tuple(map(id, lists)),
            tuple(map(len, lists)),
            tuple(map(_REQUIRES_GRAD, self.params)),
            tuple(map(_GET, self.attr_dicts, self.attr_keys)),
        )

    def describe(self, before: tuple, now: tuple) -> str:
        """What differs between two fingerprints, in words."""
        out: list[str] = []
        if before[2] != now[2]:
            out.append(f"param groups {len(before[2])} -> {len(now[2])} (sizes {list(before[2])} -> {list(now[2])})")
        elif before[:2] != now[:2]:
            out.append("the optimizer's param groups were replaced (load_state_dict?)")
        out += [f"{name} {b!r} -> {n!r}" for name, b, n in zip(self.attr_names, before[4], now[4]) if b != n]
        flips = [(name, n) for name, b, n in zip(self.param_names, before[3], now[3]) if b != n]
        for value, words in ((True, "now require grad"), (False, "no longer require grad")):
            names = [name for name, n in flips if n is value]
            if names:
                shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                out.append(f"{shown} {words if len(names) > 1 else words.replace('require', 'requires')}")
        return "; ".join(out) or "the step's state"


def _is_generator(value: Any) -> bool:
    if isinstance(value, (random.Random, np.random.Generator, np.random.RandomState, np.random.BitGenerator)):
        return True
    return isinstance(value, torch.Generator) and value.device.type == "cpu"


def _state_of(gen: Any) -> Any:
    if isinstance(gen, random.Random):
        return gen.getstate()
    if isinstance(gen, np.random.Generator):
        return gen.bit_generator.state
    if isinstance(gen, np.random.RandomState):
        return gen.get_state()
    if isinstance(gen, np.random.BitGenerator):
        return gen.state
    return gen.get_state()


def _same(a: Any, b: Any) -> bool:
    """Two generator states alike (nested dicts, tuples, arrays, tensors)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if torch.is_tensor(a):
        return torch.equal(a, b)
    return a == b


_OWN_SKIP = ("lightning", "pytorch_lightning", "torch", "builtins", "fastloop", "numpy")


def _users(fn: Any) -> bool:
    """A function of the user's code (not a library's: those are not followed)."""
    return (getattr(fn, "__module__", None) or "").split(".")[0] not in _OWN_SKIP


def _functions_of(root: Any) -> Iterator[Any]:
    """The functions whose closures and globals the step may draw from: ``root`` itself when it
    is one (a bound method's function, a partial's), and the methods of its own classes."""
    if isinstance(root, types.MethodType):
        yield from _functions_of(root.__func__)
    elif hasattr(root, "func") and callable(getattr(root, "func", None)):  # functools.partial
        yield from _functions_of(root.func)
    elif isinstance(root, types.FunctionType):
        yield root
    for klass in type(root).__mro__ if not isinstance(root, (types.FunctionType, types.MethodType)) else ():
        if klass.__module__.split(".")[0] in _OWN_SKIP:
            continue
        yield from (f for f in vars(klass).values() if isinstance(f, types.FunctionType))


def _reachable_from(fn: types.FunctionType, add: Any) -> None:
    """Hand ``add`` what ``fn`` reads besides its arguments: its closure, defaults and the
    module globals its code names."""
    code = fn.__code__
    for var, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            add(f"{fn.__name__}'s {var}", cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    for v in fn.__defaults__ or ():
        add(f"{fn.__name__}'s default", v)
    for var in _names_in(code) & fn.__globals__.keys():
        add(f"{fn.__module__}.{var}", fn.__globals__[var])


def global_generators() -> list[tuple[str, Any]]:
    """The process-wide host generators, named as the record names them."""
    return [
        ("torch's CPU generator", torch.default_generator),
        ("Python's random", random._inst),  # type: ignore[attr-defined]
        ("numpy's global generator", np.random.mtrand._rand),
    ]


def _names_in(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # a nested function or a lambda
            names |= _names_in(const)
    return names


class HostDraws:
    """The host generators a step could draw from: torch's CPU generator, Python's ``random``,
    numpy's global generator, and those reachable from ``roots`` (the model and the step
    function): generators held by a module or an object (an attribute, or an item of a list,
    tuple or dict attribute), in a function's closure or defaults, or in the module globals its
    code names (the step function's, the model's own classes' methods'). :meth:`snapshot` before
    a step and :meth:`changed` after say which of them moved.

    Example:
        >>> class Noisy(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.rng = np.random.default_rng(0)
        >>> draws = HostDraws([Noisy()])
        >>> snap = draws.snapshot()
        >>> _ = draws.roots[0].rng.uniform()
        >>> draws.changed(snap)
        'Noisy.rng (a numpy Generator)'
    """

    def __init__(self, roots: Iterable[Any] = ()) -> None:
        self.roots = [r for r in roots if r is not None]

    def generators(self) -> list[tuple[str, Any]]:
        """Every generator found, with a name for the record (globals first)."""
        found: dict[int, tuple[str, Any]] = {}
        functions: list[Any] = []

        def add(name: str, value: Any) -> None:
            items = [(name, value)]
            if isinstance(value, (list, tuple)):
                items += [(f"{name}[{i}]", v) for i, v in enumerate(value[:64])]
            elif isinstance(value, dict):
                items += [(f"{name}[{k!r}]", v) for k, v in list(value.items())[:64]]
            for n, v in items:
                if _is_generator(v):
                    found.setdefault(id(v), (n, v))
                elif isinstance(v, (types.FunctionType, types.MethodType)) and _users(v):
                    functions.append(v)

        for name, gen in global_generators():
            found[id(gen)] = (name, gen)
        for root in self.roots:
            label = getattr(root, "__qualname__", type(root).__name__)
            objects = root.named_modules() if isinstance(root, torch.nn.Module) else [("", root)]
            for path, obj in objects:
                for k, v in getattr(obj, "__dict__", {}).items():
                    add(f"{label}.{path + '.' if path else ''}{k}", v)
            functions += list(_functions_of(root))
        done: set[int] = set()
        for _ in range(3):  # the step function, the functions it names, and theirs
            batch, functions = functions, []
            for fn in batch:
                fn = getattr(fn, "__func__", fn)
                if id(fn) in done or not isinstance(fn, types.FunctionType):
                    continue
                done.add(id(fn))
                _reachable_from(fn, add)
        return list(found.values())

    def snapshot(self) -> list[tuple[str, Any, Any]]:
        return [(name, gen, _state_of(gen)) for name, gen in self.generators()]

    def changed(self, snapshot: list[tuple[str, Any, Any]]) -> str | None:
        """The generators of ``snapshot`` that moved since, in words (None: none did)."""
        globals_ = {id(g) for _, g in global_generators()}
        moved = [
            name + ("" if id(gen) in globals_ else f" (a {_kind(gen)})")
            for name, gen, state in snapshot
            if not _same(state, _state_of(gen))
        ]
        return ", ".join(moved) or None


def _kind(gen: Any) -> str:
    if isinstance(gen, torch.Generator):
        return "CPU torch.Generator"
    if isinstance(gen, random.Random):
        return "random.Random"
    return f"numpy {type(gen).__name__}"
