"""Gradient noise scale: B_simple, the batch size beyond which a bigger batch stops saving steps, with its
interval and how it moved over the run (`noise_scale.png`)."""

from __future__ import annotations

from collections.abc import Sequence

from tuneup.analyze.model import NoiseScale, RunAnalysis
from tuneup.analyze.noise_scale import noise_verdict
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, Bullets, KeyValues, Metric, Metrics, Paragraph, figures
from tuneup.report.format import MISSING, count, figure, is_number, number
from tuneup.report.plotting import SAMPLES_COLOR, Drawn, Plot, enough, fmt, shade_warmup, side_legend, xy
from tuneup.report.plotting import figure as new_figure

ID = "noise-scale"
TITLE = "Gradient noise scale"


def b_simple_text(ns: NoiseScale) -> str:
    """The headline, in words: a number with its interval, or why there is none."""
    if not is_number(ns.b_simple):
        return f"no signal: larger than can be measured at batch {ns.big_batch}, or none at all"
    if is_number(ns.ci_low) and is_number(ns.ci_high):
        return f"{number(ns.b_simple)} (95% interval {number(ns.ci_low)} to {number(ns.ci_high)})"
    if is_number(ns.ci_low) and ns.ci_low > 0:
        return f"{number(ns.b_simple)} (at least {number(ns.ci_low)})"
    if not is_number(ns.ci_high):  # from zero to unbounded: the advice's verdict too (noise_verdict)
        return f"no signal: about {number(ns.b_simple)}, but its interval runs from 0 to unbounded above"
    return number(ns.b_simple)


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    ns = analysis.noise_scale
    if ns is None:
        # The same verdict as the advice's (tuneup.analyze.noise_scale.noise_verdict), with its reason.
        verdict = noise_verdict(None, analysis.run)
        return [Paragraph(verdict.text[0].upper() + verdict.text[1:] + ".", True)]
    out: list[Block] = [
        Metrics(
            (
                Metric("B_simple", b_simple_text(ns), "samples: the noise scale, tr(Σ)/|G|²"),
                Metric("Batches compared", f"{count(ns.small_batch)} and {count(ns.big_batch)}", "samples"),
            )
        ),
        Paragraph(
            "B_simple (McCandlish et al. 2018) is the batch size at which the gradient's noise equals its "
            "signal. Well below it, doubling the batch nearly halves the steps to a given loss; well above it, "
            "a bigger batch mostly costs more samples for the same progress (steps ∝ 1 + B_simple/B)."
        ),
        KeyValues(
            "How it was measured",
            (
                ("Method", ns.method),
                ("Steady steps used", count(ns.steps)),
                ("|G|² (squared norm of the true gradient)", figure(ns.grad_sq)),
                ("tr(Σ) (one sample's gradient variance)", figure(ns.trace_sigma)),
                ("DDP comm hook", ns.comm_hook or MISSING),
                (
                    "Averaging",
                    "means of each estimate over the steps, then divided; the plot uses bias-corrected "
                    f"moving averages over about {number(ns.ema_steps, 0)} steps",
                ),
            ),
        ),
    ]
    if ns.notes:
        out.append(Bullets(tuple(ns.notes)))
    return out + figures(ID, plots)


def _draw(analysis: RunAnalysis) -> Drawn | None:
    ns = analysis.noise_scale
    if ns is None:
        return None
    xs, ys = xy(ns.series_step, ns.series_b_simple)
    if not enough(xs):
        return None
    fig, (ax,) = new_figure()
    handles = [shade_warmup(ax, analysis, xs)]
    handles += ax.plot(xs, ys, color=SAMPLES_COLOR, label="B_simple (moving averages)")
    if is_number(ns.b_simple):
        handles.append(
            ax.axhline(ns.b_simple, color="black", lw=1.0, ls="--", label=f"steady mean {fmt(ns.b_simple)}")
        )
        if is_number(ns.ci_low):
            high = ns.ci_high if is_number(ns.ci_high) else max(max(ys), ns.b_simple)
            handles.append(ax.axhspan(ns.ci_low, high, color="black", alpha=0.1, lw=0, label="95% interval"))
    for batch, style in ((ns.small_batch, ":"), (ns.big_batch, "-.")):
        handles.append(ax.axhline(batch, color="grey", lw=0.9, ls=style, label=f"batch {batch}"))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("training step")
    ax.set_ylabel("B_simple (samples)")
    title = "Gradient noise scale over the run"
    ax.set_title(title)
    side_legend(ax, [h for h in handles if h is not None])
    return Drawn(
        fig,
        title,
        "B_simple = tr(Σ)/|G|² from bias-corrected moving averages of its two estimates, with the steady "
        "steps' mean and its 95% interval; where the line sits above the batch sizes, a bigger batch would "
        "still cut the steps to a target nearly in proportion.",
    )


PLOTS: tuple[Plot, ...] = (Plot("noise_scale.png", _draw),)
