"""The plots of a report page, drawn from its JSON document: each only where it has data.

Figures: throughput per configuration, the step time split into compute and data wait (on CUDA with
a profile: GPU busy, GPU idle while the host works, data wait), peak memory and compile time where
some configuration measured them, and the loss per step (A/B: the first run of each side, which saw
the same batches). A figure with nothing to show is not drawn; the page says why in one line.

Every axis is labelled short, the configuration's number in the table (A and B for an A/B), so no
label runs into the next; the full configuration stands in the table and in the loss plot's legend.
The figures use constrained layout at the dpi they are saved with, so what
:func:`fastloop.report.figure_check.figure_problems` measures is what the page shows.

Example:
    >>> doc = {"kind": "ladder", "device": "cpu", "rungs": [
    ...     {"rung": "baseline", "step_s": {"median": 0.02}, "throughput": {"value": 1600.0, "unit": "samples/s"},
    ...      "data_wait_frac": 0.4, "peak_mem_bytes": None, "compile_s": None, "losses": [2.0, 1.9]},
    ...     {"rung": "+workers:4", "step_s": {"median": 0.01}, "throughput": {"value": 3200.0, "unit": "samples/s"},
    ...      "data_wait_frac": 0.05, "peak_mem_bytes": None, "compile_s": None, "losses": [2.0, 1.8],
    ...      "final": True}]}
    >>> figures, left_out = report_figures(doc)
    >>> [name for name, _ in figures]
    ['throughput', 'breakdown', 'loss']
    >>> left_out
    ['peak memory: not measured on the CPU', 'compile / capture time: nothing compiled']
    >>> short_labels(doc)
    ['1', '2']
"""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["FIG_DPI", "figure_png", "report_figures", "short_labels"]

FIG_DPI = 110
"""Dots per inch of every report figure, when laid out and when saved (the same layout both times)."""
XLABEL = "configuration (# in the table)"
PAGE_WIDTH_IN = 9.2
"""The widest figure the page shows at its own size: its column is about 1,020 pixels at FIG_DPI."""
SELECTED, OTHER = "tab:green", "tab:blue"
LEGEND_WRAP = 44
"""Characters a legend entry may take on one line: a long configuration wraps instead of squeezing the plot."""


def _configs(doc: dict) -> list[tuple[str, dict]]:
    """(name as the table shows it, configuration) for every row of a run, ladder or A/B document."""
    if doc.get("kind") == "ladder":
        return [(r["rung"], r) for r in doc["rungs"]]
    if doc.get("kind") == "ab":
        return [(f"A: {doc.get('a_spec')}", doc["a"]), (f"B: {doc.get('b_spec')}", doc["b"])]
    return [("run", doc)]


def short_labels(doc: dict) -> list[str]:
    """The short name of each table row, as the plots' axes show it: its number, or A and B."""
    if doc.get("kind") == "ab":
        return ["A", "B"]
    return [str(i + 1) for i in range(len(_configs(doc)))]


def _compact(v: float) -> str:
    """A bar's value in at most five characters, so neighbouring bar labels do not meet."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            v, unit = v / scale, suffix
            break
    else:
        unit = ""
    return f"{v:.0f}{unit}" if abs(v) >= 100 else f"{v:.3g}{unit}"


def _width(bars: int, extra: float = 0.0) -> float:
    """Inches for a plot of ``bars`` bars: half an inch for each bar's label, never narrower than the
    title, never wider than the page shows at the figure's own size."""
    return min(PAGE_WIDTH_IN, max(6.4, 1.6 + 0.5 * bars) + extra)


def _figure(width: float, height: float = 3.4) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=FIG_DPI, layout="constrained")


def _bars(ax: Axes, labels: list[str], values: list[float], colors: list[str] | str, fmt=_compact) -> None:
    """Bars with their value above each, the headroom for those values kept inside the axes; where
    the bars stand closer than a value's width, the values stand upright."""
    pitch = ax.figure.get_figwidth() * ax.get_position().width / len(values)
    upright = pitch < 0.42
    bars = ax.bar(range(len(values)), values, color=colors)
    ax.bar_label(bars, labels=[fmt(v) for v in values], fontsize=8, padding=2, rotation=90 if upright else 0)
    ax.set_xticks(range(len(values)), labels)
    ax.set_ylim(0, (1.3 if upright else 1.18) * max(values))
    ax.set_xlabel(XLABEL)


def _throughput(measured: list[tuple[str, str, dict]]) -> Figure | None:
    """Throughput of the configurations whose items were counted (a module that counts none has 0)."""
    counted = [(s, c) for s, _, c in measured if ((c.get("throughput") or {}).get("value") or 0) > 0]
    if not counted:
        return None
    fig = _figure(_width(len(counted)))
    ax = fig.subplots()
    colors = [SELECTED if c.get("final") else OTHER for _, c in counted]
    _bars(ax, [s for s, _ in counted], [c["throughput"]["value"] for _, c in counted], colors)
    ax.set_ylabel(counted[0][1]["throughput"].get("unit") or "items/s")
    selected = " (green: selected)" if SELECTED in colors else ""
    ax.set_title(f"Throughput per configuration{selected}")
    return fig


def _breakdown(measured: list[tuple[str, str, dict]]) -> Figure:
    fig = _figure(_width(len(measured), extra=1.8))
    ax = fig.subplots()
    x = range(len(measured))
    med = [c["step_s"]["median"] * 1e3 for _, _, c in measured]
    wait = [m * (c.get("data_wait_frac") or 0.0) for m, (_, _, c) in zip(med, measured)]
    busy = [(c.get("gpu_profile") or {}).get("gpu_busy_frac") for _, _, c in measured]
    if any(b is not None for b in busy):  # CUDA with a profile: GPU busy / GPU idle while the host works
        gpu = [m * b if b is not None else m - w for m, w, b in zip(med, wait, busy)]
        idle = [max(0.0, m - w - g) for m, w, g in zip(med, wait, gpu)]
        ax.bar(x, gpu, label="GPU busy", color="tab:blue")
        ax.bar(x, idle, bottom=gpu, label="GPU idle while\nthe host works", color="tab:red")
        ax.bar(x, wait, bottom=[g + i for g, i in zip(gpu, idle)], label="data wait", color="tab:orange")
        ax.set_title("Step time: GPU busy, GPU idle, data wait")
    else:
        ax.bar(x, [m - w for m, w in zip(med, wait)], label="compute", color="tab:blue")
        ax.bar(x, wait, bottom=[m - w for m, w in zip(med, wait)], label="data wait", color="tab:orange")
        ax.set_title("Step time: compute and data wait")
    ax.set_xticks(list(x), [s for s, _, _ in measured])
    ax.set_xlabel(XLABEL)
    ax.set_ylabel("median step (ms)")
    fig.legend(loc="outside right upper", fontsize=8)
    return fig


def _memory_compile(measured: list[tuple[str, str, dict]], doc: dict) -> tuple[Figure | None, list[str]]:
    """Peak memory and compile time, each drawn only for the configurations that measured it."""
    mem = [(s, c["peak_mem_bytes"] / 2**30) for s, _, c in measured if c.get("peak_mem_bytes")]
    comp = [(s, c["compile_s"]) for s, _, c in measured if c.get("compile_s")]
    left_out = []
    if not mem:
        on_cpu = doc.get("device") == "cpu" or not (doc.get("env") or {}).get("gpu")
        left_out.append("peak memory: not measured on the CPU" if on_cpu else "peak memory: not measured")
    if not comp:
        left_out.append("compile / capture time: nothing compiled")
    panels = [
        (items, title, color, fmt)
        for items, title, color, fmt in (
            (mem, "Peak GPU memory (GiB)", "tab:purple", lambda v: f"{v:.1f}"),
            (comp, "Compile / capture time (s)", "tab:gray", lambda v: f"{v:.0f}" if v >= 10 else f"{v:.1f}"),
        )
        if items
    ]
    if not panels:
        return None, left_out
    widths = [max(3.2, 1.2 + 0.5 * len(items)) for items, *_ in panels]
    side_by_side = sum(widths) + 0.4 <= PAGE_WIDTH_IN  # else one above the other, each the page's width
    fig = _figure(sum(widths) + 0.4, 3.2) if side_by_side else _figure(PAGE_WIDTH_IN, 3.2 * len(panels))
    axes = (
        fig.subplots(1, len(panels), squeeze=False)[0]
        if side_by_side
        else fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    )
    for ax, (items, title, color, fmt) in zip(axes, panels):
        _bars(ax, [s for s, _ in items], [v for _, v in items], color, fmt)
        ax.set_title(title)
        ax.set_xlabel("configuration (#)")
    return fig, left_out


def _wrap(text: str, width: int = LEGEND_WRAP) -> str:
    """``text`` in lines of at most ``width`` characters, broken after a space or a comma (a
    configuration such as ``workers,pin_memory,tf32`` is one word to ``textwrap``).

    Example:
        >>> print(_wrap("6: selected: workers,pin_memory,prefetch,tf32", 24))
        6: selected: workers,
        pin_memory,prefetch,tf32
    """
    lines, line = [], ""
    for piece in re.findall(r"[^\s,]+[\s,]*|[\s,]+", text):
        if line and len(line) + len(piece.rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        line += piece
    return "\n".join([*lines, line.rstrip()])


def _loss_curves(doc: dict) -> list[tuple[str, list]]:
    """(legend entry, losses) per configuration with losses; configurations that saw the very same
    losses (the selected configuration measured in the baseline's run) share one entry."""
    if doc.get("kind") == "ab":
        got = doc.get("losses") or {}
        curves = [(f"A: {doc.get('a_spec')}", got.get("a")), (f"B: {doc.get('b_spec')}", got.get("b"))]
    else:
        curves = [(f"{s}: {name}", c.get("losses")) for s, (name, c) in zip(short_labels(doc), _configs(doc))]
    grouped: dict[tuple, list[str]] = {}
    for label, losses in curves:
        if losses and any(v is not None for v in losses):
            grouped.setdefault(tuple(losses), []).append(label)
    return [("; ".join(labels), list(losses)) for losses, labels in grouped.items()][:12]


def _loss(doc: dict) -> Figure | None:
    curves = _loss_curves(doc)
    if not curves:
        return None
    labels = [_wrap(label) for label, _ in curves]
    lines = sum(label.count("\n") + 1 for label in labels)
    fig = _figure(
        PAGE_WIDTH_IN, max(3.4, 0.9 + 0.08 * lines + 0.12 * len(labels))
    )  # the legend's height: its lines and gaps
    ax = fig.subplots()
    for label, (_, losses) in zip(labels, curves):
        pts = [(i, v) for i, v in enumerate(losses) if v is not None]
        ax.plot([i for i, _ in pts], [v for _, v in pts], label=label, linewidth=1)
    ax.set_xlabel("step (warm-up included)")
    ax.set_ylabel("training loss")
    ax.set_title(
        "Loss per step (first run of each side: the same batches)" if doc.get("kind") == "ab" else "Loss per step"
    )
    fig.legend(loc="outside right upper", fontsize=8)
    return fig


def report_figures(doc: dict) -> tuple[list[tuple[str, Figure]], list[str]]:
    """The figures a report page shows, and one line for each figure left out and why.

    Args:
        doc: a run, ladder or A/B document (the JSON contract).

    Returns:
        ``(figures, left_out)``: ``(name, matplotlib Figure)`` pairs in page order, and lines such as
        ``"peak memory: not measured on the CPU"`` for the figures with nothing to show.

    Example:
        >>> report_figures({"kind": "run", "device": "cpu", "step_s": None})
        ([], ['plots: no configuration finished its measurement'])
    """
    measured = [
        (short, name, c)
        for short, (name, c) in zip(short_labels(doc), _configs(doc))
        if (c.get("step_s") or {}).get("median")
    ]
    if not measured:
        return [], ["plots: no configuration finished its measurement"]
    throughput = _throughput(measured)
    figures = [("throughput", throughput)] if throughput is not None else []
    figures.append(("breakdown", _breakdown(measured)))
    memory_compile, left_out = _memory_compile(measured, doc)
    if throughput is None:
        left_out.insert(0, "throughput: no items counted per step")
    if memory_compile is not None:
        figures.append(("memory_compile", memory_compile))
    loss = _loss(doc)
    if loss is not None:
        figures.append(("loss", loss))
    else:
        left_out.append("loss per step: no losses recorded")
    return figures, left_out


def figure_png(fig: Figure) -> bytes:
    """The figure as PNG bytes, at :data:`FIG_DPI`, laid out as :func:`figure_problems` measures it
    (no tight crop: constrained layout already keeps every label inside the figure)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=FIG_DPI)
    return buf.getvalue()
