"""Writing reports without losing anything of the user's.

Rules: a report never lands on an input file or on a file fastloop did not write; every file
is written to a temporary file in the same folder and renamed, so a reader sees the old or the
new file, never half of one; JSON is standard (NaN and infinities become ``null`` and the
document gains a warning). Checks run before torch is imported, so bad paths are answered fast.

Example:
    >>> import json, os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> atomic_write(os.path.join(d, "r.json"), to_json({"x": float("nan")}))
    >>> json.load(open(os.path.join(d, "r.json")))
    {'x': None, 'report_warnings': ['x was nan (not a finite number): written as null']}
    >>> os.listdir(d)
    ['r.json']
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from fastloop.errors import FastloopError, shorten

__all__ = ["MARKER", "REPORT_FILES", "atomic_write", "check_json_path", "check_out_dir", "sanitize", "to_json"]

MARKER = "fastloop-report"
"""Written into every Markdown and HTML report, so fastloop knows the file is its own."""
REPORT_FILES = ("report.json", "report.md", "report.html", "fit.json")
OWNED_FOLDERS = {"fit_files": ".fastloop-fit"}
"""Folders of an ``--out`` fastloop made (``fastloop fit``'s logs and checkpoints), each known by
the marker file fastloop writes in it."""


def _printable(path: str) -> str:
    """The path as a one-line message shows it: not-UTF-8 bytes escaped, a long one shortened."""
    return shorten(path)


def _check_name(path: str, flag: str) -> Path:
    if not isinstance(path, str) or not path.strip():
        raise FastloopError(f"{flag} needs a non-empty path")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise FastloopError(f"{flag} {_printable(path)}: the path is not valid UTF-8; use a UTF-8 name") from None
    p = Path(path)
    if len(path.encode()) > 4000:
        raise FastloopError(f"{flag} {_printable(path)}: the path is too long (at most 4,000 bytes)")
    for part in p.parts:
        if len(part.encode()) > 255:
            raise FastloopError(
                f"{flag}: the name {shorten(part, 40)} is {len(part.encode())} bytes long; names may be at most 255"
            )
    return p


def _ours(path: Path) -> bool:
    """Did fastloop write this file? (JSON with a fastloop_version, or a report with the marker.)"""
    try:
        if path.suffix == ".json":
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            return isinstance(doc, dict) and "fastloop_version" in doc
        with open(path, "rb") as f:
            return MARKER in f.read(4096).decode("utf-8", "replace")
    except (OSError, ValueError):
        return False


def _check_writable_dir(folder: Path, flag: str, shown: str) -> None:
    if not folder.is_dir():
        raise FastloopError(f"{flag} {shown}: the folder {folder} does not exist or is not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".fastloop-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise FastloopError(f"{flag} {shown}: cannot write in {folder} ({err.strerror or err})") from None


def check_json_path(path: str, inputs: list[str] = ()) -> None:  # type: ignore[assignment]
    """Refuse (FastloopError) a ``--json`` path that is empty, an input, a folder, a file
    fastloop did not write, read-only, or in a folder we cannot write."""
    p = _check_name(path, "--json")
    shown = _printable(path)
    for inp in inputs:
        if inp and Path(inp).exists() and p.exists() and os.path.samefile(p, inp):
            raise FastloopError(f"--json {shown} is an input of this run ({_printable(inp)}); choose another file")
    if p.is_dir():
        raise FastloopError(f"--json {shown} is a folder; give a file path")
    if p.exists():
        if not p.is_file():
            raise FastloopError(f"--json {shown} is not a regular file; give a new file path")
        if not _ours(p):
            raise FastloopError(
                f"--json {shown} exists and was not written by fastloop; refusing to overwrite it "
                f"(choose a new file, or delete it)"
            )
        if not os.access(p, os.W_OK) or not p.stat().st_mode & 0o222:  # root passes os.access
            raise FastloopError(f"--json {shown} is read-only; choose another file")
    _check_writable_dir(p.resolve().parent if p.parent.exists() else p.parent, "--json", shown)


def check_out_dir(path: str, inputs: list[str] = ()) -> None:  # type: ignore[assignment]
    """Refuse (FastloopError) an ``--out`` folder that holds files fastloop did not write."""
    p = _check_name(path, "--out")
    shown = _printable(path)
    if p.exists() and not p.is_dir():
        raise FastloopError(f"--out {shown} is a file; give a folder (new, or one fastloop wrote before)")
    if not p.exists():
        parent = next((q for q in p.resolve().parents if q.exists()), Path("/"))
        if not parent.is_dir():
            raise FastloopError(f"--out {shown}: {parent} is a file, so no folder can be made below it")
        _check_writable_dir(parent, "--out", shown)
        return
    foreign = sorted(
        e.name
        for e in p.iterdir()
        if not (e.name in REPORT_FILES and e.is_file() and _ours(e))
        and not e.name.startswith(".fastloop-")
        and not (e.name in OWNED_FOLDERS and (e / OWNED_FOLDERS[e.name]).is_file())
    )
    if foreign:
        listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise FastloopError(
            f"--out {shown} already holds files fastloop did not write ({listed}); choose a new or empty folder"
        )
    for inp in inputs:
        if inp and Path(inp).exists() and Path(inp).resolve().parent == p.resolve():
            raise FastloopError(f"--out {shown} holds an input of this run ({_printable(inp)}); choose another folder")
    _check_writable_dir(p, "--out", shown)


def sanitize(doc: object, warnings: list[str], where: str = "") -> object:
    """A copy of ``doc`` with NaN/inf replaced by None; one warning per replaced value's path."""
    if isinstance(doc, float) and not math.isfinite(doc):
        warnings.append(f"{where or 'value'} was {doc} (not a finite number): written as null")
        return None
    if isinstance(doc, dict):
        return {k: sanitize(v, warnings, f"{where}.{k}" if where else str(k)) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [sanitize(v, warnings, f"{where}[{i}]") for i, v in enumerate(doc)]
    return doc


def to_json(doc: dict) -> str:
    """Standard JSON (no NaN/Infinity tokens): non-finite values become null, with a warning."""
    found: list[str] = []
    clean = sanitize(doc, found)
    if found and isinstance(clean, dict):
        shown = found[:5] + ([f"... and {len(found) - 5} more"] if len(found) > 5 else [])
        clean.setdefault("report_warnings", []).extend(shown)
    return json.dumps(clean, indent=2, default=str, allow_nan=False) + "\n"


def atomic_write(path: str | Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.resolve().parent, prefix=".fastloop-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
