"""`step_time.png` for the Over the run section: every training step's wall-clock time, per rank.

Up to MAX_LEGEND_ENTRIES ranks, one line per rank with a legend. Beyond, 1,024 lines would be a solid
smear with a legend nobody can read: the figure shows the median rank's step time at each step with the
5th-95th percentile of the ranks as a band (and the fastest-to-slowest as a lighter one), plus the
straggler's own line when there is one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuneup.analyze.model import RunAnalysis
from tuneup.report.plotting import (
    MAX_LEGEND_ENTRIES,
    SAMPLES_COLOR,
    STRAGGLER_COLOR,
    Drawn,
    bottom_legend,
    enough,
    figure,
    fmt,
    rank_colors,
    run_ranks,
    shade_warmup,
    side_legend,
    straggler_rank,
    xy,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# The spread view evaluates every rank on one grid of steps: at most this many points across.
MAX_GRID_POINTS = 2000

Line = tuple[list[float], list[float]]


def step_axis_label(analysis: RunAnalysis) -> str:
    windows = analysis.timeseries.source == "windows"
    return "training step" + (" (end of each window of steps)" if windows else "")


def draw_step_time(analysis: RunAnalysis) -> Drawn | None:
    lines: dict[int, Line] = {}
    for key, series in analysis.timeseries.per_rank.items():
        if not key.lstrip("-").isdigit():
            continue
        xs, ys = xy(series.step, series.step_time_ms)
        if enough(xs):
            lines[int(key)] = (xs, ys)
    if not lines:
        return None
    ranks = sorted(lines)
    straggler = straggler_rank(analysis)
    fig, (ax,) = figure()
    warm = shade_warmup(ax, analysis, [x for xs, _ in lines.values() for x in xs])
    if len(ranks) > MAX_LEGEND_ENTRIES:
        shown, handles, how = _draw_spread(ax, lines, straggler)
        who = f"the {len(ranks):,} ranks"
        notes = [
            "spikes are slow steps",
            "a light band reaching far above the dark one is a few slow ranks",
        ]
        if warm is not None:
            handles.insert(0, warm)
        # Under the plot: the bands fill the axes, and a legend inside would cover them.
        bottom_legend(fig, handles)
        title = f"Step time across {len(ranks):,} ranks"
    else:
        how = ""
        shown = _draw_per_rank(ax, analysis, lines, straggler)
        who = "the one rank" if len(ranks) == 1 else f"each of the {len(ranks)} ranks"
        notes = ["spikes are slow steps"]
        if len(ranks) > 1:
            notes.append("a line above the others is a slow rank")
        handles = [*([warm] if warm is not None else []), *ax.get_lines()]
        if len(handles) > 1:
            side_legend(ax, handles)
        title = "Step time per rank"
    clipped = clip_warmup_peak(ax, analysis, shown)
    if clipped:
        notes.append(f"warm-up steps up to {fmt(clipped)} ms run off the top")
    ax.set_ylim(bottom=0)
    windows = analysis.timeseries.source == "windows"
    ax.set_xlabel(step_axis_label(analysis))
    ax.set_ylabel("step time (ms)" + (", window mean" if windows else ""))
    ax.set_title(title)
    listed = ", ".join(notes[:-1]) + " and " + notes[-1] if len(notes) > 1 else notes[0]
    return Drawn(
        fig,
        title,
        f"Wall-clock time of every training step on {who}, where lower is better: {how}{listed}.",
    )


def _draw_per_rank(
    ax: Axes, analysis: RunAnalysis, lines: dict[int, Line], straggler: int | None
) -> list[Line]:
    colors = rank_colors(run_ranks(analysis) or sorted(lines))
    many = len(lines) > 4
    for rank in sorted(lines):
        xs, ys = lines[rank]
        is_straggler = rank == straggler
        ax.plot(
            xs,
            ys,
            color=colors.get(rank, "grey"),
            lw=(0.7 if many else 1.1) * (1.6 if is_straggler else 1.0),
            alpha=0.75 if many else 0.9,
            label=f"rank {rank}" + (" (straggler)" if is_straggler else ""),
            gid=str(rank),
            zorder=3 if is_straggler else 2,
        )
    return list(lines.values())


def _draw_spread(
    ax: Axes, lines: dict[int, Line], straggler: int | None
) -> tuple[list[Line], list[Any], str]:
    """The median rank at each step, the p5-p95 and min-max bands; what was drawn, legend handles, and the
    caption's words for it."""
    import numpy as np

    steps = np.unique(np.concatenate([np.asarray(xs) for xs, _ in lines.values()]))
    if len(steps) > MAX_GRID_POINTS:
        steps = steps[np.linspace(0, len(steps) - 1, MAX_GRID_POINTS).round().astype(int)]
    grid = np.full((len(lines), len(steps)), np.nan)
    for i, (xs, ys) in enumerate(lines.values()):
        order = np.argsort(xs)
        x, y = np.asarray(xs)[order], np.asarray(ys)[order]
        # Each rank only over the steps it covers: no invented values beyond its first and last point.
        inside = (steps >= x[0]) & (steps <= x[-1])
        grid[i, inside] = np.interp(steps[inside], x, y)
    covered = ~np.isnan(grid).all(axis=0)
    steps, grid = steps[covered], grid[:, covered]
    low, p5, median, p95, high = np.nanpercentile(grid, [0, 5, 50, 95, 100], axis=0)
    xs = steps.tolist()
    handles: list[Any] = [
        ax.fill_between(
            xs, low, high, color=SAMPLES_COLOR, alpha=0.15, lw=0, label="fastest to slowest rank"
        ),
        ax.fill_between(xs, p5, p95, color=SAMPLES_COLOR, alpha=0.35, lw=0, label="p5 to p95 of the ranks"),
    ]
    (mid,) = ax.plot(xs, median, color=SAMPLES_COLOR, lw=1.1, label="median rank")
    handles.append(mid)
    shown: list[Line] = [(xs, high.tolist()), (xs, median.tolist())]
    how = (
        "the line is the median rank's step time at each step, the dark band spans the 5th to 95th "
        "percentile of the ranks and the light band the fastest to the slowest"
    )
    if straggler is not None and straggler in lines:
        sx, sy = lines[straggler]
        (line,) = ax.plot(
            sx, sy, color=STRAGGLER_COLOR, lw=0.9, alpha=0.9, label=f"rank {straggler} (straggler)"
        )
        handles.append(line)
        shown.append((sx, sy))
        how += f", with the straggler, rank {straggler}, drawn on its own"
    return shown, handles, how + "; "


def clip_warmup_peak(ax: Axes, analysis: RunAnalysis, lines: list[Line]) -> float | None:
    """Keep a slow first step (compilation, cuDNN autotuning) from flattening the steady steps.

    Returns the clipped-off peak in ms, or None when nothing was clipped.
    """
    first = analysis.warmup.first_steady_step
    if first is None:
        return None
    steady = [y for xs, ys in lines for x, y in zip(xs, ys, strict=True) if x >= first]
    warm = [(y, x) for xs, ys in lines for x, y in zip(xs, ys, strict=True) if x < first]
    if not steady or not warm or max(warm)[0] <= 2.0 * max(steady):
        return None
    peak, at_step = max(warm)
    top = max(steady) * 1.15
    ax.set_ylim(0, top)
    # Said on the plot too: a line leaving through the top edge otherwise looks like a drawing error.
    ax.annotate(
        f"\u2191 {fmt(peak)} ms",
        (at_step, top),
        xytext=(4, -3),
        textcoords="offset points",
        ha="left",
        va="top",
        fontsize=8,
    )
    return peak
