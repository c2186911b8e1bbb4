"""A self-contained HTML page: environment stamp, the table, and matplotlib plots as inline PNGs.

The plots are drawn by :mod:`fastloop.report.figures` (each only where it has data, labelled with the
configuration's number in the table); a figure left out says why in one line under the table.
"""

from __future__ import annotations

import base64
import html

from fastloop.compare import loss_line
from fastloop.report.figures import figure_png, report_figures, short_labels
from fastloop.report.fit import fit_share_lines
from fastloop.report.format import check_lines, rows, selected_line, warning_lines
from fastloop.report.ladder_fit import HEADING, fit_objective_lines, fit_phase_rows

__all__ = ["render_html"]

COLUMNS = (
    ("#", "short"),
    ("configuration", "name"),
    ("median step", "step"),
    ("IQR", "spread"),
    ("throughput", "throughput"),
    ("data wait", "wait"),
    ("peak mem", "mem"),
    ("compile", "compile"),
    ("MFU", "mfu"),
    ("vs previous", "vs_prev"),
    ("vs baseline", "vs_base"),
    ("bottleneck", "bottleneck"),
    ("decision", "decision"),
)
"""The table's columns: heading, and the key of :func:`fastloop.report.format.rows` it shows
(``short``: the number the plots label the configuration with)."""


FIGURES = ("step", "spread", "throughput", "mem", "compile")
"""Columns of one figure and its unit each, kept on one line ("640.28 ms", not "640.28" above "ms")."""


def _cell(key: str, value: object) -> str:
    text = html.escape(str(value))
    if key in FIGURES:
        return f'<td class="figure">{text}</td>'
    # a configuration is one long word to the browser ("a,b,c,..."): let it break after each comma
    return f"<td>{text.replace(',', ',<wbr>') if key == 'name' else text}</td>"


def _table(doc: dict) -> str:
    body = "".join(
        "<tr>" + "".join(_cell(k, r[k]) for _, k in COLUMNS) + "</tr>"
        for r in ({**row, "short": short} for row, short in zip(rows(doc), short_labels(doc)))
    )
    return f"<table><tr>{''.join(f'<th>{h}</th>' for h, _ in COLUMNS)}</tr>{body}</table>"


def _plots(doc: dict) -> tuple[str, str]:
    """The figures as inline images, and the lines for the figures left out."""
    figures, left_out = report_figures(doc)
    images = "".join(
        f'<figure><img class="plot" id="plot-{name}" alt="{name}" '
        f'src="data:image/png;base64,{base64.b64encode(figure_png(fig)).decode()}"/></figure>'
        for name, fig in figures
    )
    return images, "".join(f'<p class="left-out">No plot of {html.escape(line)}.</p>' for line in left_out)


def _notes(doc: dict) -> list[str]:
    """The paragraphs under the table: moves of the bottleneck, the method, the verdict, the loss,
    the check, the warnings and the diagnosis."""
    e = html.escape
    notes: list[str] = []
    for move in doc.get("moves", []):
        notes.append(f"<p><b>Bottleneck moved</b> {e(move)}</p>")
    if doc.get("method"):
        notes.append(f"<p class='stamp'>Method: {e(doc['method'])}.</p>")
    if doc.get("verdict"):
        notes.append(f"<p><b>Verdict:</b> {e(doc['verdict'])}</p>")
    if loss_line(doc.get("loss_agreement")):
        notes.append(f"<p><b>Loss:</b> {e(loss_line(doc.get('loss_agreement')))}</p>")
    checked = check_lines(doc)
    if checked:
        notes.append(
            f"<p id='check'><b>Check</b> (does the pick train as the baseline?): {e(checked[0])}</p><ul>"
            + "".join(f"<li>{e(c)}</li>" for c in checked[1:])
            + "</ul>"
        )
    if warning_lines(doc):
        notes.append("<p><b>Warnings:</b></p><ul>" + "".join(f"<li>{e(w)}</li>" for w in warning_lines(doc)) + "</ul>")
    if doc.get("diagnosis"):
        d = doc["diagnosis"]
        found = f"<b>Diagnosis:</b> {e(d['bottleneck'])} — {e(d['evidence'])}"
        notes.append(f"<p>{found} <b>Next:</b> {e(d['recommendation'])}</p>")
    return notes


def _fit_objective(doc: dict) -> list[str]:
    """A ladder aimed at the fit: its section (the phases plain vs pick, then its lines); [] otherwise."""
    e = html.escape
    lines = fit_objective_lines(doc)
    if not lines:
        return []
    rows = "".join(f"<tr><td>{e(a)}</td><td>{e(b)}</td><td>{e(c)}</td></tr>" for a, b, c in fit_phase_rows(doc))
    table = (
        f"<table id='fit-objective'><tr><th>phase</th><th>plain (predicted)</th><th>pick (predicted)</th></tr>{rows}"
        "</table>"
        if rows
        else ""
    )
    return [f"<h2>{e(HEADING)}</h2>{table}<ul>" + "".join(f"<li>{e(line)}</li>" for line in lines) + "</ul>"]


def render_html(doc: dict) -> str:
    env = doc.get("env", {})
    e = html.escape
    stamp = " | ".join(f"<b>{e(k)}</b> {e(str(v))}" for k, v in env.items() if v is not None)
    # Interrupted: answer Ctrl-C at once; the plots (the slow part) wait for a finished run
    imgs, left_out = ("", "") if doc.get("interrupted") else _plots(doc)
    notes = [f"<p><b>The whole fit:</b> {e(note)}</p>" for note in fit_share_lines(doc)] + _fit_objective(doc)
    top = ""
    if doc.get("interrupted") or doc.get("partial"):
        top += (
            f"<p><b>{'Interrupted' if doc.get('interrupted') else 'In progress'}:</b> the configurations "
            f"finished so far{' (plots are drawn for finished runs only)' if doc.get('interrupted') else ''}.</p>"
        )
    if selected_line(doc):
        top += f"<h2>{e(selected_line(doc))}</h2>"
        if doc.get("callbacks_line"):
            top += (
                f"<pre>{e(doc['callbacks_line'])}"
                + (f"\n{e(doc['loop_line'])}" if doc.get("loop_line") else "")
                + "</pre>"
            )
    notes += _notes(doc)
    title = f"<title>fastloop {e(doc.get('kind', 'run'))}</title>"
    return f"""<!doctype html><!-- fastloop-report --><html><head><meta charset="utf-8">{title}
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;font-size:13px}}.stamp{{color:#555;font-size:12px}}
img.plot{{max-width:100%}}.left-out{{color:#555;margin:0.3em 0}}
td.figure{{white-space:nowrap}}</style></head><body>
<h1>fastloop {e(doc.get("kind", "run"))}: <code>{e(str(doc.get("target")))}</code></h1>
<p class="stamp">{stamp}</p>
{top}{_table(doc)}
<p>Throughput and ratios use mean step time (before / after); (n.s.) = not significant.</p>{left_out}
{"".join(notes)}{imgs}</body></html>"""
