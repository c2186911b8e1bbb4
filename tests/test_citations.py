"""Every figure cites its run: in README.md, docs/*.md and docs/speedups/*.md, each
paragraph, list item or table row that states a measured figure (a ratio such as ``1.37x``, an
interval ``[1.05, 1.57]``, a throughput, a time, a count of tests) cites a row of
benchmarks/RESULTS.md with a link ``[R:ID](.../RESULTS.md#ID)``, and every figure in it is a
number of a cited row (to the figure's own precision: ``3.0x`` is 3.05 rounded). A figure that is
not a measurement (a budget, a setting, a rule) is marked ``<!-- not measured -->`` in its unit.
A row is the line (a table row) or the paragraph that holds ``<a id="ID"></a>``; it is dated."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "speedups").glob("*.md"))]

NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?k?"
FIGURE = re.compile(
    rf"(?<![\w.\-/:=@#])({NUMBER})(?:\s?-\s?({NUMBER}))?\s?"
    r"(x|×|img/s|samples/s|tokens/s|tok/s|GB/s|TB/s|TFLOP/s|ms|s|min|minutes|us|µs|passed|deselected)"
    r"(?![\w/])"
)
INTERVAL = re.compile(rf"\[({NUMBER}), ({NUMBER})\]")
CITE = re.compile(r"\[R:([\w.\-]+)\]\([^)]*RESULTS\.md#([\w.\-]+)\)")
ANCHOR = re.compile(r'<a id="([\w.\-]+)"></a>')
NOT_MEASURED = "<!-- not measured -->"
DATE = re.compile(r"20\d\d-\d\d-\d\d")


def units(text: str) -> list[str]:
    """Paragraphs, list items and table rows, without code blocks, inline code or comments
    (the not-measured marker is kept)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.splitlines()
        if any(line.lstrip().startswith("|") for line in lines):
            out += [line for line in lines if line.lstrip().startswith("|") and "---" not in line]
            continue
        item: list[str] = []
        for line in lines:
            if re.match(r"\s*(?:[-*]|\d+\.)\s", line) and item:
                out.append(" ".join(item))
                item = []
            item.append(line)
        if item:
            out.append(" ".join(item))
    return out


def _clean(unit: str) -> str:
    unit = re.sub(r"`[^`]*`", "", unit)
    unit = re.sub(r"<!--(?! not measured).*?-->", "", unit)
    return re.sub(r"\[R:[\w.\-]+\]\([^)]*\)", "", unit)


def _value(text: str) -> tuple[float, float]:
    """A figure's value and half a unit of its last digit (``49.7k``: 49,700 +- 50)."""
    scale = 1000.0 if text.endswith("k") else 1.0
    digits = text.rstrip("k").replace(",", "")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    return float(digits) * scale, 0.5 * 10**-decimals * scale + 1e-9


def figures(unit: str) -> list[str]:
    """The measured figures of a unit, as written."""
    clean = _clean(unit)
    found = []
    for m in FIGURE.finditer(clean):
        found += [g for g in m.groups()[:2] if g]
    for m in INTERVAL.finditer(clean):
        found += list(m.groups())
    return found


def rows() -> dict[str, str]:
    """Each anchored row of RESULTS.md: its id -> the table line or paragraph that holds it."""
    out: dict[str, str] = {}
    for unit in units(RESULTS.read_text()):
        for rid in ANCHOR.findall(unit):
            assert rid not in out, f"RESULTS.md: row id {rid} twice"
            out[rid] = unit
    return out


def _numbers(text: str) -> list[float]:
    return [
        float(n.replace(",", "")) for n in re.findall(r"\d+(?:,\d{3})*(?:\.\d+)?", re.sub(r"<a id=[^>]*>", "", text))
    ]


def problems(text: str, where: str, known: dict[str, str]) -> list[str]:
    """What is wrong with one document: units with figures and no citation (or marker), citations
    of rows that do not exist, figures that no cited row holds."""
    out = []
    for unit in units(text):
        figs = figures(unit)
        if not figs or NOT_MEASURED in unit:
            continue
        cited = CITE.findall(unit)
        if not cited:
            out.append(f"{where}: no citation for {', '.join(figs)} in: {unit.strip()[:160]}")
            continue
        bad = [rid for rid, anchor in cited if rid != anchor or rid not in known]
        if bad:
            out.append(f"{where}: cites {', '.join(bad)}, no such row of RESULTS.md")
            continue
        numbers = [n for rid, _ in cited for n in _numbers(known[rid])]
        for fig in figs:
            v, tol = _value(fig)
            if not any(abs(n - v) <= tol for n in numbers):
                out.append(
                    f"{where}: {fig} is in none of the rows it cites ({', '.join(r for r, _ in cited)}): "
                    f"{unit.strip()[:120]}"
                )
    return out


def test_every_anchored_row_of_the_results_is_dated():
    known = rows()
    assert len(known) >= 20
    undated = [rid for rid, row in known.items() if not DATE.search(row)]
    assert undated == []


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_figure_in_the_docs_cites_a_recorded_row_that_holds_it(doc):
    assert problems(doc.read_text(), str(doc.relative_to(ROOT)), rows()) == []


def test_the_check_fails_when_a_figure_is_changed_by_one_digit_or_has_no_citation():
    known = {"zoo-x": '| <a id="zoo-x"></a>2026-12-03 | ViT | 19,554 img/s | **1.93x [1.25, 2.97]** |'}
    good = "The pick ran 1.93x [1.25, 2.97] the expert, 19.6k img/s ([R:zoo-x](benchmarks/RESULTS.md#zoo-x))."
    assert problems(good, "doc", known) == []
    assert problems(good.replace("1.93x", "1.94x"), "doc", known)  # one digit off
    assert problems(good.replace("19.6k", "19.7k"), "doc", known)
    assert problems(good.replace("[1.25,", "[1.35,"), "doc", known)
    assert problems("It ran 1.93x the expert.", "doc", known)  # no citation
    assert problems("It ran 1.93x ([R:zoo-y](benchmarks/RESULTS.md#zoo-y)).", "doc", known)  # no such row
    assert problems("A budget of 80 s. <!-- not measured -->", "doc", known) == []
    assert figures("3.0-3.6x faster, in 75-85 s; `workers:8` and `--budget 300` are not figures") == [
        "3.0",
        "3.6",
        "75",
        "85",
    ]
