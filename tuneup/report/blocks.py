"""The report's format-neutral blocks: paragraphs, headline metrics, findings, tables, key/value lists,
bullets and figures, grouped in sections.

Section modules (tuneup/report/sections/) build blocks from the typed analysis; the serializers (HTML,
Markdown, the terminal) only turn blocks into text, so the formats cannot drift apart in what they say,
and each escapes in one place. Strings inside blocks are plain text, never markup.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuneup.report.artifacts import PlotFile
from tuneup.report.format import MISSING, ranks_text, text


@dataclass(frozen=True, slots=True)
class Paragraph:
    text: str
    quiet: bool = False  # says why something is absent; styled as a note


@dataclass(frozen=True, slots=True)
class Metric:
    label: str
    value: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Metrics:
    """Headline figures, shown large."""

    items: tuple[Metric, ...]


@dataclass(frozen=True, slots=True)
class FindingItem:
    severity: str  # "warning", "info", or whatever a later version writes: renderers whitelist styles
    title: str
    evidence: str


@dataclass(frozen=True, slots=True)
class FindingList:
    items: tuple[FindingItem, ...]
    empty: str = "No findings: nothing in this run crossed a threshold."


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: frozenset[int] = frozenset()  # columns right-aligned
    detail: bool = False  # long reference tables: folded away until asked for
    total: bool = False  # the last row sums up the others


@dataclass(frozen=True, slots=True)
class KeyValues:
    title: str
    pairs: tuple[tuple[str, str], ...]
    detail: bool = False


@dataclass(frozen=True, slots=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Figure:
    plot: PlotFile


@dataclass(frozen=True, slots=True)
class FigureChoice:
    """The same figure drawn against several x-axes, one shown at a time where the format can switch
    (HTML: a row of buttons, no script); formats that cannot show each one in turn, under its label."""

    title: str
    options: tuple[tuple[str, PlotFile], ...]  # (label, figure), the first shown first


@dataclass(frozen=True, slots=True)
class Code:
    """Code to copy as it stands (a recommendation's Lightning code or YAML), under a short title."""

    title: str
    text: str
    language: str = "python"


Block = Paragraph | Metrics | FindingList | Table | KeyValues | Bullets | Figure | FigureChoice | Code


@dataclass(frozen=True, slots=True)
class Section:
    id: str
    title: str
    blocks: tuple[Block, ...] = field(default_factory=tuple)


# A table with a row per rank, GPU or host folds away beyond this many rows: on a large job it would
# bury the rest of the page, and overrun the size limit of a pull-request comment.
FOLD_ROWS = 16


def table(
    title: str, header: Sequence[str], rows: Iterable[Sequence[str]], numeric: Iterable[int] = (), **kw: Any
) -> Table:
    body = tuple(tuple(r) for r in rows)
    if len(body) > FOLD_ROWS:
        kw["detail"] = True
    return Table(title, tuple(header), body, frozenset(numeric), **kw)


def by_value(mapping: dict[Any, Any]) -> str:
    """Per-rank values, one entry per distinct value: {"0": "a", "1": "b", "2": "b"} -> "a (rank 0); b (ranks 1, 2)"."""
    groups: dict[str, list[Any]] = {}
    for key, value in mapping.items():
        groups.setdefault(text(value), []).append(key)
    if len(groups) == 1 and len(mapping) > 1:
        every = "both ranks" if len(mapping) == 2 else f"all {len(mapping):,} ranks"
        return f"{next(iter(groups))} ({every})"
    return "; ".join(f"{value} ({ranks_text(keys)})" for value, keys in groups.items()) or MISSING


def figures(section_id: str, plots: Sequence[PlotFile]) -> list[Block]:
    return [Figure(p) for p in plots if p.section == section_id]
