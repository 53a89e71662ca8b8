"""The report as GitHub-flavoured Markdown, for a CI job summary or a pull-request comment.

Same sections, same order and same figures as the HTML page (both draw from `sections.report_sections`),
made compact: findings lead the summary, long reference tables fold into <details>, plots are image
links to the PNG files written beside the .md.

Every run-derived string goes through `_md`, which keeps it inside its table cell or list item and
makes any markup in it inert: a host name cannot break a table, start a link, or inject HTML. Only a
`code` span stays one (as the HTML page shows it as code), and only when nothing inside it could act.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import quote

from tuneup.analyze.model import RunAnalysis
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import (
    Block,
    Bullets,
    Code,
    Figure,
    FigureChoice,
    FindingList,
    KeyValues,
    Metrics,
    Paragraph,
    Section,
    Table,
)
from tuneup.report.sections import generated_line, page_subtitle, page_title, report_sections

_NEWLINES = re.compile(r"[\r\n\u2028\u2029]+")
# Characters that start Markdown constructs anywhere in a line: code, emphasis, links, strikethrough,
# the table-cell separator, and "$", which GitHub reads as the start of inline maths.
_ACTIVE = re.compile(r"([\\`*\[\]|~$])")
# "_" only emphasises at a word's edge (GFM); escaping it inside OMP_NUM_THREADS would only add noise.
_EDGE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


# Prose marks code as Markdown does, with backticks ("run `tuneup compare`"): one pair on one line, as the
# HTML renderer reads it. A span is kept as code only when its inside needs no escaping to stay inert:
# GitHub decodes no entity inside a code span (an escaped "<" would show as "&lt;"), and "$" or "|" there
# would still be read as maths or a table's cell separator.
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_NOT_IN_CODE = re.compile(r"[<>&$|\\]")


def _escaped(text: str) -> str:
    # Entities, not backslashes, for HTML's characters: "\<script" would still contain "<script".
    out = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    out = _ACTIVE.sub(r"\\\1", out)
    return _EDGE_UNDERSCORE.sub(r"\\_", out)


def markdown_text(value: object) -> str:
    """Plain text made safe for a table cell or list item: one line, no markup, no HTML, except `code` spans,
    which stay code spans (with nothing inside them that could act)."""
    parts = _CODE_SPAN.split(_NEWLINES.sub(" ", str(value)))
    # split() alternates text and the spans' insides: odd places are code.
    return "".join(
        f"`{part}`" if i % 2 and not _NOT_IN_CODE.search(part) else _escaped(f"`{part}`" if i % 2 else part)
        for i, part in enumerate(parts)
    )


_md = markdown_text  # the short name this module's renderers use


def _table(
    header: Sequence[str], rows: Sequence[Sequence[str]], numeric: frozenset[int] = frozenset()
) -> str:
    align = ["---:" if i in numeric else "---" for i in range(len(header))]
    lines = [
        "| " + " | ".join(_md(h) for h in header) + " |",
        "| " + " | ".join(align) + " |",
        *("| " + " | ".join(_md(v) for v in row) + " |" for row in rows),
    ]
    return "\n".join(lines)


def _titled(title: str, body: str, detail: bool) -> str:
    if detail:
        # GitHub renders Markdown inside <details> only with blank lines around it.
        return f"<details><summary>{_md(title or 'Details')}</summary>\n\n{body}\n\n</details>"
    return f"**{_md(title)}**\n\n{body}" if title else body


_SEVERITY_MARK = {"warning": "⚠️", "info": "ℹ️"}


def _findings(block: FindingList) -> str:
    if not block.items:
        return f"_{_md(block.empty)}_"
    lines = []
    for f in block.items:
        # An unknown severity (from a later version) is spelled out rather than guessed at.
        mark = _SEVERITY_MARK.get(f.severity) or f"• ({_md(f.severity)})"
        lines.append(f"- {mark} **{_md(f.title)}**: {_md(f.evidence)}")
    return "\n".join(lines)


def _figure(plot: PlotFile, image_prefix: str) -> str:
    # Percent-encoding keeps spaces and parentheses in a file name from ending the link early.
    url = quote(image_prefix + plot.name, safe="/:?#&=%+@~.-_")
    return f"![{_md(plot.caption)}]({url})"


def _block(block: Block, image_prefix: str) -> str:
    if isinstance(block, Paragraph):
        return f"_{_md(block.text)}_" if block.quiet else _md(block.text)
    if isinstance(block, Metrics):
        return _table(
            [m.label for m in block.items],
            [[m.value for m in block.items]],
            frozenset(range(len(block.items))),
        )
    if isinstance(block, FindingList):
        return _findings(block)
    if isinstance(block, Table):
        return _titled(block.title, _table(block.header, block.rows, block.numeric), block.detail)
    if isinstance(block, KeyValues):
        body = "\n".join(f"- **{_md(k)}**: {_md(v)}" for k, v in block.pairs)
        return _titled(block.title, body, block.detail)
    if isinstance(block, Bullets):
        return "\n".join(f"- {_md(item)}" for item in block.items)
    if isinstance(block, Figure):
        return _figure(block.plot, image_prefix)
    if isinstance(block, FigureChoice):
        # Markdown cannot switch: each figure under its label, one after the other.
        return "\n\n".join(
            [f"**{_md(block.title)}**"]
            + [f"_{_md(label)}_\n\n{_figure(plot, image_prefix)}" for label, plot in block.options]
        )
    if isinstance(block, Code):
        # A fence longer than any run of backticks inside keeps the code from closing it.
        fence = "`" * max(3, max((len(r) for r in re.findall(r"`+", block.text)), default=0) + 1)
        return f"**{_md(block.title)}**\n\n{fence}{block.language}\n{block.text}\n{fence}"
    raise TypeError(f"no Markdown for block {type(block).__name__}")


def _section(section: Section, image_prefix: str) -> str:
    blocks = list(section.blocks)
    if section.id == "summary":
        # A PR comment is read top-down and often only the top: what went wrong comes before the figures.
        blocks.sort(key=lambda b: not isinstance(b, FindingList))
    parts = [f"## {_md(section.title)}", *(_block(b, image_prefix) for b in blocks)]
    return "\n\n".join(parts)


def render_section(section: Section, image_prefix: str = "") -> str:
    """One section on its own (`tuneup advise --format md`)."""
    return _section(section, image_prefix)


def render_markdown(analysis: RunAnalysis, plots: Sequence[PlotFile], image_prefix: str = "") -> str:
    """The report as Markdown; plot images are linked as `image_prefix + plot.name`."""
    return render_sections_markdown(
        page_title(analysis),
        page_subtitle(analysis),
        report_sections(analysis, plots),
        generated_line(analysis),
        image_prefix,
    )


def render_sections_markdown(
    title: str, subtitle: str, sections: Sequence[Section], footer: str = "", image_prefix: str = ""
) -> str:
    """Any sections as one Markdown document, as the report writes them (`tuneup tune`'s report uses it);
    figures link to `image_prefix + plot.name`."""
    parts = [
        f"# {_md(title)}",
        _md(subtitle),
        *(_section(s, image_prefix) for s in sections),
    ]
    if footer:
        parts.append(f"_{_md(footer)}_")
    return "\n\n".join(parts) + "\n"
