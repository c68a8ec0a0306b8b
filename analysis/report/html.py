"""The HTML writer: blocks (:mod:`pathprobe.analysis.report.blocks`) as one self-contained page
(plots inline as PNG); the compare report is :func:`render`."""

from __future__ import annotations

import html
from collections.abc import Iterable
from pathlib import Path

from pathprobe.analysis.report.blocks import Block, Code, Figure, Heading, Note, Notes, Paragraph, Row, Table, Title
from pathprobe.analysis.report.model import Report
from pathprobe.analysis.report.sections import Records, build

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
td.text,th.text{text-align:left}th{background:#f3f3f3}
.verdict{background:#fff6d6;padding:6px 10px;margin:4px 0}
.self-report{background:#eef4ff;padding:6px 10px;margin:4px 0}
.verdict.flagged{background:#f4f4f4;color:#555;border-left:4px solid #c00}
.client-warning{background:#fde2e1;border-left:4px solid #c00;padding:6px 10px;margin:4px 0}
.warning{background:#fdf0e1;border-left:4px solid #e68a00;padding:6px 10px;margin:4px 0}
.client-note{background:#eef3fb;border-left:4px solid #4e79a7;padding:6px 10px;margin:4px 0}
.failed{color:#b00}.skipped{color:#888}img.plot{max-width:100%;border:1px solid #eee;margin:8px 0}
code{background:#f4f4f4;padding:1px 3px}.meta{color:#555;font-size:13px}
"""

_JS = """
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('img.plot');
  var ok = 0;
  imgs.forEach(function (im) { if (im.complete && im.naturalWidth > 0) ok++; });
  document.body.setAttribute('data-plots-total', String(imgs.length));
  document.body.setAttribute('data-plots-loaded', String(ok));
  // where each anchored block is laid out (left,top,right,bottom in CSS px): what a first screen shows
  document.querySelectorAll('[id]').forEach(function (el) {
    var r = el.getBoundingClientRect();
    el.setAttribute('data-box', [r.left, r.top, r.right, r.bottom].map(Math.round).join(','));
  });
});
"""

_e = html.escape


def render(report: Report, records: Records, out_path: str | Path) -> Path:
    """Write the compare report's page (``records``: the plots that draw single requests read them)."""
    import matplotlib

    matplotlib.use("Agg")
    out = Path(out_path)
    out.write_text(page(build(report, records)), encoding="utf-8")
    return out


def page(blocks: Iterable[Block]) -> str:
    head = (
        "<!doctype html><html><head><meta charset='utf-8'><title>pathprobe compare</title>"
        f"<style>{_CSS}</style><script>{_JS}</script></head><body>"
    )
    return "\n".join([head, *(text for b in blocks if (text := block(b))), "</body></html>"])


def block(b: Block) -> str:
    """One block as HTML ('' for a figure with nothing to draw)."""
    if isinstance(b, Title):
        return f"<h1>{_e(b.text)}</h1>"
    if isinstance(b, Heading):
        return f"<h{b.level}>{_e(b.text)}</h{b.level}>"
    if isinstance(b, Paragraph):
        return f"<p class='meta'>{_e(b.text)}</p>" if b.muted else f"<p>{_e(b.text)}</p>"
    if isinstance(b, Notes):
        return notes(b)
    if isinstance(b, Table):
        return table(b)
    if isinstance(b, Code):
        return f"<pre>{_e(b.text)}</pre>"
    return figure(b)


def figure(f: Figure) -> str:
    png = f.draw()
    if png is None:
        return ""
    anchor = f" id='{_e(f.anchor)}'" if f.anchor else ""
    return (
        f"<h2>{_e(f.title)}</h2><p>{_e(f.caption)}</p>"
        f"<img class='plot'{anchor} alt='{_e(f.title)}' src='data:image/png;base64,{png}'>"
    )


def note_text(n: Note) -> str:
    text = f"<a href='{_e(n.href)}'>{_e(n.text)}</a>" if n.href else _e(n.text)
    if n.flag:
        return f"<b>flagged: {_e(n.flag)}</b> · {text}"
    if n.label and n.subject:
        return f"<b>{_e(n.label)}</b> {_e(n.subject)}: {text}"
    if n.label:
        return f"<b>{_e(n.label)}:</b> {text}"
    return f"<b>{_e(n.subject)}</b>: {text}" if n.subject else text


def notes(b: Notes) -> str:
    """Notes of a kind stand out as boxes; plain ones are a list."""
    out = [f"<p>{_e(b.intro)}:</p>"] if b.intro else []
    plain = [f"<li>{note_text(n)}</li>" for n in b.items if n.kind == "plain"]
    for n in b.items:
        if n.kind != "plain":
            css = f"{n.kind} flagged" if n.flag else n.kind
            out.append(f"<div class='{css}'>{note_text(n)}</div>")
    if plain:
        out.append("<ul>" + "".join(plain) + "</ul>")
    return "\n".join(out)


def _cell(tag: str, text: str, i: int, t: Table) -> str:
    cls = " class='text'" if i in t.left else ""
    return f"<{tag}{cls}>{_e(text)}</{tag}>"


def _row(row: Row, t: Table) -> str:
    attrs = f" class='{_e(row.status)}'" if row.status else ""
    if row.key:
        attrs += f" data-config='{_e(row.key, quote=True)}'"
    if row.hint:
        attrs += f" title='{_e(row.hint, quote=True)}'"
    if row.span:
        first, rest = row.cells[0], " ".join(row.cells[1:])
        span = f"<td colspan='{len(t.columns) - 1}' class='text'>{_e(rest)}</td>"
        return f"<tr{attrs}>{_cell('td', first, 0, t)}{span}</tr>"
    return f"<tr{attrs}>" + "".join(_cell("td", c, i, t) for i, c in enumerate(row.cells)) + "</tr>"


def table(t: Table) -> str:
    attrs = f" class='{_e(t.kind)}'" if t.kind else ""
    if t.anchor:
        attrs += f" id='{_e(t.anchor)}'"
    if t.concurrency is not None:
        attrs += f" data-concurrency='{t.concurrency}'"
    head = "<tr>" + "".join(_cell("th", c, i, t) for i, c in enumerate(t.columns)) + "</tr>"
    caption = f"<p>{_e(t.caption)}:</p>" if t.caption else ""
    return f"{caption}<table{attrs}>" + head + "".join(_row(r, t) for r in t.rows) + "</table>"
