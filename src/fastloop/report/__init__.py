"""Reports: JSON is the source of truth; Markdown and HTML are rendered from it."""

from fastloop.errors import FastloopError
from fastloop.report.files import atomic_write, to_json
from fastloop.report.fit import FIT_KINDS, render_fit_html, render_fit_markdown
from fastloop.report.html import render_html
from fastloop.report.markdown import render_markdown
from fastloop.report.terminal import print_document

__all__ = ["print_document", "render_html", "render_markdown", "write_reports"]


def write_reports(doc: dict, out_dir: str | None, json_path: str | None, html: bool = True) -> list[str]:
    """Write ``--json FILE`` and/or ``--out DIR`` (report.json, report.md, report.html).

    ``html=False`` leaves report.html as it is (its plots take most of the time: a ladder's
    update after each run refreshes the HTML only every few seconds).

    Each file is written atomically (temporary file, then rename); JSON is standard JSON.
    An OSError becomes a FastloopError naming the file.
    """
    from pathlib import Path

    written = []
    text = to_json(doc)
    try:
        if json_path:
            atomic_write(json_path, text)
            written.append(json_path)
        if out_dir:
            out = Path(out_dir)
            out.mkdir(parents=True, exist_ok=True)
            atomic_write(out / "report.json", text)
            fit = doc.get("kind") in FIT_KINDS  # fastloop fit and ab --fit have pages of their own
            atomic_write(out / "report.md", render_fit_markdown(doc) if fit else render_markdown(doc))
            written += [str(out / "report.json"), str(out / "report.md")]
            if html:
                atomic_write(out / "report.html", render_fit_html(doc) if fit else render_html(doc))
                written.append(str(out / "report.html"))
    except OSError as err:
        raise FastloopError(
            f"cannot write the report to {err.filename or out_dir or json_path}: {err.strerror or err}"
        ) from None
    return written
