"""The report's interruptions section: the run's segments, what each interruption cost, how often to save."""

from __future__ import annotations

from typing import Any

from tuneup.report.content import Block, KeyValues, Metric, Metrics, Paragraph, Table
from tuneup.report.format import count, duration, is_number, ms, text, unix_time, usd

_REASONS = {"start": "start", "resume": "resumed from a checkpoint", "restart": "restarted by torchrun"}


def _segment_row(seg: dict[str, Any]) -> tuple[str, ...]:
    first, last = seg.get("first_step"), seg.get("last_step")
    steps = f"{count(first)} to {count(last)}" if is_number(first) and is_number(last) else "—"
    reason = _REASONS.get(str(seg.get("reason")), text(seg.get("reason")))
    if is_number(seg.get("restart_count")) and seg.get("reason") == "restart":
        reason += f" (restart {seg['restart_count']})"
    status = ", ".join(text(s) for s in seg.get("status") or []) or "—"
    return (
        text(seg.get("index")),
        reason,
        text(seg.get("world_size")),
        steps,
        unix_time(seg.get("start_unix")),
        duration(seg["end_unix"] - seg["start_unix"])
        if is_number(seg.get("end_unix")) and is_number(seg.get("start_unix"))
        else "—",
        status,
        duration(seg.get("downtime_before_s")) if is_number(seg.get("downtime_before_s")) else "—",
        count(seg.get("redone_steps")) if is_number(seg.get("redone_steps")) else "—",
    )


def interruptions_blocks(report: dict[str, Any]) -> list[Block]:
    section = report.get("interruptions")
    if not isinstance(section, dict) or not isinstance(section.get("segments"), list):
        return [
            Paragraph(
                "No interruption figures: this report was made by a tuneup that did not work them out.", True
            )
        ]
    segments = [s for s in section["segments"] if isinstance(s, dict)]
    n = section.get("interruptions") or 0
    blocks: list[Block] = []
    if len(segments) <= 1 and not n:
        blocks.append(Paragraph("One segment, completed: the run was not interrupted or restarted.", True))
    else:
        metrics = [
            Metric("Interruptions", text(n), "segments that ended early or were restarted"),
            Metric("Time lost", duration(section.get("lost_s")), "downtime plus work redone"),
        ]
        if is_number(section.get("usd_lost")):
            metrics.append(
                Metric("Cost of the interruptions", usd(section["usd_lost"]), "at the job's price")
            )
        blocks.append(Metrics(tuple(metrics)))
        blocks.append(
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
        blocks.append(
            Paragraph(
                "The figures in the other sections are the last segment's. Steps redone are those between the "
                "checkpoint a segment resumed from and where the segment before it had got to."
            )
        )
        if is_number(section.get("usd_all_segments")):
            blocks.append(
                Paragraph(
                    f"All segments together cost {usd(section['usd_all_segments'])} at the job's price."
                )
            )
    blocks.extend(_checkpoint_advice(section))
    return blocks


def _checkpoint_advice(section: dict[str, Any]) -> list[Block]:
    save_s = section.get("checkpoint_save_s")
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
            f"{ms(save_s * 1000)} (median of {count(section.get('checkpoint_saves_seen'))} saves)",
        ),
        (
            "Mean time between interruptions",
            duration(section.get("mtbf_s")) if is_number(section.get("mtbf_s")) else "none observed",
        ),
    ]
    if is_number(section.get("recommended_checkpoint_interval_s")):
        pairs.append(
            ("Recommended checkpoint interval", duration(section["recommended_checkpoint_interval_s"]))
        )
    elif is_number(section.get("example_interval_s")):
        pairs.append(
            (
                f"Checkpoint interval if interrupted once per {duration(section.get('example_mtbf_s'))}",
                duration(section["example_interval_s"]),
            )
        )
    return [
        KeyValues("Checkpoints (Young/Daly)", tuple(pairs)),
        Paragraph(text(section.get("rule")) + ".", True),
    ]
