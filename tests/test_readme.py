"""The README is the front door: short, its commands are CI's, its links lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, flags=re.S)


def test_the_readme_is_a_short_front_door():
    assert len(README.splitlines()) <= 150
    assert "callbacks(" in "\n".join(README.splitlines()[:60])  # the Lightning user's first line, near the top


def test_the_readme_setup_installs_what_ci_installs():
    setup = _bash_blocks()[0]
    ci = (ROOT / ".ci" / "run").read_text()
    readme_pips = re.findall(r"pip install ([^&\n]+?)\s*(?:&&|$)", setup)
    ci_pips = [re.sub(r"\s+#.*", "", line.split("pip install", 1)[1]).replace("-q", "").strip()
               for line in ci.splitlines() if line.strip().startswith("pip install")]
    assert [p.strip() for p in readme_pips] == ci_pips


def test_the_readme_test_command_is_what_ci_runs():
    assert _bash_blocks()[1].strip() == "python -m pytest"
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("python -m pytest")


def test_every_link_of_the_readme_exists():
    for link in re.findall(r"\]\(([^)#]+)\)", README):
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link
