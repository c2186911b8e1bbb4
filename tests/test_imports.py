"""The import graph of fastloop's modules has no cycle.

How it is checked: every module under ``src/fastloop`` (and the recipes) is parsed with ``ast``;
its module-level imports of ``fastloop.*`` (those under ``TYPE_CHECKING`` too: a type that needs
a module is a dependency on it, and a cycle hidden there is a cycle in the design; not those
inside functions) are edges; ``from fastloop.a import b`` points at ``fastloop.a.b`` when that
is a module, else at ``fastloop.a``. A depth-first search over that graph must find no cycle.
Importing a submodule runs its package's ``__init__`` first, so an import of
``fastloop.speedups.base`` from outside ``fastloop.speedups`` is also an edge to the package
(``fastloop.speedups``, whose ``__init__`` imports every speedup); a module inside the package
gets no such edge (the package is already being imported when it runs).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for base, prefix in ((ROOT / "src" / "fastloop", "fastloop"), (ROOT / "recipes", "fastloop.recipes")):
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([prefix, *parts])] = path
    return out


def _top_level_imports(tree: ast.Module) -> list[ast.stmt]:
    found: list[ast.stmt] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, ast.If):  # TYPE_CHECKING's imports count
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _top_level_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    base = ".".join(up[: len(up) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                if t in modules and t != name:
                    graph[name].add(t)
                parts = t.split(".")
                for i in range(2, len(parts)):  # the packages the import runs first
                    pkg = ".".join(parts[:i])
                    if pkg in modules and not (name + ".").startswith(pkg + "."):
                        graph[name].add(pkg)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state:
                found = dfs(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = dfs(n)
            if found:
                return found
    return None


def test_the_checker_sees_cycles_through_a_package_init():
    # fastloop.speedups.batch_size.batch_size must not import a module outside the package that imports
    # fastloop.speedups.base at the top (it did: the search core lived in fastloop.drivers.batch_size)
    graph = import_graph()
    assert "fastloop.speedups" in graph["fastloop.adapters.loop"]
    assert "fastloop.speedups" not in graph["fastloop.speedups.workers"]


def test_the_checker_counts_an_import_under_type_checking(tmp_path, monkeypatch):
    fake = tmp_path / "m.py"
    fake.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fastloop.b import B\n")
    other = tmp_path / "b.py"
    other.write_text("from fastloop.m import f\n")
    monkeypatch.setattr(__import__(__name__), "_modules", lambda: {"fastloop.m": fake, "fastloop.b": other})
    graph = import_graph()
    assert graph == {"fastloop.m": {"fastloop.b"}, "fastloop.b": {"fastloop.m"}}
    assert find_cycle(graph) == ["fastloop.b", "fastloop.m", "fastloop.b"]


def test_the_checker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 40 and graph["fastloop.lightning"], "the graph was not built"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_report_and_compare_import_without_torch():
    """Reading or rendering a report, and comparing runs, need no torch."""
    import subprocess
    import sys

    code = "import sys, fastloop.report, fastloop.compare; assert 'torch' not in sys.modules, 'torch was imported'"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


PRIVATE_FENCES = ("_compat", "_torch_private", "_lightning_private")
"""Modules that exist to hold private touches of torch and Lightning: importing from them is their point."""


def underscore_imports() -> list[str]:
    """``from fastloop.X import _name`` anywhere in fastloop (in functions too), but from the fences."""
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fastloop"):
                if (node.module or "").rsplit(".", 1)[-1] in PRIVATE_FENCES:
                    continue
                found += [
                    f"{name}: from {node.module} import {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    return found


def test_no_underscore_name_is_imported_across_modules():
    """A module's public surface is what others use; private names stay at home."""
    assert underscore_imports() == []


def test_the_underscore_check_sees_an_import_inside_a_function(tmp_path, monkeypatch):
    fake = tmp_path / "m.py"
    fake.write_text("def f():\n    from fastloop.data import _hidden\n")
    monkeypatch.setattr(__import__(__name__), "_modules", lambda: {"fastloop.fake": fake})
    assert underscore_imports() == ["fastloop.fake: from fastloop.data import _hidden"]


def _all_imports() -> dict[str, set[str]]:
    """Every fastloop module -> the fastloop modules it imports anywhere (top level, in
    functions, under TYPE_CHECKING)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    base = ".".join(up[: len(up) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def layers() -> dict[str, int]:
    """The layer of each module name or package prefix (``fastloop.measure.*``), from docs/layers.md."""
    out = {}
    for line in (ROOT / "docs" / "layers.md").read_text().splitlines():
        m = re.match(r"\| (\d) \| (.*?) \|", line)
        if m:
            for mod in re.findall(r"`([\w.*]+)`", m.group(2)):
                out[mod] = int(m.group(1))
    return out


def layer_of(module: str, table: dict[str, int]) -> int | None:
    if module in table:
        return table[module]
    for key, layer in table.items():
        if key.endswith(".*") and (module + ".").startswith(key[:-1]) or key.endswith(".*") and module == key[:-2]:
            return layer
    return None


LAYER_EXCEPTIONS = {("fastloop", "fastloop.speedups")}
"""Written in docs/layers.md: the package answers fastloop.speedup_names() from the registry."""


def arrows_up(graph: dict[str, set[str]], table: dict[str, int]) -> list[str]:
    """The layer check: each import from a module to one in a higher layer, but the written
    exceptions (LAYER_EXCEPTIONS)."""
    return sorted(
        f"{a} (layer {layer_of(a, table)}) -> {b} (layer {layer_of(b, table)})"
        for a, targets in graph.items()
        for b in targets
        if (a, b) not in LAYER_EXCEPTIONS and layer_of(b, table) > layer_of(a, table)
    )


def test_every_module_has_a_layer_and_every_import_points_down_or_sideways():
    table = layers()
    graph = _all_imports()
    unplaced = sorted(m for m in graph if layer_of(m, table) is None)
    assert unplaced == [], f"modules not in docs/layers.md: {unplaced}"
    up = arrows_up(graph, table)
    assert up == [], "imports back up the layers:\n" + "\n".join(up)


def test_no_circle_counting_every_import():
    graph = _all_imports()
    for a, b in LAYER_EXCEPTIONS:
        graph[a].discard(b)
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_layer_check_sees_an_arrow_back_up_and_lets_the_written_exception_through():
    table = layers()
    assert layer_of("fastloop.measure.timer", table) == 2 and layer_of("fastloop.cli", table) == 7
    assert layer_of("fastloop.speedups", table) == 3  # the package itself
    fake = {
        "fastloop.measure.timer": {"fastloop.drivers.ladder"},
        "fastloop": {"fastloop.speedups"},  # written in docs/layers.md: not reported
        "fastloop.errors": {"fastloop.speedups"},
    }  # the same arrow from another layer-0 module: reported
    assert arrows_up(fake, table) == [
        "fastloop.errors (layer 0) -> fastloop.speedups (layer 3)",
        "fastloop.measure.timer (layer 2) -> fastloop.drivers.ladder (layer 6)",
    ]


STATE_NAMES = ("state", "self.state", "ladder", "L", "self.L")
"""How the ladder's modules name the ladder's state."""
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault", "sort", "add"}


def _into_state(node: ast.expr) -> bool:
    """Is ``node`` a member of the ladder's state, or something inside one (``state.x``, ``state.x[i].y``)?"""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
        if ast.unparse(node) in STATE_NAMES:
            return True
    return False


def ladder_state_misuses(modules: dict[str, Path] | None = None) -> list[str]:
    """In the ladder's modules but the state's own: a private member of the state used
    (``state._x``), a member of the state assigned or deleted (``state.x = ...``,
    ``state.x[i] = ...``), or changed in place (``state.x.append(...)``)."""
    found = []
    for name, path in (modules or _modules()).items():
        if not name.startswith("fastloop.drivers.ladder.") or name == "fastloop.drivers.ladder.state":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{name}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if ast.unparse(node.value) in STATE_NAMES:
                    found.append(f"{where}: private {ast.unparse(node)}")
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
                found += [f"{where}: writes {ast.unparse(t)}" for t in flat if _into_state(t)]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                if _into_state(node.func):
                    found.append(f"{where}: changes {ast.unparse(node.func.value)} in place")
    return sorted(found)


def test_only_the_ladders_state_changes_the_ladders_state():
    """The search, its moves and sizes read the state and ask it to change through its
    methods (keep, drop, record_rung, ...); none writes its members or uses its private ones."""
    assert ladder_state_misuses() == []


def test_the_state_check_sees_a_write_a_change_in_place_and_a_private_member(tmp_path):
    fake = tmp_path / "m.py"
    fake.write_text(
        "def f(state, self):\n"
        "    state.selected.append('x')\n"
        "    self.state.rungs[0].decision = 'y'\n"
        "    state._best_runs = {}\n"
        "    self.state = state\n"
        "    state.keep(['x'])\n"
    )
    assert ladder_state_misuses({"fastloop.drivers.ladder.fake": fake}) == [
        "fastloop.drivers.ladder.fake:2: changes state.selected in place",
        "fastloop.drivers.ladder.fake:3: writes self.state.rungs[0].decision",
        "fastloop.drivers.ladder.fake:4: private state._best_runs",
        "fastloop.drivers.ladder.fake:4: writes state._best_runs",
    ]


def test_no_module_takes_an_untyped_search_or_names_the_state_by_one_letter():
    """No piece takes another as ``search: Any`` or holds the state as ``self.L``: the pieces have
    typed interfaces."""
    hits = [
        f"{name}: {line.strip()}"
        for name, path in _modules().items()
        for line in path.read_text().splitlines()
        if "search: Any" in line or re.search(r"self\.L\b", line)
    ]
    assert hits == []
