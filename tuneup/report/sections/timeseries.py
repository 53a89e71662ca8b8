"""Over the run: throughput, step time and loss, step by step (or window by window on a long run).

Figures: `throughput.png` (all ranks' samples/s with the steady-state rate the report quotes),
`step_time.png` (one line per rank, or on a large job the median rank with the spread of the ranks as a
band) and `loss.png`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuneup.analyze.model import RunAnalysis
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, Paragraph, figures
from tuneup.report.format import number, text
from tuneup.report.plotting import (
    CONSTANT_RATIO_TOLERANCE,
    SAMPLES_COLOR,
    TOKENS_COLOR,
    Drawn,
    Plot,
    bottom_legend,
    enough,
    figure,
    fmt,
    num,
    plain_log_axis,
    rate_formatter,
    shade_warmup,
    xy,
)
from tuneup.report.sections.timeseries_step_time import draw_step_time, step_axis_label

if TYPE_CHECKING:
    from matplotlib.axes import Axes

ID = "timeseries"
TITLE = "Over the run"


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    ts = analysis.timeseries
    out: list[Block] = []
    loss = ts.loss
    if len(loss.step) == 1 and len(loss.values) == 1:
        out.append(
            Paragraph(f"Loss at step {text(loss.step[0])}: {number(loss.values[0])} (one step recorded).")
        )
    elif loss.step and len(loss.step) == len(loss.values):
        out.append(
            Paragraph(
                f"Loss went from {number(loss.values[0])} at step {text(loss.step[0])} "
                f"to {number(loss.values[-1])} at step {text(loss.step[-1])}."
            )
        )
    drawn = figures(ID, plots)
    if not drawn:
        return [*out, Paragraph("No plots were drawn for this section.", True)]
    if ts.source == "steps":
        out.append(Paragraph("The curves show every recorded step, warm-up included."))
    elif ts.source == "windows":
        out.append(
            Paragraph(
                "The run was longer than the per-step record keeps, so the curves show one point per "
                "window of steps (the window's mean)."
            )
        )
    return out + drawn


# ---------------------------------------------------------------------------------------------------
# Throughput over the run.


def _draw_throughput(analysis: RunAnalysis) -> Drawn | None:
    series = analysis.timeseries.throughput
    sx, sy = xy(series.step, series.samples_per_s)
    tx, ty = xy(series.step, series.tokens_per_s)
    has_samples, has_tokens = enough(sx), enough(tx)
    if not (has_samples or has_tokens):
        return None
    fig, (ax,) = figure()
    handles: list[Any] = []
    warm = shade_warmup(ax, analysis, sx or tx)
    if warm is not None:
        handles.append(warm)
    token_note = ""
    steady = num(analysis.throughput.samples_per_s)
    if has_samples:
        (line,) = ax.plot(sx, sy, color=SAMPLES_COLOR, lw=1.0, label="samples/s")
        handles.append(line)
        ax.set_ylabel("samples/s, all ranks")
        if steady:
            handles.append(
                ax.axhline(
                    steady,
                    color="black",
                    ls="--",
                    lw=1.0,
                    alpha=0.7,
                    label=f"steady-state rate: {fmt(steady)} samples/s",
                )
            )
        if has_tokens:
            token_note = _tokens_axis(ax, handles, (sx, sy), (tx, ty))
    else:
        (line,) = ax.plot(tx, ty, color=TOKENS_COLOR, lw=1.0, label="tokens/s")
        handles.append(line)
        ax.set_ylabel("tokens/s, all ranks")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(rate_formatter())
    ax.set_xlabel(step_axis_label(analysis))
    title = "Throughput over the run"
    ax.set_title(title)
    if len(handles) > 1:
        # Below the plot: inside, it would sit on the line wherever throughput dips.
        bottom_legend(fig, handles)
    notes = []
    if has_samples and steady:
        notes.append("the dashed line is the steady-state rate the report quotes")
    if warm is not None:
        notes.append("the shaded warm-up steps are left out of the report's rates")
    note = "".join(f"; {n}" for n in notes)
    what = "samples" if has_samples else "tokens"
    return Drawn(
        fig,
        title,
        f"Training speed of all ranks together in {what} per second at each training step, where "
        f"higher is better and dips are slow steps{note}{token_note}.",
    )


def _tokens_axis(
    ax: Axes,
    handles: list[Any],
    samples: tuple[list[float], list[float]],
    tokens: tuple[list[float], list[float]],
) -> str:
    """Tokens/s beside samples/s: a second scale on the same line, or a line of its own; the caption's note."""
    ratio = constant_ratio(*samples, *tokens)
    if ratio is not None:
        # Same curve on a second scale: one line, two sets of ticks.
        sec = ax.secondary_yaxis("right", functions=(lambda v: v * ratio, lambda v: v / ratio))
        sec.set_ylabel(f"tokens/s, all ranks ({ratio:.4g} tokens per sample)")
        sec.yaxis.set_major_formatter(rate_formatter())
        return "; the right axis reads the same line in tokens/s"
    ax2 = ax.twinx()
    ax2.grid(False)
    ax2.spines["right"].set_visible(True)
    (tline,) = ax2.plot(*tokens, color=TOKENS_COLOR, lw=0.9, alpha=0.85, label="tokens/s")
    handles.append(tline)
    ax2.set_ylabel("tokens/s, all ranks", color=TOKENS_COLOR)
    ax2.set_ylim(bottom=0)
    ax2.yaxis.set_major_formatter(rate_formatter())
    return "; tokens/s (pink, right axis) moves apart from it as sequence lengths vary"


def constant_ratio(sx: list[float], sy: list[float], tx: list[float], ty: list[float]) -> float | None:
    """Tokens per sample when it is the same at every step (within CONSTANT_RATIO_TOLERANCE), else None."""
    samples = {x: y for x, y in zip(sx, sy, strict=True) if y > 0}
    ratios = [t / samples[x] for x, t in zip(tx, ty, strict=True) if x in samples]
    if len(ratios) < 2:
        return None
    mid = sorted(ratios)[len(ratios) // 2]
    if mid <= 0 or any(abs(r - mid) > CONSTANT_RATIO_TOLERANCE * mid for r in ratios):
        return None
    return mid


# ---------------------------------------------------------------------------------------------------
# Loss.


def _draw_loss(analysis: RunAnalysis) -> Drawn | None:
    loss = analysis.timeseries.loss
    xs, ys = xy(loss.step, loss.values)
    if not enough(xs):
        return None
    import numpy as np

    present = analysis.run.ranks_present
    # analyze_run takes the loss from the lowest rank present.
    rank = loss.rank if loss.rank is not None else (min(present) if present else None)
    who = f"rank {rank}" if rank is not None else "one rank"
    windows = analysis.timeseries.source == "windows"
    fig, (ax,) = figure()
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
        plain_log_axis(ax)
    ax.set_xlabel(step_axis_label(analysis))
    ax.set_ylabel(f"loss ({who}, as logged{', log scale' if log else ''})")
    title = "Training loss"
    ax.set_title(title)
    if len(handles) > 1:
        # Below the axes: a loss that climbs back up would run under a legend in a corner.
        bottom_legend(fig, handles)
    smooth_note = f", with a moving mean over {window} points as the solid line" if smooth else ""
    return Drawn(
        fig,
        title,
        f"The training loss {who} logged at each training step, on the model's own scale"
        f"{' and a logarithmic axis' if log else ''}{smooth_note}; it should trend down.",
    )


PLOTS: tuple[Plot, ...] = (
    Plot("throughput.png", _draw_throughput),
    Plot("step_time.png", draw_step_time),
    Plot("loss.png", _draw_loss),
)
