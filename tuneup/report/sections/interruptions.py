"""The Interruptions section: the run's segments, what each interruption cost, and how often to save a
checkpoint (Young/Daly)."""

from __future__ import annotations

from collections.abc import Sequence

from tuneup.analyze.model import Interruptions, RunAnalysis, Segment
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, KeyValues, Metric, Metrics, Paragraph, Table
from tuneup.report.format import MISSING, count, duration, is_number, ms, text, unix_time, usd
from tuneup.report.plotting import Plot

ID = "interruptions"
TITLE = "Interruptions and checkpoints"
PLOTS: tuple[Plot, ...] = ()

NOT_MEASURED = "No interruption figures: this report was made by a tuneup that did not work them out."

_REASONS = {"start": "start", "resume": "resumed from a checkpoint", "restart": "restarted by torchrun"}


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    section = analysis.interruptions
    if section is None:
        return [Paragraph(NOT_MEASURED, True)]
    segments = section.segments
    n = section.interruptions or 0
    out: list[Block] = []
    if len(segments) <= 1 and not n and section.user_stops:
        out.append(Paragraph("One segment, stopped by the user (Ctrl-C): a stop, not an interruption.", True))
    elif len(segments) <= 1 and not n:
        out.append(Paragraph("One segment, completed: the run was not interrupted or restarted.", True))
    else:
        metrics = [
            Metric("Interruptions", text(n), "segments that ended early or were restarted"),
            Metric("Time lost", duration(section.lost_s), "downtime plus work redone or not saved"),
        ]
        if is_number(section.usd_lost):
            metrics.append(Metric("Cost of the interruptions", usd(section.usd_lost), "at the job's price"))
        out.append(Metrics(tuple(metrics)))
        out.append(
            Table(
                "Segments",
                (
                    "Segment",
                    "Began as",
                    "Ranks",
                    "Steps",
                    "Started",
                    "Ran for",
                    "Ended",
                    "Down before",
                    "Steps redone",
                ),
                tuple(_segment_row(s) for s in segments),
                numeric=frozenset({0, 2, 5, 7, 8}),
            )
        )
        out.append(
            Paragraph(
                "The figures in the other sections are the last segment's. Steps redone are those between the "
                "checkpoint a segment resumed from and where the segment before it had got to."
            )
        )
        if is_number(section.usd_all_segments):
            out.append(
                Paragraph(f"All segments together cost {usd(section.usd_all_segments)} at the job's price.")
            )
    out.extend(_checkpoint_advice(section))
    return out


def _segment_row(seg: Segment) -> tuple[str, ...]:
    first, last = seg.first_step, seg.last_step
    steps = f"{count(first)} to {count(last)}" if is_number(first) and is_number(last) else MISSING
    reason = _REASONS.get(seg.reason, text(seg.reason))
    if is_number(seg.restart_count) and seg.reason == "restart":
        reason += f" (restart {seg.restart_count})"
    ran_for = (
        duration(seg.end_unix - seg.start_unix)
        if is_number(seg.end_unix) and is_number(seg.start_unix)
        else MISSING
    )
    return (
        text(seg.index),
        reason,
        text(seg.world_size),
        steps,
        unix_time(seg.start_unix),
        ran_for,
        ", ".join(text(s) for s in seg.status) or MISSING,
        duration(seg.downtime_before_s) if is_number(seg.downtime_before_s) else MISSING,
        count(seg.redone_steps) if is_number(seg.redone_steps) else MISSING,
    )


def _checkpoint_advice(section: Interruptions) -> list[Block]:
    save_s = section.checkpoint_save_s
    if not is_number(save_s):
        return [
            Paragraph(
                "No checkpoint save was seen in the recorded steps, so no checkpoint interval is recommended: "
                "the save time is measured from the steps that carry a save.",
                True,
            )
        ]
    pairs = [
        (
            "Time to save a checkpoint",
            f"{ms(save_s * 1000)} (median of {count(section.checkpoint_saves_seen)} saves)",
        ),
        (
            "Mean time between interruptions",
            duration(section.mtbf_s) if is_number(section.mtbf_s) else "none observed",
        ),
    ]
    if is_number(section.recommended_checkpoint_interval_s):
        pairs.append(("Recommended checkpoint interval", duration(section.recommended_checkpoint_interval_s)))
    elif is_number(section.example_interval_s):
        pairs.append(
            (
                f"Checkpoint interval if interrupted once per {duration(section.example_mtbf_s)}",
                duration(section.example_interval_s),
            )
        )
    return [
        KeyValues("Checkpoints (Young/Daly)", tuple(pairs)),
        Paragraph(text(section.rule) + ".", True),
    ]
