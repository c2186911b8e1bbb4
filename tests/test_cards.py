"""Every registered speedup has a card in docs/speedups/NAME.md, and the card's code blocks run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fastloop.speedups import REGISTRY

DOCS = Path(__file__).resolve().parents[1] / "docs" / "speedups"


def test_every_speedup_has_a_card():
    missing = sorted(n for n in REGISTRY if not (DOCS / f"{n}.md").is_file())
    assert not missing, f"speedups without a card in docs/speedups/: {missing}"


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(
    "card",
    # the compile card's blocks compile on the CPU (tens of seconds): .ci/run's second step
    [pytest.param(c, marks=pytest.mark.slow) if c.stem == "compile" else c for c in sorted(DOCS.glob("*.md"))],
    ids=lambda p: p.stem,
)
def test_card_code_blocks_run(card, monkeypatch):
    monkeypatch.chdir(DOCS.parents[1])
    blocks = re.findall(r"```python\n(.*?)```", card.read_text(), flags=re.S)
    assert len(blocks) >= 2, f"{card.name} needs a Lightning and a plain-loop example"
    for code in blocks:
        exec(compile(code, str(card), "exec"), {"__name__": f"card_{card.stem}"})
