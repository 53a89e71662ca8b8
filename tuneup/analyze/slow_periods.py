"""Slow periods: stretches of the steady steps that ran well above the steady step time.

A contended host, a co-scheduled job, a thermal or power cap, a cold page cache in the first epoch: each
makes many consecutive steps slow, at the start of the run or in its middle. Warm-up (steady.py) is only
the leading transient, so these steps stay in the steady state, and this module says where they are.

Slow is measured against the steady step time as the lower quartile of the steady steps (`BASELINE_QUANTILE`),
not their median: a plateau can cover half the steady steps (the case that warm-up used to swallow), and
then the median sits between the two levels and nothing would read as slow.

Past the record's `detail_steps` only one step in a stride is kept (tuneup.record.writer.RecordingPolicy:
a prime stride, so that the kept steps are not the periodic logging or validation steps, which run slower).
Each kept step then stands for the steps since the one kept before it: the steady step time counts it that
many times, a period's share of the time takes the clock's time for those steps (the kept step alone is one
draw of a heavy-tailed distribution), and a dense stretch is not measured against a sampled one by step
count.

They are kept in the throughput and step-time figures on purpose: they are part of what the job delivered
and was paid for, and a throughput that left them out would promise a speed the job did not have. The
report says they are there, how much slower they ran and what share of the time they took, so a reader
can judge how much of the figure they carry.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tuneup._stats import weighted_quantile
from tuneup.analyze.model import SlowPeriod
from tuneup.analyze.steady import PLATEAU_MIN_STEPS, WARMUP_FACTOR
from tuneup.record.schema import StepRecord

# A step is slow at the same bar as a warm-up step: above this factor of the steady step time.
SLOW_FACTOR = WARMUP_FACTOR
# The steady step time slow periods are measured against: this quantile of the steady steps. The lower
# quartile is the pace the job keeps when nothing slows it, and stays so while slow periods cover up to
# three quarters of the steps; against the jitter of an undisturbed run it sits only a little under the
# median (a tenth, on a shared CPU), which SLOW_FACTOR's margin absorbs.
BASELINE_QUANTILE = 0.25
# Steps are judged by the median of a centred window of this many steps, so that an isolated stall (a data
# stall, a checkpoint, a garbage collection: the data-loading section reports those) never makes a period,
# and one fast step inside a slow stretch does not split it in two.
SLOW_WINDOW_STEPS = 9
# A period needs at least this many recorded steps: the length at which a slow lead stops being warm-up.
SLOW_MIN_STEPS = PLATEAU_MIN_STEPS
# ...and to last at least this long. A shorter slow stretch is a hiccup (a burst of another process, a
# collection, a cache flush: on a shared host with millisecond steps there are dozens a second), which the
# heavy-tailed step-time finding covers; a slow period is a phase of the run, long enough for several
# telemetry samples (one a second by default) to show what the host was doing.
SLOW_MIN_S = 5.0
# Fewer steady steps than this and the steady step time itself is a handful of steps: nothing is reported.
MIN_STEADY_STEPS = 2 * SLOW_MIN_STEPS


@dataclass(frozen=True, slots=True)
class JobStep:
    step: int
    wall_ms: float  # the median over the ranks that recorded the step
    t_end: float  # unix seconds, as the lowest of those ranks recorded it
    # How many steps it stands for: 1 where every step is kept, the gap since the step kept before it where
    # the record samples.
    weight: int = 1


def _weighted(series: list[JobStep]) -> list[JobStep]:
    return [
        JobStep(s.step, s.wall_ms, s.t_end, max(1, s.step - series[i - 1].step) if i else 1)
        for i, s in enumerate(series)
    ]


def job_steps(steady: dict[int, list[StepRecord]]) -> list[JobStep]:
    """The job's steps in step order, each its median over the ranks that recorded it.

    Ranks step together, so a slow period shows on every rank; the median keeps one rank's own stall
    (the straggler finding's business) from reading as the job's."""
    if len(steady) == 1:
        (steps,) = steady.values()
        return _weighted([JobStep(s.step, s.wall_ms, s.t_end) for s in steps])
    by_step: dict[int, tuple[list[float], float]] = {}
    for _, steps in sorted(steady.items()):
        for s in steps:
            by_step.setdefault(s.step, ([], s.t_end))[0].append(s.wall_ms)
    return _weighted([JobStep(step, statistics.median(w), t) for step, (w, t) in sorted(by_step.items())])


def _spent_ms(series: list[JobStep]) -> list[float]:
    """What the steps each kept step stands for took: its own wall time where every step is kept; past the
    record's detail, the clock from the step kept before it to its end, which every step between ran in.
    A kept step's own time times its weight was no estimate of that on a heavy-tailed run: three kept steps
    after step 1,000 averaged 8.7 ms where the clock (and the windows, which sum every step) said 40.5 ms,
    so a sampled stretch's share of the time came out a fifth of what it was."""
    out = []
    for i, s in enumerate(series):
        gap_ms = (s.t_end - series[i - 1].t_end) * 1000.0 if i else math.nan
        sampled = s.weight > 1 and math.isfinite(gap_ms) and gap_ms > 0
        out.append(max(gap_ms, s.wall_ms) if sampled else s.wall_ms * s.weight)
    return out


def _rolling_median(values: Sequence[float], width: int) -> list[float]:
    half = width // 2
    return [statistics.median(values[max(0, i - half) : i + half + 1]) for i in range(len(values))]


def slow_periods(steady: dict[int, list[StepRecord]]) -> list[SlowPeriod]:
    """The slow periods of the steady steps (each rank's steps after its warm-up), in step order."""
    series = job_steps(steady)
    if len(series) < MIN_STEADY_STEPS:
        return []
    walls = [s.wall_ms for s in series]
    weights = [s.weight for s in series]
    spent_ms = _spent_ms(series)
    total_ms = sum(spent_ms)
    baseline_ms = weighted_quantile(walls, weights, BASELINE_QUANTILE)
    if not (baseline_ms > 0 and math.isfinite(total_ms)):
        return []
    limit_ms = SLOW_FACTOR * baseline_ms
    smoothed = _rolling_median(walls, SLOW_WINDOW_STEPS)
    # A step that stands for others (past detail_steps, one kept in a stride) is judged by itself: a window
    # of them spans hundreds of steps, and one that reaches back into the dense steps made the fast steps
    # 1010 and 1111 slow for the slow steps 987-999 beside them.
    slow = [
        wall > limit_ms if weight > 1 else median > limit_ms
        for wall, weight, median in zip(walls, weights, smoothed, strict=True)
    ]
    out: list[SlowPeriod] = []
    end = 0
    while end < len(series):
        if not slow[end]:
            end += 1
            continue
        start = end
        while end < len(series) and slow[end]:
            end += 1
        # A period begins and ends on a step that was slow itself: the window's median carries a slow
        # stretch's verdict a few steps past its edges.
        i, j = start, end
        while i < j and walls[i] <= limit_ms:
            i += 1
        while j > i and walls[j - 1] <= limit_ms:
            j -= 1
        if i == j:
            continue
        first, last = series[i], series[j - 1]
        # Wall-clock, from the first step's start to the last one's end: past the record's detail_steps it
        # spans the steps that were run but not recorded, too.
        duration_s = last.t_end - (first.t_end - first.wall_ms / 1000.0)
        period = walls[i:j]
        median_ms = statistics.median(period)
        share = sum(spent_ms[i:j]) / total_ms
        # A damaged record (an infinite step, a clock that jumped) gives no figure to state: say nothing.
        figures_finite = all(math.isfinite(x) for x in (median_ms, duration_s, share))
        if j - i >= SLOW_MIN_STEPS and figures_finite and duration_s >= SLOW_MIN_S:
            out.append(
                SlowPeriod(
                    first_step=first.step,
                    last_step=last.step,
                    steps=j - i,
                    median_ms=median_ms,
                    baseline_ms=baseline_ms,
                    slowdown=median_ms / baseline_ms,
                    duration_s=duration_s,
                    share_of_time=share,
                )
            )
    return out
