"""What a reader would find wrong with a drawn matplotlib figure, found by measuring it.

A plot is worth drawing only where it shows something and where its words can be read. This module
lays a figure out as it will be saved and lists, as sentences, what breaks that:

- an axes that holds no data within its limits (empty frames: bars of height 0, nothing plotted);
- two text elements whose boxes intersect (tick labels, titles of neighbouring plots, bar labels,
  a legend over a label);
- a text element or a legend that reaches past the figure's edge (cut off when saved).

Every figure fastloop draws for a report (the ladder's and A/B's page, the fit's) can be checked
with :func:`figure_problems`; the tests assert it returns nothing.

Example:
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> fig, (left, right) = plt.subplots(1, 2, figsize=(4, 2), layout="constrained")
    >>> _ = left.bar([0, 1], [3.0, 4.0])
    >>> _ = right.bar([0, 1], [0.0, 0.0])  # "0 = not measured": an empty frame
    >>> figure_problems(fig)
    ['axes 2 of 2: no data drawn within its limits']
    >>> plt.close(fig)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.backend_bases import RendererBase
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

__all__ = ["figure_problems", "text_boxes"]

SLACK_PX = 1.0
"""Pixels two boxes may share, or a box may pass the edge by, before it counts: antialiasing, not
a reader, sees a one-pixel touch."""


def _renderer(fig: Figure) -> RendererBase:
    """Lay the figure out (constrained layout included) as saving would, and return its renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _axes_name(ax: Axes, fig: Figure) -> str:
    title = ax.get_title() or ax.get_title("left") or ax.get_title("right")
    visible = [a for a in fig.axes if a.get_visible()]
    return f"axes {title!r}" if title else f"axes {visible.index(ax) + 1} of {len(visible)}"


def _inside(lo: float, hi: float, a: float, b: float) -> bool:
    """Does the interval [a, b] (any order) reach into the open view interval (lo, hi)?"""
    a, b = min(a, b), max(a, b)
    return b > lo and a < hi


def _holds_data(ax: Axes) -> bool:
    """Does any line, patch, collection or image of ``ax`` show finite data inside its limits?

    A bar of height 0 or a line whose points all lie outside the view shows nothing."""
    (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
    for line in ax.lines:
        if line.get_visible() and any(
            math.isfinite(x) and math.isfinite(y) and x0 <= x <= x1 and y0 <= y <= y1 for x, y in line.get_xydata()
        ):
            return True
    for patch in ax.patches:
        if not patch.get_visible():
            continue
        box = patch.get_bbox() if hasattr(patch, "get_bbox") else None
        if box is None:
            return True  # a drawn shape without a data box (a polygon): it is there
        corners = (box.x0, box.x1, box.y0, box.y1)
        if all(math.isfinite(v) for v in corners) and box.width != 0 and box.height != 0:
            if _inside(x0, x1, box.x0, box.x1) and _inside(y0, y1, box.y0, box.y1):
                return True
    for coll in ax.collections:
        lim = coll.get_datalim(ax.transData)
        if coll.get_visible() and all(math.isfinite(v) for v in lim.extents):
            if _inside(x0, x1, lim.x0, lim.x1 + 1e-12) and _inside(y0, y1, lim.y0, lim.y1 + 1e-12):
                return True
    return any(im.get_visible() for im in ax.images)


def _shown_tick_labels(ax: Axes) -> tuple[list, set[int]]:
    """The tick labels ``ax`` draws (ticks inside the view, labels on and not empty), and the ids of
    all its tick labels: the tick objects outside the view exist but are not drawn."""
    shown, every = [], set()
    for axis in (ax.xaxis, ax.yaxis):
        lo, hi = sorted(axis.get_view_interval())
        tol = 1e-9 * max(abs(lo), abs(hi), 1.0)
        for tick in axis.get_major_ticks() + axis.get_minor_ticks():
            for label in (tick.label1, tick.label2):
                every.add(id(label))
                if (
                    ax.axison
                    and tick.get_visible()
                    and label.get_visible()
                    and label.get_text().strip()
                    and lo - tol <= tick.get_loc() <= hi + tol
                ):
                    shown.append(label)
    return shown, every


def text_boxes(fig: Figure, renderer: RendererBase | None = None) -> list[tuple[str, Bbox]]:
    """Every piece of text the figure draws, as (what it says, its box in pixels).

    A legend counts as one box (its entries are laid out by matplotlib and never meet each other,
    but the legend as a whole can cover a label). Tick labels count only where their tick is drawn.

    Args:
        fig: a matplotlib figure.
        renderer: the renderer of a figure already drawn; ``None`` draws it first.

    Returns:
        ``(description, bbox)`` pairs, in display pixels (origin at the bottom left).

    Example:
        >>> import matplotlib
        >>> matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt
        >>> fig, ax = plt.subplots()
        >>> _ = ax.set_title("Throughput"); _ = ax.set_xticks([0, 1], ["1", "2"])
        >>> sorted(what for what, _ in text_boxes(fig) if "tick" not in what)
        ["'Throughput'"]
        >>> plt.close(fig)
    """
    from matplotlib.text import Text

    renderer = renderer or _renderer(fig)
    out: list[tuple[str, Bbox]] = []
    skip: set[int] = set()
    for ax in fig.axes:
        if not ax.get_visible():
            skip |= {id(t) for t in ax.findobj(Text)}
            continue
        shown, every = _shown_tick_labels(ax)
        skip |= every
        out += [(f"tick label {t.get_text()!r}", t.get_window_extent(renderer)) for t in shown]
    for legend in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() and ax.get_visible()]:
        skip |= {id(t) for t in legend.findobj(Text)}
        if legend.get_visible():
            entries = ", ".join(t.get_text() for t in legend.get_texts())
            out.append((f"legend ({_short(entries)})", legend.get_window_extent(renderer)))
    for t in fig.findobj(Text):
        if id(t) in skip or not t.get_visible() or not t.get_text().strip():
            continue
        if t.axes is not None and not t.axes.axison and t in (t.axes.xaxis.label, t.axes.yaxis.label):
            continue
        out.append((repr(_short(t.get_text())), t.get_window_extent(renderer)))
    return out


def _short(text: str, width: int = 48) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _overlap(a: Bbox, b: Bbox) -> bool:
    dx = min(a.x1, b.x1) - max(a.x0, b.x0)
    dy = min(a.y1, b.y1) - max(a.y0, b.y0)
    return dx > SLACK_PX and dy > SLACK_PX


def figure_problems(fig: Figure) -> list[str]:
    """What a reader would see wrong with ``fig`` once drawn, one sentence each; empty when none.

    The figure is laid out as saving it would (its own size, dpi and layout engine), then measured:
    every visible axes must hold data within its limits, no two text boxes may intersect, and no
    text or legend may reach past the figure's edge.

    Args:
        fig: a matplotlib figure, drawn or not (it is drawn here on an Agg canvas).

    Returns:
        One sentence per problem, naming the axes or the text concerned.

    Example:
        >>> import matplotlib
        >>> matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt
        >>> fig, ax = plt.subplots(figsize=(2, 2), layout="constrained")
        >>> _ = ax.plot([0, 1], [0, 1]); _ = ax.set_title("a title far too long for a small figure")
        >>> figure_problems(fig)
        ["'a title far too long for a small figure' reaches past the figure's edge"]
        >>> plt.close(fig)
    """
    renderer = _renderer(fig)
    problems = [
        f"{_axes_name(ax, fig)}: no data drawn within its limits"
        for ax in fig.axes
        if ax.get_visible() and ax.axison and not _holds_data(ax)
    ]
    boxes = text_boxes(fig, renderer)
    edge = fig.bbox
    for what, box in boxes:
        if (
            box.x0 < edge.x0 - SLACK_PX
            or box.y0 < edge.y0 - SLACK_PX
            or box.x1 > edge.x1 + SLACK_PX
            or box.y1 > edge.y1 + SLACK_PX
        ):
            problems.append(f"{what} reaches past the figure's edge")
    for i, (what, box) in enumerate(boxes):
        for other, other_box in boxes[i + 1 :]:
            if _overlap(box, other_box):
                problems.append(f"{what} overlaps {other}")
    return problems
