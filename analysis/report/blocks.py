"""The neutral blocks a report page is made of: what the section builders
(:mod:`pathprobe.analysis.report.sections`) yield and the writers
(:mod:`~pathprobe.analysis.report.markdown`, :mod:`~pathprobe.analysis.report.html`) render.

A block says what to show, never how: no Markdown, no HTML in its text. A writer shows every
kind of block; one that cannot show a kind well (an inline image in Markdown) leaves it out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, slots=True)
class Title:
    """The page's title (once, first)."""

    text: str


@dataclass(frozen=True, slots=True)
class Heading:
    """A section's heading: level 2 a section, level 3 one inside it."""

    text: str
    level: Literal[2, 3] = 2


@dataclass(frozen=True, slots=True)
class Paragraph:
    """A line of prose; ``muted`` for the run's particulars (time, host, placement)."""

    text: str
    muted: bool = False


#: how a note stands out: the load generator's saturation (or contention), another warning, a
#: verdict, a gateway's self-report, or plain
NoteKind = Literal["client-warning", "client-note", "warning", "verdict", "self-report", "plain"]


@dataclass(frozen=True, slots=True)
class Note:
    """One item of a :class:`Notes` block: a label (``WARNING``, ``verdict``), what it is about
    (``subject``: a configuration) and its text; ``flag`` marks a verdict that should not be trusted
    as it stands; ``href`` links the text."""

    text: str
    label: str = ""
    kind: NoteKind = "plain"
    subject: str = ""
    flag: str | None = None
    href: str | None = None


@dataclass(frozen=True, slots=True)
class Notes:
    """A list of notes, with an optional line that introduces them."""

    items: tuple[Note, ...]
    intro: str = ""


@dataclass(frozen=True, slots=True)
class Row:
    """A table row: one text per column, or ``span``: the first cell, then one text over the rest."""

    cells: tuple[str, ...]
    span: bool = False
    status: str = ""  # the configuration's status (ok, failed, skipped): a writer may colour the row
    key: str = ""  # the configuration the row is about (HTML: data-config)
    hint: str = ""  # why (HTML: the row's tooltip)


@dataclass(frozen=True, slots=True)
class Table:
    """Columns and rows of text; ``left``: the columns read as text (left-aligned), the rest are numbers."""

    columns: tuple[str, ...]
    rows: tuple[Row, ...]
    caption: str = ""
    left: frozenset[int] = frozenset({0})
    kind: str = ""  # what the table is (HTML: its class, e.g. path-tax)
    concurrency: int | None = None
    anchor: str = ""  # the one table of its kind on a page (HTML: its id)


@dataclass(frozen=True, slots=True)
class Figure:
    """A plot: ``draw`` returns its PNG (base64) or None when there is nothing to draw; it is called
    only by a writer that shows figures, so a text report never pays for matplotlib."""

    title: str
    caption: str
    draw: Callable[[], str | None] = field(compare=False)
    anchor: str = ""  # the one figure of its kind on a page (HTML: the image's id)


@dataclass(frozen=True, slots=True)
class Code:
    """Preformatted text (the method, as JSON)."""

    text: str


Block = Title | Heading | Paragraph | Notes | Table | Figure | Code
