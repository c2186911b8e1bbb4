"""A self-contained HTML page: environment stamp, the table, and matplotlib plots as inline PNGs.

Plots: throughput per rung (waterfall of gains), step time split into data wait and compute,
peak memory and compile time per configuration, and the loss per step (A/B: the first run of each
side, which saw the same batches).
"""

from __future__ import annotations

import base64
import html
import io

from fastloop.compare import loss_line
from fastloop.report.format import check_lines, rows, selected_line, warning_lines

__all__ = ["render_html"]


def _configs(doc: dict) -> list[tuple[str, dict]]:
    if doc.get("kind") == "ladder":
        return [(r["rung"], r) for r in doc["rungs"]]
    if doc.get("kind") == "ab":
        return [("A", doc["a"]), ("B", doc["b"])]
    return [("run", doc)]


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _plots(doc: dict) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfgs = [(n, c) for n, c in _configs(doc) if (c.get("step_s") or {}).get("median")]
    if not cfgs:
        return []
    names = [n for n, _ in cfgs]
    out = []
    # 1. throughput waterfall: each bar starts where the previous configuration ended
    tp = [c["throughput"]["value"] or 0 for _, c in cfgs]
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(names)), 3.4))
    prev = 0.0
    for i, v in enumerate(tp):
        base = prev if i else 0.0
        ax.bar(i, v - base, bottom=base, color="tab:green" if v >= base else "tab:red")
        ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8)
        prev = v
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel(cfgs[0][1]["throughput"]["unit"])
    ax.set_title("Throughput per configuration (waterfall of gains)")
    out.append(("throughput", _png(fig)))
    plt.close(fig)
    # 2. step-time breakdown
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(names)), 3.4))
    med = [c["step_s"]["median"] * 1e3 for _, c in cfgs]
    wait = [m * (c.get("data_wait_frac") or 0.0) for m, (_, c) in zip(med, cfgs)]
    busy = [(c.get("gpu_profile") or {}).get("gpu_busy_frac") for _, c in cfgs]
    if any(b is not None for b in busy):  # CUDA with a profile: GPU busy / GPU idle while the host works
        gpu = [m * b if b is not None else m - w for m, w, b in zip(med, wait, busy)]
        idle = [max(0.0, m - w - g) for m, w, g in zip(med, wait, gpu)]
        ax.bar(names, gpu, label="GPU busy", color="tab:blue")
        ax.bar(names, idle, bottom=gpu, label="GPU idle while the host works", color="tab:red")
        ax.bar(names, wait, bottom=[g + i for g, i in zip(gpu, idle)], label="data wait", color="tab:orange")
        ax.set_title("Step time: GPU busy, GPU idle while the host works, data wait")
    else:
        ax.bar(names, [m - w for m, w in zip(med, wait)], label="compute", color="tab:blue")
        ax.bar(names, wait, bottom=[m - w for m, w in zip(med, wait)], label="data wait", color="tab:orange")
        ax.set_title("Step time: compute vs data wait")
    ax.set_ylabel("median step (ms)")
    ax.legend()
    ax.tick_params(axis="x", rotation=30)
    out.append(("breakdown", _png(fig)))
    plt.close(fig)
    # 3. memory and compile time
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(max(7, 1.6 * len(names)), 3.2))
    a1.bar(names, [(c.get("peak_mem_bytes") or 0) / 2**30 for _, c in cfgs], color="tab:purple")
    a1.set_title("Peak GPU memory (GiB; 0 = not measured on CPU)")
    a2.bar(names, [c.get("compile_s") or 0 for _, c in cfgs], color="tab:gray")
    a2.set_title("Compile / capture time (s)")
    for a in (a1, a2):
        a.tick_params(axis="x", rotation=30)
    out.append(("memory_compile", _png(fig)))
    plt.close(fig)
    # 4. loss per step: does the faster configuration train the same?
    curves = _loss_curves(doc)
    if curves:
        fig, ax = plt.subplots(figsize=(7, 3.4))
        for name, losses in curves:
            pts = [(i, v) for i, v in enumerate(losses) if v is not None]
            ax.plot([i for i, _ in pts], [v for _, v in pts], label=name, linewidth=1)
        ax.set_xlabel("step (warm-up included)")
        ax.set_ylabel("training loss")
        ax.set_title(
            "Loss per step (first run of each configuration: the same batches)"
            if doc.get("kind") == "ab"
            else "Loss per step"
        )
        ax.legend(fontsize=8)
        out.append(("loss", _png(fig)))
        plt.close(fig)
    return out


def _loss_curves(doc: dict) -> list[tuple[str, list]]:
    if doc.get("kind") == "ab":
        got = doc.get("losses") or {}
        curves = [(f"A: {doc.get('a_spec')}", got.get("a")), (f"B: {doc.get('b_spec')}", got.get("b"))]
    else:
        curves = [(n, c.get("losses")) for n, c in _configs(doc)]
    return [(n, v) for n, v in curves if v and any(x is not None for x in v)][:12]


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
        notes.append(
            f"<p><b>Diagnosis:</b> {e(d['bottleneck'])} — {e(d['evidence'])} <b>Next:</b> {e(d['recommendation'])}</p>"
        )
    return notes


def render_html(doc: dict) -> str:
    env = doc.get("env", {})
    e = html.escape
    stamp = " | ".join(f"<b>{e(k)}</b> {e(str(v))}" for k, v in env.items() if v is not None)
    head = [
        "configuration",
        "median step",
        "IQR",
        "throughput",
        "data wait",
        "peak mem",
        "compile",
        "MFU",
        "vs previous",
        "vs baseline",
        "bottleneck",
        "decision",
    ]
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{e(str(r[k]))}</td>"
            for k in (
                "name",
                "step",
                "spread",
                "throughput",
                "wait",
                "mem",
                "compile",
                "mfu",
                "vs_prev",
                "vs_base",
                "bottleneck",
                "decision",
            )
        )
        + "</tr>"
        for r in rows(doc)
    )
    # Interrupted: answer Ctrl-C at once; the plots (the slow part) wait for a finished run
    imgs = (
        ""
        if doc.get("interrupted")
        else "".join(
            f'<figure><img class="plot" id="plot-{n}" alt="{n}" src="data:image/png;base64,{b}"/></figure>'
            for n, b in _plots(doc)
        )
    )
    notes = []
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
    return f"""<!doctype html><!-- fastloop-report --><html><head><meta charset="utf-8"><title>fastloop {e(doc.get("kind", "run"))}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;font-size:13px}}.stamp{{color:#555;font-size:12px}}
img.plot{{max-width:100%}}</style></head><body>
<h1>fastloop {e(doc.get("kind", "run"))}: <code>{e(str(doc.get("target")))}</code></h1>
<p class="stamp">{stamp}</p>
{top}<table><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr>{body}</table>
<p>Throughput and ratios use mean step time (before / after); (n.s.) = not significant.</p>
{"".join(notes)}{imgs}</body></html>"""
