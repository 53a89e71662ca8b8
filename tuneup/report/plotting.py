"""What the report's figures share: size, style, colours, legends, axes, and saving a PNG safely.

Each section module draws its own figures from the typed analysis (`Plot`); `tuneup.report.sections`
writes them all (`render_plots`). A figure without data (no GPUs, no loss, a single step) is skipped.

Drawing goes through `matplotlib.figure.Figure` with an explicit Agg canvas instead of pyplot:
pyplot keeps a global registry of open figures (the memory that grows when one forgets
`plt.close`), and `matplotlib.use("Agg")` after pyplot is loaded switches the caller's backend and
closes all of their open figures, which would hurt anyone calling this from a notebook. Without
pyplot no display is ever needed and the caller's matplotlib state is left alone.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneup._stats import number
from tuneup.analyze.model import RunAnalysis
from tuneup.record.schema import STEP_TIME_LINES

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

WIDTH_PX = 900
HEIGHT_PX = 450
DPI = 110
# Stacked panels need more height than one plot to keep each panel's ticks readable.
PANEL_HEIGHT_PX = 210

# The step's phases, then tuneup's own time (the record's one list): stacked in this order, they add up to
# the step, as the step-time table's lines do.
PHASE_ORDER = STEP_TIME_LINES
# Okabe-Ito colours: distinguishable with the common colour-vision deficiencies. Other renderers
# (HTML tables, Markdown legends) should take phase colours from here so every figure agrees.
PHASE_COLORS: dict[str, str] = {
    "data": "#E69F00",
    "forward": "#56B4E9",
    "backward": "#0072B2",
    "optimizer": "#009E73",
    "sync": "#CC79A7",
    "other": "#B0B0B0",
    "tuneup": "#F0E442",
}
if set(PHASE_COLORS) != set(PHASE_ORDER):
    raise ImportError("tuneup.report.plotting: PHASE_COLORS must give every phase of PHASE_ORDER a colour")
# Text drawn on top of a phase's bar segment: dark on the light colours, white on the dark ones.
PHASE_TEXT_COLORS = {
    "data": "black",
    "forward": "black",
    "backward": "white",
    "optimizer": "white",
    "sync": "black",
}
STRAGGLER_COLOR = "#D55E00"
RANK_BOX_COLOR = "#9CC3E0"
SAMPLES_COLOR = "#0072B2"
TOKENS_COLOR = "#CC79A7"
WARMUP_COLOR = "#D9D9D9"
SENT_COLOR = "#009E73"
# Past this many series a legend stops being readable: ranks get a colour bar instead.
MAX_LEGEND_ENTRIES = 16
# Tokens per sample that vary less than this are a constant: tokens/s is then a relabelled
# samples/s axis rather than a second line drawn exactly on top of the first.
CONSTANT_RATIO_TOLERANCE = 0.005
# A host whose traffic outside loopback never reaches this (MB/s) trained on one machine: a panel of
# zeros would take a third of the figure to say so, so the caption says it instead.
IDLE_NETWORK_MB_S = 0.01

# Applied on top of matplotlib's defaults, so a user's matplotlibrc (dark styles, usetex) cannot
# change the report. parse_math off: host and model names are data, and a `$` in one must render
# as a `$`, not start mathtext (which raises on what it cannot parse). usetex off for the same reason.
STYLE: dict[str, Any] = {
    "text.parse_math": False,
    "text.usetex": False,
    "font.size": 9.5,
    "axes.titlesize": 11.5,
    "axes.titleweight": "bold",
    "figure.titlesize": 11.5,
    "figure.titleweight": "bold",
    "axes.labelsize": 9.5,
    "legend.fontsize": 8.5,
    "legend.framealpha": 0.9,
    "axes.grid": True,
    "grid.alpha": 0.35,
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.2,
    "savefig.dpi": DPI,
    "figure.dpi": DPI,
}


@dataclass(slots=True)
class Drawn:
    """A figure ready to save, with the words the report shows next to it."""

    figure: Figure
    title: str
    caption: str


@dataclass(frozen=True, slots=True)
class Plot:
    """One figure of a section: its file name and how to draw it from the analysis (None: no data)."""

    name: str
    draw: Callable[[RunAnalysis], Drawn | None]


# ---------------------------------------------------------------------------------------------------
# Reading series: a point whose value is missing (None) or not finite is left out.


def num(value: Any) -> float | None:
    return number(value)


def _as_list(value: Any) -> list[Any]:
    # Not named `list`: that would shadow the builtin for this whole module (isinstance, the legends).
    return value if isinstance(value, list) else []


def xy(xs: Any, ys: Any) -> tuple[list[float], list[float]]:
    """Pairs where both values are finite numbers, in order."""
    out_x: list[float] = []
    out_y: list[float] = []
    for x, y in zip(_as_list(xs), _as_list(ys), strict=False):
        fx, fy = num(x), num(y)
        if fx is not None and fy is not None:
            out_x.append(fx)
            out_y.append(fy)
    return out_x, out_y


def fmt(value: float) -> str:
    """A number with the digits a reader needs: 1234, 123, 12.3, 1.23."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def enough(xs: Sequence[float]) -> bool:
    # One point draws no line; a plot of it says nothing the report's tables do not.
    return len(xs) >= 2


# ---------------------------------------------------------------------------------------------------
# Drawing helpers.


def figure(rows: int = 1, height_px: int = HEIGHT_PX) -> tuple[Figure, list[Axes]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_PX / DPI, height_px / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0].tolist()
    return fig, axes


def save(fig: Figure, path: Path) -> None:
    # Written beside the target and renamed, so a crash never leaves a half-written PNG in a report.
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, format="png", dpi=DPI)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        # Drops every artist now rather than when the cyclic collector gets to the figure.
        fig.clear()


def palette(n: int) -> list[Any]:
    """n colours that a legend can tell apart, or an ordered ramp when a colour bar must do it."""
    from matplotlib import colormaps

    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= MAX_LEGEND_ENTRIES:
        return [colormaps["tab20"](i) for i in range(n)]
    return [colormaps["viridis"](0.9 * i / (n - 1)) for i in range(n)]


def rank_colors(ranks: Sequence[int]) -> dict[int, Any]:
    """One colour per rank, the same in every figure of a report."""
    ordered = sorted(set(ranks))
    return dict(zip(ordered, palette(len(ordered)), strict=True))


def rank_colour_bar(fig: Figure, axes: list[Axes], colors: dict[int, Any], ranks: Sequence[int]) -> None:
    """Which colour is which rank, for more ranks than a legend can list."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm, ListedColormap

    ordered = sorted(ranks)
    cmap = ListedColormap([colors.get(r, "grey") for r in ordered])
    norm = BoundaryNorm([*(r - 0.5 for r in ordered), ordered[-1] + 0.5], cmap.N)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes, label="rank", aspect=40)
    # Ticks on ranks, not on the half-way boundaries between their colours.
    bar.set_ticks(ordered[:: max(1, math.ceil(len(ordered) / 10))])


def side_legend(ax: Axes, handles: Sequence[Any]) -> None:
    """A legend beside a single plot rather than on its lines."""
    ax.legend(handles=list(handles), loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def bottom_legend(fig: Figure, handles: Sequence[Any]) -> None:
    """A legend under the plot, in as many columns as fit.

    Under stacked panels it is the only good place: beside them it would either widen one panel's row
    (constrained layout sizes rows to fit an axes legend) or, as a figure legend at the top right, run
    into the figure's title.
    """
    longest = max(len(str(h.get_label())) for h in handles)
    # About 6.5 px a character at the legend's font size, plus the line sample and the gaps.
    per_entry_px = 6.5 * longest + 50
    ncols = max(1, min(len(handles), int((WIDTH_PX - 40) // per_entry_px)))
    fig.legend(handles=list(handles), loc="outside lower center", ncols=ncols)


def proxy(color: Any, label: str, ls: str = "-") -> Any:
    from matplotlib.lines import Line2D

    return Line2D([], [], color=color, ls=ls, lw=1.5, label=label)


def rate_formatter() -> Any:
    from matplotlib.ticker import EngFormatter

    # 26k and 1.2M read faster than 26000 or a 1e6 offset at the top of the axis.
    return EngFormatter(sep="")


def plain_log_axis(ax: Axes) -> None:
    """Label a log axis 1, 2, 5, 10, 20 ... in plain digits.

    matplotlib's log labels are mathtext (10^2), which the style turns off for the sake of literal
    `$` in names: left alone they would print as `$\\mathdefault{10^{2}}$`.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def run_ranks(analysis: RunAnalysis) -> list[int]:
    """Every rank the analysis speaks of, for one colour per rank across the report's figures."""
    ranks = set(analysis.run.ranks_present)
    ranks.update(int(r) for r in analysis.timeseries.per_rank if r.lstrip("-").isdigit())
    ranks.update(r.rank for r in analysis.step_time.per_rank)
    ranks.update(p.rank for p in analysis.telemetry.processes)
    return sorted(ranks)


def straggler_rank(analysis: RunAnalysis) -> int | None:
    straggler = analysis.ranks.straggler
    return None if straggler is None else straggler.rank


def shade_warmup(ax: Axes, analysis: RunAnalysis, xs: Sequence[float]) -> Any | None:
    """Shade the steps before the first steady step; the handle for the legend, or None when none were."""
    first = analysis.warmup.first_steady_step
    if first is None or not xs or first <= min(xs):
        return None
    # Steps are integers: the span covers each warm-up step's half-step on either side.
    left, right = min(xs) - 0.5, min(first, max(xs) + 1) - 0.5
    return ax.axvspan(left, right, color=WARMUP_COLOR, alpha=0.7, lw=0, zorder=0, label="warm-up (left out)")
