"""The badput ledger: where a run's wall time and dollars went, split into productive training compute and
named badput, adding up to the whole.

Each rank's time over the run's span (the first rank's fit start to the last rank's fit end) is split by
what its record measured (tuneup/analyze/timeline.py):

- inside the training steps (every step, from the windows): the wait for the batch (data_wait), the
  collectives the step waited for (exposed_communication), the trainer's own barriers between batches and
  a rank's wait for a late one at the collectives (sync_wait: its exposed time above the least-waiting
  rank's, per step), the first step's time above the steady step (startup: compilation, warm-up), the
  steps a resumed segment did again (restarts); what is left is productive_compute;
- around them: the fit's setup and sanity check (startup), validation and checkpoint saves (the callback
  timed each), the fit loop's time between steps and the teardown (other);
- a rank's time outside its own fit while the others ran (idle_devices);
- between segments, the downtime after an interruption (restarts).

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
from tuneup.analyze.timeline import first_step_extra_s, rank_timeline, step_total_s
from tuneup.record.schema import RankRecord, Run

BASIS = {
    "productive_compute": "the training steps' time less the waits and repeats named below",
    "startup": "the fit's setup and sanity check, and the first step's time above the steady step",
    "data_wait": "the training steps' wait for their batch, every step",
    "exposed_communication": "collectives the steps waited for, less the waits for a late rank",
    "sync_wait": "the trainer's barriers between batches, and waits at the collectives for a late rank",
    "validation": "the validation loops, as the callback timed them",
    "checkpoint_saves": "the checkpoint saves, as the callback timed them",
    "restarts": "downtime between segments after an interruption, and the steps a resume did again",
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


def _late_rank_waits_s(ranks: list[RankRecord]) -> dict[int, float]:
    """Each rank's wait at the collectives for a late rank: its exposed collective time per step above the
    least-waiting rank's (the last to arrive waits least; what it waits is the transfer), over its steps."""
    per_step = {}
    for rec in ranks:
        exposed_s, steps = step_total_s(rec, "comm_exposed_ms")
        if steps and exposed_s > 0:
            per_step[rec.rank] = (exposed_s / steps, steps)
    if len(per_step) < 2:
        return {}
    least = min(mean for mean, _ in per_step.values())
    return {rank: (mean - least) * steps for rank, (mean, steps) in per_step.items()}


def _rank_seconds(rec: RankRecord, span_s: float, late_wait_s: float, redone_s: float) -> dict[str, float]:
    """One rank's seconds by category, adding up to the run's span."""
    parts = {p.name: p.seconds for p in rank_timeline(rec).parts}
    steps_s = parts["training_steps"]
    # The parts of the steps that are not productive, in this order, each within what is left of the steps.
    inside = {
        "data_wait": step_total_s(rec, "data_ms")[0],
        "exposed_communication": step_total_s(rec, "comm_exposed_ms")[0] - late_wait_s,
        "sync_wait": step_total_s(rec, "sync_ms")[0] + late_wait_s,
        "startup": first_step_extra_s(rec) or 0.0,
        "restarts": redone_s,
    }
    left = steps_s
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


def _segment_seconds(run: Run, redone_s: float) -> tuple[_Seconds, float, float]:
    """A segment's seconds by category (the mean over its ranks), and its span's start and end."""
    t0, t_end = run_span(run)
    span_s = max(0.0, t_end - t0)
    ranks = [rec for _, rec in sorted(run.ranks.items())]
    waits = _late_rank_waits_s(ranks)
    out = _Seconds(world_size=run.world_size)
    for rec in ranks:
        for name, value in _rank_seconds(rec, span_s, waits.get(rec.rank, 0.0), redone_s).items():
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
        redone_s = (rows[i].redone_s or 0.0) if rows else 0.0
        seconds, t0, t_end = _segment_seconds(run, redone_s)
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
