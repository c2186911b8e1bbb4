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
    ci_pips = [
        re.sub(r"\s+#.*", "", line.split("pip install", 1)[1]).replace("-q", "").strip()
        for line in ci.splitlines()
        if line.strip().startswith("pip install")
    ]
    assert [p.strip() for p in readme_pips] == ci_pips


def test_the_readme_test_command_is_what_ci_runs():
    """CI runs the README's test command as written, then the slow tests it leaves out, last."""
    assert _bash_blocks()[1].strip() == "python -m pytest"
    steps = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    steps = [line for line in steps if line and not line.startswith("#")]
    assert steps[-2:] == ["python -m pytest", "python -m pytest -m slow"], steps[-2:]


def test_every_link_of_the_readme_exists():
    for link in re.findall(r"\]\(([^)#]+)\)", README):
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link


def _main_job_records() -> list[dict]:
    """The rows of the main job's record in benchmarks/RESULTS.md."""
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    section = text.split("| date | commit | command | wall | kept (vs baseline) | dropped | not tried |", 1)[1]
    rows = [r for r in section.split("\n\n", 1)[0].splitlines() if r.startswith("|") and "---" not in r]

    def names(cell: str) -> set[str]:
        return set(re.findall(r"\b(workers|bf16|fp16|fused_optimizer|pin_memory|prefetch|tf32)\b", cell))

    out = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        kept = re.match(r"([\w, ]+?) (\d+\.\d+)x \[(\d+\.\d+), (\d+\.\d+)\]", cells[4])
        out.append(
            {
                "commit": cells[1],
                "kept": names(kept.group(1)),
                "ratio": float(kept.group(2)),
                "dropped": names(cells[5].split("(")[0]),
                "not_tried": names(cells[6].split("(")[0]),
            }
        )
    return out


def test_the_readmes_claim_on_the_main_job_is_the_recorded_run():
    """The sentence that states what the main job measured matches the recorded runs of
    that command (names kept, dropped and untried in every run; the range of the point estimates),
    so the two cannot drift."""
    records = _main_job_records()
    assert len(records) >= 2  # a development run and a fresh clone's
    para = re.search(r"Set up and run the main job(.*?)```bash", README, flags=re.S).group(1)
    para = " ".join(para.split())
    kept = re.search(r"kept `(\w+)` \((\d+\.\d)-(\d+\.\d)x", para)
    assert kept, para
    lo, hi = float(kept.group(2)), float(kept.group(3))
    ratios = [r["ratio"] for r in records]
    assert (lo, hi) == (round(min(ratios), 1), round(max(ratios), 1)), (lo, hi, ratios)
    dropped = re.search(r"measured ((?:`\w+`(?:, | and )?)+) together and dropped them", para)
    assert dropped, para
    log = subprocess_log()
    for r in records:
        assert {kept.group(1)} == r["kept"] and set(re.findall(r"`(\w+)`", dropped.group(1))) == r["dropped"]
        untried = r["not_tried"] - r["kept"]  # a size of the kept speedup (workers:2) is not one untried alone
        assert ("untried alone" in para) == bool(untried) and untried <= r["dropped"]
        assert r["commit"].split()[0].rstrip(",") in log


def subprocess_log() -> str:
    """The repository's commit IDs (short), where git is there; otherwise the record's own claim is taken."""
    import subprocess

    try:
        return subprocess.run(
            ["git", "log", "--format=%h %H"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):  # pragma: no cover - a copy without .git
        return " ".join(r["commit"] for r in _main_job_records())
