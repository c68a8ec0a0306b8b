"""The Markdown writer: blocks (:mod:`pathprobe.analysis.report.blocks`) as Markdown. The compare
report (printed on stdout and written to report.md) is :func:`markdown`; ``pathprobe analyze``'s
segment table is :func:`render` of one table. Figures are left out (they are in report.html)."""

from __future__ import annotations

from collections.abc import Iterable

from pathprobe.analysis.report.blocks import Block, Code, Figure, Heading, Note, Notes, Paragraph, Table, Title
from pathprobe.analysis.report.model import Report
from pathprobe.analysis.report.sections import build


def markdown(report: Report) -> str:
    """The compare report: every section, in page order."""
    return render(build(report))


def render(blocks: Iterable[Block]) -> str:
    return "\n\n".join(text for b in blocks if (text := block(b)))


def block(b: Block) -> str:
    """One block as Markdown ('' for a figure)."""
    if isinstance(b, Title):
        return f"## {b.text}"
    if isinstance(b, Heading):
        return f"{'#' * (b.level + 1)} {b.text}"
    if isinstance(b, Paragraph):
        return b.text
    if isinstance(b, Notes):
        items = [note(n) for n in b.items]
        return "\n".join([f"{b.intro}:", *items] if b.intro else items)
    if isinstance(b, Table):
        return table(b)
    if isinstance(b, Code):
        return f"```json\n{b.text}\n```"
    assert isinstance(b, Figure)
    return ""


def note(n: Note) -> str:
    """``- **label** (flagged: why) subject: text``, each part only where it is given."""
    head = f"**{n.label}**" if n.label else ""
    if n.flag:
        head += f" (flagged: {n.flag})"
    if n.subject:
        head = f"{head} {n.subject}".strip()
    text = f"[{n.text}]({n.href})" if n.href else n.text
    return f"- {head}: {text}" if head else f"- {text}"


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def table(t: Table) -> str:
    n = len(t.columns)
    lines = [
        "| " + " | ".join(cell(c) for c in t.columns) + " |",
        "|" + "".join("---|" if i in t.left else "---:|" for i in range(n)),
    ]
    for row in t.rows:
        cells = [cell(c) for c in row.cells]
        pad = " |" * (n - len(cells)) if row.span else ""
        lines.append("| " + " | ".join(cells) + " |" + pad)
    return f"{t.caption}:\n\n" + "\n".join(lines) if t.caption else "\n".join(lines)
