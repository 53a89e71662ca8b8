"""Where the fit's wall time went: setup, sanity check, training steps, validation, checkpoint saves, the
rest of the fit loop, and teardown, per rank, from the real start and end times the callback recorded.

Measured directly: each rank's fit start (the callback's `setup`) and end (its `teardown`), the sanity
check, every validation and every checkpoint save (start and duration), the training loop's start and
end, and every training step (its phases; windows aggregate the steps the record did not keep one by
one). What is left inside the training loop once steps, validation and saves are taken out is
"other_fit_loop": epoch ends, the trainer's work between batches that no step owns (after a validation,
around an epoch's first batch), other callbacks' epoch hooks. Records written before these times existed
fall back to the first and last step, and say so in `RankTimeline.end`.
"""

from __future__ import annotations

import statistics
from typing import Any

from tuneup._stats import finite, number
from tuneup.analyze.model import RankTimeline, Timeline, TimelineInterval, TimelinePart
from tuneup.analyze.steady import warmup_steps
from tuneup.record.schema import STOP_USER_INTERRUPT, RankRecord, Run

# A fit that ended by one of these is over: a report never projects time "to go" for it.
ENDED_REASONS = frozenset(
    {"max_steps", "max_epochs", "max_time", "early_stopping", "should_stop", "fast_dev_run", "end_of_data"}
)


def _num(raw: dict[str, Any], key: str) -> float | None:
    return number(raw.get(key))


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rank_stop_reason(rec: RankRecord) -> str | None:
    """Why this rank's fit ended, as its record says; None for a record that did not close (still running,
    or killed). Records written before an exception's reason was kept say it by their status alone: the
    callback closed a KeyboardInterrupt's as "interrupted", any other exception's as "exception"."""
    reason = rec.info.raw.get("stop_reason")
    if reason:
        return str(reason)
    return {"interrupted": STOP_USER_INTERRUPT, "exception": "exception"}.get(str(rec.info.raw.get("status")))


def rank_ended(rec: RankRecord, max_steps: int | None = None) -> bool:
    """Whether this rank's fit is over: it stopped for a reason that ends a fit (max_steps, early stopping...),
    or it closed as completed without saying why and short of no step budget (a plain loop's `with` block
    that ended normally: the loop cannot tell why it stopped, only that it did; with a max_steps it had not
    reached, what finishing it costs is still worth projecting)."""
    reason = rank_stop_reason(rec)
    if reason:
        return reason in ENDED_REASONS
    if not rec.info.closed or rec.info.raw.get("status") != "completed":
        return False
    last = rec.steps[-1].step if rec.steps else None
    return not (max_steps and max_steps > 0 and (last is None or last + 1 < max_steps))


def compiled_modules(run: Run) -> list[str] | None:
    """The modules torch.compile wraps, as the callback saw them at setup; None where it did not look."""
    compiled = run.manifest.model.get("compiled")
    return [str(name) for name in compiled] if isinstance(compiled, list) else None


def first_step_extra_s(rec: RankRecord) -> float | None:
    """How much longer the fit's first training step took than the steady step (the median after warm-up,
    as the analysis defines warm-up): its compilation under torch.compile, lazy initialisation, the first
    batch. None without a steady step to measure against."""
    walls = [s.wall_ms for s in rec.steps]
    warm = warmup_steps(walls)
    if len(walls) < 2 or warm >= len(walls):
        return None
    return finite(max(0.0, walls[0] - statistics.median(walls[max(1, warm) :])) / 1000.0)


def step_total_s(rec: RankRecord, metric: str = "wall_ms") -> tuple[float, int]:
    """Seconds of `metric` (a step's time or one of its parts: "wall_ms", "data_ms", "comm_exposed_ms",
    "sync_ms") summed over this rank's training steps, and over how many steps: from the windows, which
    aggregate every step, where there are any; else from the steps kept. A step without the metric (no
    timed collective) adds nothing."""
    total_ms, count = 0.0, 0
    for window in rec.windows:
        stats = window.stats.get(metric)
        if stats and "mean" in stats and "n" in stats:
            total_ms += stats["mean"] * stats["n"]
        count += window.count
    if count < len(rec.steps):  # no windows (an old or truncated record): the kept steps are all there is
        values = [getattr(s, metric) for s in rec.steps]
        total_ms, count = sum(v for v in values if v is not None), len(rec.steps)
    return total_ms / 1000.0, count


def training_steps_s(rec: RankRecord) -> tuple[float, int]:
    """Seconds spent in this rank's training steps, and how many."""
    return step_total_s(rec, "wall_ms")


def timed_events(rec: RankRecord, kind: str) -> list[tuple[float | None, float]]:
    """(start in unix seconds or None, duration in seconds) of each event of `kind` that has a duration."""
    out = []
    for event in rec.events:
        if event.get("kind") == kind:
            duration_ms = _num(event, "duration_ms")
            if duration_ms is not None and duration_ms >= 0:
                out.append((_num(event, "t_start"), duration_ms / 1000.0))
    return out


def overlap_s(inner: list[tuple[float | None, float]], outer: list[tuple[float | None, float]]) -> float:
    """Seconds of `inner` intervals that lie inside `outer` ones (a save made during a validation)."""
    total = 0.0
    for start, length in inner:
        if start is None:
            continue
        for o_start, o_length in outer:
            if o_start is not None:
                total += max(0.0, min(start + length, o_start + o_length) - max(start, o_start))
    return total


def fit_span(rec: RankRecord) -> tuple[float | None, float | None, str]:
    """This rank's fit start and end in unix seconds, and what the end is."""
    raw = rec.info.raw
    start = _num(raw, "fit_start_unix") or rec.info.start_unix
    last_step = rec.steps[-1].t_end if rec.steps else None
    if "train_start_unix" in raw:  # a record of the fit's times; older ones end at their last step
        for key, label in (("fit_end_unix", "fit end"), ("train_end_unix", "training end")):
            end = _num(raw, key)
            if end is not None:
                return start, end, label
        if rec.info.end_unix is not None and rec.info.closed:
            return start, rec.info.end_unix, "record closed"
    if start is None and rec.steps:
        start = rec.steps[0].t_end - rec.steps[0].wall_ms / 1000.0
    return start, last_step, "last step"


def rank_timeline(rec: RankRecord) -> RankTimeline:
    raw = rec.info.raw
    start, end, end_label = fit_span(rec)
    wall = end - start if start is not None and end is not None and end >= start else None
    train_start = _num(raw, "train_start_unix") or rec.info.start_unix
    train_end = _num(raw, "train_end_unix")
    sanity = timed_events(rec, "sanity_check")
    validation = timed_events(rec, "validation")
    saves = timed_events(rec, "checkpoint")
    steps_s, steps = training_steps_s(rec)
    sanity_s = sum(d for _, d in sanity)
    # Setup: everything before the training loop but the sanity check (the strategy's setup before it,
    # the fit loop's data setup after it).
    setup_s = (
        max(0.0, train_start - start - sanity_s)
        if start is not None and train_start is not None and _num(raw, "fit_start_unix")
        else 0.0
    )
    first_sanity = min((t for t, _ in sanity if t is not None), default=None)
    teardown_s = max(0.0, end - train_end) if end is not None and train_end is not None else 0.0
    saves_s = sum(d for _, d in saves)
    # A save inside a validation (ModelCheckpoint ordered before tuneup) is counted once, as a save.
    validation_s = sum(d for _, d in validation) - overlap_s(saves, validation)
    measured = {
        "setup": (setup_s, None),
        "sanity_check": (sanity_s, len(sanity)),
        "training_steps": (steps_s, steps),
        "validation": (max(0.0, validation_s), len(validation)),
        "checkpoint_saves": (saves_s, sum(1 for e in rec.events if e.get("kind") == "checkpoint")),
    }
    named = sum(seconds for seconds, _ in measured.values()) + teardown_s
    other = max(0.0, wall - named) if wall is not None else 0.0
    values = {**measured, "other_fit_loop": (other, None), "teardown": (teardown_s, None)}
    total = wall if wall else sum(seconds for seconds, _ in values.values())
    parts = [
        TimelinePart(name, seconds, seconds / total if total else 0.0, count)
        for name, (seconds, count) in values.items()
    ]
    recorded = "train_start_unix" in raw
    intervals: list[TimelineInterval] = []
    if recorded and start is not None:

        def at(name: str, t: float | None, seconds: float) -> None:
            if t is not None and seconds > 0:
                intervals.append(TimelineInterval(name, t - start, seconds))

        # Drawn as it happened: the strategy's setup up to the sanity check, the fit loop's after it.
        before_sanity = (first_sanity - start) if first_sanity is not None else setup_s
        at("setup", start, min(setup_s, max(0.0, before_sanity)))
        if first_sanity is not None and train_start is not None:
            after = setup_s - min(setup_s, max(0.0, before_sanity))
            at("setup", train_start - after, after)
        if train_start is not None:
            loop_end = train_end if train_end is not None else end
            at("training_steps", train_start, (loop_end or train_start) - train_start)
        for name, events in (
            ("sanity_check", sanity),
            ("validation", validation),
            ("checkpoint_saves", saves),
        ):
            for t, seconds in events:
                at(name, t, seconds)
        if train_end is not None:
            at("teardown", train_end, teardown_s)
    return RankTimeline(
        rec.rank, finite(start), finite(end), finite(wall), parts, end_label, recorded, intervals
    )


def timeline(run: Run) -> Timeline | None:
    if not run.ranks:
        return None
    per_rank = [rank_timeline(rec) for _, rec in sorted(run.ranks.items())]
    main = per_rank[0]
    rec = run.ranks[main.rank]
    raw = rec.info.raw
    steps = next(p.seconds for p in main.parts if p.name == "training_steps")
    loop_extra = sum(
        p.seconds for p in main.parts if p.name in ("validation", "checkpoint_saves", "other_fit_loop")
    )
    reasons = {reason for r in run.ranks.values() if (reason := rank_stop_reason(r))}
    closed = [r for r in run.ranks.values() if r.info.closed or rank_stop_reason(r)]
    stop = sorted(reasons)[0] if len(reasons) == 1 else (", ".join(sorted(reasons)) if reasons else None)
    process_start = _num(raw, "process_start_unix")
    return Timeline(
        rank=main.rank,
        fit_wall_s=main.wall_s,
        before_fit_s=finite(main.fit_start_unix - process_start)
        if process_start is not None
        and main.fit_start_unix is not None
        and main.fit_start_unix >= process_start
        else None,
        parts=main.parts,
        loop_overhead_share=finite(loop_extra / steps) if steps > 0 and main.times_recorded else None,
        ended=bool(closed)
        and all(rank_ended(r, _int_or_none(run.manifest.trainer.get("max_steps"))) for r in closed),
        stop_reason=stop,
        max_time_s=_num(run.manifest.trainer, "max_time_s"),
        per_rank=per_rank,
        tuneup_start_s=_num(raw, "tuneup_start_s"),
        compiled=compiled_modules(run),
        first_step_extra_s=first_step_extra_s(rec),
    )
