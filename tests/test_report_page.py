"""The HTML report as a person reads it.

Two recorded ladder documents (tests/reports/) are rendered to report.html by the code that
``--out`` runs. Every matplotlib figure is measured at the moment it is saved into the page
(``figure_problems``: each drawn axes holds data, no two text boxes meet, no text past the figure's
edge), the page's images are checked to be exactly those figures, and the page is opened in Chromium:
each figure must be decoded, shown at its own size and found on the screenshot as drawn.

The pages and their screenshots (``page.png``) are kept for a person to look at, as CI artifacts:
under ``$FASTLOOP_ARTIFACTS/report-pages/NAME/``, or ``build/report-pages/NAME/`` in the checkout
(the test prints the folder, and names it in every failure).
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fastloop.report import write_reports
from fastloop.report.figure_check import figure_problems, text_boxes

FIXTURES = Path(__file__).parent / "reports"
PAGES = {
    # `fastloop ladder demo --budget 420 --out DIR` on a 2-core CPU at 2dafea6: 5 rungs, no memory, nothing compiled
    "ladder_demo_cpu": "ladder_demo_cpu.json",
    # a ViT ladder on an H200 at c7fbbb2 (git show 283a213:benchmarks/results/round20/reports/ladder_vit_2/report.json):
    # 6 rungs, peak memory, compile and capture time, the GPU profile
    "ladder_gpu": "ladder_gpu.json",
    # `fastloop ladder demo --objective fit --rungs workers,async_checkpoint,deferred_logging --budget 150 --out DIR`
    # on a busy 2-core CPU at d19d96f: the step's search had room for its baseline; the fit's section
    "ladder_fit_demo_cpu": "ladder_fit_demo_cpu.json",
}
"""Recorded ladder documents, with the keys no report reads (each rung's env, timings, checks) taken out."""
WINDOW_WIDTH = 1200
PROBE = """<script>addEventListener("load", () => {
  const boxes = [...document.querySelectorAll("img.plot")].map(i => { const r = i.getBoundingClientRect();
    return {id: i.id, x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height,
            natural_w: i.naturalWidth, natural_h: i.naturalHeight}; });
  const pre = document.createElement("pre"); pre.id = "layout"; pre.hidden = true;
  pre.textContent = JSON.stringify({images: boxes, width: document.documentElement.scrollWidth,
                                    bottom: document.body.getBoundingClientRect().bottom + scrollY + 16});
  document.body.appendChild(pre); });</script>"""
"""Added to a copy of the page: once the images are loaded, Chromium writes where each one stands."""


def _artifacts(name: str) -> Path:
    root = Path(os.environ.get("FASTLOOP_ARTIFACTS") or Path(__file__).resolve().parents[1] / "build")
    out = root / "report-pages" / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    print(f"report page and screenshot: {out}")
    return out


def _measure_figures_as_saved(monkeypatch) -> list[dict]:
    """Each figure saved while the page renders: the PNG bytes it became and what a reader would find
    wrong with it, measured right after saving (the page's own code path, whatever draws it)."""
    from matplotlib.figure import Figure

    saved: list[dict] = []
    real_savefig = Figure.savefig

    def savefig_and_measure(fig, fname, *args, **kwargs):
        real_savefig(fig, fname, *args, **kwargs)
        problems = figure_problems(fig)
        if kwargs.get("bbox_inches") == "tight":  # that crop grows to hold every text: nothing is cut at the edge
            problems = [p for p in problems if not p.endswith("past the figure's edge")]
        saved.append({"png": fname.getvalue() if isinstance(fname, io.BytesIO) else None, "problems": problems})

    monkeypatch.setattr(Figure, "savefig", savefig_and_measure)
    return saved


def _chromium(*args: str) -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (the .ci/run installs it)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    flags += ["--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]
    flags += ["--force-device-scale-factor=1"]
    p = subprocess.run([chromium, *flags, *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-800:]
    return p.stdout


def _look_in_chromium(page: Path, pngs: list[bytes]) -> None:
    """Open the page in Chromium (one start: the layout and the screenshot together); each image must
    be decoded, shown at its own size (not shrunk) and appear on the screenshot pixel for pixel; the
    page must fit the window's width. The screenshot, cut to the page's height, is kept as page.png."""
    from matplotlib.image import imread, imsave

    probe = page.with_name("layout_probe.html")
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    shot = page.with_name("page.png")
    window_height = 2000 + sum(imread(io.BytesIO(png)).shape[0] + 40 for png in pngs)
    dom = _chromium(
        "--dump-dom",
        f"--screenshot={shot}",
        "--virtual-time-budget=10000",
        f"--window-size={WINDOW_WIDTH},{window_height}",
        probe.as_uri(),
    )
    found = re.search(r'<pre id="layout"[^>]*>(.*?)</pre>', dom, re.S)
    assert found, f"Chromium did not finish loading {probe}"
    layout = json.loads(html.unescape(found.group(1)))
    assert layout["width"] <= WINDOW_WIDTH, f"the page is {layout['width']} px wide: cut at the right ({page})"
    assert layout["bottom"] <= window_height, f"the page is taller than the screenshot: {layout}"
    screen = imread(str(shot))[: round(layout["bottom"]), :, :3]
    imsave(shot, screen)
    assert len(layout["images"]) == len(pngs), layout
    for box, png in zip(layout["images"], pngs):
        drawn = imread(io.BytesIO(png))[..., :3]
        height, width = drawn.shape[:2]
        assert (box["natural_w"], box["natural_h"]) == (width, height), f"{box['id']} not decoded as drawn: {box}"
        assert (round(box["w"]), round(box["h"])) == (width, height), f"{box['id']} shown shrunk: {box} ({shot})"
        x, y = round(box["x"]), round(box["y"])
        on_screen = screen[y : y + height, x : x + width]
        assert on_screen.shape == drawn.shape, f"{box['id']} runs off the screenshot ({shot})"
        assert np.abs(on_screen - drawn).mean() < 0.01, f"{box['id']} on the screenshot is not the figure drawn"


@pytest.mark.parametrize("name", list(PAGES))
def test_the_report_page_as_a_person_reads_it(name, monkeypatch):
    doc = json.loads((FIXTURES / PAGES[name]).read_text())
    out = _artifacts(name)
    saved = _measure_figures_as_saved(monkeypatch)
    write_reports(doc, str(out), None)
    page = (out / "report.html").read_text()
    problems = [f"figure {i + 1}: {p}" for i, figure in enumerate(saved) for p in figure["problems"]]
    assert problems == [], f"{out / 'report.html'}:\n" + "\n".join(problems)
    shown = [
        base64.b64decode(b) for b in re.findall(r'<img class="plot"[^>]*src="data:image/png;base64,([^"]+)"', page)
    ]
    assert len(shown) >= 3 and shown == [figure["png"] for figure in saved], "the page shows other images"
    on_gpu = doc["device"] == "cuda"
    assert ('id="plot-memory_compile"' in page) == on_gpu
    assert ("No plot of peak memory: not measured on the CPU." in page) == (not on_gpu)
    assert ("No plot of compile / capture time: nothing compiled." in page) == (not on_gpu)
    _look_in_chromium(out / "report.html", [figure["png"] for figure in saved])


def _fig(**kw):
    from matplotlib.figure import Figure

    return Figure(dpi=100, layout="constrained", **kw)


def test_figure_problems_finds_neighbouring_titles_that_meet_and_rotated_labels_that_overlap():
    fig = _fig(figsize=(5, 3))
    left, right = fig.subplots(1, 2)
    left.bar([0, 1], [1.0, 2.0])
    right.bar([0, 1], [3.0, 4.0])
    left.set_title("Peak GPU memory (GiB; 0 = not measured on CPU)")
    right.set_title("Compile / capture time (s)")
    names = ["+bf16,fused_optimizer (compute bundle)", "selected: workers:4"]
    left.set_xticks([0, 1], names, rotation=30, ha="right")
    found = figure_problems(fig)
    assert "'Peak GPU memory (GiB; 0 = not measured on CPU)' overlaps 'Compile / capture time (s)'" in found
    assert "tick label '+bf16,fused_optimizer (compute bundle)' overlaps tick label 'selected: workers:4'" in found


def test_figure_problems_is_empty_for_a_figure_that_fits():
    fig = _fig(figsize=(5, 3))
    left, right = fig.subplots(1, 2)
    left.bar([0, 1], [1.0, 2.0])
    right.plot([0, 1, 2], [3.0, 1.0, 2.0])
    left.set_title("Memory (GiB)")
    right.set_title("Compile (s)")
    left.set_xticks([0, 1], ["1", "2"])
    assert figure_problems(fig) == []


def test_an_axes_counts_as_empty_when_its_data_lies_outside_its_limits_or_is_not_finite():
    fig = _fig(figsize=(6, 2.5))
    outside, nan, zero = fig.subplots(1, 3)
    outside.plot([0, 1], [5.0, 6.0])
    outside.set_ylim(0, 1)
    nan.plot([0, 1], [float("nan"), float("nan")])
    zero.bar([0, 1], [0.0, 0.0])
    assert figure_problems(fig) == [f"axes {i} of 3: no data drawn within its limits" for i in (1, 2, 3)]


def test_tick_labels_outside_the_view_are_not_text_a_reader_sees():
    """Matplotlib keeps tick objects for positions outside the limits; they are not drawn, so they
    neither overlap nor reach past the edge."""
    fig = _fig(figsize=(4, 3))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1])
    ax.set_xticks([-5, 0, 1, 6], ["far left", "0", "1", "far right"])
    ax.set_xlim(-0.1, 1.1)
    said = [what for what, _ in text_boxes(fig)]
    assert "tick label '0'" in said and not any("far" in what for what in said)
    assert figure_problems(fig) == []


def _rung(i: int, n: int) -> dict:
    """A GPU ladder's rung with a long configuration name, memory, and a compile on every third."""
    stack = "tf32,bf16,fused_optimizer,channels_last,compile,cuda_graph,workers:16,pin_memory,prefetch"
    name = "baseline" if i == 0 else f"{'selected: ' if i == n - 1 else '+'}{stack[: 12 + 5 * i]} (compute bundle)"
    step = 0.05 / (1 + i)
    return {
        "rung": name,
        "step_s": {"median": step},
        "throughput": {"value": 256 / step, "unit": "samples/s"},
        "data_wait_frac": 0.3 / (1 + i),
        "gpu_profile": {"gpu_busy_frac": 0.6},
        "peak_mem_bytes": (3 + i) * 2**31,
        "compile_s": 40.0 + i if i % 3 == 1 else None,
        "losses": [2.0 - 0.01 * k - 0.001 * i for k in range(50)],
        "final": i == n - 1,
    }


@pytest.mark.parametrize("rungs", [1, 28])
def test_every_figure_of_a_lone_configuration_and_of_a_crowded_gpu_ladder_fits(rungs):
    from fastloop.report.figures import PAGE_WIDTH_IN, report_figures

    doc = {"kind": "ladder", "device": "cuda", "env": {"gpu": "H100"}, "rungs": [_rung(i, rungs) for i in range(rungs)]}
    figures, left_out = report_figures(doc)
    assert [name for name, _ in figures] == ["throughput", "breakdown", "memory_compile", "loss"]
    assert left_out == (["compile / capture time: nothing compiled"] if rungs == 1 else [])
    for name, fig in figures:
        assert fig.get_figwidth() <= PAGE_WIDTH_IN and figure_problems(fig) == [], name


def test_a_run_that_counts_no_items_has_no_throughput_plot_and_says_so():
    from fastloop.report.figures import report_figures

    run = {"kind": "run", "device": "cpu", "step_s": {"median": 0.01}, "throughput": {"value": 0.0, "unit": "items/s"}}
    figures, left_out = report_figures(run)
    assert [name for name, _ in figures] == ["breakdown"] and figure_problems(figures[0][1]) == []
    assert left_out[0] == "throughput: no items counted per step"


FIT_PAGES = {
    # `fastloop fit demo --epochs 2 --json F` on a 2-core CPU at 9e918f5: the phase timeline, three metric curves
    "fit_demo_cpu": "fit_demo_cpu.json",
    # `fastloop ab demo --fit --a none --b workers --epochs 1 --seeds 2` on the same machine: two sides, two seeds
    "abfit_demo_cpu": "abfit_demo_cpu.json",
}
"""Recorded ``fit`` and ``ab --fit`` documents: their pages follow the ladder page's rules."""


@pytest.mark.parametrize("name", list(FIT_PAGES))
def test_the_fit_pages_as_a_person_reads_them(name, monkeypatch):
    """A fit's page (a timeline per run, the metric curves against steps and against seconds) and an A/B
    of fits: every figure holds data, no two texts meet, nothing past the edge, shown at its own size."""
    doc = json.loads((FIXTURES / FIT_PAGES[name]).read_text())
    out = _artifacts(name)
    saved = _measure_figures_as_saved(monkeypatch)
    write_reports(doc, str(out), None)
    page = (out / "report.html").read_text()
    problems = [f"figure {i + 1}: {p}" for i, figure in enumerate(saved) for p in figure["problems"]]
    assert problems == [], f"{out / 'report.html'}:\n" + "\n".join(problems)
    shown = [
        base64.b64decode(b) for b in re.findall(r'<img class="plot"[^>]*src="data:image/png;base64,([^"]+)"', page)
    ]
    fits = [doc] if doc["kind"] == "fit" else doc["fits"]["a"] + doc["fits"]["b"]
    metrics = {k for fit in fits for r in fit["outcome"]["validation"] for k in r["metrics"]}
    assert len(shown) == 2 + len(metrics) and shown == [figure["png"] for figure in saved]
    _look_in_chromium(out / "report.html", [figure["png"] for figure in saved])
