"""Reports: JSON is the source of truth; Markdown and HTML are rendered from it."""

from fastloop.report.html import render_html
from fastloop.report.markdown import render_markdown
from fastloop.report.terminal import print_document

__all__ = ["print_document", "render_html", "render_markdown", "write_reports"]


def write_reports(doc: dict, out_dir: str | None, json_path: str | None) -> list[str]:
    """Write ``--json FILE`` and/or ``--out DIR`` (report.json, report.md, report.html)."""
    import json
    from pathlib import Path

    written = []
    text = json.dumps(doc, indent=2, default=str)
    if json_path:
        Path(json_path).write_text(text)
        written.append(json_path)
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(text)
        (out / "report.md").write_text(render_markdown(doc))
        (out / "report.html").write_text(render_html(doc))
        written += [str(out / n) for n in ("report.json", "report.md", "report.html")]
    return written
