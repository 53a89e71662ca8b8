"""Convergence: each metric the training logged against steps, hours, samples and dollars (one figure per
x-axis, switchable in the HTML page), the best value and what the run spent since, plateau, divergence and
drift findings, the ranks' training losses and the gradient norm, and the time and cost to a target."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tuneup.analyze.convergence import FINDING_IDS
from tuneup.analyze.model import Convergence, CurvePoint, MetricCurve, RunAnalysis, TargetOutcome
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import (
    Block,
    Figure,
    FigureChoice,
    FindingItem,
    FindingList,
    KeyValues,
    Paragraph,
    table,
)
from tuneup.report.format import MISSING, count, duration, is_number, plural, sentence, text, usd
from tuneup.report.plotting import (
    HEIGHT_PX,
    PANEL_HEIGHT_PX,
    SAMPLES_COLOR,
    STRAGGLER_COLOR,
    Drawn,
    Plot,
    bottom_legend,
    proxy,
    rate_formatter,
)
from tuneup.report.plotting import figure as new_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes

ID = "convergence"
TITLE = "Convergence"

# At most this many metrics get a panel in the figures (validation metrics first): more would shrink each
# panel past reading. The table lists them all.
MAX_PANELS = 6
BEST_COLOR = "#009E73"
TARGET_COLOR = "#D55E00"

# The x-axes, in the order the page offers them: (key, button label, axis label).
AXES = (
    ("steps", "steps", "training step"),
    ("hours", "hours", "hours since the run's start"),
    ("samples", "samples", "samples trained on (all ranks)"),
    ("usd", "dollars", "dollars spent (the run's price × hours)"),
)


def elapsed(hours: float | None) -> str:
    """Hours as a reader takes them in: seconds and minutes below a tenth of an hour, else hours."""
    if not is_number(hours):
        return MISSING
    return duration(hours * 3600) if hours < 0.1 else f"{hours:,.2f} h"


def _value(value: float | None) -> str:
    return f"{value:.4g}" if is_number(value) else MISSING


def _at(point: CurvePoint) -> str:
    parts = [f"step {point.step:,}", f"after {elapsed(point.hours)}"]
    if is_number(point.usd):
        parts.append(usd(point.usd))
    return ", ".join(parts)


def span(low: float | None, high: float | None, show: Callable[[float], str]) -> str:
    """An interval after its figure: " [low, high]", "open" where it has no upper bound."""
    if low is None and high is None:
        return ""
    return f" [{show(low) if low is not None else '?'}, {show(high) if high is not None else 'open'}]"


def target_line(outcome: TargetOutcome) -> str:
    """The target in one line, for the summary, the section and `tuneup show`."""
    head = f"{outcome.target}"
    if outcome.status == "reached" and outcome.reached is not None:
        p = outcome.reached
        money = f" and {usd(p.usd)}" if is_number(p.usd) else " (no price: $ unknown)"
        return (
            f"{head} reached at step {p.step:,} after {elapsed(p.hours)}{money} "
            f"({outcome.metric} = {_value(p.value)})"
        )
    if outcome.status == "projected" and is_number(outcome.step):
        steps = f"step {count(outcome.step)}" + span(outcome.step_low, outcome.step_high, count)
        hours = (
            f", {elapsed(outcome.hours)}" + span(outcome.hours_low, outcome.hours_high, elapsed)
            if is_number(outcome.hours)
            else ", hours unknown (no steady step time)"
        )
        money = (
            f", {usd(outcome.usd)}" + span(outcome.usd_low, outcome.usd_high, usd)
            if is_number(outcome.usd)
            else ", $ unknown (no price)"
        )
        form = f": {outcome.form}" if outcome.form else ""
        return f"{head} not reached yet; projected at {steps}{hours}{money}{form}"
    if outcome.status == "not_recorded":
        return f"{head}: {outcome.reason}"
    return f"{head} not reached; not projected: {outcome.reason}"


def metric_line(c: MetricCurve) -> str:
    """One metric in one line: its best, when, and what the run spent since (`tuneup show`)."""
    if c.best is None:
        last = _value(c.last.value) if c.last else MISSING
        return (
            f"{c.name}: last {last} at step {c.step[-1]:,}; no best: {c.direction_basis}"
            if c.step
            else c.name
        )
    since = ""
    if c.evaluations_since_best:
        since = (
            f"; {plural(c.evaluations_since_best, 'value')} since, {count(c.steps_since_best)} steps, {elapsed(c.hours_since_best)}"
            + (f", {usd(c.usd_since_best)}" if is_number(c.usd_since_best) else "")
        )
    else:
        since = "; the last value is the best"
    flags = (" PLATEAU" if c.plateau else "") + (" NaN/inf" if c.nonfinite_steps else "")
    return f"{c.name}: best {_value(c.best.value)} at {_at(c.best)}{since}{flags}"


def _metric_rows(conv: Convergence) -> list[tuple[str, ...]]:
    rows = []
    for c in conv.metrics:
        best = c.best
        since = MISSING
        if best is not None and c.evaluations_since_best == 0:
            since = "the last value is the best"
        elif best is not None and c.evaluations_since_best is not None:
            since = (
                f"{plural(c.evaluations_since_best, 'value')}, {count(c.steps_since_best)} steps, "
                f"{elapsed(c.hours_since_best)}"
                + (f", {usd(c.usd_since_best)}" if is_number(c.usd_since_best) else "")
            )
        rows.append(
            (
                c.name,
                c.source,
                {"lower": "lower is better", "higher": "higher is better"}.get(c.direction, "unknown"),
                count(len(c.step)),
                _value(best.value) if best else MISSING,
                _at(best) if best else MISSING,
                since,
                _value(c.last.value) if c.last else MISSING,
            )
        )
    return rows


def _target_blocks(outcome: TargetOutcome, conv: Convergence) -> list[Block]:
    pairs = [("Target", f"{outcome.target} ({outcome.given_by})"), ("Outcome", target_line(outcome))]
    if outcome.status == "projected" or outcome.projection_status:
        pairs += [
            ("Projection", f"{text(outcome.projection_status)}: {text(outcome.reason)}"),
            ("Curve", text(outcome.form)),
            ("Points used", count(outcome.points_used)),
            ("Steps to hours", f"{_value(conv.s_per_step)} s per step: {conv.s_per_step_basis}"),
        ]
        if is_number(outcome.asymptote):
            pairs.append(("Asymptote", _value(outcome.asymptote)))
    return [KeyValues("Time and cost to the target", tuple(pairs))]


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    conv = analysis.convergence
    if conv is None:
        return [
            Paragraph(
                "The run logged no metric and recorded no training loss: nothing to follow. "
                "TuneupCallback records what the LightningModule logs with self.log (val_loss, val_acc).",
                True,
            )
        ]
    out: list[Block] = []
    if conv.target is not None:
        out += _target_blocks(conv.target, conv)
    if conv.metrics:
        out.append(
            table(
                "Metrics the training logged",
                ("Metric", "Read at", "Direction", "Values", "Best", "Best at", "Since the best", "Last"),
                _metric_rows(conv),
                numeric=(3, 4, 7),
            )
        )
        unknown = [c.name for c in conv.metrics if c.direction == "unknown"]
        if unknown:
            out.append(
                Paragraph(
                    f"{', '.join(unknown)}: the name does not say whether lower or higher is better, so no best "
                    "is picked; a --target on it (METRIC<=VALUE or METRIC>=VALUE) says it.",
                    True,
                )
            )
    else:
        out.append(Paragraph("The run logged no metric (self.log): only its training loss is shown.", True))
    choice = tuple(
        (label, p) for key, label, _axis in AXES for p in plots if p.name == f"convergence_{key}.png"
    )
    if choice:
        out.append(FigureChoice("Metrics against", choice))
    out.append(
        FindingList(
            tuple(
                FindingItem(text(f.severity), text(f.title), sentence(f.evidence))
                for f in analysis.findings
                if f.id in FINDING_IDS
            ),
            empty=f"No plateau (none over {conv.plateau_evaluations} validations), no NaN or spike, no drift "
            "between the ranks' losses.",
        )
    )
    notes = [
        ("Samples axis", conv.samples_basis),
        (
            "Dollars axis",
            f"hours × {usd(conv.usd_per_hour)} per hour (the cost section's price)"
            if is_number(conv.usd_per_hour)
            else f"no dollar figure is shown: {text(conv.not_priced_reason)}",
        ),
        ("Plateau", f"no new best over the last {conv.plateau_evaluations} values of a validation metric"),
        ("Spike", conv.spike_rule),
    ]
    if conv.loss_spread is not None:
        ls = conv.loss_spread
        notes.append(
            (
                "Training loss across ranks",
                f"{ls.ranks} ranks; last window spread {_value(ls.spread[-1])} against noise "
                f"{_value(ls.noise[-1])}" + (": drifting apart" if ls.drifting else ": within noise"),
            )
        )
    if conv.grad_norm is not None:
        gn = conv.grad_norm
        notes.append(
            (
                "Gradient norm",
                f"{gn.source}, rank {gn.rank}: median {_value(gn.median)} over {len(gn.step):,} steps",
            )
        )
    notes += [("Note", n) for n in conv.notes]
    out.append(KeyValues("How it is read", tuple(notes), detail=True))
    return out + [Figure(p) for p in plots if p.name == "convergence_ranks.png"]


# -- figures ----------------------------------------------------------------------------------------------


def _height(panels: int) -> int:
    """A panel's height each, with room for the title and the legend; one panel as tall as any plot."""
    return max(PANEL_HEIGHT_PX * panels + 80, HEIGHT_PX)


def _panels(conv: Convergence) -> list[MetricCurve]:
    curves = [c for c in conv.metrics if sum(v is not None for v in c.values) >= 1]
    wanted = conv.target.metric if conv.target is not None else None
    # The target's metric first, then validation metrics: what a reader looks for before the rest.
    curves.sort(key=lambda c: (c.name != wanted, c.source != "validation", c.direction == "unknown", c.name))
    return curves[:MAX_PANELS]


def _xs(curve: MetricCurve, key: str) -> Sequence[float | None]:
    axes: dict[str, Sequence[float | None]] = {
        "steps": curve.step,
        "hours": curve.hours,
        "samples": curve.samples,
        "usd": curve.usd,
    }
    return axes[key]


def _x_of(point: CurvePoint, key: str) -> float | None:
    return {"steps": point.step, "hours": point.hours, "samples": point.samples, "usd": point.usd}[key]


def _draw_axis(key: str, label: str, axis_label: str) -> Callable[[RunAnalysis], Drawn | None]:
    """The figure of every metric against one x-axis (AXES), a panel each."""

    def draw(analysis: RunAnalysis) -> Drawn | None:
        conv = analysis.convergence
        if conv is None:
            return None
        curves = _panels(conv)
        # A curve is drawn where its x is known (no price: no dollars axis).
        drawable = [
            c
            for c in curves
            if sum(x is not None and v is not None for x, v in zip(_xs(c, key), c.values, strict=True)) >= 1
        ]
        if not drawable:
            return None
        fig, axes = new_figure(len(drawable), _height(len(drawable)))
        outcome = conv.target
        handles = [proxy(SAMPLES_COLOR, "recorded value")]
        for ax, c in zip(axes, drawable, strict=True):
            pts = [
                (x, v) for x, v in zip(_xs(c, key), c.values, strict=True) if x is not None and v is not None
            ]
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            ax.plot(xs, ys, color=SAMPLES_COLOR, marker="o" if len(xs) <= 60 else None, ms=3)
            bad = [
                x
                for x, step in zip(_xs(c, key), c.step, strict=True)
                if x is not None and step in c.nonfinite_steps
            ]
            for x in bad:
                ax.axvline(x, color=STRAGGLER_COLOR, lw=1.0, ls=":")
            if c.best is not None and _x_of(c.best, key) is not None:
                ax.plot([_x_of(c.best, key)], [c.best.value], marker="*", ms=11, color=BEST_COLOR, ls="none")
            if outcome is not None and outcome.metric == c.name:
                ax.axhline(outcome.value, color=TARGET_COLOR, lw=1.0, ls="--")
                _draw_target(ax, outcome, key)
            ax.set_ylabel(c.name)
            if key in ("samples",):
                ax.xaxis.set_major_formatter(rate_formatter())
        axes[-1].set_xlabel(axis_label)
        handles.append(proxy(BEST_COLOR, "best so far", ls="none"))
        handles[-1].set_marker("*")
        if outcome is not None and any(c.name == outcome.metric for c in drawable):
            handles.append(proxy(TARGET_COLOR, f"target {outcome.target}", ls="--"))
            if outcome.status in ("reached", "projected"):
                mark = proxy(
                    TARGET_COLOR,
                    "reached" if outcome.status == "reached" else "projected (shade: interval)",
                    ls="none",
                )
                mark.set_marker("D")
                if outcome.status == "projected":
                    mark.set_markerfacecolor("white")
                handles.append(mark)
        if any(c.nonfinite_steps for c in drawable):
            handles.append(proxy(STRAGGLER_COLOR, "NaN or inf", ls=":"))
        bottom_legend(fig, handles)
        title = f"Logged metrics against {label}"
        fig.suptitle(title)
        caption = (
            f"Each metric the training logged (a panel each, the reporting rank's values) against {axis_label}; "
            "the star marks the best value so far"
            + (
                ", the dashed line the target and, where projected, the interval of steps to it"
                if outcome
                else ""
            )
            + "."
        )
        return Drawn(fig, title, caption)

    return draw


def _scaled(outcome: TargetOutcome) -> tuple[float | None, float | None]:
    """The step interval in samples, at the projection's own samples per step."""
    if not outcome.samples or not outcome.step:
        return None, None
    per_step = outcome.samples / outcome.step
    return (
        outcome.step_low * per_step if outcome.step_low is not None else None,
        outcome.step_high * per_step if outcome.step_high is not None else None,
    )


def _draw_target(ax: Axes, outcome: TargetOutcome, key: str) -> None:
    """The reached point, or the projected one with its interval, on the target's panel."""
    if outcome.reached is not None:
        x = _x_of(outcome.reached, key)
        if x is not None:
            ax.plot([x], [outcome.reached.value], marker="D", ms=6, color=TARGET_COLOR, ls="none")
        return
    if outcome.status != "projected":
        return
    mid, low, high = {
        "steps": (outcome.step, outcome.step_low, outcome.step_high),
        "hours": (outcome.hours, outcome.hours_low, outcome.hours_high),
        "usd": (outcome.usd, outcome.usd_low, outcome.usd_high),
        "samples": (outcome.samples, *_scaled(outcome)),
    }[key]
    if mid is None or not math.isfinite(mid):
        return
    ax.plot([mid], [outcome.value], marker="D", ms=6, mfc="white", color=TARGET_COLOR, ls="none")
    if low is not None:
        right = high if high is not None else mid * 1.5
        ax.axvspan(low, right, color=TARGET_COLOR, alpha=0.12, lw=0)


def _draw_ranks(analysis: RunAnalysis) -> Drawn | None:
    conv = analysis.convergence
    if conv is None:
        return None
    ls, gn = conv.loss_spread, conv.grad_norm
    panels = [p for p in (ls if ls is not None and len(ls.step) >= 2 else None, gn) if p is not None]
    if not panels:
        return None
    fig, axes = new_figure(len(panels), _height(len(panels)))
    handles = []
    i = 0
    if ls is not None and len(ls.step) >= 2:
        ax = axes[i]
        i += 1
        handles += ax.plot(
            ls.step,
            ls.spread,
            color=STRAGGLER_COLOR,
            marker="o",
            ms=3,
            label="spread of the ranks' mean losses",
        )
        handles += ax.plot(ls.step, ls.noise, color="grey", ls="--", label="what noise alone gives")
        ax.set_ylabel("loss spread")
        ax.set_ylim(bottom=0)
    if gn is not None:
        ax = axes[i]
        handles += ax.plot(
            gn.step, gn.values, color=SAMPLES_COLOR, lw=0.9, label=f"gradient norm ({gn.source})"
        )
        spikes = set(gn.spike_steps)
        if spikes:
            sx = [s for s in gn.step if s in spikes]
            sy = [v for s, v in zip(gn.step, gn.values, strict=True) if s in spikes]
            handles += ax.plot(sx, sy, ls="none", marker="^", color=TARGET_COLOR, label="spike")
        ax.set_ylabel("gradient norm")
    axes[-1].set_xlabel("training step")
    title = "Training loss across ranks and gradient norm"
    fig.suptitle(title)
    bottom_legend(fig, handles)
    return Drawn(
        fig,
        title,
        "How far the ranks' training losses lie apart over windows of steps, against the spread their own "
        "scatter would give (the dashed line; ranks drifting apart rise well above it, the finding fires at 3×), and "
        "the gradient norm per recorded step.",
    )


PLOTS: tuple[Plot, ...] = (
    *(Plot(f"convergence_{key}.png", _draw_axis(key, label, axis_label)) for key, label, axis_label in AXES),
    Plot("convergence_ranks.png", _draw_ranks),
)
