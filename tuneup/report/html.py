"""The report as one self-contained HTML page: inline CSS, plots as data: URIs, no script, no network.

Escaping is the default, not a step to remember: markup is built only with `el` and `void`, which
escape every child and attribute value that is not already `Html` (markup made by those two helpers).
A Content-Security-Policy in the page itself backs this up: even injected markup could neither run
script nor fetch anything.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from pathlib import Path

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


class Html(str):
    """Markup made here, safe to place as is. Any other str is text and gets escaped."""

    __slots__ = ()


def _e(value: object) -> Html:
    return value if isinstance(value, Html) else Html(html.escape(str(value), quote=True))


# Prose marks code as Markdown does, with backticks ("run `tuneup compare`"): one pair on one line.
_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def _prose(value: object) -> Html:
    """Text that may hold `code` spans: each span becomes <code>, everything escaped. Code blocks keep
    their backticks (they are code); prose in every other block goes through here. The backticks stay in
    the page's text, hidden by the style: a string from the record (a catalog cell, a path) is still there
    verbatim, and only its look changes."""
    if isinstance(value, Html):
        return value
    parts = _CODE_SPAN.split(str(value))
    tick = el("span", "`", class_="tick")
    # split() alternates text and the spans' insides: odd places are code.
    return Html("".join(el("code", tick, part, tick) if i % 2 else _e(part) for i, part in enumerate(parts)))


def _attrs(attrs: dict[str, object]) -> str:
    # Python names cannot be "class": callers write class_; a None value leaves the attribute out.
    return "".join(
        f' {name.rstrip("_").replace("_", "-")}="{html.escape(str(value), quote=True)}"'
        for name, value in attrs.items()
        if value is not None
    )


def el(tag: str, *children: object, **attrs: object) -> Html:
    return Html(f"<{tag}{_attrs(attrs)}>{''.join(_e(c) for c in children)}</{tag}>")


def void(tag: str, **attrs: object) -> Html:
    return Html(f"<{tag}{_attrs(attrs)}>")


def join(parts: Sequence[object], sep: str = "\n") -> Html:
    return Html(sep.join(_e(p) for p in parts))


# Only image formats a browser shows in <img> without running anything; SVG could carry script.
_IMAGE_TYPES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def figure_html(plot: PlotFile) -> Html:
    try:
        data = Path(plot.path).read_bytes()
    except OSError as exc:
        return el("p", f"Plot “{plot.title}” could not be read ({type(exc).__name__}).", class_="note")
    mime = next((m for magic, m in _IMAGE_TYPES if data.startswith(magic)), None)
    if mime is None:
        return el("p", f"Plot “{plot.title}” is not a PNG, JPEG or GIF image and is left out.", class_="note")
    uri = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
    return el(
        "figure",
        void("img", src=uri, alt=plot.caption),
        # The plot draws its own title: the caption says how to read it.
        el("figcaption", _prose(plot.caption)),
    )


# A figure choice shows one pane at a time with radio buttons and CSS alone (the page runs no script): the
# n-th checked button shows the n-th pane, for up to this many panes.
MAX_CHOICES = 6


def _figure_choice(block: FigureChoice) -> Html:
    # One radio group per choice, named after its first figure's file (unique in a report).
    group = "switch-" + re.sub(r"[^A-Za-z0-9_-]+", "-", block.options[0][1].name if block.options else "none")
    buttons: list[Html] = []
    for i, (label, _plot) in enumerate(block.options[:MAX_CHOICES]):
        key = f"{group}-{i}"
        attrs: dict[str, object] = {"type": "radio", "name": group, "id": key}
        if i == 0:
            attrs["checked"] = "checked"
        buttons.append(void("input", **attrs))
        buttons.append(el("label", label, for_=key))
    panes = [el("div", figure_html(plot), class_="pane") for _label, plot in block.options[:MAX_CHOICES]]
    return el(
        "div",
        el("p", el("strong", block.title), " · x-axis:", class_="switch-title"),
        join(buttons, ""),
        el("div", join(panes), class_="panes"),
        class_="switch",
    )


_SEVERITY_CLASS = {"warning": "warning", "info": "info"}


def _findings(block: FindingList) -> Html:
    if not block.items:
        return el("p", _prose(block.empty), class_="note")
    items = [
        el(
            "li",
            el("span", f.severity, class_=f"badge {_SEVERITY_CLASS.get(f.severity, 'other')}"),
            " ",
            el("strong", _prose(f.title)),
            el("p", _prose(f.evidence)),
            class_=f"finding {_SEVERITY_CLASS.get(f.severity, 'other')}",
        )
        for f in block.items
    ]
    return el("ul", join(items), class_="findings")


def _caption(title: str) -> Html:
    return el("h3", title) if title else Html("")


def _titled(title: str, body: Html, detail: bool) -> Html:
    if detail:
        # Long reference tables (configuration, environment) stay one click away; find-in-page still
        # searches them.
        return el("details", el("summary", title or "Details"), body)
    return Html(_caption(title) + body)


# A text cell longer than this wraps (at word boundaries, in a column at least LONG_CELL_EM wide); shorter
# cells and figures stay on one line, so a table of short values reads across.
LONG_CELL_CHARS = 40


def _table(block: Table) -> Html:
    def cell(tag: str, i: int, value: str) -> Html:
        kind = "num" if i in block.numeric else "long" if len(value) > LONG_CELL_CHARS else None
        return el(tag, _prose(value), class_=kind)

    head = el("tr", *(cell("th", i, h) for i, h in enumerate(block.header)))
    last = len(block.rows) - 1
    body = [
        el(
            "tr",
            *(cell("td", i, v) for i, v in enumerate(row)),
            class_="total" if block.total and n == last else None,
        )
        for n, row in enumerate(block.rows)
    ]
    table = el("table", el("thead", head), el("tbody", join(body)))
    return _titled(block.title, el("div", table, class_="scroll"), block.detail)


def _key_values(block: KeyValues) -> Html:
    rows = [el("tr", el("th", _prose(k), scope="row"), el("td", _prose(v))) for k, v in block.pairs]
    return _titled(block.title, el("table", el("tbody", join(rows)), class_="kv"), block.detail)


def _metrics(block: Metrics) -> Html:
    cards = [
        el(
            "div",
            el("div", _prose(m.label), class_="label"),
            el("div", _prose(m.value), class_="value"),
            el("div", _prose(m.detail), class_="detail"),
            class_="metric",
        )
        for m in block.items
    ]
    return el("div", join(cards), class_="metrics")


def block_html(block: Block) -> Html:
    if isinstance(block, Paragraph):
        return el("p", _prose(block.text), class_="note" if block.quiet else None)
    if isinstance(block, Metrics):
        return _metrics(block)
    if isinstance(block, FindingList):
        return _findings(block)
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, KeyValues):
        return _key_values(block)
    if isinstance(block, Bullets):
        return el("ul", join([el("li", _prose(item)) for item in block.items]), class_="plain")
    if isinstance(block, Figure):
        return figure_html(block.plot)
    if isinstance(block, FigureChoice):
        return _figure_choice(block)
    if isinstance(block, Code):
        return el("div", el("p", el("strong", block.title)), el("pre", el("code", block.text)), class_="code")
    raise TypeError(f"no HTML for block {type(block).__name__}")


def _section(section: Section) -> Html:
    return el(
        "section", el("h2", section.title), join([block_html(b) for b in section.blocks]), id=section.id
    )


# System fonts only: a web font would be a network fetch.
PAGE_CSS = """
:root { color-scheme: light; --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --soft: #f6f8fa;
  --accent: #0b5cad; --warn: #9a6700; --warn-bg: #fff8c5; --info: #0b5cad; --info-bg: #ddf4ff; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #fff; line-height: 1.5;
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 32px 64px; }
header h1 { margin: 0 0 4px; font-size: 26px; }
header p { margin: 0; color: var(--muted); }
nav.toc { margin: 20px 0 8px; padding: 12px 16px; background: var(--soft); border: 1px solid var(--line);
  border-radius: 8px; }
nav.toc ol { margin: 0; padding: 0; list-style: none; display: flex; flex-wrap: wrap; gap: 4px 18px; }
nav.toc a { color: var(--accent); text-decoration: none; }
nav.toc a:hover { text-decoration: underline; }
section { margin-top: 36px; }
h2 { font-size: 20px; border-bottom: 1px solid var(--line); padding-bottom: 6px; margin: 0 0 12px; }
h3 { font-size: 15px; margin: 20px 0 6px; }
p { margin: 8px 0; }
p.note { color: var(--muted); font-style: italic; }
.scroll { overflow-x: auto; }
.scroll td { white-space: nowrap; }
.scroll td.long { white-space: normal; min-width: 24em; overflow-wrap: break-word; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 14px; }
th, td { padding: 5px 10px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
thead th { background: var(--soft); font-weight: 600; border-bottom: 2px solid var(--line); white-space: nowrap; }
tbody tr:nth-child(even) > * { background: #fbfcfd; }
tr.total td { font-weight: 600; border-top: 2px solid var(--line); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.kv th { font-weight: 600; color: var(--muted); white-space: nowrap; }
table.kv td { overflow-wrap: break-word; min-width: 16em; }
code { font: 13px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: var(--soft);
  border-radius: 4px; padding: 0 3px; }
pre code { background: none; padding: 0; }
code .tick { display: none; }
p code, li code, td code { white-space: nowrap; }
details { margin: 14px 0; }
summary { cursor: pointer; font-weight: 600; }
details[open] > summary { margin-bottom: 6px; }
.metrics { display: grid; grid-template-columns: repeat(auto-fit, minmax(200px, 1fr)); gap: 12px; margin: 8px 0 14px; }
.metric { border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px; }
.metric .label { color: var(--muted); font-size: 13px; }
.metric .value { font-size: 26px; font-weight: 600; font-variant-numeric: tabular-nums; }
.metric .detail { color: var(--muted); font-size: 12px; }
ul.findings { list-style: none; padding: 0; margin: 10px 0; }
li.finding { border: 1px solid var(--line); border-left-width: 4px; border-radius: 6px; padding: 8px 12px;
  margin: 8px 0; }
li.finding.warning { border-left-color: var(--warn); }
li.finding.info { border-left-color: var(--info); }
li.finding p { margin: 4px 0 0; }
.badge { display: inline-block; font-size: 12px; font-weight: 600; border-radius: 10px; padding: 0 8px;
  margin-right: 4px; text-transform: uppercase; letter-spacing: 0.03em; background: var(--soft); color: var(--muted); }
.badge.warning { background: var(--warn-bg); color: var(--warn); }
.badge.info { background: var(--info-bg); color: var(--info); }
pre { background: var(--soft); border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px;
  overflow-x: auto; font-size: 13px; margin: 4px 0 12px; }
div.code p { margin: 8px 0 2px; }
figure { margin: 16px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; }
figcaption { color: var(--muted); font-size: 14px; margin-top: 4px; }
.switch { margin: 16px 0; }
.switch > p.switch-title { display: inline-block; margin: 0 8px 6px 0; }
.switch > input { position: absolute; opacity: 0; width: 1px; height: 1px; }
.switch > label { display: inline-block; padding: 1px 12px; margin: 0 4px 6px 0; border: 1px solid var(--line);
  border-radius: 14px; cursor: pointer; font-size: 13px; color: var(--accent); }
.switch > input:checked + label { background: var(--accent); border-color: var(--accent); color: #fff; }
.switch > input:focus-visible + label { outline: 2px solid var(--accent); outline-offset: 1px; }
.switch .pane { display: none; }
.switch .pane figure { margin-top: 4px; }
.switch > input:nth-of-type(1):checked ~ .panes > .pane:nth-child(1),
.switch > input:nth-of-type(2):checked ~ .panes > .pane:nth-child(2),
.switch > input:nth-of-type(3):checked ~ .panes > .pane:nth-child(3),
.switch > input:nth-of-type(4):checked ~ .panes > .pane:nth-child(4),
.switch > input:nth-of-type(5):checked ~ .panes > .pane:nth-child(5),
.switch > input:nth-of-type(6):checked ~ .panes > .pane:nth-child(6) { display: block; }
footer { margin-top: 48px; color: var(--muted); font-size: 13px; }
@media print { nav.toc { display: none; } section { break-inside: avoid-page; } .switch .pane { display: block; } }
"""

# Defence in depth: no script, no fetch, images only from data: URIs, styles only from this page.
PAGE_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def render_html(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> str:
    """The whole report as one HTML5 document that opens offline."""
    return render_sections_html(
        page_title(analysis),
        page_subtitle(analysis),
        report_sections(analysis, plots),
        generated_line(analysis),
    )


def page_head(title: str, extra_css: str = "") -> Html:
    """Every page's head: the policy that forbids script and fetches, the report's styles (and a page's
    own after them), the title."""
    return el(
        "head",
        void("meta", charset="utf-8"),
        void("meta", http_equiv="Content-Security-Policy", content=PAGE_CSP),
        void("meta", name="viewport", content="width=device-width, initial-scale=1"),
        void("meta", name="color-scheme", content="light"),
        el("title", title),
        el("style", Html(PAGE_CSS + extra_css)),
    )


def render_sections_html(title: str, subtitle: str, sections: Sequence[Section], footer: str = "") -> str:
    """Any sections as one offline HTML5 page with the report's shell: styles, the policy that forbids
    script and fetches, a table of contents, and every string escaped (`tuneup tune`'s report uses it).
    Figures are the sections' own Figure blocks, embedded as data: URIs."""
    toc = el(
        "nav",
        el("ol", join([el("li", el("a", s.title, href=f"#{s.id}")) for s in sections])),
        class_="toc",
        aria_label="Sections",
    )
    head = page_head(title)
    body = el(
        "body",
        el(
            "main",
            el("header", el("h1", title), el("p", subtitle)),
            toc,
            join([_section(s) for s in sections]),
            el("footer", el("p", footer)) if footer else "",
        ),
    )
    return "<!DOCTYPE html>\n" + el("html", head, body, lang="en") + "\n"
