"""Where the fit's wall time went: setup, sanity check, training steps, validation, checkpoint saves, the
rest of the fit loop and teardown, from each rank's real start and end (tuneup.analyze.timeline)."""

from __future__ import annotations

from collections.abc import Sequence

from tuneup.analyze.model import RankTimeline, RunAnalysis, Timeline, TimelinePart
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, Paragraph, figures, table
from tuneup.report.format import count, duration, fraction_percent, is_number, text
from tuneup.report.plotting import HEIGHT_PX, Drawn, Plot, bottom_legend, figure
from tuneup.report.sections._scale import MAX_LINES, PER_ROW_LIMIT

ID = "timeline"
TITLE = "Where the fit's time went"

LABELS = {
    "setup": "Setup",
    "sanity_check": "Sanity check",
    "training_steps": "Training steps",
    "validation": "Validation",
    "checkpoint_saves": "Checkpoint saves",
    "other_fit_loop": "Other fit-loop time",
    "teardown": "Teardown",
}
MEANING = {
    "setup": "model to device, the strategy's wrapping, optimizers, checkpoint restore, the loop's data setup",
    "sanity_check": "Lightning's validation batches before training",
    "training_steps": "every step's data, forward, backward, optimizer, sync and other",
    "validation": "validation loops during training",
    "checkpoint_saves": "trainer.save_checkpoint, start to end",
    "other_fit_loop": "epoch ends, work between batches that no step owns",
    "teardown": "the strategy's teardown, on_fit_end",
}
# Okabe-Ito, as the phase colours: training steps take the forward colour, the rest their own.
COLORS = {
    "setup": "#E69F00",
    "sanity_check": "#F0E442",
    "training_steps": "#0072B2",
    "validation": "#009E73",
    "checkpoint_saves": "#D55E00",
    "other_fit_loop": "#B0B0B0",
    "teardown": "#CC79A7",
}
STOP_REASONS = {
    "max_steps": "max_steps was reached",
    "max_epochs": "max_epochs was reached",
    "max_time": "max_time ran out",
    "early_stopping": "early stopping stopped it",
    "should_stop": "the module or a callback set trainer.should_stop",
    "fast_dev_run": "it was a fast_dev_run",
    "end_of_data": "the data ran out",
    "sigterm": "it received SIGTERM",
    "user_interrupt": "the user interrupted it (Ctrl-C)",
    "exception": "an exception was raised",
}
# The first training step's extra time is named, where torch.compile is not, only above this share of the
# fit: below it, it is a first step's usual warm-up.
FIRST_STEP_SHARE = 0.05


def stop_reason_text(tl: Timeline) -> str | None:
    """Why the fit stopped, in words (the report, `tuneup show` and the Markdown say the same)."""
    return STOP_REASONS.get(tl.stop_reason, tl.stop_reason) if tl.stop_reason else None


def part_label(name: str, tl: Timeline) -> str:
    """A part's name as the report shows it: the sanity check names torch.compile's warm-up where the model
    was compiled, since compilation runs in the first validation step's call, which the sanity check makes."""
    label = LABELS.get(name, text(name))
    if tl.compiled and name == "sanity_check":
        label += " (incl. torch.compile warm-up)"
    return label


def compile_line(tl: Timeline) -> str | None:
    """One sentence on torch.compile's time where the record shows it: which modules were compiled and what
    the first training step took beyond a steady one; else on a first step that took a large share."""
    extra = tl.first_step_extra_s if is_number(tl.first_step_extra_s) else None
    first = f"the first training step took {duration(extra)} more than a steady step" if extra else None
    if tl.compiled:
        names = ", ".join("the LightningModule" if not n else text(n) for n in tl.compiled[:4])
        more = f" and {len(tl.compiled) - 4} more" if len(tl.compiled) > 4 else ""
        where = (
            "the sanity check's first validation step and the first training step"
            if any(p.name == "sanity_check" and p.seconds > 0 for p in tl.parts)
            else "the first training step"
        )
        line = f"Compiled with torch.compile: {names}{more}; its compilation runs inside {where}"
        return line + (f" ({first})." if first else ".")
    if extra and is_number(tl.fit_wall_s) and tl.fit_wall_s > 0 and extra / tl.fit_wall_s >= FIRST_STEP_SHARE:
        return (
            f"The first training step took {duration(extra)} more than a steady step "
            f"({fraction_percent(extra / tl.fit_wall_s)} of the fit): its warm-up (compilation, lazy "
            "initialisation, the first batch)."
        )
    return None


def _part_count(part: TimelinePart) -> str:
    if part.count is None:
        return ""
    return count(part.count)


def summary_line(tl: Timeline, analysis: RunAnalysis) -> str:
    """One sentence: the fit's wall time, its largest parts, and why it stopped (the summary's too)."""
    if not is_number(tl.fit_wall_s):
        return "The fit's wall time is unknown: the record has no start or end time."
    parts = sorted((p for p in tl.parts if p.seconds > 0), key=lambda p: -p.seconds)
    shown = ", ".join(f"{part_label(p.name, tl).lower()} {fraction_percent(p.share)}" for p in parts[:4])
    ranks = f" on rank {tl.rank}" if analysis.run.world_size > 1 else ""
    line = f"The fit took {duration(tl.fit_wall_s)}{ranks}: {shown}."
    why = stop_reason_text(tl)
    if why:
        line += f" It stopped because {why}."
    if is_number(tl.max_time_s):
        line += f" max_time was {duration(tl.max_time_s)}."
    return line


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    tl = analysis.timeline
    if tl is None:
        return [Paragraph("This report was written before tuneup recorded the fit's timeline.", True)]
    # The summary says the sentence; here the table gives every part, and why the fit stopped.
    out: list[Block] = []
    why = stop_reason_text(tl)
    if why:
        line = f"The fit stopped because {why}."
        if is_number(tl.max_time_s):
            line += f" max_time was {duration(tl.max_time_s)}."
        out.append(Paragraph(line))
    compiled = compile_line(tl)
    if compiled:
        out.append(Paragraph(compiled))
    meaning = dict(MEANING)
    if is_number(tl.tuneup_start_s):
        meaning["setup"] += f"; tuneup's own start-up {duration(tl.tuneup_start_s)}"
    # A part that never happened (no validation, no save) is named once below, not as a row of zeros.
    happened = [p for p in tl.parts if p.seconds > 0 or p.count]
    rows = [
        (
            part_label(p.name, tl),
            duration(p.seconds),
            fraction_percent(p.share),
            _part_count(p),
            meaning.get(p.name, ""),
        )
        for p in happened
    ]
    rows.append(("Fit", duration(tl.fit_wall_s), "100%", "", "setup to the fit's end"))
    out.append(
        table(
            "Parts of the fit",
            ("Part", "Time", "Share", "Count", "What it holds"),
            rows,
            (1, 2, 3),
            total=True,
        )
    )
    main = tl.per_rank[0] if tl.per_rank else None
    absent = [LABELS.get(p.name, text(p.name)).lower() for p in tl.parts if p not in happened]
    if absent and (main is None or main.times_recorded):  # an older record does not know: said below
        out.append(Paragraph(f"Not in this fit: {', '.join(absent)}.", True))
    if main is not None and not main.times_recorded:
        out.append(
            Paragraph(
                "This run was recorded before tuneup kept the fit's own times: setup, sanity check and "
                "teardown are unknown, and the fit is taken from the first step to the last.",
                True,
            )
        )
    elif main is not None and main.end != "fit end":
        out.append(Paragraph(f"The fit's end was not recorded; it is taken at the {main.end}.", True))
    if is_number(tl.before_fit_s):
        out.append(
            Paragraph(
                f"Before the fit, the process ran {duration(tl.before_fit_s)} (imports, data preparation, "
                "launching the ranks, the process group): not in the fit's time, but paid for.",
                True,
            )
        )
    if len(tl.per_rank) > 1:
        out.append(_rank_table(tl.per_rank))
    return out + figures(ID, plots)


def _rank_table(per_rank: list[RankTimeline]) -> Block:
    names = ("training_steps", "validation", "checkpoint_saves", "other_fit_loop")
    shown = (
        per_rank
        if len(per_rank) <= PER_ROW_LIMIT
        else sorted(per_rank, key=lambda r: -(r.wall_s or 0))[:PER_ROW_LIMIT]
    )
    rows = []
    for r in shown:
        seconds = {p.name: p.seconds for p in r.parts}
        rows.append((text(r.rank), duration(r.wall_s), *(duration(seconds.get(n)) for n in names)))
    title = "Per rank" if len(shown) == len(per_rank) else f"Per rank: the {len(shown)} longest fits"
    return table(title, ("Rank", "Fit", *(LABELS[n] for n in names)), rows, range(1, 2 + len(names)))


def _draw(analysis: RunAnalysis) -> Drawn | None:
    tl = analysis.timeline
    if tl is None or not tl.per_rank or not is_number(tl.fit_wall_s):
        return None
    ranks = tl.per_rank[:MAX_LINES]
    in_time = all(r.intervals for r in ranks)
    from matplotlib.patches import Patch

    # The report's plot height at least, however few ranks: every figure of a report has one size.
    fig, (ax,) = figure(height_px=max(HEIGHT_PX, 90 + 30 * len(ranks)))
    for y, r in enumerate(ranks):
        if in_time:
            # Where each part happened: the training loop as one stretch, the rest drawn over it.
            for iv in sorted(r.intervals, key=lambda iv: iv.name != "training_steps"):
                ax.barh(y, iv.duration_s, left=iv.start_s, color=COLORS.get(iv.name, "#B0B0B0"), height=0.6)
        else:
            left = 0.0
            for p in r.parts:
                if p.seconds > 0:
                    ax.barh(y, p.seconds, left=left, color=COLORS.get(p.name, "#B0B0B0"), height=0.6)
                    left += p.seconds
    ax.set_yticks(range(len(ranks)), [f"rank {r.rank}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the fit started")
    ax.grid(axis="y", visible=False)
    names = [n for n in LABELS if any(p.name == n and p.seconds > 0 for r in ranks for p in r.parts)]
    if in_time:
        names = [
            n for n in names if n != "other_fit_loop"
        ]  # not drawn apart: it is inside the loop's stretch
    bottom_legend(fig, [Patch(color=COLORS[n], label=LABELS[n]) for n in names])
    shown = (
        "" if len(ranks) == len(tl.per_rank) else f"The first {len(ranks)} of {len(tl.per_rank):,} ranks. "
    )
    how = (
        "Each row is one rank's fit in time, from the callback's setup to the fit's end: the training loop, "
        "with validation and checkpoint saves drawn where they happened (other fit-loop time is inside the "
        "loop's stretch)."
        if in_time
        else "Each bar is one rank's fit cut into its parts' totals (this record has no times of its own "
        "for validation and saves)."
    )
    return Drawn(fig, "Where the fit's time went", shown + how)


PLOTS: tuple[Plot, ...] = (Plot("fit_timeline.png", _draw),)
