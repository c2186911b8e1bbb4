"""The house rules a newcomer relies on (DESIGN.md, issue 33): no source file over 400 lines, no
function over 80, and the drivers name no speedup (they read capabilities)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "fastloop"


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_source_file_over_400_lines_and_no_function_over_80():
    long_files = {str(p.relative_to(SRC)): n for p in _sources() if (n := len(p.read_text().splitlines())) > 400}
    long_functions = {}
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 80:
                    long_functions[f"{p.relative_to(SRC)}:{node.name}"] = n
    assert len(_sources()) > 50, "the tree was not found"
    assert long_files == {} and long_functions == {}


def test_the_search_and_the_fork_server_name_no_speedup_in_their_code():
    """The staged search and the fork server decide by Speedup attributes; a speedup's name may
    appear in their prose (docstrings, comments, messages), not in a tuple or comparison."""
    from fastloop.speedups import REGISTRY

    names = "|".join(REGISTRY)
    pattern = re.compile(rf"""(==|!=|\bin)\s*\(?\s*["']({names})["']|\(\s*["']({names})["'],""")
    for rel in ("drivers/ladder_search.py", "drivers/forkserver.py", "drivers/ladder_gates.py", "drivers/ladder_sizing.py"):
        tree = ast.parse((SRC / rel).read_text())
        doc_lines = {n.lineno for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        code = [ln.split("#")[0] for i, ln in enumerate((SRC / rel).read_text().splitlines(), 1) if i not in doc_lines]
        hits = [ln for ln in code if pattern.search(ln)]
        assert hits == [], f"{rel} names speedups: {hits}"


def test_every_package_is_in_the_distribution():
    """pyproject's explicit package list names every package under src/fastloop (a non-editable
    install left fastloop.adapters and fastloop.drivers out)."""
    root = SRC.parents[1]
    text = (root / "pyproject.toml").read_text()
    listed = set(re.findall(r'"(fastloop[\w.]*)"', text.split("packages = [", 1)[1].split("]", 1)[0]))
    src = root / "src"
    found = {".".join(p.parent.relative_to(src).parts) for p in (src / "fastloop").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
