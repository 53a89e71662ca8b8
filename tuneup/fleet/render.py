"""The fleet view written out: one static HTML page, Markdown, JSON, and a terminal summary.

The page runs no script, as the run report's pages: its filters (tag value, period) are radio buttons and CSS
`:checked` rules over what the view pre-aggregated. Each figure of a filter choice is a `Slice` rendered once,
hidden unless both its tag value and its period are the checked ones; the regressions and the spend-by-period
rows carry their tag value and period as classes and are hidden row by row. No script means no policy
exception: the report's Content-Security-Policy (no script, no fetch, images from data: URIs) holds as is.
The two spend charts are drawn for the whole selection and are not filtered; the page says so.

Markup comes from the report's own escaping helpers (tuneup.report.html): every string from a run (tags,
run keys, recommendations) is escaped on its way in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from tuneup.analyze.model import to_json
from tuneup.fleet.dashboard import (
    MAX_PAIRS,
    NO_GROUP,
    OTHER_GROUP,
    TOP_ROWS_ALL,
    TOP_ROWS_SLICE,
    TOP_RUNS_ALL,
    TOP_RUNS_SLICE,
    FleetView,
    RegressionPair,
    Slice,
    SpendCell,
)
from tuneup.report import format as fmt
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import FOLD_ROWS, Block, Figure, Metric, Metrics, Paragraph, Section, Table
from tuneup.report.html import Html, block_html, el, figure_html, join, page_head, void
from tuneup.report.sections.badput import label as category_label

FORMATS = ("html", "md", "json", "text")
HTML_NAME, MD_NAME, JSON_NAME = "fleet.html", "fleet.md", "fleet.json"
GROUP_CHART, INSTANCE_CHART = "fleet_spend_by_group.png", "fleet_spend_by_instance.png"
# Bars per chart stacked by at most this many keys; the rest are one "other" segment.
CHART_KEYS = 8
TEXT_RUNS = 5  # the terminal's most expensive runs
TEXT_PAIRS = 5  # and its regressions


# A summed ledger past this many hours reads in hours ("10,152 h"); below, as the report writes a duration.
HOURS_FROM_S = 100 * 3600


def _time_format(total_s: float) -> Callable[[float], str]:
    """One unit for a whole ledger: a fleet's spans thousands of hours, a few runs' minutes."""
    if total_s >= HOURS_FROM_S:
        return lambda seconds: fmt.with_unit(seconds / 3600, "h")
    return fmt.duration


def _title(view: FleetView) -> str:
    return "Fleet: where the training money went"


def _subtitle(view: FleetView) -> str:
    whole = view.whole.totals if view.slices else None
    runs = whole.runs if whole else 0
    span = (
        f", started {fmt.unix_time(view.first_start_unix)[:10]} to {fmt.unix_time(view.last_start_unix)[:10]}"
        if view.first_start_unix is not None
        else ""
    )
    chosen = [f"{k}={v}" for k, v in view.filters.tags.items()]
    if view.filters.since:
        chosen.append(f"since {view.filters.since}")
    if view.filters.until:
        chosen.append(f"until {view.filters.until}")
    narrowed = f"; filtered to {', '.join(chosen)}" if chosen else ""
    return f"{fmt.plural(runs, 'run')} of {fmt.count(view.runs_in_index)} in {view.index}{span}{narrowed}"


def _nothing(view: FleetView) -> str:
    """Why there is no figure at all: an empty index, only unreadable runs, or filters that match none."""
    if view.runs_in_index == 0:
        return "The index holds no runs yet: tuneup index RUN_DIR... adds them."
    unreadable = (
        f" {fmt.plural(view.unreadable_runs, 'run')} matched but could not be read "
        f"({', '.join(view.unreadable_examples)})."
        if view.unreadable_runs
        else ""
    )
    return f"No readable run matches the filters.{unreadable}"


def _footer(view: FleetView) -> str:
    return f"Generated {fmt.unix_time(view.generated_unix)} by tuneup fleet from {view.index}."


# -- the blocks of one slice (shared by the page and the Markdown) -------------------------------------


def _headline(s: Slice) -> Metrics:
    t = s.totals
    priced = "" if t.priced_runs == t.runs else f"{t.priced_runs:,} of {t.runs:,} runs priced"
    return Metrics(
        (
            Metric("Spend", fmt.usd(t.usd), priced or f"{fmt.plural(t.runs, 'run')}"),
            Metric("Device hours", fmt.number(t.device_hours), ""),
            Metric("Useful share", fmt.share(t.useful_share), "of the runs' wall time: productive compute"),
            Metric("Badput", fmt.usd(t.badput_usd), f"{fmt.share(t.badput_usd_share)} of the priced spend"),
            Metric(
                "$ per 1M samples",
                fmt.usd(t.usd_per_million_samples),
                f"$ per 1M tokens {fmt.usd(t.usd_per_million_tokens)}",
            ),
        )
    )


def _ledger_table(s: Slice) -> Table:
    total_s = sum(line.seconds for line in s.ledger)
    time_text = _time_format(total_s)
    rows = [
        (
            category_label(line.category),
            time_text(line.seconds),
            fmt.share(line.share),
            fmt.usd(line.usd),
            fmt.share(line.usd_share),
        )
        for line in s.ledger
    ]
    priced = [line.usd for line in s.ledger if line.usd is not None]
    rows.append(("Total", time_text(total_s), "100.0%", fmt.usd(sum(priced) if priced else None), ""))
    return Table(
        "Badput ledger, summed over the runs",
        ("Category", "Time", "Share of time", "$", "Share of $"),
        tuple(rows),
        numeric=frozenset({1, 2, 3, 4}),
        total=True,
    )


def _instances_table(s: Slice, cap: int) -> Table:
    return Table(
        f"Spend by instance type (top {cap})",
        ("Instance", "Runs", "$", "Device hours", "Useful share"),
        tuple(
            (
                i.instance,
                fmt.count(i.runs),
                fmt.usd(i.usd),
                fmt.number(i.device_hours),
                fmt.share(i.useful_share),
            )
            for i in s.instances
        ),
        numeric=frozenset({1, 2, 3, 4}),
    )


def _configurations_table(s: Slice, cap: int) -> Table:
    return Table(
        f"$ per 1M samples and tokens by configuration (top {cap} by spend)",
        (
            "Instance",
            "World",
            "Precision",
            "Strategy",
            "Global batch",
            "Runs",
            "$",
            "Samples/s (median)",
            "$ / 1M samples",
            "$ / 1M tokens",
            "MFU (median)",
        ),
        tuple(
            (
                c.instance,
                fmt.text(c.world_size),
                fmt.text(c.precision),
                fmt.text(c.strategy),
                fmt.text(c.global_batch_size),
                fmt.count(c.runs),
                fmt.usd(c.usd),
                fmt.large(c.samples_per_s_median),
                fmt.usd(c.usd_per_million_samples),
                fmt.usd(c.usd_per_million_tokens),
                fmt.share(c.mfu_median),
            )
            for c in s.configurations
        ),
        numeric=frozenset({1, 4, 5, 6, 7, 8, 9, 10}),
    )


def _runs_table(s: Slice, cap: int, group_by: str) -> Table:
    # What it cost and what to do about it first; where and when after (a wide table scrolls).
    return Table(
        f"The {cap} most expensive runs",
        (
            "Run",
            group_by,
            "$",
            "Useful share",
            "Badput $",
            "Top recommendation",
            "Gain",
            "Instance",
            "World",
            "Duration",
            "Start (UTC)",
        ),
        tuple(
            (
                r.run_id or r.run_key,
                r.group,
                fmt.usd(r.usd),
                fmt.share(r.useful_share),
                fmt.usd(r.badput_usd),
                fmt.text(r.top_recommendation),
                fmt.share(r.top_gain),
                fmt.text(r.instance),
                fmt.text(r.world_size),
                fmt.duration(r.duration_s),
                fmt.unix_time(r.start_unix)[:16],
            )
            for r in s.expensive_runs
        ),
        numeric=frozenset({2, 3, 4, 6, 8, 9}),
    )


def _caps(s: Slice) -> tuple[int, int]:
    whole = s.group is None and s.period is None
    return (TOP_ROWS_ALL, TOP_RUNS_ALL) if whole else (TOP_ROWS_SLICE, TOP_RUNS_SLICE)


# -- regressions -------------------------------------------------------------------------------------


def _pair_cells(p: RegressionPair) -> tuple[str, ...]:
    interval = (
        f"{fmt.share(p.ratio_low - 1)} to {fmt.share(p.ratio_high - 1)}"
        if p.ratio_low is not None and p.ratio_high is not None
        else fmt.MISSING
    )
    return (
        p.verdict,
        p.group,
        p.baseline_run_id or p.baseline_key,
        p.candidate_run_id or p.candidate_key,
        fmt.share(p.change),
        interval,
        fmt.large(p.baseline_samples_per_s),
        fmt.large(p.candidate_samples_per_s),
        f"{p.baseline_windows} / {p.candidate_windows}",
        fmt.unix_time(p.candidate_start_unix)[:16],
        p.configuration,
        p.reason,
    )


# The verdict and its effect first; the evidence and the pair's setting after.
PAIR_HEADER = (
    "Verdict",
    "Tag value",
    "Before",
    "After",
    "Slower by",
    "Samples/s change (90% interval)",
    "Samples/s before",
    "Samples/s after",
    "Windows",
    "After's start (UTC)",
    "Configuration",
    "Rule's reason",
)
PAIR_NUMERIC = frozenset({4, 6, 7, 8})


def _regression_lines(view: FleetView) -> list[str]:
    r = view.regressions
    counts = ", ".join(f"{fmt.count(n)} {v}" for v, n in r.verdicts.items() if n)
    lines = [
        f"Consecutive runs (by start) of one {view.filters.group_by!r} value and one configuration (instance, "
        f"world size, precision, global batch): {fmt.plural(r.pairs_judged, 'pair')} judged"
        + (f" ({counts})." if counts else "."),
        f"Rule: {r.rule}.",
        r.samples,
    ]
    if r.ungrouped_runs:
        lines.append(
            f"{fmt.plural(r.ungrouped_runs, 'run')} without the {view.filters.group_by!r} tag "
            f"{'is' if r.ungrouped_runs == 1 else 'are'} in no pair (--group-by names another tag)."
        )
    if r.pairs_judged > len(r.pairs):
        lines.append(
            f"The table keeps {MAX_PAIRS} pairs: regressions first, then improvements, each by size."
        )
    return lines


# -- charts ------------------------------------------------------------------------------------------


def _draw_spend(
    cells: Sequence[SpendCell], periods: Sequence[str], by: str, what: str, path: Path
) -> PlotFile | None:
    """Stacked bars of spend per period, one colour per key (the CHART_KEYS biggest; the rest '(other)').
    Where no run has a price, device hours instead: an empty dollar axis would say nothing."""
    import matplotlib
    import matplotlib.style
    from matplotlib.ticker import FuncFormatter

    from tuneup.report.plotting import STYLE, figure, palette, rate_formatter, save

    if not cells or not periods:
        return None
    priced = any(c.usd for c in cells)

    def amount(c: SpendCell) -> float:
        return (c.usd if priced else c.device_hours) or 0.0

    title = f"Spend by {by}" if priced else f"Device hours by {by} (no run is priced)"
    total: dict[str, float] = {}
    for c in cells:
        total[c.key] = total.get(c.key, 0.0) + amount(c)
    # The remainder joins the view's own "(other)" tag value where it has one: one segment, one label.
    keys = sorted((k for k in total if k != OTHER_GROUP), key=lambda k: -total[k])
    shown = keys[:CHART_KEYS]
    series = {k: [0.0] * len(periods) for k in [*shown, OTHER_GROUP]}
    where = {p: i for i, p in enumerate(periods)}
    for c in cells:
        series[c.key if c.key in shown else OTHER_GROUP][where[c.period]] += amount(c)
    if not any(series[OTHER_GROUP]):
        del series[OTHER_GROUP]
    with matplotlib.rc_context(), matplotlib.style.context(["default", STYLE]):
        fig, (ax,) = figure(height_px=330)
        bottom = [0.0] * len(periods)
        for (key, values), colour in zip(series.items(), palette(len(series)), strict=True):
            ax.bar(range(len(periods)), values, bottom=bottom, color=colour, label=key, width=0.8)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_xticks(range(len(periods)), list(periods), rotation=30 if len(periods) > 6 else 0)
        ax.set_ylabel("$" if priced else "device hours")
        if max(bottom) >= 1000:
            ax.yaxis.set_major_formatter(rate_formatter())  # 80k, not 80000
        else:  # "0.014", not the engineering "14m" (milli, not minutes)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        save(fig, path)
    measure = "Spend" if priced else "Device hours"
    return PlotFile(
        path.name, path, title, "spend", f"{measure} per period, stacked by {what} (the whole selection)."
    )


def _charts(view: FleetView, plot_dir: Path) -> list[PlotFile]:
    plot_dir.mkdir(parents=True, exist_ok=True)
    charts = [
        _draw_spend(
            view.spend_by_group,
            view.periods,
            view.filters.group_by,
            f"{view.filters.group_by} tag value",
            plot_dir / GROUP_CHART,
        ),
        _draw_spend(
            view.spend_by_instance,
            view.periods,
            "instance type",
            "instance type",
            plot_dir / INSTANCE_CHART,
        ),
    ]
    return [c for c in charts if c is not None]


# -- Markdown ----------------------------------------------------------------------------------------


def fleet_sections(view: FleetView, plots: Sequence[PlotFile]) -> list[Section]:
    """The whole selection's figures as the report's sections (the Markdown; the page adds its filters)."""
    if not view.slices:
        return [Section("summary", "Summary", (Paragraph(_nothing(view), quiet=True),))]
    whole = view.whole
    caps = _caps(whole)
    spend_rows = tuple(
        (c.period, c.key, fmt.count(c.runs), fmt.usd(c.usd), fmt.number(c.device_hours))
        for c in view.spend_by_group
    )
    pairs = tuple(_pair_cells(p) for p in view.regressions.pairs)
    return [
        Section("summary", "Summary", (_headline(whole), *(Paragraph(n, quiet=True) for n in view.notes))),
        Section("ledger", "Where the money went", (_ledger_table(whole),)),
        Section(
            "spend",
            "Spend over time",
            (
                *(Figure(p) for p in plots),
                Table(
                    f"Spend by period and {view.filters.group_by}",
                    ("Period", view.filters.group_by, "Runs", "$", "Device hours"),
                    spend_rows,
                    numeric=frozenset({2, 3, 4}),
                ),
                _instances_table(whole, caps[0]),
            ),
        ),
        Section("configurations", "Cost by configuration", (_configurations_table(whole, caps[0]),)),
        Section("runs", "Most expensive runs", (_runs_table(whole, caps[1], view.filters.group_by),)),
        Section(
            "regressions",
            "Regressions between consecutive runs",
            (
                *(Paragraph(line) for line in _regression_lines(view)),
                Table("Pairs judged", PAIR_HEADER, pairs, numeric=PAIR_NUMERIC),
            ),
        ),
    ]


def render_markdown(view: FleetView, plot_dir: Path, plots: Sequence[PlotFile] | None = None) -> str:
    """The dashboard as Markdown, the whole selection only (no filters); the charts, drawn into `plot_dir`
    unless given, are linked by file name."""
    from tuneup.report.markdown import render_sections_markdown

    plots = _charts(view, plot_dir) if plots is None else plots
    return render_sections_markdown(_title(view), _subtitle(view), fleet_sections(view, plots), _footer(view))


# -- JSON and the terminal ---------------------------------------------------------------------------


def render_json(view: FleetView) -> str:
    from tuneup.report import json_text

    return json_text(to_json(view))


def render_text(view: FleetView) -> str:
    """The terminal summary: spend, useful share, badput $ by category, the most expensive runs, regressions."""
    lines = [_title(view), _subtitle(view), ""]
    if not view.slices:
        return "\n".join([*lines, _nothing(view)]) + "\n"
    whole = view.whole
    t = whole.totals
    lines += [
        f"Spend          {fmt.usd(t.usd)} over {fmt.plural(t.runs, 'run')} ({fmt.number(t.device_hours)} device hours)",
        f"Useful share   {fmt.share(t.useful_share)} of wall time; badput {fmt.usd(t.badput_usd)} "
        f"({fmt.share(t.badput_usd_share)} of the priced spend)",
        f"$ per 1M       {fmt.usd(t.usd_per_million_samples)} samples, {fmt.usd(t.usd_per_million_tokens)} tokens",
    ]
    if view.unreadable_runs:
        lines.append(
            f"Unreadable     {fmt.plural(view.unreadable_runs, 'run')} (no figures): {', '.join(view.unreadable_examples)}"
        )
    lines += ["", "Where the money went"]
    time_text = _time_format(sum(x.seconds for x in whole.ledger))
    lines += fmt.aligned_table(
        ("category", "time", "share", "$"),
        [
            (category_label(x.category), time_text(x.seconds), fmt.share(x.share), fmt.usd(x.usd))
            for x in whole.ledger
        ],
        right={1, 2, 3},
        indent="  ",
    )
    lines += ["", f"Most expensive runs (top {TEXT_RUNS})"]
    lines += fmt.aligned_table(
        ("run", view.filters.group_by, "$", "useful", "top recommendation"),
        [
            (
                r.run_id or r.run_key,
                r.group,
                fmt.usd(r.usd),
                fmt.share(r.useful_share),
                fmt.text(r.top_recommendation),
            )
            for r in whole.expensive_runs[:TEXT_RUNS]
        ],
        right={2, 3},
        indent="  ",
    )
    regressions = [p for p in view.regressions.pairs if p.verdict == "REGRESSION"]
    # The pairs' count, and the runs left out of every pair where there are some; the rule at length is the
    # page's.
    said = [
        line for line in _regression_lines(view) if line.startswith("Consecutive") or "in no pair" in line
    ]
    lines += ["", "Regressions", *(f"  {line}" for line in said)]
    if regressions:
        lines += fmt.aligned_table(
            ("after", "before", view.filters.group_by, "slower by", "configuration"),
            [
                (
                    p.candidate_run_id or p.candidate_key,
                    p.baseline_run_id or p.baseline_key,
                    p.group,
                    fmt.share(p.change),
                    p.configuration,
                )
                for p in regressions[:TEXT_PAIRS]
            ],
            right={3},
            indent="  ",
        )
    else:
        lines.append("  none")
    lines.append("  (samples: each run's step windows, autocorrelated: weaker evidence than separate runs)")
    return "\n".join(lines) + "\n"


# -- the page ----------------------------------------------------------------------------------------

_FLEET_CSS = """
main { max-width: 1400px; }
body > input.f { position: absolute; opacity: 0; width: 1px; height: 1px; }
nav.filters { margin: 16px 0 8px; padding: 10px 16px; background: var(--soft); border: 1px solid var(--line);
  border-radius: 8px; }
nav.filters p { margin: 4px 0; }
nav.filters label { display: inline-block; padding: 0 10px; margin: 2px 4px 2px 0; border: 1px solid var(--line);
  border-radius: 14px; cursor: pointer; font-size: 13px; color: var(--accent); background: #fff; }
.verdict-REGRESSION { color: #b42318; font-weight: 600; }
.verdict-IMPROVEMENT { color: #1a7f37; font-weight: 600; }
td.reason { white-space: normal; min-width: 22em; }
"""


def _filter_css(groups: int, periods: int) -> str:
    """The filters' rules: a slice shows when its tag value and its period are the checked ones; a row hides
    when either differs. One rule per button, whatever the number of runs."""
    rules = []
    for name, n in (("g", groups), ("p", periods)):
        rules.append(f"#f{name}-all:checked ~ main .s:not(.{name}-all) {{ display: none; }}")
        rules.append(
            f"#f{name}-all:checked ~ main label[for=f{name}-all] {{ background: var(--accent); color: #fff; }}"
        )
        for i in range(n):
            rules.append(
                f"#f{name}-{i}:checked ~ main .s:not(.{name}-{i}), #f{name}-{i}:checked ~ main .r:not(.{name}-{i}) "
                "{ display: none; }"
            )
            rules.append(
                f"#f{name}-{i}:checked ~ main label[for=f{name}-{i}] {{ background: var(--accent); color: #fff; }}"
            )
    return "\n".join(rules)


def _classes(view: FleetView, group: str | None, period: str | None, kind: str) -> str:
    g = "all" if group is None else str(view.groups.index(group))
    p = "all" if period is None else str(view.periods.index(period))
    return f"{kind} g-{g} p-{p}"


def _group_of(view: FleetView, value: str) -> str:
    """A regression's raw tag value as the page's button (a value past MAX_GROUPS is OTHER_GROUP)."""
    return value if value in view.groups else OTHER_GROUP if OTHER_GROUP in view.groups else NO_GROUP


def _row_table(
    title: str,
    header: Sequence[str],
    rows: Sequence[tuple[str, Sequence[str]]],
    numeric: frozenset[int],
    wide: int | None = None,
    verdict: int | None = None,
    fold: bool = False,
) -> Html:
    def cell(i: int, value: str) -> Html:
        kind = "num" if i in numeric else "reason" if i == wide else None
        if i == verdict:
            kind = f"verdict-{value.replace(' ', '_')}"
        return el("td", value, class_=kind)

    head = el("tr", *(el("th", h, class_="num" if i in numeric else None) for i, h in enumerate(header)))
    body = [el("tr", *(cell(i, v) for i, v in enumerate(cells)), class_=classes) for classes, cells in rows]
    table = el("div", el("table", el("thead", head), el("tbody", join(body))), class_="scroll")
    if fold and len(rows) > FOLD_ROWS:
        # A long table would bury the sections below it; one click away, and find-in-page still searches it.
        return el("details", el("summary", f"{title} ({fmt.plural(len(rows), 'row')})"), table)
    return Html(el("h3", title) + table)


def _sliced(view: FleetView, build: Callable[[Slice], Block]) -> Html:
    """One block per slice, each wrapped in its filter classes; an empty choice says so."""
    parts: list[Html] = []
    have = {(s.group, s.period): s for s in view.slices}
    for group in [None, *view.groups]:
        for period in [None, *view.periods]:
            s = have.get((group, period))
            body = (
                block_html(build(s))
                if s is not None
                else el("p", "No runs for this choice of filters.", class_="note")
            )
            parts.append(el("div", body, class_=_classes(view, group, period, "s")))
    return join(parts)


def render_html(view: FleetView, plot_dir: Path, plots: Sequence[PlotFile] | None = None) -> str:
    """The dashboard as one offline page: the report's styles and policy, filters in CSS, charts as data: URIs
    (drawn into `plot_dir` unless given)."""
    title = _title(view)
    group_by = view.filters.group_by
    inputs = [void("input", type="radio", name="fg", id="fg-all", class_="f", checked="checked")]
    inputs += [
        void("input", type="radio", name="fg", id=f"fg-{i}", class_="f") for i in range(len(view.groups))
    ]
    inputs.append(void("input", type="radio", name="fp", id="fp-all", class_="f", checked="checked"))
    inputs += [
        void("input", type="radio", name="fp", id=f"fp-{i}", class_="f") for i in range(len(view.periods))
    ]
    filters = el(
        "nav",
        el(
            "p",
            el("strong", f"{group_by}: "),
            el("label", "all", for_="fg-all"),
            *(el("label", g, for_=f"fg-{i}") for i, g in enumerate(view.groups)),
        ),
        el(
            "p",
            el("strong", f"{view.period_unit}: "),
            el("label", "all", for_="fp-all"),
            *(el("label", p, for_=f"fp-{i}") for i, p in enumerate(view.periods)),
        ),
        el(
            "p",
            "The filters narrow every headline and table below (without a server: each choice was computed when "
            "the page was made). The two spend charts show the whole selection.",
            class_="note",
        ),
        class_="filters",
        aria_label="Filters",
    )
    sections: list[Html] = []

    def section(id_: str, heading: str, *body: object) -> None:
        sections.append(el("section", el("h2", heading), *body, id=id_))

    if not view.slices:
        section("summary", "Summary", el("p", _nothing(view), class_="note"))
    else:
        section(
            "summary",
            "Summary",
            _sliced(view, _headline),
            join([el("p", n, class_="note") for n in view.notes]),
            el(
                "p",
                f"{fmt.plural(view.unreadable_runs, 'run')} of the index could not be read and have no figures: "
                f"{', '.join(view.unreadable_examples)}{' and more' if view.unreadable_runs > len(view.unreadable_examples) else ''}.",
                class_="note",
            )
            if view.unreadable_runs
            else "",
        )
        section(
            "ledger",
            "Where the money went",
            el(
                "p",
                "Each run's wall time and dollars split into productive compute and named badput, summed over "
                "the runs. Validation is badput here unless a run was recorded with validation counted as useful; "
                "a run's useful share and badput $ follow its own setting.",
                class_="note",
            ),
            _sliced(view, _ledger_table),
        )
        plots = _charts(view, plot_dir) if plots is None else plots
        spend_rows = [
            (
                _classes(view, c.key, c.period, "r"),
                (c.period, c.key, fmt.count(c.runs), fmt.usd(c.usd), fmt.number(c.device_hours)),
            )
            for c in view.spend_by_group
        ]
        section(
            "spend",
            "Spend over time",
            join([figure_html(p) for p in plots]),
            _row_table(
                f"Spend by {view.period_unit} and {group_by}",
                ("Period", group_by, "Runs", "$", "Device hours"),
                spend_rows,
                frozenset({2, 3, 4}),
                fold=True,
            ),
            _sliced(view, lambda s: _instances_table(s, _caps(s)[0])),
        )
        section(
            "configurations",
            "Cost by configuration",
            _sliced(view, lambda s: _configurations_table(s, _caps(s)[0])),
        )
        section(
            "runs",
            "Most expensive runs",
            el(
                "p",
                f"The {TOP_RUNS_ALL} most expensive runs of the whole selection; {TOP_RUNS_SLICE} for a "
                "filtered choice.",
                class_="note",
            ),
            _sliced(view, lambda s: _runs_table(s, _caps(s)[1], group_by)),
        )
        pair_rows = [
            (_classes(view, _group_of(view, p.group), p.period, "r"), _pair_cells(p))
            for p in view.regressions.pairs
        ]
        section(
            "regressions",
            "Regressions between consecutive runs",
            join([el("p", line) for line in _regression_lines(view)]),
            _row_table(
                "Pairs judged", PAIR_HEADER, pair_rows, PAIR_NUMERIC, wide=len(PAIR_HEADER) - 1, verdict=0
            ),
        )
    toc = el(
        "nav",
        el(
            "ol",
            *(
                el("li", el("a", t, href=f"#{i}"))
                for i, t in (
                    ("summary", "Summary"),
                    ("ledger", "Where the money went"),
                    ("spend", "Spend over time"),
                    ("configurations", "Cost by configuration"),
                    ("runs", "Most expensive runs"),
                    ("regressions", "Regressions"),
                )
            ),
        ),
        class_="toc",
        aria_label="Sections",
    )
    head = page_head(title, _FLEET_CSS + _filter_css(len(view.groups), len(view.periods)))
    body = el(
        "body",
        join(inputs, ""),
        el(
            "main",
            el("header", el("h1", title), el("p", _subtitle(view))),
            toc,
            filters,
            join(sections),
            el("footer", el("p", _footer(view))),
        ),
    )
    return "<!DOCTYPE html>\n" + el("html", head, body, lang="en") + "\n"


def write_fleet(view: FleetView, out_dir: Path, formats: Sequence[str]) -> list[Path]:
    """The requested files (html, md, json) into `out_dir`, atomically (tuneup.report.publish): fleet.html,
    fleet.md with its two chart PNGs, fleet.json."""
    from tuneup.report import publish

    def render(scratch: Path) -> list[str]:
        names: list[str] = []
        if "json" in formats:
            (scratch / JSON_NAME).write_text(render_json(view), encoding="utf-8")
            names.append(JSON_NAME)
        # Drawn once for both: the page embeds them, the Markdown links the files written beside it.
        plots = _charts(view, scratch) if {"md", "html"} & set(formats) else []
        if "md" in formats:
            (scratch / MD_NAME).write_text(render_markdown(view, scratch, plots), encoding="utf-8")
            names += [p.name for p in plots] + [MD_NAME]
        if "html" in formats:
            (scratch / HTML_NAME).write_text(render_html(view, scratch, plots), encoding="utf-8")
            names.append(HTML_NAME)
        return names

    return publish(out_dir, "the fleet dashboard", render)
