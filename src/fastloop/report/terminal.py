"""Rich tables for the terminal."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fastloop.compare import loss_line
from fastloop.report.fit import fit_share_lines
from fastloop.report.format import check_lines, ranks_lines, rows, selected_line, warning_lines
from fastloop.report.ladder_fit import HEADING, fit_objective_lines, fit_phase_rows
from fastloop.report.markdown import search_story

__all__ = ["make_console", "print_document"]


def make_console() -> Console:
    """A console as wide as the terminal, or 160 columns when output goes to a file or pipe."""
    probe = Console()
    return probe if probe.is_terminal else Console(width=160)


def print_document(doc: dict, console: Console | None = None) -> None:
    console = console or make_console()
    env = doc.get("env", {})
    ladder = doc.get("kind") == "ladder"
    table = Table(
        title=f"fastloop {doc.get('kind', 'run')}: {doc.get('target')}  "
        f"[{env.get('gpu') or 'CPU'}, torch {env.get('torch')}]"
    )
    for col in ("configuration", "median step", "IQR", "throughput", "data wait", "peak mem", "compile", "MFU"):
        table.add_column(col)
    if ladder:
        table.add_column("vs prev")
        table.add_column("vs base")
        table.add_column("decision")
    for r in rows(doc):
        cells = [
            r["name"] + (f" ({r['status']})" if r["status"] in ("skipped", "failed") else ""),
            r["step"],
            r["spread"],
            r["throughput"],
            r["wait"],
            r["mem"],
            r["compile"],
            r["mfu"],
        ]
        if ladder:
            cells += [r["vs_prev"], r["vs_base"], r["decision"].partition(":")[0][:24]]
        table.add_row(*cells)
    console.print(table)
    for line in warning_lines(doc):
        console.print(f"[yellow]warning[/yellow]: {line}", highlight=False)
    for line in ranks_lines(doc):
        console.print(line)
    if doc.get("kind") == "ab":
        console.print(f"verdict: {doc['verdict']}")
        if loss_line(doc.get("loss_agreement")):
            console.print(f"loss: {loss_line(doc.get('loss_agreement'))}")
    for line in search_story(doc):
        if line:
            console.print(line.replace("**", "").replace("`", "").replace("1. ", "- ", 1), highlight=False)
    for i, line in enumerate(check_lines(doc)):
        console.print(("check: " if i == 0 else "  ") + line, highlight=False)
    if doc.get("diagnosis"):
        d = doc["diagnosis"]
        console.print(f"diagnosis: [bold]{d['bottleneck']}[/bold] - {d['evidence']}\nnext: {d['recommendation']}")
    for move in doc.get("moves", []):
        console.print(f"bottleneck moved {move}")
    for note in fit_share_lines(doc):
        console.print(f"the whole fit: {note}", highlight=False, markup=False)
    if fit_phase_rows(doc):
        fit = Table(title=HEADING)
        for col in ("phase", "plain (predicted)", "pick (predicted)"):
            fit.add_column(col)
        for row in fit_phase_rows(doc):
            fit.add_row(*row)
        console.print(fit)
    for line in fit_objective_lines(doc):
        console.print(f"the whole fit: {line}", highlight=False, markup=False)
    if selected_line(doc):
        console.print(f"[bold]{selected_line(doc)}[/bold]\n{doc.get('callbacks_line', '')}")
        if doc.get("loop_line"):
            console.print(doc["loop_line"])
