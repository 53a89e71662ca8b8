"""The ranks section's figure, rank_step_time.png: a box per rank up to `PER_ROW_LIMIT` ranks; beyond, a
rank x step heatmap of step time, ranks grouped by host, colour limits at the 1st and 99th percentiles,
and the straggler (or else the slowest rank) named on its row.
"""

from __future__ import annotations

import warnings
from typing import Any

from tuneup.analyze.model import RunAnalysis
from tuneup.report.format import plural, text
from tuneup.report.plotting import (
    HEIGHT_PX,
    RANK_BOX_COLOR,
    STRAGGLER_COLOR,
    WIDTH_PX,
    Drawn,
    bottom_legend,
    figure,
    num,
    straggler_rank,
)
from tuneup.report.sections._scale import PER_ROW_LIMIT, every, robust_limits

# ---------------------------------------------------------------------------------------------------
# rank_step_time.png: a box per rank, or beyond PER_ROW_LIMIT ranks a rank x step heatmap.


def draw_rank_step_time(analysis: RunAnalysis) -> Drawn | None:
    if len(analysis.step_time.per_rank) > PER_ROW_LIMIT:
        drawn = _draw_rank_heatmap(analysis)
        if drawn is not None:
            return drawn
    return _draw_rank_boxes(analysis)


def _draw_rank_boxes(analysis: RunAnalysis) -> Drawn | None:
    stats: list[dict[str, Any]] = []
    ranks: list[int] = []
    for entry in analysis.step_time.per_rank:
        d = entry.distribution_ms
        q = {k: num(getattr(d, k)) for k in ("min", "p5", "p25", "p50", "p75", "p95", "max")}
        if any(v is None for v in q.values()):
            continue
        stats.append(
            {
                "med": q["p50"],
                "q1": q["p25"],
                "q3": q["p75"],
                "whislo": q["p5"],
                "whishi": q["p95"],
                "fliers": [q["min"], q["max"]],
                "label": str(entry.rank),
            }
        )
        ranks.append(entry.rank)
    if not stats:
        return None
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    order = sorted(range(len(ranks)), key=lambda i: ranks[i])
    ranks = [ranks[i] for i in order]
    stats = [stats[i] for i in order]
    straggler = straggler_rank(analysis)
    fig, (ax,) = figure()
    positions = list(range(len(stats)))
    art = ax.bxp(
        stats,
        positions=positions,
        widths=0.6,
        patch_artist=True,
        showfliers=True,
        manage_ticks=False,
        medianprops={"color": "black", "lw": 1.4},
        flierprops={"marker": "o", "markersize": 3.5, "markerfacecolor": "white", "markeredgecolor": "0.3"},
        whiskerprops={"color": "0.3"},
        capprops={"color": "0.3"},
        boxprops={"edgecolor": "0.3"},
    )
    for box, rank in zip(art["boxes"], ranks, strict=True):
        box.set_facecolor(STRAGGLER_COLOR if rank == straggler else RANK_BOX_COLOR)
    step = every(len(ranks), 32)  # keep tick labels from running into each other
    ax.set_xticks(positions[::step], [str(r) for r in ranks[::step]])
    for tick, rank in zip(ax.get_xticklabels(), ranks[::step], strict=True):
        if rank == straggler:
            tick.set_color(STRAGGLER_COLOR)
            tick.set_fontweight("bold")
    ax.set_xlim(-0.6, len(stats) - 0.4)
    ax.set_ylim(bottom=0)
    ax.grid(axis="x", visible=False)
    ax.set_axisbelow(True)
    ax.set_xlabel("rank")
    ax.set_ylabel("step time, steady steps (ms)")
    handles: list[Any] = [
        Patch(facecolor=RANK_BOX_COLOR, edgecolor="0.3", label="p25 to p75, line at median"),
        Line2D([], [], color="0.3", label="whiskers: p5 to p95"),
        Line2D([], [], ls="", marker="o", markersize=4, mfc="white", mec="0.3", label="min and max"),
    ]
    title = "Step time distribution per rank"
    straggler_note = ""
    if straggler is not None and straggler in ranks:
        phase = analysis.ranks.straggler.phase if analysis.ranks.straggler else None
        what = f" (slow {phase})" if isinstance(phase, str) else ""
        handles.insert(
            0, Patch(facecolor=STRAGGLER_COLOR, edgecolor="0.3", label=f"rank {straggler}: straggler{what}")
        )
        title += f": rank {straggler} is the straggler"
        straggler_note = f", and rank {straggler}, highlighted, is the straggler that holds the others back"
    ax.set_title(title)
    # Below the axes: a rank whose fastest step is near zero would put its box under a legend inside.
    bottom_legend(fig, handles)
    return Drawn(
        fig,
        title,
        "Spread of step times after warm-up on each rank: the box spans the middle half of the steps "
        "(line at the median), whiskers reach the 5th and 95th percentiles and dots mark the fastest and "
        f"slowest step; boxes at different heights mean unevenly loaded ranks{straggler_note}.",
    )


# A pixel row per rank where it fits: 1,024 ranks get a taller figure rather than rows thinner than a
# pixel, where one slow rank would be blended away. Beyond this height rows are blended (antialiased).
HEATMAP_MAX_HEIGHT_PX = 1250
# Title, step axis and margins around the heatmap's rows.
HEATMAP_FRAME_PX = 150
# Host boundaries are drawn as lines up to this many hosts; beyond, lines would cover the rows.
HOST_LINES = 32
# At most this many columns, about one per pixel of the plot's width.
HEATMAP_COLUMNS = 600
# Labelled ticks on the rank axis, at most.
RANK_LABELS = 14


def _heatmap_grid(analysis: RunAnalysis) -> tuple[list[int], list[int], Any] | None:
    """(ranks, steps, grid ms): a row per rank, a column per step any rank kept, NaN where it has none."""
    import numpy as np

    series = {int(k): v for k, v in analysis.timeseries.per_rank.items() if k.lstrip("-").isdigit()}
    steps = sorted({s for v in series.values() for s in v.step if isinstance(s, int)})
    if len(series) < 2 or len(steps) < 2:
        return None
    ranks = sorted(series)
    column = {s: i for i, s in enumerate(steps)}
    grid = np.full((len(ranks), len(steps)), np.nan)
    for row, rank in enumerate(ranks):
        v = series[rank]
        for s, y in zip(v.step, v.step_time_ms, strict=False):
            value = num(y)
            if value is not None and s in column:
                grid[row, column[s]] = value
    if not np.isfinite(grid).any():
        return None
    if len(steps) > HEATMAP_COLUMNS:
        # More columns than pixels: neighbours averaged in equal groups, each labelled with its last step.
        size = -(-len(steps) // HEATMAP_COLUMNS)
        pad = -len(steps) % size
        padded = np.pad(grid, ((0, 0), (0, pad)), constant_values=np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a group where a rank kept no step: NaN
            grid = np.nanmean(padded.reshape(len(ranks), -1, size), axis=2)
        steps = [steps[min(i + size - 1, len(steps) - 1)] for i in range(0, len(steps), size)]
    return ranks, steps, grid


def _draw_rank_heatmap(analysis: RunAnalysis) -> Drawn | None:
    import numpy as np
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    found = _heatmap_grid(analysis)
    if found is None:
        return None
    ranks, steps, grid = found
    steady_from = _first_steady_column(steps, analysis.warmup.first_steady_step)
    # Limits from the steady steps: the warm-up's slow first steps would take the whole colour range.
    limits = robust_limits(grid[:, steady_from:]) or robust_limits(grid)
    if limits is None:
        return None
    n = len(ranks)
    height = max(HEIGHT_PX, min(HEATMAP_MAX_HEIGHT_PX, n + HEATMAP_FRAME_PX))
    fig, (ax,) = figure(height_px=height)
    from matplotlib import colormaps

    cmap = colormaps["viridis"].with_extremes(bad="#EEEEEE")
    # Evenly spaced steps (every step, or every k-th as thinning keeps them) get a true step axis with
    # round ticks; uneven ones get a column each, labelled with the step it holds.
    gaps = np.diff(steps)
    # The last thinned group or window may be cut short by the run's end.
    body = gaps[:-1] if gaps.size > 1 else gaps
    even = bool(body.size) and body.max() - body.min() <= 0.1 * np.median(body) and gaps[-1] <= body.max()
    half = float(np.median(body)) / 2 if even else 0.5
    x0, x1 = (steps[0] - half, steps[0] + (2 * len(steps) - 1) * half) if even else (-0.5, len(steps) - 0.5)
    # Each column repeated to about a pixel each: smoothing then blends rows thinner than a pixel (a slow
    # rank stays visible) without smearing a few wide columns into each other.
    wide = np.repeat(grid, max(1, -(-WIDTH_PX // len(steps))), axis=1)
    image = ax.imshow(
        np.ma.masked_invalid(wide),
        aspect="auto",
        cmap=cmap,
        vmin=limits[0],
        vmax=limits[1],
        # Every row and column gets a pixel where they fit; where not, rows are blended, never dropped.
        interpolation="nearest" if height - HEATMAP_FRAME_PX >= n else "antialiased",
        extent=(x0, x1, n - 0.5, -0.5),
    )
    ax.grid(False)
    clipped_low = bool(np.nanmin(grid) < limits[0])
    clipped_high = bool(np.nanmax(grid) > limits[1])
    extend = {(False, False): "neither", (True, False): "min", (False, True): "max"}.get(
        (clipped_low, clipped_high), "both"
    )
    fig.colorbar(image, ax=ax, label="step time (ms)", extend=extend, extendfrac=0.03, aspect=30, pad=0.01)
    if even:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:,.0f}"))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
        ax.xaxis.set_major_formatter(
            FuncFormatter(lambda x, _pos: f"{steps[int(x)]:,}" if x == int(x) and 0 <= x < len(steps) else "")
        )
    windows = analysis.timeseries.source == "windows"
    ax.set_xlabel("step (window means)" if windows else "step")
    if 0 < steady_from < len(steps):
        edge = x0 + steady_from * (x1 - x0) / len(steps)  # the left edge of the first steady column
        ax.axvline(edge, color="white", ls="--", lw=1.0)
    ax.set_ylabel("rank")
    _mark_slowest(analysis, ax, ranks)
    _label_hosts(analysis, ax, ranks)
    straggler = straggler_rank(analysis)
    title = "Step time per rank over the run"
    if straggler is not None and straggler in ranks:
        title += f": rank {straggler} is the straggler"
    ax.set_title(title)
    hosts = len({analysis.run.hosts.get(str(r)) for r in ranks})
    where = f" grouped by host ({plural(hosts, 'host')})" if hosts > 1 else ""
    group = int(np.median(gaps)) if gaps.size else 1
    column = (
        "a stretch of steps (the mean of its windows)"
        if windows
        else "a step"
        if group <= 1
        else f"{group} steps (their mean)"
    )
    warm = ", the dashed line ends the warm-up" if 0 < steady_from < len(steps) else ""
    return Drawn(
        fig,
        title,
        f"Each row is one of {n:,} ranks{where} and each column {column}, coloured by step time "
        "(colour limits at the 1st and 99th percentiles of the steady steps, so that one slow step does "
        "not wash out the rest): a row brighter than the others is a slow rank, a bright column a moment "
        f"when every rank was slow{warm}.",
    )


def _first_steady_column(steps: list[int], first_steady: int | None) -> int:
    """The first column with no warm-up step in it. A column holds the steps after the previous column's
    (thinned points and windows are labelled with their last step)."""
    if first_steady is None:
        return 0
    gap = steps[1] - steps[0] if len(steps) > 1 else 1  # the first column's width, as the next's
    for i, step in enumerate(steps):
        start = steps[i - 1] + 1 if i else step - (gap - 1)
        if start >= first_steady:
            return i
    return 0


def _mark_slowest(analysis: RunAnalysis, ax: Any, ranks: list[int]) -> None:
    """Name the straggler (or else the slowest rank) on its row: one row of 1,024 is otherwise lost."""
    straggler = straggler_rank(analysis)
    slowest = analysis.ranks.slowest[0].rank if analysis.ranks.slowest else None
    rank = straggler if straggler in ranks else slowest if slowest in ranks else None
    if rank is None:
        return
    row = ranks.index(rank)
    what = "straggler" if rank == straggler else "slowest"
    ax.annotate(
        f"rank {rank}: {what}",
        (0.0, row),
        xycoords=("axes fraction", "data"),
        xytext=(4, 0),
        textcoords="offset points",
        ha="left",
        va="center",
        fontsize=8,
        color="white",
        fontweight="bold",
        bbox={"boxstyle": "round,pad=0.2", "fc": STRAGGLER_COLOR, "ec": "none", "alpha": 0.9},
    )


def _label_hosts(analysis: RunAnalysis, ax: Any, ranks: list[int]) -> None:
    """Rank ticks at host boundaries, few enough to read; boundary lines while they stay apart."""
    hosts = [analysis.run.hosts.get(str(r)) for r in ranks]
    starts = [i for i, h in enumerate(hosts) if i == 0 or h != hosts[i - 1]]
    n = len(ranks)
    if len(starts) <= 1 or len(starts) > n // 2 or any(h is None for h in hosts):
        # One host, or hosts that do not group ranks: plain rank numbers.
        step = every(n, RANK_LABELS)
        ticks = list(range(0, n, step))
        ax.set_yticks(ticks, [str(ranks[i]) for i in ticks])
        return
    if len(starts) <= HOST_LINES:
        for i in starts[1:]:
            ax.axhline(i - 0.5, color="white", lw=0.6, alpha=0.8)
    shown = starts[:: every(len(starts), RANK_LABELS)]
    ax.set_yticks(shown, [f"{_short(hosts[i])} · {ranks[i]}" for i in shown])
    ax.set_ylabel("host · first rank")
    if len(starts) > HOST_LINES:
        # Every boundary as a short tick, the lines themselves would bury rows of a pixel each.
        ax.set_yticks([i - 0.5 for i in starts], minor=True)
        ax.tick_params(axis="y", which="minor", length=2)


def _short(name: str | None, limit: int = 18) -> str:
    name = text(name)
    return name if len(name) <= limit else name[: limit - 1] + "…"
