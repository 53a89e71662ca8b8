"""The badput ledger: the run's wall time and dollars split into productive compute and named badput,
adding up to the whole (tuneup.analyze.badput), with what each category holds and which are judgement
calls."""

from __future__ import annotations

from collections.abc import Sequence

from tuneup.analyze.model import Badput, BadputCategory, RunAnalysis
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, Metric, Metrics, Paragraph, figures, table
from tuneup.report.format import duration, fraction_percent, is_number, text, usd
from tuneup.report.plotting import Drawn, Plot, figure

ID = "badput"
TITLE = "Where the money went: goodput and badput"

LABELS = {
    "productive_compute": "Productive compute",
    "startup": "Startup",
    "data_wait": "Data wait",
    "exposed_communication": "Exposed communication",
    "sync_wait": "Synchronization waits",
    "validation": "Validation",
    "checkpoint_saves": "Checkpoint saves",
    "restarts": "Restarts and redone work",
    "idle_devices": "Idle devices",
    "other": "Other",
}
# Useful work in the colour of the timeline's training steps; badput in greys and warm colours.
USEFUL_COLOR, BADPUT_COLOR = "#0072B2", "#D55E00"


# A badput category below this share of the run is named among the absent, not given a row of near zeros.
MIN_SHARE = 0.0005


def shown(b: Badput) -> list[BadputCategory]:
    """The categories worth a row: the useful ones, and badput of at least MIN_SHARE of the run."""
    return [c for c in b.categories if c.useful or c.share >= MIN_SHARE]


def label(name: str) -> str:
    return LABELS.get(name, text(name))


def _cost_or_time(c: BadputCategory) -> str:
    return f"{usd(c.usd)}, {fraction_percent(c.share)}" if is_number(c.usd) else fraction_percent(c.share)


def ledger_line(b: Badput, largest: int = 2) -> str:
    """One sentence: how much of the run was useful, what its badput cost, and its largest categories (the
    summary, `tuneup show` and the Markdown say the same)."""
    total = f"{duration(b.wall_s)}" + (f", {usd(b.usd)}" if is_number(b.usd) else "")
    line = f"Goodput {fraction_percent(b.useful_share)} of the run's {total}"
    bad = sorted((c for c in shown(b) if not c.useful and c.seconds > 0), key=lambda c: -c.seconds)
    if not bad:
        return line + ": no badput measured."
    spent = f" (badput {usd(b.badput_usd)})" if is_number(b.badput_usd) else ""
    named = ", ".join(f"{label(c.name).lower()} {_cost_or_time(c)}" for c in bad[:largest])
    return f"{line}{spent}; the largest badput: {named}."


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    b = analysis.badput
    if b is None:
        return [
            Paragraph(
                "No ledger: no rank recorded a training step (or the report predates the ledger).", True
            )
        ]
    priced = is_number(b.usd)
    out: list[Block] = [
        Metrics(
            (
                Metric("Goodput", fraction_percent(b.useful_share), "useful time over the run's wall time"),
                Metric(
                    "Badput",
                    usd(b.badput_usd) if priced else duration(b.wall_s - b.useful_s),
                    "at the run's price" if priced else "no price: `--price-per-hour` or `--instance` adds $",
                ),
                Metric(
                    "Run",
                    duration(b.wall_s),
                    f"{b.device_hours:.4g} device-hours" + (f", {usd(b.usd)}" if priced else ""),
                ),
            )
        ),
        Paragraph(ledger_line(b, largest=3)),
    ]
    rows = [
        (
            label(c.name),
            duration(c.seconds),
            fraction_percent(c.share),
            usd(c.usd) if priced else "",
            "useful" if c.useful else "badput",
            text(c.basis),
        )
        for c in shown(b)
    ]
    rows.append(
        (
            "Run",
            duration(b.wall_s),
            "100%",
            usd(b.usd) if priced else "",
            "",
            "the fit's wall time" + (", every segment and the downtime between" if b.segments > 1 else ""),
        )
    )
    out.append(
        table(
            "Badput ledger",
            ("Category", "Time", "Share", "Cost", "Counted as", "How it is measured"),
            rows,
            (1, 2, 3),
            total=True,
        )
    )
    absent = [label(c.name).lower() for c in b.categories if c not in shown(b)]
    if absent:
        out.append(Paragraph(f"Not in this run, or under {MIN_SHARE:.2%} of it: {', '.join(absent)}.", True))
    calls = [
        f"{label(c.name).lower()}: {text(c.judgement)}" for c in shown(b) if c.judgement and not c.useful
    ]
    if calls:
        out.append(Paragraph("Judgement calls, counted as badput here: " + "; ".join(calls) + ".", True))
    if b.validation_useful:
        out.append(Paragraph("Validation is counted as useful work (--validation-useful).", True))
    if is_number(b.before_fit_s):
        cost = f" ({usd(b.before_fit_usd)})" if is_number(b.before_fit_usd) else ""
        out.append(
            Paragraph(
                f"Not in the ledger, as not in the cost section: {duration(b.before_fit_s)}{cost} from the "
                "first process's start to its fit (imports, launching the ranks, data preparation).",
                True,
            )
        )
    if b.gaps_between_segments_s > 0:
        out.append(
            Paragraph(
                f"Not in the ledger: {duration(b.gaps_between_segments_s)} between segments that followed a "
                "completed or user-stopped one, when no job ran.",
                True,
            )
        )
    return out + figures(ID, plots)


def _draw(analysis: RunAnalysis) -> Drawn | None:
    b = analysis.badput
    if b is None or b.wall_s <= 0:
        return None
    bars = sorted((c for c in shown(b) if c.seconds > 0), key=lambda c: c.seconds)
    if not bars:
        return None
    priced = all(is_number(c.usd) for c in bars)
    fig, (ax,) = figure()
    values = [c.usd if priced else c.seconds for c in bars]
    ax.barh(
        range(len(bars)),
        values,
        color=[USEFUL_COLOR if c.useful else BADPUT_COLOR for c in bars],
        height=0.6,
    )
    ax.set_yticks(range(len(bars)), [label(c.name) for c in bars])
    for y, (c, value) in enumerate(zip(bars, values, strict=True)):
        ax.annotate(
            f" {fraction_percent(c.share)}", (value, y), va="center", fontsize=8, annotation_clip=False
        )
    ax.set_xlabel("USD" if priced else "seconds")
    ax.grid(axis="y", visible=False)
    ax.margins(x=0.12)
    return Drawn(
        fig,
        "Badput ledger",
        f"The run's {'dollars' if priced else 'wall time'} by category (blue: useful work, orange: badput), "
        "each bar's share of the whole beside it; the categories add up to the run.",
    )


PLOTS: tuple[Plot, ...] = (Plot("badput.png", _draw),)
