"""Where step time goes: the steady step split into data, forward, backward, optimizer, sync and other time
and tuneup's own, for all ranks together and per rank, and the figure of it (`step_breakdown.png`): the
table's lines, the figure's segments and report.json's `step_time.phases` are the run record's one list
(tuneup.record.schema.STEP_TIME_LINES).

The phases are means, so that they add up to the step; where a few slow steps carry a mean (the analysis
marks it `noisy`), the table shows the median and p95 beside it and says so. Slow periods, kept in the
figures, are listed with how much slower they ran and what share of the time they took.

The figure stays readable at any job size: one bar per rank up to MAX_BARS ranks, one bar per host up to
MAX_BARS hosts, and beyond that five bars for the spread of the ranks (fastest, p5, median, p95, slowest).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuneup.analyze.model import RankStepTime, RunAnalysis, StepTime
from tuneup.analyze.slow_periods import SLOW_FACTOR
from tuneup.record.schema import TUNEUP_PHASE
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, Paragraph, figures, table
from tuneup.report.format import MISSING, count, is_number, ms, number, share, text
from tuneup.report.plotting import (
    HEIGHT_PX,
    MAX_LEGEND_ENTRIES,
    PHASE_COLORS,
    PHASE_ORDER,
    PHASE_TEXT_COLORS,
    STRAGGLER_COLOR,
    Drawn,
    Plot,
    figure,
    fmt,
    num,
    straggler_rank,
)

ID = "step-time"
TITLE = "Where step time goes"

# More bars than this and their labels no longer fit the figure's height: group them.
MAX_BARS = 32
# The ranks the distribution view shows, by whole step: (label, quantile).
_SPREAD = (("fastest", 0.0), ("p5", 0.05), ("median", 0.5), ("p95", 0.95), ("slowest", 1.0))

NOISY = "noisy: slow steps pull the mean above the median"
NOT_TIMED = "not timed"
# tuneup's own time in the step (its hooks, the noise scale's norms), where the record keeps it apart from
# the user's phases.
_LABELS = {TUNEUP_PHASE: "tuneup's own"}


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    st = analysis.step_time
    out: list[Block] = []
    if not st.phases:
        out.append(Paragraph("No steady-state steps were recorded, so step time cannot be split.", True))
    else:
        # The mean first: it is the step the throughput figures are made of, and what the phases add up to.
        out.append(
            Paragraph(
                f"Over all ranks' steady-state steps: mean {ms(st.mean_ms)} (the step the throughput is made "
                f"of), median {ms(st.median_ms)}, p95 {ms(st.p95_ms)}"
                + (" (heavy-tailed: slow steps pull the mean above the median)." if st.noisy else ".")
            )
        )
        out.extend(_phase_table(st))
    if st.slow_periods:
        out.extend(_slow_periods(st))
    if len(st.per_rank) > 1:
        names = list(dict.fromkeys(n for r in st.per_rank for n in r.phase_mean_ms))
        rank_rows = []
        for r in st.per_rank:
            values = [r.phase_mean_ms.get(n) for n in names]
            total = sum(values) if values and all(is_number(v) for v in values) else None  # type: ignore[misc]
            rank_rows.append((text(r.rank), *(ms(v) for v in values), ms(total)))
        out.append(
            table(
                "Per rank: mean per step",
                ("Rank", *(_LABELS.get(n, n) for n in names), "whole step"),
                rank_rows,
                range(1, len(names) + 2),
            )
        )
    return out + figures(ID, plots)


def _phase_table(st: StepTime) -> list[Block]:
    """The mean per step by phase; with a median and p95 column, and the label, where any is noisy."""
    whole = share(1.0) if is_number(st.mean_ms) else MISSING
    blind = set(st.phases_not_timed)
    after = _not_timed(st)
    noisy = [name for name, p in st.phases.items() if p.noisy and name not in blind]
    if not noisy and not st.noisy:
        rows = [
            (_LABELS.get(name, name), NOT_TIMED, MISSING)
            if name in blind
            else (_LABELS.get(name, name), ms(p.ms), share(p.share))
            for name, p in st.phases.items()
        ]
        rows.append(("whole step", ms(st.mean_ms), whole))
        return [
            table("All ranks: mean per step", ("Phase", "Time", "Share of step"), rows, (1, 2), total=True),
            *after,
        ]
    rows = [
        (_LABELS.get(name, name), NOT_TIMED, MISSING, MISSING, MISSING, "")
        if name in blind
        else (
            _LABELS.get(name, name),
            ms(p.ms),
            share(p.share),
            ms(p.median_ms),
            ms(p.p95_ms),
            NOISY if p.noisy else "",
        )
        for name, p in st.phases.items()
    ]
    rows.append(
        ("whole step", ms(st.mean_ms), whole, ms(st.median_ms), ms(st.p95_ms), NOISY if st.noisy else "")
    )
    header = ("Phase", "Time", "Share of step", "Median", "p95", "Note")
    out: list[Block] = [table("All ranks: mean per step", header, rows, (1, 2, 3, 4), total=True), *after]
    if noisy:
        named = noisy[0] if len(noisy) == 1 else f"{', '.join(noisy[:-1])} and {noisy[-1]}"
        out.append(
            Paragraph(
                f"The {named} mean{'s are' if len(noisy) > 1 else ' is'} pulled above the median by slow "
                "steps: read the median for what a typical step spends. The means are kept in the table "
                "because they add up to the step the throughput is made of."
            )
        )
    return out


def _not_timed(st: StepTime) -> list[Block]:
    """What the trainer's adapter could not time, said under the table: their time is in "other"."""
    if not st.phases_not_timed:
        return []
    names = st.phases_not_timed
    named = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return [
        Paragraph(
            f"The trainer's adapter did not time {named} on every rank (a phase the training loop never "
            f'marked): {"its" if len(names) == 1 else "their"} time is inside "other", and no figure here '
            "or in the advice reads it as measured."
        )
    ]


def _slow_periods(st: StepTime) -> list[Block]:
    rows = [
        (
            f"{text(p.first_step)}–{text(p.last_step)}",
            count(p.steps),
            ms(p.median_ms),
            f"{number(p.slowdown, 1)}×",
            share(p.share_of_time),
        )
        for p in st.slow_periods
    ]
    return [
        Paragraph(
            f"Slow periods: stretches of steady steps whose median ran above {number(SLOW_FACTOR, 1)}× the "
            f"steady step time ({ms(st.slow_periods[0].baseline_ms)}, the lower quartile of the steady steps: "
            "the pace kept when nothing slows the job). They are not warm-up, and they stay in the "
            "throughput and step-time figures, since they are part of what the job delivered."
        ),
        table(
            "Slow periods, kept in the figures",
            ("Steps", "Recorded steps", "Median step", "Of the steady step", "Share of the time"),
            rows,
            (1, 2, 3, 4),
        ),
    ]


# ---------------------------------------------------------------------------------------------------
# The figure.


@dataclass(frozen=True, slots=True)
class _Bar:
    label: str
    phases_ms: dict[str, float]
    straggler: bool = False  # drawn in the straggler's colour

    @property
    def total_ms(self) -> float:
        return sum(self.phases_ms.values())


def _phase_means(entry: RankStepTime) -> dict[str, float]:
    return {p: max(0.0, num(entry.phase_mean_ms.get(p)) or 0.0) for p in PHASE_ORDER}


def _rank_bars(entries: list[RankStepTime], straggler: int | None) -> list[_Bar]:
    return [
        _Bar(
            f"rank {e.rank}" + (" (straggler)" if e.rank == straggler else ""),
            _phase_means(e),
            e.rank == straggler,
        )
        for e in entries
    ]


def _host_bars(entries: list[RankStepTime], hosts: dict[str, str], straggler: int | None) -> list[_Bar]:
    """One bar per host: the mean of its ranks' phase means, hosts in order of their lowest rank."""
    by_host: dict[str, list[RankStepTime]] = {}
    for e in entries:
        by_host.setdefault(hosts[str(e.rank)], []).append(e)
    names = _short_names(list(by_host))
    # The rank count goes on a label only where hosts differ in it; the caption says it otherwise.
    counted = len({len(m) for m in by_host.values()}) > 1
    bars = []
    for host, members in by_host.items():
        means = [_phase_means(e) for e in members]
        phases = {p: sum(m[p] for m in means) / len(means) for p in PHASE_ORDER}
        has_straggler = any(e.rank == straggler for e in members)
        notes = [f"{len(members)} ranks"] * counted + [f"straggler: rank {straggler}"] * has_straggler
        label = names[host] + (f" ({', '.join(notes)})" if notes else "")
        bars.append(_Bar(label, phases, has_straggler))
    return bars


def _short_names(hosts: list[str], limit: int = 24) -> dict[str, str]:
    """Host names as short as still tells them apart: a domain all of them share is dropped
    (ip-10-0-3-17.us-west-2.compute.internal -> ip-10-0-3-17), and a name still too long is cut in the
    middle. Long labels would squeeze the bars into a sliver of the figure."""
    suffix = hosts[0]
    for host in hosts[1:]:
        while not host.endswith(suffix):
            suffix = suffix[1:]
    suffix = suffix[suffix.find(".") :] if "." in suffix else ""
    out = {}
    for host in hosts:
        name = host[: len(host) - len(suffix)] if suffix and len(hosts) > 1 else host
        name = name or host
        out[host] = name if len(name) <= limit else f"{name[: limit // 2 - 1]}\u2026{name[-(limit // 2) :]}"
    return out


def _spread_bars(entries: list[RankStepTime], straggler: int | None) -> list[_Bar]:
    """The ranks at the fastest, p5, median, p95 and slowest whole step: a real rank each, named."""
    ranked = sorted(entries, key=lambda e: (sum(_phase_means(e).values()), e.rank))
    bars = []
    for label, q in _SPREAD:
        e = ranked[round(q * (len(ranked) - 1))]
        tag = " (straggler)" if e.rank == straggler else ""
        bars.append(_Bar(f"{label}: rank {e.rank}{tag}", _phase_means(e), e.rank == straggler))
    return bars


def _bars(analysis: RunAnalysis) -> tuple[list[_Bar], str] | None:
    """The bars to draw and what one stands for ("rank", "host" or "spread"), or None without data."""
    entries = sorted(
        (e for e in analysis.step_time.per_rank if sum(_phase_means(e).values()) > 0), key=lambda e: e.rank
    )
    if not entries:
        return None
    straggler = straggler_rank(analysis)
    if len(entries) <= MAX_BARS:
        return _rank_bars(entries, straggler), "rank"
    hosts = analysis.run.hosts
    host_count = len({hosts.get(str(e.rank)) for e in entries})
    if all(str(e.rank) in hosts for e in entries) and 1 < host_count <= MAX_BARS:
        return _host_bars(entries, hosts, straggler), "host"
    return _spread_bars(entries, straggler), "spread"


_PHASES_SPLIT = (
    "split into data loading, forward, backward, optimizer, sync and other time, and tuneup's own time "
    "where the record keeps it apart (ms, total at the bar's end)"
)


def _drawn_lines(entries: Sequence[RankStepTime]) -> list[str]:
    """The lines to stack, in the record's order: every phase, and tuneup's own time where the record kept
    it apart from them (as the table shows it)."""
    apart = any(TUNEUP_PHASE in e.phase_mean_ms for e in entries)
    return [p for p in PHASE_ORDER if p != TUNEUP_PHASE or apart]


def _draw_step_breakdown(analysis: RunAnalysis) -> Drawn | None:
    chosen = _bars(analysis)
    if chosen is None:
        return None
    bars, kind = chosen
    n = len(bars)
    fig, (ax,) = figure(height_px=min(1400, max(HEIGHT_PX, 130 + 30 * n)))
    ys = list(range(n))
    totals = [b.total_ms for b in bars]
    x_max = max(totals)
    label_segments = n <= MAX_LEGEND_ENTRIES
    left = [0.0] * n
    lines = _drawn_lines(analysis.step_time.per_rank)
    for phase in lines:
        widths = [b.phases_ms[phase] for b in bars]
        drawn = ax.barh(
            ys, widths, left=left, height=0.7, color=PHASE_COLORS[phase], label=_LABELS.get(phase, phase)
        )
        if label_segments:
            for bar, w in zip(drawn, widths, strict=True):
                # Only where the number fits inside its segment.
                if w >= 0.09 * x_max:
                    ax.text(
                        bar.get_x() + w / 2,
                        bar.get_y() + bar.get_height() / 2,
                        fmt(w),
                        ha="center",
                        va="center",
                        fontsize=8,
                        color=PHASE_TEXT_COLORS.get(phase, "black"),
                    )
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, total in zip(ys, totals, strict=True):
        ax.text(total + 0.01 * x_max, y, f"{fmt(total)} ms", va="center", ha="left", fontsize=8.5)
    ax.set_xlim(0, x_max * 1.14)
    ax.set_yticks(ys, [b.label for b in bars])
    for tick, b in zip(ax.get_yticklabels(), bars, strict=True):
        if b.straggler:
            tick.set_color(STRAGGLER_COLOR)
            tick.set_fontweight("bold")
    ax.invert_yaxis()  # rank 0 (or the fastest) on top, as the tables list it
    ax.grid(axis="y", visible=False)
    ax.set_axisbelow(True)  # grid lines behind the bars, not across the numbers on them
    ax.set_xlabel("mean time per training step, steady steps (ms)")
    title, caption = _words(analysis, kind, n)
    ax.set_title(title)
    fig.legend(loc="outside lower center", ncols=len(lines), title=None)
    return Drawn(fig, title, caption)


def _words(analysis: RunAnalysis, kind: str, bars: int) -> tuple[str, str]:
    tail = "; the longest segment is where tuning pays most."
    if kind == "rank":
        return (
            "Where each rank's step time goes",
            f"Each bar is one rank's mean training step after warm-up, {_PHASES_SPLIT}{tail}",
        )
    ranks = len(analysis.step_time.per_rank)
    if kind == "host":
        return (
            "Where each host's step time goes",
            f"Each bar is one of the {bars} hosts' mean training step after warm-up (the mean of its ranks' "
            f"phase means, {ranks:,} ranks in all), {_PHASES_SPLIT}{tail}",
        )
    return (
        f"Where step time goes across {ranks:,} ranks",
        f"Each bar is one rank's mean training step after warm-up: the fastest rank, the ranks at the 5th "
        f"percentile, the median and the 95th percentile, and the slowest rank of all {ranks:,} by whole "
        f"step, {_PHASES_SPLIT}{tail}",
    )


PLOTS: tuple[Plot, ...] = (Plot("step_breakdown.png", _draw_step_breakdown),)
