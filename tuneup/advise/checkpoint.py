"""Checkpoint interval: how often to save so that interruptions cost the least time (Young/Daly).

Saving every τ seconds, with a save taking C seconds and interruptions every M seconds on average, loses
(first order, Young 1974) a share of the wall time

    waste(τ) = C/τ + τ/(2M)        (the saves, and on average half an interval of work redone per interruption)

least at τ* = sqrt(2·C·M). The objective is the time lost to interruptions and saves; the gain is the
share of it the new interval saves: 1 − waste(τ*)/waste(τ₀), τ₀ the run's own interval (its time over the
saves it made). C is measured (the callback times each save); M is observed: the run's time over its
interruptions, so it is known only where the record has at least one. The interval of the gain is M's
~90% interval for a Poisson count of n interruptions (Wilson–Hilferty), τ* held at the proposal.

Downtime per interruption (restart, requeue) is lost whatever the interval, so it is left out of both.

A fit the user stopped (Ctrl-C) is no interruption (tuneup.analyze.interruptions): it says nothing of how
often the job is interrupted, and nothing is recommended from it. The evidence puts the model's loss in
seconds beside the time the report counts as lost, so that the two can be read together.
"""

from __future__ import annotations

import math

from tuneup.advise.context import AdviceContext
from tuneup.advise.model import Change, Range, Recommendation
from tuneup.analyze.interruptions import young_daly_interval_s
from tuneup.analyze.model import Interruptions

Z90 = 1.645
OBJECTIVE = "time lost to interruptions"


def waste_share(interval_s: float, save_s: float, mtbf_s: float) -> float:
    """Young's first-order share of wall time lost to saves and redone work."""
    return save_s / interval_s + interval_s / (2.0 * mtbf_s)


def poisson_rate_interval(events: int, span_s: float) -> tuple[float, float]:
    """~90% interval of an event rate from `events` seen in `span_s` (Wilson–Hilferty)."""

    def quantile(k: float, z: float) -> float:
        return k * (1 - 1 / (9 * k) + z / (3 * math.sqrt(k))) ** 3

    low = quantile(events, -Z90) if events > 0 else 0.0
    high = quantile(events + 1, Z90)
    return max(0.0, low) / span_s, high / span_s


def _duration(s: float) -> str:
    # Never "0 s": an interval under ten seconds keeps its significant digits.
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.0f} min"
    if s >= 10:
        return f"{s:.0f} s"
    return f"{s:.2g} s"


def recommend(ctx: AdviceContext) -> list[Recommendation]:
    section = ctx.analysis.interruptions
    knob = "checkpoint interval"
    if section is None:
        ctx.skip(knob, "the analysis has no interruption figures")
        return []
    if not section.interruptions and section.user_stops:
        ctx.skip(
            knob,
            "the run was stopped by the user (Ctrl-C), which is no interruption: it says nothing of how often "
            "the job is interrupted, so there is nothing to plan checkpoints for",
        )
        return []
    if not section.interruptions or not section.mtbf_s:
        ctx.skip(
            knob,
            "no interruption recorded, so the mean time between interruptions is unknown and Young/Daly has "
            "nothing to weigh the saves against",
        )
        return []
    save_s = section.checkpoint_save_s
    if not save_s:
        ctx.skip(knob, "no checkpoint save was timed: the interval's cost side is unknown")
        return []
    mtbf, n, run_s = (
        section.mtbf_s,
        section.interruptions,
        section.run_s or section.mtbf_s * section.interruptions,
    )
    best = young_daly_interval_s(save_s, mtbf)
    saves = section.checkpoint_saves_seen
    current = run_s / saves if saves else None
    if current is None:
        ctx.skip(knob, "the run's own save interval is unknown (no saves counted)")
        return []
    now, then = waste_share(current, save_s, mtbf), waste_share(best, save_s, mtbf)
    gain = 1 - then / now

    def gain_at(m: float) -> float:
        return 1 - waste_share(best, save_s, m) / waste_share(current, save_s, m)

    rate_low, rate_high = poisson_rate_interval(n, run_s)
    ends = [gain_at(1 / r) for r in (rate_low, rate_high) if r > 0] + [gain]
    rng = Range(gain, min(ends), max(ends))
    if rng.value < ctx.min_gain:
        ctx.skip(
            knob,
            f"saving every {_duration(best)} instead of every {_duration(current)} would cut the time lost "
            f"by {gain:.1%}, under the {ctx.min_gain:.0%} threshold",
        )
        return []
    step_s = (ctx.observation.step_mean_ms / 1000.0) * (1 + (_loop_overhead(ctx) or 0.0))
    steps = max(1, round(best / step_s))
    # The time-based form only where it is a whole number of seconds: timedelta(seconds=0) saves never.
    python, yaml = ctx.code.checkpoint(steps, best if round(best) >= 1 else None)
    evidence = [
        f"{n} interruption(s) in {_duration(run_s)}: mean time between interruptions {_duration(mtbf)}",
        f"a checkpoint save takes {save_s:.2g} s (median of {saves} timed)",
        f"the run saved every {_duration(current)} on average: expected loss {now:.2%} of the wall time "
        f"(C/τ + τ/2M); at τ* = sqrt(2·C·M) = {_duration(best)}, {then:.2%}",
        f"{_duration(best)} is {steps} training steps at {step_s * 1000:.0f} ms per step (loop overhead included)",
        _against_the_record(section, now, current, save_s, run_s, n),
    ]
    caveats = [
        "the interval rests on the interruptions this record saw; with few of them the MTBF is uncertain "
        "(the interval of the gain spans its ~90% range)",
        ctx.code.resume(),
    ]
    return [
        Recommendation(
            id="checkpoint.interval",
            title=f"Save a checkpoint every {steps} steps (~{_duration(best)})",
            changes=[
                Change("checkpoint interval", _duration(current), f"{steps} steps (~{_duration(best)})")
            ],
            objective=OBJECTIVE,
            gain=rng,
            confidence="medium" if n >= 3 else "low",
            evidence=evidence,
            code=python,
            yaml=yaml,
            caveats=caveats,
        )
    ]


def _against_the_record(
    section: Interruptions, now: float, current_s: float, save_s: float, run_s: float, interruptions: int
) -> str:
    """The model's loss at the run's own interval in seconds, beside the work the report counts as lost to
    the interruptions (redone, or unsaved where no segment resumed yet): the gain is a share of the first,
    and the second is what the record saw of it. Downtime is left out of both (no interval changes it)."""
    saves_s = save_s * run_s / current_s
    redo_s = interruptions * current_s / 2
    seen_s = (section.redone_s or 0.0) + (section.unsaved_s or 0.0)
    return (
        f"at the run's interval the model loses {_duration(now * run_s)} of its {_duration(run_s)}: "
        f"{_duration(saves_s)} saving and {_duration(redo_s)} of work to redo (half an interval per "
        f"interruption); the record lost {_duration(seen_s)} of work to its interruptions (the report's "
        "time lost, less downtime)"
    )


def _loop_overhead(ctx: AdviceContext) -> float | None:
    t = ctx.analysis.timeline
    return t.loop_overhead_share if t is not None else None
