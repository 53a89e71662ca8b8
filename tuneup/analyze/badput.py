"""The badput ledger: where a run's wall time and dollars went, split into productive training compute and
named badput, adding up to the whole.

Each rank's time over the run's span (the first rank's fit start to the last rank's fit end) is split by
what its record measured (tuneup/analyze/timeline.py):

- inside the training steps (every step, from the windows): the wait for the batch (data_wait), the
  collectives the step waited for (exposed_communication), the trainer's own barriers between batches and
  a rank's wait for a late one at the collectives (sync_wait: its exposed time above the least-waiting
  rank's, per step), the first step's time above the steady step (startup: compilation, warm-up), and the
  steps whose progress an interruption lost, which the next segment did again (restarts, whole: their
  waits too); what is left is productive_compute;
- around them: the fit's setup and sanity check (startup), validation and checkpoint saves (the callback
  timed each), the fit loop's time between steps and the teardown (other);
- a rank's time outside its own fit while the others ran (idle_devices);
- between segments, after an interruption: from one fit's end to the next one's start (restarts; the next
  fit's setup and checkpoint restore are its startup, as in every fit). The interruptions section's
  downtime is measured between the records (last step, record opened), for its checkpoint interval.

The ranks' shares are averaged (each rank is one device's time), segments and downtime are summed, and
dollars are device-time at the run's price: on a one-segment run the ledger's dollars are the cost
section's. Google's ml-goodput-measurement names the same categories (initialization, program startup,
data loading, checkpointing, wasted progress from disruptions); it reports no dollars.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuneup._stats import finite
from tuneup.analyze.model import BADPUT_CATEGORIES, Badput, BadputCategory, Interruptions
from tuneup.analyze.run_info import run_span
from tuneup.analyze.timeline import first_step_extra_s, overlap_s, rank_timeline, step_total_s, timed_events
from tuneup.record.schema import RankRecord, Run

BASIS = {
    "productive_compute": "the training steps' time less the waits and repeats named below",
    "startup": "the fit's setup and sanity check, and the first step's time above the steady step",
    "data_wait": "the training steps' wait for their batch, every step",
    "exposed_communication": "collectives the steps waited for, less the waits for a late rank",
    "sync_wait": "the trainer's barriers between batches, and waits at the collectives for a late rank",
    "validation": "the validation loops, as the callback timed them",
    "checkpoint_saves": "the checkpoint saves, as the callback timed them",
    "restarts": "after an interruption, the time from one segment's fit end to the next one's fit start "
    "(the next fit's setup is startup), and the steps the resume did again",
    "idle_devices": "a rank's time outside its own fit while the run's other ranks were in theirs",
    "other": "the fit loop's time between steps, teardown, and what no record names",
}

JUDGEMENT = {
    "startup": "a fit cannot start without it, and a compilation may pay for itself in faster steps",
    "exposed_communication": "data-parallel training needs its collectives; overlap and a faster link "
    "shrink the exposed part, not all of it",
    "validation": "useful work to many teams (model selection, early stopping): `--validation-useful` counts "
    "it as such",
    "checkpoint_saves": "insurance against interruptions; the checkpoint interval (Young/Daly, in the "
    "interruptions section) sizes it",
}


@dataclass
class _Seconds:
    """One segment's seconds by category (the mean over its ranks), and the device count they are paid at."""

    world_size: int
    by_category: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BADPUT_CATEGORIES, 0.0))


def _late_rank_waits_s(step_totals: dict[int, dict[str, tuple[float, int]]]) -> dict[int, float]:
    """Each rank's wait at the collectives for a late rank: its exposed collective time per step above the
    least-waiting rank's (the last to arrive waits least; what it waits is the transfer), over its steps.
    `step_totals` is each rank's `step_total_s` by step metric."""
    per_step = {}
    for rank, totals in step_totals.items():
        exposed_s, steps = totals["comm_exposed_ms"]
        if steps and exposed_s > 0:
            per_step[rank] = (exposed_s / steps, steps)
    if len(per_step) < 2:
        return {}
    least = min(mean for mean, _ in per_step.values())
    return {rank: (mean - least) * steps for rank, (mean, steps) in per_step.items()}


# The step metrics a step's badput is read from, and the wall time they are parts of.
_STEP_METRICS = ("wall_ms", "data_ms", "comm_exposed_ms", "sync_ms")


def _redone_steps_s(rec: RankRecord, from_step: int | None) -> dict[str, float]:
    """Seconds of this rank's steps numbered `from_step` and up, by step metric: the steps the next segment
    did again, having resumed from an older checkpoint (their progress was lost). From the steps kept, scaled
    to the steps run where the record kept one in `sample_every`."""
    if from_step is None:
        return {}
    kept = [s for s in rec.steps if s.step >= from_step]
    if not kept:
        return {}
    ran = max(s.step for s in kept) + 1 - from_step
    scale = max(1.0, ran / len(kept))
    return {m: scale * sum(getattr(s, m) or 0.0 for s in kept) / 1000.0 for m in _STEP_METRICS}


def _fit_parts_s(rec: RankRecord) -> dict[str, float]:
    """The rank's fit timeline parts in seconds. A record without the fit's own times spans its first step
    to its last: a validation or save timed outside that span (the sanity check before it, a last save
    after it) is counted only for what falls inside, and the rest of the span is the fit loop's."""
    tl = rank_timeline(rec)
    parts = {p.name: p.seconds for p in tl.parts}
    if tl.times_recorded or tl.fit_start_unix is None or tl.wall_s is None:
        return parts
    span = [(tl.fit_start_unix, tl.wall_s)]
    for name, kind in (
        ("sanity_check", "sanity_check"),
        ("validation", "validation"),
        ("checkpoint_saves", "checkpoint"),
    ):
        parts[name] = overlap_s(timed_events(rec, kind), span)
    named = sum(v for k, v in parts.items() if k != "other_fit_loop")
    parts["other_fit_loop"] = max(0.0, tl.wall_s - named)
    return parts


def _rank_seconds(
    rec: RankRecord,
    span_s: float,
    step_totals: dict[str, tuple[float, int]],
    late_wait_s: float,
    redone: dict[str, float],
) -> dict[str, float]:
    """One rank's seconds by category, adding up to the run's span; `step_totals` is its `step_total_s` by
    step metric, `redone` what `_redone_steps_s` gives for its steps that a later segment did again."""
    parts = _fit_parts_s(rec)
    total = {m: step_totals[m][0] - redone.get(m, 0.0) for m in _STEP_METRICS}
    # The parts of the steps that are not productive, in this order, each within what is left of the steps:
    # the redone steps whole (waits and all), then the waits of the others.
    inside = {
        "restarts": redone.get("wall_ms", 0.0),
        "data_wait": total["data_ms"],
        "exposed_communication": total["comm_exposed_ms"] - late_wait_s,
        "sync_wait": total["sync_ms"] + late_wait_s,
        "startup": first_step_extra_s(rec) or 0.0,
    }
    left = parts["training_steps"]
    seconds = dict.fromkeys(BADPUT_CATEGORIES, 0.0)
    for name, value in inside.items():
        taken = min(max(0.0, value), left)
        seconds[name] += taken
        left -= taken
    seconds["productive_compute"] = left
    seconds["startup"] += parts["setup"] + parts["sanity_check"]
    seconds["validation"] = parts["validation"]
    seconds["checkpoint_saves"] = parts["checkpoint_saves"]
    seconds["other"] = parts["other_fit_loop"] + parts["teardown"]
    rest = span_s - sum(seconds.values())
    if rest >= 0:
        # The rank's fit was shorter than the run's span: it started late or ended early.
        seconds["idle_devices"] = rest
    else:
        # The timed parts overlap beyond the rank's fit (events timed across its end): trimmed from the
        # least specific category first, then in proportion, so that the ledger still adds up.
        cut = min(seconds["other"], -rest)
        seconds["other"] -= cut
        over = sum(seconds.values()) - span_s
        if over > 0 and span_s > 0:
            scale = span_s / sum(seconds.values())
            seconds = {name: value * scale for name, value in seconds.items()}
    return seconds


def _segment_seconds(run: Run, redone_from_step: int | None) -> tuple[_Seconds, float, float]:
    """A segment's seconds by category (the mean over its ranks), and its span's start and end;
    `redone_from_step` is the first of its steps that the next segment did again, if any."""
    t0, t_end = run_span(run)
    span_s = max(0.0, t_end - t0)
    ranks = [rec for _, rec in sorted(run.ranks.items())]
    # One pass over each rank's windows per metric, for the late-rank waits and the rank's own split alike.
    step_totals = {rec.rank: {m: step_total_s(rec, m) for m in _STEP_METRICS} for rec in ranks}
    waits = _late_rank_waits_s(step_totals)
    out = _Seconds(world_size=run.world_size)
    for rec in ranks:
        redone = _redone_steps_s(rec, redone_from_step)
        seconds = _rank_seconds(rec, span_s, step_totals[rec.rank], waits.get(rec.rank, 0.0), redone)
        for name, value in seconds.items():
            out.by_category[name] += value / len(ranks)
    return out, t0, t_end


def badput_ledger(
    segments: list[Run],
    interruptions: Interruptions | None,
    usd_per_device_hour: float | None,
    before_fit_s: float | None = None,
    validation_useful: bool = False,
) -> Badput | None:
    """The ledger of the run whose segments (in order; one for a run never restarted) are given;
    `interruptions` is their interruptions section (the downtime and redone steps it found), `before_fit_s`
    the first segment's time from its process start to its fit (the job timeline's). None where no segment
    has a rank."""
    rows = interruptions.segments if interruptions and len(interruptions.segments) == len(segments) else None
    parts: list[_Seconds] = []
    gaps_s = 0.0
    previous_end: float | None = None
    for i, run in enumerate(segments):
        if not run.ranks:
            continue
        after = rows[i + 1] if rows and i + 1 < len(rows) else None
        redone_from = after.first_step if after is not None and after.redone_steps else None
        seconds, t0, t_end = _segment_seconds(run, redone_from)
        if previous_end is not None:
            gap_s = max(0.0, t0 - previous_end)
            if rows and rows[i].downtime_before_s is not None:
                # After an interruption the job's devices are held while it restarts: paid badput.
                downtime = _Seconds(world_size=parts[-1].world_size)
                downtime.by_category["restarts"] = gap_s
                parts.append(downtime)
            else:
                gaps_s += gap_s
        parts.append(seconds)
        previous_end = t_end
    if not parts:
        return None
    totals = {name: sum(p.by_category[name] for p in parts) for name in BADPUT_CATEGORIES}
    usd = (
        {
            name: sum(p.by_category[name] * p.world_size for p in parts) * usd_per_device_hour / 3600.0
            for name in BADPUT_CATEGORIES
        }
        if usd_per_device_hour is not None
        else None
    )
    wall_s = sum(totals.values())
    useful = {"productive_compute", "validation"} if validation_useful else {"productive_compute"}
    categories = [
        BadputCategory(
            name=name,
            seconds=totals[name],
            share=totals[name] / wall_s if wall_s > 0 else 0.0,
            usd=finite(usd[name]) if usd is not None else None,
            useful=name in useful,
            basis=BASIS[name],
            judgement=JUDGEMENT.get(name),
        )
        for name in BADPUT_CATEGORIES
    ]
    useful_s = sum(totals[name] for name in useful)
    total_usd = finite(sum(usd.values())) if usd is not None else None
    return Badput(
        wall_s=wall_s,
        usd=total_usd,
        device_hours=sum(sum(p.by_category.values()) * p.world_size for p in parts) / 3600.0,
        categories=categories,
        useful_s=useful_s,
        useful_share=useful_s / wall_s if wall_s > 0 else 0.0,
        badput_usd=finite(sum(v for name, v in usd.items() if name not in useful))
        if usd is not None
        else None,
        validation_useful=validation_useful,
        segments=len(segments),
        before_fit_s=before_fit_s,
        before_fit_usd=finite(before_fit_s * segments[0].world_size * usd_per_device_hour / 3600.0)
        if before_fit_s is not None and usd_per_device_hour is not None
        else None,
        gaps_between_segments_s=gaps_s,
    )
