"""Interruptions: a run's segments, the time and work each interruption cost, and how often to checkpoint.

Each segment after the first began because the one before it ended early (a kill, a crash, a pre-emption)
or was restarted. An interruption costs the downtime between segments and the work redone: the steps
between the checkpoint a segment resumed from and where the segment before it had got to; where no
segment resumed after it yet, the training since its last save, which a resume will redo. A segment the
user stopped (Ctrl-C) ended as its user chose: it is no interruption, and no checkpoint interval is
planned for it (a SIGTERM's pre-emption or a kill still counts).

The checkpoint interval that minimizes the expected loss is Young/Daly's T = sqrt(2 x C x MTBF), with C
the time to save one checkpoint (measured: how much longer the steps that carried a save took than the
others) and MTBF the mean time between interruptions (observed: the run's time over its interruptions).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from tuneup._stats import finite
from tuneup.analyze.model import Interruptions, Segment
from tuneup.analyze.run_info import STATUS_COMPLETED, rank_status
from tuneup.analyze.steady import steady_steps
from tuneup.analyze.timeline import rank_stop_reason, timed_events
from tuneup.record.schema import STOP_USER_INTERRUPT, Run

# Without an observed interruption the interval is shown for this MTBF, as an example only.
EXAMPLE_MTBF_S = 24 * 3600.0


def _steady_ms(run: Run) -> float | None:
    times = []
    for rec in run.ranks.values():
        times.extend(s.wall_ms for s in steady_steps(rec.steps) if not s.checkpoint)
    return statistics.median(times) if times else None


def _timed_saves_s(segments: list[Run]) -> list[float]:
    """Each checkpoint save's duration in seconds, as the callback timed it (trainer.save_checkpoint,
    start to end, wherever it happened: in a step's gap, at an epoch's end, after validation). The
    slowest rank's, since the ranks wait for each other at the save's barrier."""
    saves: list[float] = []
    for run in segments:
        per_rank = [[seconds for _, seconds in timed_events(rec, "checkpoint")] for rec in run.ranks.values()]
        if per_rank and per_rank[0]:
            # The n-th save of every rank is one save; a rank whose record lost some ends the pairing.
            saves.extend(max(times) for times in zip(*per_rank, strict=False))
    return saves


def checkpoint_save_s(segments: list[Run], steady_ms: list[float | None]) -> tuple[float | None, int]:
    """The time one checkpoint save takes, and how many saves that is from: timed by the callback where
    the record has the saves' durations; in older records, how much longer the steps that carried a save
    took than each segment's usual (median steady) step."""
    timed = _timed_saves_s(segments)
    if timed:
        return statistics.median(timed), len(timed)
    extra, saves = [], 0
    for run, usual in zip(segments, steady_ms, strict=True):
        if usual is None:
            continue
        for rec in run.ranks.values():
            flagged = [s.wall_ms for s in rec.steps if s.checkpoint]
            saves = max(saves, len(flagged))
            extra.extend(max(0.0, w - usual) / 1000.0 for w in flagged)
    return (statistics.median(extra), saves) if extra else (None, 0)


def young_daly_interval_s(save_s: float, mtbf_s: float) -> float:
    return math.sqrt(2.0 * save_s * mtbf_s)


def stopped_by_user(run: Run) -> bool:
    """Whether the user stopped this segment (Ctrl-C): every rank that closed says so. A rank that left no
    closed record beside them is the stop's doing too (it was ended with the others)."""
    reasons = [rank_stop_reason(rec) for rec in run.ranks.values() if rec.info.closed]
    return bool(reasons) and all(reason == STOP_USER_INTERRUPT for reason in reasons)


def _segment(run: Run, step_ms: float | None) -> Segment:
    info = run.manifest.raw.get("segment") if isinstance(run.manifest.raw.get("segment"), dict) else {}
    steps = [s for rec in run.ranks.values() for s in rec.steps]
    starts = [rec.info.start_unix for rec in run.ranks.values() if rec.info.start_unix]
    statuses = sorted({rank_status(rec) for rec in run.ranks.values()})
    return Segment(
        index=int(info.get("index") or 0),
        reason=info.get("reason", "start"),
        restart_count=info.get("restart_count"),
        checkpoint=info.get("checkpoint"),
        path=run.location,
        world_size=run.world_size,
        first_step=min((s.step for s in steps), default=None),
        last_step=max((s.step for s in steps), default=None),
        start_unix=finite(min(starts)) if starts else None,
        end_unix=finite(max(s.t_end for s in steps)) if steps else None,
        status=statuses,
        step_ms=finite(step_ms),
    )


def _unsaved_s(run: Run, segment: Segment) -> float | None:
    """Seconds of training from the segment's last checkpoint save (its end, as the callback timed it; in
    older records the end of the last step that carried one) to its last step, or from its first step
    without a save: what an interruption at its end lost."""
    saves = [t + d for rec in run.ranks.values() for t, d in timed_events(rec, "checkpoint") if t is not None]
    saves = saves or [s.t_end for rec in run.ranks.values() for s in rec.steps if s.checkpoint]
    starts = [s.t_end - s.wall_ms / 1000.0 for rec in run.ranks.values() for s in rec.steps[:1]]
    if segment.end_unix is None or not (saves or starts):
        return None
    since = max(saves) if saves else min(starts)
    return finite(max(0.0, segment.end_unix - since))


def _completed(segment: Segment) -> bool:
    return segment.status == [STATUS_COMPLETED]


def _after_interruption(before: Segment, after: Segment) -> Segment:
    """`after` with what the interruption before it cost: the downtime and the steps done again. A fit
    resumed after one that completed (training on from its last checkpoint) followed no interruption."""
    if _completed(before):
        return after
    gap = (
        max(0.0, after.start_unix - before.end_unix)
        if after.start_unix is not None and before.end_unix is not None
        else None
    )
    redone = (
        max(0, before.last_step + 1 - after.first_step)
        if before.last_step is not None and after.first_step is not None
        else None
    )
    redo_s = redone * before.step_ms / 1000.0 if redone is not None and before.step_ms else None
    return dataclasses.replace(
        after, downtime_before_s=finite(gap), redone_steps=redone, redone_s=finite(redo_s)
    )


def interruptions_section(segments: list[Run], usd_per_device_hour: float | None = None) -> Interruptions:
    """The segments, what each interruption cost, and the recommended checkpoint interval."""
    steady_ms = [_steady_ms(run) for run in segments]  # one warm-up detection per segment
    rows = [_segment(run, ms) for run, ms in zip(segments, steady_ms, strict=True)]
    by_user = [stopped_by_user(run) for run in segments]
    for i in range(1, len(rows)):
        if not by_user[i - 1]:
            rows[i] = _after_interruption(rows[i - 1], rows[i])
    for i, (run, user) in enumerate(zip(segments, by_user, strict=True)):
        resumed = i + 1 < len(rows) and rows[i + 1].redone_steps is not None
        if not (_completed(rows[i]) or user or resumed):
            rows[i] = dataclasses.replace(rows[i], unsaved_s=_unsaved_s(run, rows[i]))
    downtime_s = sum(r.downtime_before_s or 0.0 for r in rows)
    redone_s = sum(r.redone_s or 0.0 for r in rows)
    unsaved_s = sum(r.unsaved_s or 0.0 for r in rows)
    # A segment that did not complete ended with an interruption, whether or not another followed it;
    # resuming a completed fit to train on is none, and neither is a fit the user stopped.
    interruptions = sum(1 for row, user in zip(rows, by_user, strict=True) if not (_completed(row) or user))
    span = [r for r in rows if r.start_unix is not None and r.end_unix is not None]
    run_s = (span[-1].end_unix - span[0].start_unix) if span else None  # type: ignore[operator]
    save_s, saves = checkpoint_save_s(segments, steady_ms)
    mtbf_s = run_s / interruptions if run_s and interruptions else None
    usd_all = usd_lost = None
    if usd_per_device_hour is not None:
        # Devices were paid while they ran, whatever became of the work; lost work is paid twice.
        usd_all = finite(
            sum(
                (r.end_unix - r.start_unix) / 3600.0 * usd_per_device_hour * r.world_size  # type: ignore[operator]
                for r in span
            )
        )
        usd_lost = finite(
            sum(
                ((r.downtime_before_s or 0.0) + (r.redone_s or 0.0) + (r.unsaved_s or 0.0))
                / 3600.0
                * usd_per_device_hour
                * r.world_size
                for r in rows
            )
        )
    return Interruptions(
        segments=rows,
        interruptions=interruptions,
        downtime_s=finite(downtime_s),
        redone_s=finite(redone_s),
        lost_s=finite(downtime_s + redone_s + unsaved_s),
        run_s=finite(run_s),
        checkpoint_save_s=finite(save_s),
        checkpoint_saves_seen=saves,
        mtbf_s=finite(mtbf_s),
        recommended_checkpoint_interval_s=finite(young_daly_interval_s(save_s, mtbf_s))
        if save_s and mtbf_s
        else None,
        example_interval_s=finite(young_daly_interval_s(save_s, EXAMPLE_MTBF_S)) if save_s else None,
        example_mtbf_s=EXAMPLE_MTBF_S,
        rule="Young/Daly: interval = sqrt(2 x checkpoint save time x mean time between interruptions)",
        usd_all_segments=usd_all,
        usd_lost=usd_lost,
        user_stops=sum(by_user),
        unsaved_s=finite(unsaved_s),
    )
