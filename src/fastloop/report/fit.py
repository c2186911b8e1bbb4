"""Reports of a fit (``fastloop fit``) and of two fits' A/B (``fastloop ab --fit``): the terminal
table, Markdown and an HTML page, rendered from the JSON document.

The page's plots: a timeline per run (the fit's phases stacked, in seconds), and each metric's
curve against steps and against seconds (the training loss, each validation metric). A plot is
drawn only where it has data; axis labels are short (``A1`` is side A's first seed), the full
names are in the legend and the tables.

Example:
    >>> doc = {"kind": "fit", "wall_s": 10.0, "phases": {"startup": 3.0, "train": 6.5, "other": 0.5}}
    >>> [(r["phase"], r["share"]) for r in phase_rows(doc)]
    [('startup', '30.0%'), ('train', '65.0%'), ('other', '5.0%')]
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

from rich.console import Console
from rich.table import Table

from fastloop.report.format import fmt_s

__all__ = [
    "FIT_KINDS",
    "fit_figures",
    "fit_share_lines",
    "phase_rows",
    "print_fit",
    "render_fit_html",
    "render_fit_markdown",
]

FIT_KINDS = ("fit", "ab-fit")
PHASE_ORDER = ("startup", "compile", "train", "validation", "checkpoint", "epoch_edges", "host_syncs", "other")
PHASE_COLOURS = {
    "startup": "#9e9e9e",
    "compile": "#8e44ad",
    "train": "#1f77b4",
    "validation": "#2ca02c",
    "checkpoint": "#d62728",
    "epoch_edges": "#ff7f0e",
    "host_syncs": "#e6c229",
    "other": "#cccccc",
}


def fit_share_lines(doc: dict) -> list[str]:
    """The note a ``run``, ``ladder`` or ``ab`` report prints on the share of the fit its step
    figures cover (``fit_share``, set by the command), as a list of one line or none."""
    note = (doc.get("fit_share") or {}).get("note")
    return [note] if note else []


def phase_rows(doc: dict) -> list[dict]:
    """One row per phase the fit has (seconds and share of the outside clock)."""
    wall = doc.get("wall_s") or 0.0
    return [
        {"phase": p, "seconds": f"{doc['phases'][p]:.2f}", "share": f"{100 * doc['phases'][p] / wall:.1f}%"}
        for p in PHASE_ORDER
        if doc["phases"].get(p) and wall > 0
    ]


def _step_line(doc: dict) -> str | None:
    s = doc.get("step_only") or {}
    if not s.get("median_s"):
        return None
    return (
        f"step only: median step {fmt_s(s['median_s'])} (IQR {fmt_s(s['p25_s'])}-{fmt_s(s['p75_s'])}, "
        f"{s['steady_steps']} steady of {s['steps']} batches): the step figure covers "
        f"{100 * (s['covers_frac'] or 0):.0f}% of this fit's {doc['wall_s']:.1f} s"
    )


def _outcome_lines(doc: dict) -> list[str]:
    out = doc["outcome"]
    values = [v for v in out["train_loss"]["value"] if v is not None]
    lines = [f"training loss: {values[0]:.4g} (first batch) -> {values[-1]:.4g} (last)"] if values else []
    for run in out["validation"]:
        shown = ", ".join(f"{k} {v:.4g}" if v is not None else f"{k} -" for k, v in run["metrics"].items())
        lines.append(f"validation {run['index'] + 1} (step {run['step']}, {run['second']:.1f} s): {shown}")
    if out.get("until"):
        r = out.get("reached")
        lines.append(
            f"{out['until']}: reached at step {r['step']}, {r['second']:.1f} s from the start"
            if r
            else f"{out['until']}: not reached (the fit ended first; the curve so far is above)"
        )
    return lines


def _fit_lines(doc: dict) -> list[str]:
    """Everything below the phase table of a fit, as plain lines."""
    check = doc["phase_check"]
    other = 100 * (check["other_frac"] or 0)
    lines = [
        f"the phases sum to the outside clock; `other` (what no phase claims) is {other:.1f}% of it "
        f"(tolerance {100 * check['tolerance']:g}%)"
    ]
    if _step_line(doc):
        lines.append(_step_line(doc))
    c = doc["compiles"]
    if c["count"]:
        lines.append(
            f"compiles: {c['count']} graph(s), {c['seconds']:.1f} s ({c['cold']} built cold, {c['warm']} from "
            "Inductor's cache)"
        )
    applied = [s["name"] for s in doc.get("speedups", []) if s["status"] == "applied"]
    not_applied = [
        f"{s['name']} {s['status']}: {s['reason']}" for s in doc.get("speedups", []) if s["status"] != "applied"
    ]
    lines.append(f"speedups applied: {', '.join(applied) or 'none'}" + "".join(f"; {n}" for n in not_applied))
    if doc["settings"].get("left_out"):
        lines.append(
            "Trainer settings replaced: " + "; ".join(f"{k} ({v})" for k, v in doc["settings"]["left_out"].items())
        )
    lines += _outcome_lines(doc)
    if doc.get("failed"):
        f = doc["failed"]
        lines.append(f"the fit raised in its {f['phase']} phase at {f['second']:.1f} s: {f['error']}")
    return lines + [f"warning: {w}" for w in doc.get("warnings", [])]


def _ab_rows(doc: dict) -> list[tuple[str, str, str, str]]:
    """(figure, A's seconds, B's seconds, verdict) for the whole fit, the step and each phase."""
    t = doc["time"]
    items = [t["wall"], t["step_only"], *([t["to_target"]] if t.get("to_target") else []), *t["phases"].values()]

    def sec(x: float | None) -> str:
        return fmt_s(x) if x is not None else "-"

    return [(v["name"], sec(v.get("a_s")), sec(v.get("b_s")), v["verdict"].split(": ", 1)[-1]) for v in items]


def _ab_lines(doc: dict) -> list[str]:
    lines = [o["verdict"] for o in doc["outcome"]] + list(doc["diverged"])
    if doc.get("failed_side"):
        lines.append(f"side {doc['failed_side']['side']} ({doc['failed_side']['spec']}) failed: no comparison")
    return lines + [f"method: {doc['method']}"]


def _title(doc: dict) -> str:
    env = doc.get("env") or {}
    where = f"[{env.get('gpu') or 'CPU'}, torch {env.get('torch')}]"
    if doc["kind"] == "fit":
        length = doc["settings"].get("length") or {}
        said = ", ".join(f"{k}={v}" for k, v in length.items() if v not in (None, -1))
        return f"fastloop fit: {doc.get('target')} {where} ({said or 'its own length'}, {doc['wall_s']:.1f} s)"
    return f"fastloop ab --fit: {doc.get('target')} {where}: A = {doc['a_spec']}, B = {doc['b_spec']}"


def print_fit(doc: dict, console: Console | None = None) -> None:
    """The terminal's tables and lines for a ``fit`` or ``ab-fit`` document."""
    console = console or Console(width=160)
    console.print(_title(doc), highlight=False, markup=False)
    table = Table()
    if doc["kind"] == "fit":
        for col in ("phase", "seconds", "share"):
            table.add_column(col)
        for r in phase_rows(doc):
            table.add_row(r["phase"], r["seconds"], r["share"])
        lines = _fit_lines(doc)
    else:
        for col in ("figure", "A", "B", "verdict"):
            table.add_column(col)
        for row in _ab_rows(doc):
            table.add_row(*row)
        lines = _ab_lines(doc)
    console.print(table)
    for line in lines:
        console.print(line, highlight=False, markup=False)


def render_fit_markdown(doc: dict) -> str:
    """The Markdown report of a ``fit`` or ``ab-fit`` document."""
    env = doc.get("env") or {}
    out = [
        "<!-- fastloop-report -->",
        f"# {_title(doc)}",
        "",
        f"{env.get('gpu') or 'CPU'} | torch {env.get('torch')} | lightning {env.get('lightning')} | fastloop "
        f"{doc.get('fastloop_version')} ({env.get('commit') or 'no commit'}) | {env.get('date')}",
        "",
    ]
    if doc.get("partial") or doc.get("interrupted"):
        out += [
            "**" + ("Interrupted" if doc.get("interrupted") else "In progress") + ":** the fits finished so far.",
            "",
        ]
    if doc["kind"] == "fit":
        out += ["| phase | seconds | share |", "|---|---|---|"]
        out += [f"| {r['phase']} | {r['seconds']} | {r['share']} |" for r in phase_rows(doc)]
        out += ["", *[f"- {line}" for line in _fit_lines(doc)]]
    else:
        out += ["| figure | A | B | verdict |", "|---|---|---|---|"]
        out += [f"| {f} | {a} | {b} | {v.replace('|', '/')} |" for f, a, b, v in _ab_rows(doc)]
        out += ["", *[f"- {line}" for line in _ab_lines(doc)]]
    return "\n".join(out) + "\n"


def _runs(doc: dict) -> list[tuple[str, str, dict]]:
    """(short label, full name, fit document) of every fit in the document."""
    if doc["kind"] == "fit":
        return [("fit", doc["settings"].get("speedups_asked") or "fit", doc)]
    out = []
    for side in ("a", "b"):
        for i, fit in enumerate(doc["fits"][side]):
            out.append(
                (
                    f"{side.upper()}{i + 1}",
                    f"{side.upper()} = {doc[side + '_spec']}, seed {fit['settings']['seed']}",
                    fit,
                )
            )
    return out


def _timeline(runs: list[tuple[str, str, dict]]) -> Any:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * len(runs)))
    used = [p for p in PHASE_ORDER if any(fit["phases"].get(p, 0) > 0 for _, _, fit in runs)]
    for y, (_, _, fit) in enumerate(runs):
        left = 0.0
        for p in used:
            width = fit["phases"].get(p, 0.0)
            ax.barh(y, width, left=left, color=PHASE_COLOURS[p], label=p if y == 0 else None)
            left += width
    ax.set_yticks(range(len(runs)), [label for label, _, _ in runs])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title("Where each fit's time went")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45 if len(runs) < 3 else -0.2), ncol=4, fontsize=8)
    return fig


def _style(label: str, k: int, points: bool) -> dict:
    """A's fits in blues, solid, round markers; B's in oranges, dashed, crosses: where B's curve
    lies on A's (the same batches, the same result), both stay visible."""
    import matplotlib

    b = label.startswith("B")
    shade = 0.45 + 0.5 * ((k % 4) / 4)
    return {
        "color": matplotlib.colormaps["Oranges" if b else "Blues"](shade),
        "linestyle": "--" if b else "-",
        "marker": ("x" if b else "o") if points else "",
    }


def _curves(runs: list[tuple[str, str, dict]], metric: str) -> Any | None:
    """``metric`` against steps and against seconds, one line a fit (None: no fit has it)."""
    import matplotlib.pyplot as plt

    series = []
    for label, name, fit in runs:
        if metric == "train_loss":
            tl = fit["outcome"]["train_loss"]
            pts = [(s, t, v) for s, t, v in zip(tl["step"], tl["second"], tl["value"]) if v is not None]
        else:
            pts = [
                (r["step"], r["second"], r["metrics"][metric])
                for r in fit["outcome"]["validation"]
                if r["metrics"].get(metric) is not None
            ]
        if pts:
            series.append((label, name, pts))
    if not series:
        return None
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(9, 3.2))
    for k, (label, name, pts) in enumerate(series):
        style = _style(label, k, metric != "train_loss")
        by_step.plot([p[0] for p in pts], [p[2] for p in pts], linewidth=1, label=f"{label}: {name}", **style)
        by_time.plot([p[1] for p in pts], [p[2] for p in pts], linewidth=1, **style)
    by_step.set_xlabel("step")
    by_time.set_xlabel("seconds")
    by_step.set_ylabel(metric)
    fig.suptitle(f"{metric} against steps and against seconds")
    fig.legend(loc="lower center", bbox_to_anchor=(0.5, -0.12 - 0.05 * len(series)), ncol=2, fontsize=8)
    fig.tight_layout()
    return fig


def fit_figures(doc: dict) -> list[tuple[str, Any]]:
    """The page's figures (matplotlib), each only where it has data: (name, figure)."""
    import matplotlib

    matplotlib.use("Agg")
    runs = _runs(doc)
    if not runs:
        return []
    figures = [("timeline", _timeline(runs))]
    metrics = ["train_loss"] + sorted(
        {
            k
            for _, _, fit in runs
            for r in fit["outcome"]["validation"]
            for k, v in r["metrics"].items()
            if v is not None
        }
    )
    for metric in metrics:
        fig = _curves(runs, metric)
        if fig is not None:
            figures.append((f"curve-{metric}", fig))
    return figures


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def render_fit_html(doc: dict) -> str:
    """The HTML page of a ``fit`` or ``ab-fit`` document (tables, lines, the plots)."""
    e = html.escape
    env = doc.get("env") or {}
    stamp = " | ".join(f"<b>{e(k)}</b> {e(str(v))}" for k, v in env.items() if v is not None)
    if doc["kind"] == "fit":
        head, body = ("phase", "seconds", "share"), [(r["phase"], r["seconds"], r["share"]) for r in phase_rows(doc)]
        lines = _fit_lines(doc)
    else:
        head, body, lines = ("figure", "A", "B", "verdict"), _ab_rows(doc), _ab_lines(doc)
    table = "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
    table += "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in body) + "</table>"
    legend = ""
    if doc["kind"] == "ab-fit":
        legend = "<p>" + "; ".join(f"<b>{e(label)}</b>: {e(name)}" for label, name, _ in _runs(doc)) + "</p>"
    imgs = (
        ""
        if doc.get("interrupted")
        else "".join(
            f'<figure><img class="plot" id="plot-{e(n)}" alt="{e(n)}" src="data:image/png;base64,{_png(f)}"/></figure>'
            for n, f in fit_figures(doc)
        )
    )
    items = "".join(f"<li>{e(line)}</li>" for line in lines)
    return f"""<!doctype html><!-- fastloop-report --><html><head><meta charset="utf-8"><title>{e(_title(doc))}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;font-size:13px}}.stamp{{color:#555;font-size:12px}}
img.plot{{max-width:100%}}</style></head><body>
<h1>{e(_title(doc))}</h1>
<p class="stamp">{stamp}</p>
{table}<ul>{items}</ul>{legend}{imgs}</body></html>"""
