"""The report's figures: one PNG per question, drawn from the report dict (`analyze_run`) alone.

`render_plots(report, out_dir)` writes every figure whose data the run has and returns a `PlotFile`
for each; a figure without data (no GPUs, no loss, a single step) is skipped, never raised.

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

from tuneup._log import logger
from tuneup.report.artifacts import PlotFile
from tuneup.report.artifacts import dig as _dig

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

WIDTH_PX = 900
HEIGHT_PX = 450
DPI = 110
# Stacked panels need more height than one plot to keep each panel's ticks readable.
PANEL_HEIGHT_PX = 210

PHASE_ORDER = ("data", "forward", "backward", "optimizer", "other")
# Okabe-Ito colours: distinguishable with the common colour-vision deficiencies. Other renderers
# (HTML tables, Markdown legends) should take phase colours from here so every figure agrees.
PHASE_COLORS: dict[str, str] = {
    "data": "#E69F00",
    "forward": "#56B4E9",
    "backward": "#0072B2",
    "optimizer": "#009E73",
    "other": "#B0B0B0",
}
# Text drawn on top of a phase's bar segment: dark on the light colours, white on the dark ones.
_PHASE_TEXT_COLORS = {"data": "black", "forward": "black", "backward": "white", "optimizer": "white"}
STRAGGLER_COLOR = "#D55E00"
_RANK_BOX_COLOR = "#9CC3E0"
_SAMPLES_COLOR = "#0072B2"
_TOKENS_COLOR = "#CC79A7"
_WARMUP_COLOR = "#D9D9D9"
_SENT_COLOR = "#009E73"
# Past this many series a legend stops being readable: ranks get a colour bar instead.
MAX_LEGEND_ENTRIES = 16
# Tokens per sample that vary less than this are a constant: tokens/s is then a relabelled
# samples/s axis rather than a second line drawn exactly on top of the first.
_CONSTANT_RATIO_TOLERANCE = 0.005
# A host whose traffic outside loopback never reaches this (MB/s) trained on one machine: a panel of
# zeros would take a third of the figure to say so, so the caption says it instead.
IDLE_NETWORK_MB_S = 0.01

# Applied on top of matplotlib's defaults, so a user's matplotlibrc (dark styles, usetex) cannot
# change the report. parse_math off: host and model names are data, and a `$` in one must render
# as a `$`, not start mathtext (which raises on what it cannot parse). usetex off for the same reason.
_STYLE: dict[str, Any] = {
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
class _Drawn:
    """A figure ready to save, with the words the report shows next to it."""

    figure: Figure
    title: str
    caption: str


@dataclass(frozen=True, slots=True)
class _Plot:
    name: str
    section: str
    draw: Callable[[dict[str, Any]], _Drawn | None]


def render_plots(report: dict[str, Any], out_dir: Path) -> list[PlotFile]:
    """Write the report's figures as PNGs into `out_dir`; one `PlotFile` per figure written, in page order.

    A figure whose data is missing is skipped. A figure that fails to draw is skipped with a warning:
    one bad figure must not cost the user the whole report.
    """
    import matplotlib  # imported here so that importing tuneup.report stays cheap
    import matplotlib.style

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[PlotFile] = []
    with matplotlib.rc_context(), matplotlib.style.context(["default", _STYLE]):
        for plot in _PLOTS:
            path = out_dir / plot.name
            try:
                drawn = plot.draw(report)
                if drawn is not None:
                    _save(drawn.figure, path)
            except Exception as exc:
                logger.warning("tuneup: plot %s was not drawn: %s: %s", plot.name, type(exc).__name__, exc)
                drawn = None
            if drawn is None:
                # A figure from an earlier report in the same folder would otherwise sit there
                # looking current.
                path.unlink(missing_ok=True)
                continue
            written.append(PlotFile(plot.name, path, drawn.title, plot.section, drawn.caption))
    return written


# ---------------------------------------------------------------------------------------------------
# Reading the report dict: every value may be missing, None, or the wrong type in a damaged report.


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _xy(xs: Any, ys: Any) -> tuple[list[float], list[float]]:
    """Pairs where both values are finite numbers, in order."""
    out_x: list[float] = []
    out_y: list[float] = []
    for x, y in zip(_list(xs), _list(ys), strict=False):
        fx, fy = _num(x), _num(y)
        if fx is not None and fy is not None:
            out_x.append(fx)
            out_y.append(fy)
    return out_x, out_y


def _series(obj: Any, name: str, scale: float = 1.0) -> tuple[list[float], list[float]]:
    xs, ys = _xy(_dig(obj, "series", name, "t_s"), _dig(obj, "series", name, "values"))
    return xs, [y * scale for y in ys]


def _rank(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


def _straggler(report: dict[str, Any]) -> int | None:
    return _rank(_dig(report, "ranks", "straggler", "rank"))


def _fmt(value: float) -> str:
    """A number with the digits a reader needs: 1234, 123, 12.3, 1.23."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _enough(xs: Sequence[float]) -> bool:
    # One point draws no line; a plot of it says nothing the report's tables do not.
    return len(xs) >= 2


# ---------------------------------------------------------------------------------------------------
# Drawing helpers.


def _figure(rows: int = 1, height_px: int = HEIGHT_PX) -> tuple[Figure, list[Axes]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_PX / DPI, height_px / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0].tolist()
    return fig, axes


def _save(fig: Figure, path: Path) -> None:
    # Written beside the target and renamed, so a crash never leaves a half-written PNG in a report.
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, format="png", dpi=DPI)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        # Drops every artist now rather than when the cyclic collector gets to the figure.
        fig.clear()


def _palette(n: int) -> list[Any]:
    """n colours that a legend can tell apart, or an ordered ramp when a colour bar must do it."""
    from matplotlib import colormaps

    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= MAX_LEGEND_ENTRIES:
        return [colormaps["tab20"](i) for i in range(n)]
    return [colormaps["viridis"](0.9 * i / (n - 1)) for i in range(n)]


def _rank_colors(ranks: Sequence[int]) -> dict[int, Any]:
    """One colour per rank, the same in every figure of a report."""
    ordered = sorted(set(ranks))
    return dict(zip(ordered, _palette(len(ordered)), strict=True))


def _report_ranks(report: dict[str, Any]) -> list[int]:
    ranks = {r for r in (_rank(x) for x in _list(_dig(report, "run", "ranks_present"))) if r is not None}
    per_rank = _dig(report, "timeseries", "per_rank")
    if isinstance(per_rank, dict):
        ranks.update(r for r in (_rank(k) for k in per_rank) if r is not None)
    for entry in _list(_dig(report, "step_time", "per_rank")):
        if (r := _rank(_dig(entry, "rank"))) is not None:
            ranks.add(r)
    for entry in _list(_dig(report, "telemetry", "processes")):
        if (r := _rank(_dig(entry, "rank"))) is not None:
            ranks.add(r)
    return sorted(ranks)


def _rank_colour_bar(fig: Figure, axes: list[Axes], colors: dict[int, Any], ranks: Sequence[int]) -> None:
    """Which colour is which rank, for more ranks than a legend can list."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm, ListedColormap

    ordered = sorted(ranks)
    cmap = ListedColormap([colors.get(r, "grey") for r in ordered])
    norm = BoundaryNorm([*(r - 0.5 for r in ordered), ordered[-1] + 0.5], cmap.N)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes, label="rank", aspect=40)
    # Ticks on ranks, not on the half-way boundaries between their colours.
    bar.set_ticks(ordered[:: max(1, math.ceil(len(ordered) / 10))])


def _side_legend(ax: Axes, handles: Sequence[Any]) -> None:
    """A legend beside a single plot rather than on its lines."""
    ax.legend(handles=list(handles), loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _bottom_legend(fig: Figure, handles: Sequence[Any]) -> None:
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


def _proxy(color: Any, label: str, ls: str = "-") -> Any:
    from matplotlib.lines import Line2D

    return Line2D([], [], color=color, ls=ls, lw=1.5, label=label)


def _shade_warmup(ax: Axes, report: dict[str, Any], xs: Sequence[float]) -> Any | None:
    """Shade the steps before the first steady step; the handle for the legend, or None when none were."""
    first = _num(_dig(report, "warmup", "first_steady_step"))
    if first is None or not xs or first <= min(xs):
        return None
    # Steps are integers: the span covers each warm-up step's half-step on either side.
    left, right = min(xs) - 0.5, min(first, max(xs) + 1) - 0.5
    return ax.axvspan(left, right, color=_WARMUP_COLOR, alpha=0.7, lw=0, zorder=0, label="warm-up (left out)")


def _rate_formatter() -> Any:
    from matplotlib.ticker import EngFormatter

    # 26k and 1.2M read faster than 26000 or a 1e6 offset at the top of the axis.
    return EngFormatter(sep="")


def _plain_log_axis(ax: Axes) -> None:
    """Label a log axis 1, 2, 5, 10, 20 ... in plain digits.

    matplotlib's log labels are mathtext (10^2), which the style turns off for the sake of literal
    `$` in names: left alone they would print as `$\\mathdefault{10^{2}}$`.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


# ---------------------------------------------------------------------------------------------------
# The figures.


def _draw_throughput(report: dict[str, Any]) -> _Drawn | None:
    tp = _dig(report, "timeseries", "throughput")
    sx, sy = _xy(_dig(tp, "step"), _dig(tp, "samples_per_s"))
    tx, ty = _xy(_dig(tp, "step"), _dig(tp, "tokens_per_s"))
    has_samples, has_tokens = _enough(sx), _enough(tx)
    if not (has_samples or has_tokens):
        return None
    fig, (ax,) = _figure()
    windows = _dig(report, "timeseries", "source") == "windows"
    handles: list[Any] = []
    warm = _shade_warmup(ax, report, sx or tx)
    if warm is not None:
        handles.append(warm)
    token_note = ""
    if has_samples:
        (line,) = ax.plot(sx, sy, color=_SAMPLES_COLOR, lw=1.0, label="samples/s")
        handles.append(line)
        ax.set_ylabel("samples/s, all ranks")
        steady = _num(_dig(report, "throughput", "samples_per_s"))
        if steady:
            handles.append(
                ax.axhline(
                    steady,
                    color="black",
                    ls="--",
                    lw=1.0,
                    alpha=0.7,
                    label=f"steady-state rate: {_fmt(steady)} samples/s",
                )
            )
        if has_tokens:
            ratio = _constant_ratio(sx, sy, tx, ty)
            if ratio is not None:
                # Same curve on a second scale: one line, two sets of ticks.
                sec = ax.secondary_yaxis("right", functions=(lambda v: v * ratio, lambda v: v / ratio))
                sec.set_ylabel(f"tokens/s, all ranks ({ratio:.4g} tokens per sample)")
                sec.yaxis.set_major_formatter(_rate_formatter())
                token_note = "; the right axis reads the same line in tokens/s"
            else:
                ax2 = ax.twinx()
                ax2.grid(False)
                ax2.spines["right"].set_visible(True)
                (tline,) = ax2.plot(tx, ty, color=_TOKENS_COLOR, lw=0.9, alpha=0.85, label="tokens/s")
                handles.append(tline)
                ax2.set_ylabel("tokens/s, all ranks", color=_TOKENS_COLOR)
                ax2.set_ylim(bottom=0)
                ax2.yaxis.set_major_formatter(_rate_formatter())
                token_note = "; tokens/s (pink, right axis) moves apart from it as sequence lengths vary"
    else:
        (line,) = ax.plot(tx, ty, color=_TOKENS_COLOR, lw=1.0, label="tokens/s")
        handles.append(line)
        ax.set_ylabel("tokens/s, all ranks")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(_rate_formatter())
    ax.set_xlabel("optimizer step" + (" (end of each window of steps)" if windows else ""))
    title = "Throughput over the run"
    ax.set_title(title)
    if len(handles) > 1:
        # Below the plot: inside, it would sit on the line wherever throughput dips.
        _bottom_legend(fig, handles)
    notes = []
    if has_samples and _num(_dig(report, "throughput", "samples_per_s")):
        notes.append("the dashed line is the steady-state rate the report quotes")
    if warm is not None:
        notes.append("the shaded warm-up steps are left out of the report's rates")
    note = "".join(f"; {n}" for n in notes)
    what = "samples" if has_samples else "tokens"
    return _Drawn(
        fig,
        title,
        f"Training speed of all ranks together in {what} per second at each optimizer step, where "
        f"higher is better and dips are slow steps{note}{token_note}.",
    )


def _constant_ratio(sx: list[float], sy: list[float], tx: list[float], ty: list[float]) -> float | None:
    samples = {x: y for x, y in zip(sx, sy, strict=True) if y > 0}
    ratios = [t / samples[x] for x, t in zip(tx, ty, strict=True) if x in samples]
    if len(ratios) < 2:
        return None
    mid = sorted(ratios)[len(ratios) // 2]
    if mid <= 0 or any(abs(r - mid) > _CONSTANT_RATIO_TOLERANCE * mid for r in ratios):
        return None
    return mid


def _draw_step_time(report: dict[str, Any]) -> _Drawn | None:
    per_rank = _dig(report, "timeseries", "per_rank")
    if not isinstance(per_rank, dict):
        return None
    lines: dict[int, tuple[list[float], list[float]]] = {}
    for key, series in per_rank.items():
        rank = _rank(key)
        xs, ys = _xy(_dig(series, "step"), _dig(series, "step_time_ms"))
        if rank is not None and _enough(xs):
            lines[rank] = (xs, ys)
    if not lines:
        return None
    ranks = sorted(lines)
    colors = _rank_colors(_report_ranks(report) or ranks)
    straggler = _straggler(report)
    fig, (ax,) = _figure()
    many = len(ranks) > 4
    all_x = [x for xs, _ in lines.values() for x in xs]
    warm = _shade_warmup(ax, report, all_x)
    for rank in ranks:
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
    clipped = _clip_warmup_peak(ax, report, lines)
    ax.set_ylim(bottom=0)
    windows = _dig(report, "timeseries", "source") == "windows"
    ax.set_xlabel("optimizer step" + (" (end of each window of steps)" if windows else ""))
    ax.set_ylabel("step time (ms)" + (", window mean" if windows else ""))
    title = "Step time per rank"
    ax.set_title(title)
    colour_bar = len(ranks) > MAX_LEGEND_ENTRIES
    if colour_bar:
        _rank_colour_bar(fig, [ax], colors, ranks)
        if warm is not None:
            ax.legend(handles=[warm], loc="lower right")
    else:
        handles = [*([warm] if warm is not None else []), *ax.get_lines()]
        if len(handles) > 1:
            _side_legend(ax, handles)
    notes = ["spikes are slow steps"]
    if len(ranks) > 1:
        notes.append("a line above the others is a slow rank")
    if colour_bar:
        notes.append("the colour bar maps colours to ranks")
    if clipped:
        notes.append(f"warm-up steps up to {_fmt(clipped)} ms run off the top")
    who = "the one rank" if len(ranks) == 1 else f"each of the {len(ranks)} ranks"
    return _Drawn(
        fig,
        title,
        f"Wall-clock time of every optimizer step on {who}, where lower is better: "
        f"{', '.join(notes[:-1]) + ' and ' + notes[-1] if len(notes) > 1 else notes[0]}.",
    )


def _clip_warmup_peak(
    ax: Axes, report: dict[str, Any], lines: dict[int, tuple[list[float], list[float]]]
) -> float | None:
    """Keep a slow first step (compilation, cuDNN autotuning) from flattening the steady steps.

    Returns the clipped-off peak in ms, or None when nothing was clipped.
    """
    first = _num(_dig(report, "warmup", "first_steady_step"))
    if first is None:
        return None
    steady = [y for xs, ys in lines.values() for x, y in zip(xs, ys, strict=True) if x >= first]
    warm = [(y, x) for xs, ys in lines.values() for x, y in zip(xs, ys, strict=True) if x < first]
    if not steady or not warm or max(warm)[0] <= 2.0 * max(steady):
        return None
    peak, at_step = max(warm)
    top = max(steady) * 1.15
    ax.set_ylim(0, top)
    # Said on the plot too: a line leaving through the top edge otherwise looks like a drawing error.
    ax.annotate(
        f"\u2191 {_fmt(peak)} ms",
        (at_step, top),
        xytext=(4, -3),
        textcoords="offset points",
        ha="left",
        va="top",
        fontsize=8,
    )
    return peak


def _draw_loss(report: dict[str, Any]) -> _Drawn | None:
    xs, ys = _xy(_dig(report, "timeseries", "loss", "step"), _dig(report, "timeseries", "loss", "values"))
    if not _enough(xs):
        return None
    import numpy as np

    present = [r for r in (_rank(x) for x in _list(_dig(report, "run", "ranks_present"))) if r is not None]
    # analyze_run takes the loss from the lowest rank present.
    who = f"rank {min(present)}" if present else "one rank"
    windows = _dig(report, "timeseries", "source") == "windows"
    fig, (ax,) = _figure()
    smooth = len(xs) >= 50
    (raw,) = ax.plot(
        xs,
        ys,
        color="#0072B2",
        lw=0.8 if smooth else 1.2,
        alpha=0.45 if smooth else 1.0,
        label="loss per window" if windows else "loss per step",
    )
    handles = [raw]
    window = 0
    if smooth:
        window = max(5, len(xs) // 50)
        kernel = np.ones(window) / window
        mean = np.convolve(np.asarray(ys), kernel, mode="valid")
        # Centred on its points: a trailing mean lags a falling loss and appears to sit above it.
        start = (window - 1) // 2
        (avg,) = ax.plot(
            xs[start : start + len(mean)],
            mean,
            color="#0072B2",
            lw=1.6,
            label=f"moving mean of {window} points",
        )
        handles.append(avg)
    positive = min(ys) > 0
    log = positive and max(ys) / min(ys) >= 20
    if log:
        # A loss falling over orders of magnitude is a flat line on a linear axis after the first steps.
        ax.set_yscale("log")
        _plain_log_axis(ax)
    ax.set_xlabel("optimizer step" + (" (end of each window of steps)" if windows else ""))
    ax.set_ylabel(f"loss ({who}, as logged{', log scale' if log else ''})")
    title = "Training loss"
    ax.set_title(title)
    if len(handles) > 1:
        # Below the axes: a loss that climbs back up would run under a legend in a corner.
        _bottom_legend(fig, handles)
    smooth_note = f", with a moving mean over {window} points as the solid line" if smooth else ""
    return _Drawn(
        fig,
        title,
        f"The training loss {who} logged at each optimizer step, on the model's own scale"
        f"{' and a logarithmic axis' if log else ''}{smooth_note}; it should trend down.",
    )


def _draw_step_breakdown(report: dict[str, Any]) -> _Drawn | None:
    rows: list[tuple[int, dict[str, float]]] = []
    for entry in _list(_dig(report, "step_time", "per_rank")):
        rank = _rank(_dig(entry, "rank"))
        phases = _dig(entry, "phase_mean_ms")
        if rank is None or not isinstance(phases, dict):
            continue
        values = {p: max(0.0, _num(phases.get(p)) or 0.0) for p in PHASE_ORDER}
        if sum(values.values()) > 0:
            rows.append((rank, values))
    if not rows:
        return None
    rows.sort()
    straggler = _straggler(report)
    n = len(rows)
    fig, (ax,) = _figure(height_px=min(1400, max(HEIGHT_PX, 130 + 30 * n)))
    ys = list(range(n))
    totals = [sum(v.values()) for _, v in rows]
    x_max = max(totals)
    label_segments = n <= MAX_LEGEND_ENTRIES
    left = [0.0] * n
    for phase in PHASE_ORDER:
        widths = [v[phase] for _, v in rows]
        bars = ax.barh(ys, widths, left=left, height=0.7, color=PHASE_COLORS[phase], label=phase)
        if label_segments:
            for bar, w in zip(bars, widths, strict=True):
                # Only where the number fits inside its segment.
                if w >= 0.09 * x_max:
                    ax.text(
                        bar.get_x() + w / 2,
                        bar.get_y() + bar.get_height() / 2,
                        _fmt(w),
                        ha="center",
                        va="center",
                        fontsize=8,
                        color=_PHASE_TEXT_COLORS.get(phase, "black"),
                    )
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, total in zip(ys, totals, strict=True):
        ax.text(total + 0.01 * x_max, y, f"{_fmt(total)} ms", va="center", ha="left", fontsize=8.5)
    ax.set_xlim(0, x_max * 1.14)
    ax.set_yticks(ys, [f"rank {r}" + (" (straggler)" if r == straggler else "") for r, _ in rows])
    for tick, (r, _) in zip(ax.get_yticklabels(), rows, strict=True):
        if r == straggler:
            tick.set_color(STRAGGLER_COLOR)
            tick.set_fontweight("bold")
    ax.invert_yaxis()  # rank 0 on top, as the tables list it
    ax.grid(axis="y", visible=False)
    ax.set_axisbelow(True)  # grid lines behind the bars, not across the numbers on them
    ax.set_xlabel("mean time per optimizer step, steady steps (ms)")
    title = "Where each rank's step time goes"
    ax.set_title(title)
    fig.legend(loc="outside lower center", ncols=len(PHASE_ORDER), title=None)
    return _Drawn(
        fig,
        title,
        "Each bar is one rank's mean optimizer step after warm-up, split into data loading, forward, "
        "backward, optimizer and other time (ms, total at the bar's end); the longest segment is where "
        "tuning pays most.",
    )


def _draw_rank_step_time(report: dict[str, Any]) -> _Drawn | None:
    keys = ("min", "p5", "p25", "p50", "p75", "p95", "max")
    stats: list[dict[str, Any]] = []
    ranks: list[int] = []
    for entry in _list(_dig(report, "step_time", "per_rank")):
        rank = _rank(_dig(entry, "rank"))
        dist = _dig(entry, "distribution_ms")
        q = {k: _num(_dig(dist, k)) for k in keys}
        if rank is None or any(v is None for v in q.values()):
            continue
        stats.append(
            {
                "med": q["p50"],
                "q1": q["p25"],
                "q3": q["p75"],
                "whislo": q["p5"],
                "whishi": q["p95"],
                "fliers": [q["min"], q["max"]],
                "label": str(rank),
            }
        )
        ranks.append(rank)
    if not stats:
        return None
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    order = sorted(range(len(ranks)), key=lambda i: ranks[i])
    ranks = [ranks[i] for i in order]
    stats = [stats[i] for i in order]
    straggler = _straggler(report)
    fig, (ax,) = _figure()
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
        box.set_facecolor(STRAGGLER_COLOR if rank == straggler else _RANK_BOX_COLOR)
    step = max(1, math.ceil(len(ranks) / 32))  # keep tick labels from running into each other
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
        Patch(facecolor=_RANK_BOX_COLOR, edgecolor="0.3", label="p25 to p75, line at median"),
        Line2D([], [], color="0.3", label="whiskers: p5 to p95"),
        Line2D([], [], ls="", marker="o", markersize=4, mfc="white", mec="0.3", label="min and max"),
    ]
    title = "Step time distribution per rank"
    straggler_note = ""
    if straggler is not None and straggler in ranks:
        phase = _dig(report, "ranks", "straggler", "phase")
        what = f" (slow {phase})" if isinstance(phase, str) else ""
        handles.insert(
            0, Patch(facecolor=STRAGGLER_COLOR, edgecolor="0.3", label=f"rank {straggler}: straggler{what}")
        )
        title += f": rank {straggler} is the straggler"
        straggler_note = f", and rank {straggler}, highlighted, is the straggler that holds the others back"
    ax.set_title(title)
    # Below the axes: a rank whose fastest step is near zero would put its box under a legend inside.
    _bottom_legend(fig, handles)
    return _Drawn(
        fig,
        title,
        "Spread of step times after warm-up on each rank: the box spans the middle half of the steps "
        "(line at the median), whiskers reach the 5th and 95th percentiles and dots mark the fastest and "
        f"slowest step; boxes at different heights mean unevenly loaded ranks{straggler_note}.",
    )


def _gpu_label(gpu: dict[str, Any], multi_host: bool) -> str:
    index = gpu.get("index")
    name = f"GPU {index}" if isinstance(index, int) else "GPU"
    host = gpu.get("host")
    return f"{host} {name}" if multi_host and isinstance(host, str) else name


def _draw_gpu(report: dict[str, Any]) -> _Drawn | None:
    gpus = [g for g in _list(_dig(report, "telemetry", "gpus")) if isinstance(g, dict)]
    if not gpus:
        return None
    panels = (
        ("util_percent", 1.0, "utilization (%)"),
        ("power_w", 1.0, "power (W)"),
        ("mem_used_bytes", 1 / 2**30, "memory used (GiB)"),
    )
    data = {name: [(g, _series(g, name, scale)) for g in gpus] for name, scale, _ in panels}
    shown = [p for p in panels if any(_enough(xs) for _, (xs, _) in data[p[0]])]
    if not shown:
        return None
    multi_host = len({g.get("host") for g in gpus}) > 1
    colors = _palette(len(gpus))
    fig, axes = _figure(rows=len(shown), height_px=90 + PANEL_HEIGHT_PX * len(shown))
    thin = len(gpus) > 4
    for ax, (name, scale, label) in zip(axes, shown, strict=True):
        for color, (gpu, (xs, ys)) in zip(colors, data[name], strict=True):
            if xs:
                ax.plot(xs, ys, color=color, lw=0.8 if thin else 1.2, label=_gpu_label(gpu, multi_host))
        ax.set_ylabel(label)
        if name == "util_percent":
            ax.set_ylim(0, 105)
        else:
            ax.set_ylim(bottom=0)
        if name == "mem_used_bytes":
            totals = {t for g in gpus if (t := _num(g.get("mem_total_bytes"))) is not None}
            # One capacity line when the GPUs agree; mixed GPUs would need one per GPU, which clutters.
            if len(totals) == 1:
                cap = totals.pop() * scale
                peak = max((y for _, (_, ys) in data[name] for y in ys), default=0.0)
                ax.axhline(cap, color="black", ls="--", lw=1.0, alpha=0.7)
                ax.annotate(
                    f"capacity {cap:.0f} GiB",
                    (1.0, cap),
                    xycoords=("axes fraction", "data"),
                    xytext=(-4, -3),
                    textcoords="offset points",
                    ha="right",
                    va="top",
                    fontsize=8,
                )
                ax.set_ylim(0, max(cap, peak) * 1.08)
    axes[-1].set_xlabel("time since the run started (s)")
    title = "GPU utilization, power and memory"
    fig.suptitle(title)
    key_note = ""
    if 1 < len(gpus) <= MAX_LEGEND_ENTRIES:
        # One entry per GPU, whichever panels it has data in.
        _bottom_legend(fig, [_proxy(c, _gpu_label(g, multi_host)) for c, g in zip(colors, gpus, strict=True)])
    elif len(gpus) == 1:
        title = f"{title}: {_gpu_label(gpus[0], True)}"
        fig.suptitle(title)
    else:
        key_note = f" ({len(gpus)} GPUs, one line each, too many to label)"
    what = ", ".join(label.split(" (")[0] for _, _, label in shown)
    return _Drawn(
        fig,
        title,
        f"Per GPU over the run{key_note} ({what}, sampled in the background): low utilization while "
        "training means the GPU waits on data, the host or communication.",
    )


def _draw_host(report: dict[str, Any]) -> _Drawn | None:
    processes = [p for p in _list(_dig(report, "telemetry", "processes")) if isinstance(p, dict)]
    hosts = [h for h in _list(_dig(report, "telemetry", "hosts")) if isinstance(h, dict)]
    per_rank: dict[str, dict[int, tuple[list[float], list[float]]]] = {"cpu": {}, "rss": {}}
    for proc in processes:
        rank = _rank(proc.get("rank"))
        if rank is None:
            continue
        for key, name, scale in (("cpu", "cpu_percent", 1.0), ("rss", "rss_bytes", 1 / 2**30)):
            xs, ys = _series(proc, name, scale)
            if _enough(xs):
                per_rank[key][rank] = (xs, ys)
    net: list[tuple[str, tuple[list[float], list[float]], tuple[list[float], list[float]]]] = []
    for i, host in enumerate(hosts):
        recv = _series(host, "net_recv_bytes_per_s", 1e-6)
        sent = _series(host, "net_sent_bytes_per_s", 1e-6)
        if _enough(recv[0]) or _enough(sent[0]):
            name = host.get("host")
            net.append((name if isinstance(name, str) else f"host {i}", recv, sent))
    net_peak = max((y for _, (_, ry), (_, sy) in net for y in (*ry, *sy)), default=0.0)
    idle_network = bool(net) and net_peak < IDLE_NETWORK_MB_S
    shown = [k for k in ("cpu", "rss") if per_rank[k]] + (["net"] if net and not idle_network else [])
    if not shown:
        return None
    ranks = sorted(set(per_rank["cpu"]) | set(per_rank["rss"]))
    colors = _rank_colors(_report_ranks(report) or ranks)
    fig, axes = _figure(rows=len(shown), height_px=90 + PANEL_HEIGHT_PX * len(shown))
    many = len(ranks) > 4
    for ax, kind in zip(axes, shown, strict=True):
        if kind in ("cpu", "rss"):
            for rank, (xs, ys) in sorted(per_rank[kind].items()):
                ax.plot(
                    xs,
                    ys,
                    color=colors.get(rank, "grey"),
                    lw=0.8 if many else 1.2,
                    label=f"rank {rank}",
                    gid=str(rank),
                )
            ax.set_ylim(bottom=0)
            ax.set_ylabel("CPU (%)" if kind == "cpu" else "RSS (GiB)")
            note = (
                "each rank's process tree: CPU, 100% = one busy core"
                if kind == "cpu"
                else "each rank's process tree: resident memory"
            )
            ax.set_title(note, loc="left", fontsize=9, fontweight="normal")
        else:
            host_colors = _rank_colors(list(range(len(net))))
            for i, (name, (rx, ry), (sx, sy)) in enumerate(net):
                who = name if len(net) > 1 else "network"
                # One host: a colour per direction. Several: a colour per host, a line style per direction.
                recv_color, sent_color = (
                    (_SAMPLES_COLOR, _SENT_COLOR) if len(net) == 1 else (host_colors[i], host_colors[i])
                )
                if rx:
                    ax.plot(rx, ry, color=recv_color, lw=1.1, label=f"{who} receive")
                if sx:
                    ax.plot(sx, sy, color=sent_color, lw=1.1, ls="--", label=f"{who} send")
            ax.set_ylim(0, net_peak * 1.15)
            ax.set_ylabel("network (MB/s)")
            where = f"host {net[0][0]}" if len(net) == 1 else "each host"
            ax.set_title(f"{where}: all interfaces but loopback", loc="left", fontsize=9, fontweight="normal")
    axes[-1].set_xlabel("time since the run started (s)")
    title = "Rank processes" + (" and host network" if "net" in shown else "") + " over the run"
    fig.suptitle(title)
    rank_axes = [ax for ax, kind in zip(axes, shown, strict=True) if kind != "net"]
    handles: list[Any] = []
    colour_bar = bool(rank_axes) and len(ranks) > MAX_LEGEND_ENTRIES
    if colour_bar:
        # Beside every panel, the network's too, so that the panels stay aligned.
        _rank_colour_bar(fig, axes, colors, ranks)
    elif rank_axes and len(ranks) > 1:
        handles += [_proxy(colors.get(r, "grey"), f"rank {r}") for r in ranks]
    if "net" in shown:
        handles += axes[shown.index("net")].get_lines()
    if len(handles) > 1:
        _bottom_legend(fig, handles)
    parts = []
    if "cpu" in shown:
        parts.append("each rank's CPU use (100% is one busy core)")
    if "rss" in shown:
        parts.append("its resident memory in GiB")
    if "net" in shown:
        parts.append("each host's network traffic in MB/s outside loopback")
    notes = [
        "a rank pinned near 100% CPU on a data-bound step is short of data-loader workers",
        "memory that keeps climbing is a leak",
    ]
    if idle_network:
        notes.append(
            f"network traffic outside loopback stayed under {IDLE_NETWORK_MB_S} MB/s and is not drawn"
        )
    if colour_bar:
        notes.append("the colour bar maps colours to ranks")
    listed = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    return _Drawn(fig, title, f"Over the run, {listed}: {'; '.join(notes)}.")


def _size_label(nbytes: float) -> str:
    return f"{_fmt(nbytes / 2**20)} MiB" if nbytes >= 2**20 else f"{_fmt(nbytes / 2**10)} KiB"


def _draw_communication(report: dict[str, Any]) -> _Drawn | None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ranks = []
    for entry in _list(_dig(report, "communication", "per_rank")):
        rank, comm, exposed = (
            _rank(_dig(entry, "rank")),
            _num(_dig(entry, "comm_ms")),
            _num(_dig(entry, "exposed_ms")),
        )
        if rank is not None and comm is not None:
            ranks.append((rank, comm, min(comm, exposed if exposed is not None else comm)))
    buckets = [
        (b.get("bucket"), _num(b.get("median_ms")), _num(b.get("bytes")))
        for b in _list(_dig(report, "communication", "per_bucket"))
        if isinstance(b, dict) and _num(b.get("median_ms")) is not None
    ]
    if not ranks:
        return None
    fig = Figure(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, squeeze=True) if buckets else (fig.subplots(1, 1), None)
    ys = list(range(len(ranks)))
    exposed = [e for _, _, e in ranks]
    hidden = [c - e for _, c, e in ranks]
    left.barh(ys, exposed, height=0.6, color=PHASE_COLORS["backward"], label="waited for (exposed)")
    left.barh(
        ys, hidden, left=exposed, height=0.6, color=PHASE_COLORS["forward"], label="hidden behind backward"
    )
    left.set_yticks(ys, [f"rank {r}" for r, _, _ in ranks])
    left.invert_yaxis()
    left.set_xlabel("collective time per step (ms)")
    left.set_title("Per rank")
    left.legend(loc="lower right", fontsize=8)
    if right is not None:
        xs = list(range(len(buckets)))
        right.bar(xs, [t for _, t, _ in buckets], color=PHASE_COLORS["backward"], width=0.6)
        right.set_xticks(xs, [f"{b}\n{_size_label(n or 0)}" for b, _, n in buckets], fontsize=8)
        right.set_xlabel("DDP gradient bucket (size)")
        right.set_ylabel("median time (ms)")
        right.set_title("Per gradient bucket")
    title = "Communication per step"
    fig.suptitle(title, fontweight="bold")
    return _Drawn(
        fig,
        title,
        "Left: each rank's collective time per step, split into what the step waited for after backward "
        "compute ended and what overlapped with it (a rank with far less than the others arrives late and "
        "makes them wait); right: the median time of each DDP gradient bucket's collective.",
    )


_PLOTS: tuple[_Plot, ...] = (
    _Plot("throughput.png", "timeseries", _draw_throughput),
    _Plot("step_time.png", "timeseries", _draw_step_time),
    _Plot("loss.png", "timeseries", _draw_loss),
    _Plot("step_breakdown.png", "step-time", _draw_step_breakdown),
    _Plot("rank_step_time.png", "ranks", _draw_rank_step_time),
    _Plot("gpu_utilization.png", "hardware", _draw_gpu),
    _Plot("host_utilization.png", "hardware", _draw_host),
    _Plot("communication.png", "communication", _draw_communication),
)
