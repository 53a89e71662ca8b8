"""Ranks side by side: is one rank slower than the others, which one, on which host, and since when.

Up to `PER_ROW_LIMIT` ranks the section has a row per rank and a box per rank; beyond, the spread of
the ranks' median steps, the slowest and fastest ranks, and a row per host. The figure is drawn in
ranks_plots.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuneup.analyze.model import RunAnalysis
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, FindingItem, FindingList, Paragraph, figures, table
from tuneup.report.format import count, ms, plural, sentence, text
from tuneup.report.plotting import Plot
from tuneup.report.sections._scale import PER_ROW_LIMIT, signed_percent
from tuneup.report.sections.ranks_plots import draw_rank_step_time

ID = "ranks"
TITLE = "Ranks side by side"
PLOTS: tuple[Plot, ...] = (Plot("rank_step_time.png", draw_rank_step_time),)

# Beyond this many hosts the per-host table names the slowest and fastest hosts, not every one.
HOST_EXTREMES = (10, 5)


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    per_rank = analysis.step_time.per_rank
    out: list[Block] = []
    if len(per_rank) > PER_ROW_LIMIT and analysis.ranks.median_step_ms is not None:
        out += _at_scale(analysis)
    elif per_rank:
        out.append(_per_rank_table(analysis))
    straggler = analysis.ranks.straggler
    if straggler is not None:
        out.append(
            FindingList(
                (
                    FindingItem(
                        "warning",
                        f"Straggler: rank {text(straggler.rank)}, in {text(straggler.phase)}",
                        sentence(straggler.summary),
                    ),
                )
            )
        )
    elif len(per_rank) > 1:
        out.append(
            Paragraph("No straggler: no rank's own work is slower than the others' by a share that matters.")
        )
    else:
        out.append(Paragraph("Only one rank recorded steady-state steps: there is nothing to compare.", True))
    return out + figures(ID, plots)


def _per_rank_table(analysis: RunAnalysis) -> Block:
    per_rank = analysis.step_time.per_rank
    hosts = analysis.run.hosts
    names = list(dict.fromkeys(n for r in per_rank for n in r.phase_median_ms))
    rows = [
        (
            text(r.rank),
            text(hosts.get(str(r.rank))),
            count(r.steps),
            ms(r.median_ms),
            ms(r.p95_ms),
            *(ms(r.phase_median_ms.get(n)) for n in names),
        )
        for r in per_rank
    ]
    header = ("Rank", "Host", "Steps", "Median step", "p95 step", *names)
    return table(
        "Steady-state steps per rank; phase columns are medians", header, rows, range(2, 5 + len(names))
    )


def _at_scale(analysis: RunAnalysis) -> list[Block]:
    """A few dozen rows that say what 1,024 would: the spread, the extremes, and the hosts."""
    ranks = analysis.ranks
    spread = ranks.median_step_ms
    assert spread is not None
    n = len(analysis.step_time.per_rank)
    middle = spread.p50
    out: list[Block] = []
    if ranks.slowest and ranks.fastest:
        slow, fast = ranks.slowest[0], ranks.fastest[0]
        out.append(
            Paragraph(
                f"The slowest of {n:,} ranks is rank {slow.rank} on {text(slow.host)}: its median steady step is "
                f"{ms(slow.median_ms)}, {signed_percent(slow.median_ms, middle)} against the median rank's "
                f"{ms(middle)}; the fastest is rank {fast.rank} on {text(fast.host)} at {ms(fast.median_ms)}. "
                "report.json holds every rank's figures."
            )
        )
    out.append(_spread_row(f"Median steady step, spread across {plural(n, 'rank')}", spread))
    extremes = [("slowest", r) for r in ranks.slowest] + [("fastest", r) for r in ranks.fastest]
    if extremes:
        out.append(
            table(
                f"The {len(ranks.slowest)} slowest and {len(ranks.fastest)} fastest ranks, by median steady step",
                ("", "Rank", "Host", "Median step", "Against the median rank"),
                [
                    (which, text(r.rank), text(r.host), ms(r.median_ms), signed_percent(r.median_ms, middle))
                    for which, r in extremes
                ],
                (3, 4),
            )
        )
    hosts = ranks.per_host
    if hosts:
        shown, title = hosts, f"Per host: the median steady step of its ranks ({plural(len(hosts), 'host')})"
        if len(hosts) > PER_ROW_LIMIT:
            slow_k, fast_k = HOST_EXTREMES
            by_median = sorted(hosts, key=lambda h: (h.median_ms, h.host))
            shown = by_median[::-1][:slow_k] + by_median[:fast_k][::-1]
            title = (
                f"The {slow_k} slowest and {fast_k} fastest of {len(hosts):,} hosts, "
                "by the median steady step of their ranks"
            )
        out.append(
            table(
                title,
                (
                    "Host",
                    "Ranks",
                    "Median step",
                    "Slowest rank",
                    "Its median step",
                    "Fastest rank's median step",
                ),
                [
                    (
                        text(h.host),
                        count(h.ranks),
                        ms(h.median_ms),
                        text(h.slowest_rank),
                        ms(h.slowest_median_ms),
                        ms(h.fastest_median_ms),
                    )
                    for h in shown
                ],
                (1, 2, 4, 5),
            )
        )
    return out


def _spread_row(title: str, q: Any) -> Block:
    return table(
        title,
        ("", "min", "p5", "median", "p95", "max"),
        [("Median step", ms(q.min), ms(q.p5), ms(q.p50), ms(q.p95), ms(q.max))],
        range(1, 6),
    )
