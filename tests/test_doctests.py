"""The recipes' docstring examples run under the name they are installed as, ``fastloop.recipes``
(pytest's ``--doctest-modules`` would import the folder recipes/ as a second, top-level package
``recipes``). Every module under src/fastloop is collected by ``--doctest-modules`` itself
(pyproject's pytest options)."""

from __future__ import annotations

import ast
import doctest
import importlib
import pkgutil
import tomllib
from pathlib import Path

import pytest

import fastloop.recipes

ROOT = Path(__file__).resolve().parents[1]
RECIPE_MODULES = sorted(m.name for m in pkgutil.walk_packages(fastloop.recipes.__path__, "fastloop.recipes."))


@pytest.mark.parametrize("name", [m for m in RECIPE_MODULES if not m.endswith("__main__")])
def test_recipe_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_the_recipes_have_examples_and_every_source_module_is_collected():
    """The recipes' examples are found (the walk reaches them), and the default run collects the
    doctests of src/fastloop: ``--doctest-modules`` in the options, src/fastloop in testpaths."""
    finder = doctest.DocTestFinder()
    found = sum(len(t.examples) for m in RECIPE_MODULES for t in finder.find(importlib.import_module(m)))
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert found >= 3
    assert "--doctest-modules" in options["addopts"].split()
    assert "src/fastloop" in options["testpaths"]


EXTRAS = {"nvidia": "dali", "torchao": "fp8", "liger_kernel": "fused_loss"}
"""The top-level package each optional extra of pyproject installs -> the extra's name."""


def _imports_run_on_import(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: at its top, in class bodies, under ``if`` or
    ``try``; not inside functions, and not under ``if TYPE_CHECKING:``."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


def _extras_imported_on_import(path: Path) -> list[str]:
    """``module line: extra`` for each import of an optional extra that runs when ``path`` is imported."""
    hits = []
    for node in _imports_run_on_import(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        hits += [f"{path.name}:{node.lineno}: {n}" for n in names if n.split(".")[0] in EXTRAS]
    return hits


def test_an_import_of_an_extra_that_runs_on_import_is_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import torchao\n"
        "def f():\n    import nvidia.dali\n"
        "try:\n    from liger_kernel.transformers import X\nexcept ImportError:\n    X = None\n"
    )
    assert _extras_imported_on_import(module) == ["m.py:7: liger_kernel.transformers"]


def test_no_module_imports_an_optional_extra_when_it_is_imported():
    """--doctest-modules imports every module of src/fastloop: one that imported DALI, torchao or
    liger at its top would fail the collection where that extra is not installed (and, guarded by
    ``try``, would still cost every import of fastloop where it is). An extra is imported inside the
    function that uses it, and the speedup that needs it says so when it is absent."""
    sources = [p for folder in ("src", "recipes") for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(sources) > 50
    assert [hit for p in sources for hit in _extras_imported_on_import(p)] == []
