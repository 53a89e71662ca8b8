"""The headline figures, one definition each: steady-state throughput and step time.

Throughput is the samples (tokens, steps) of the steady steps over their time: what the job delivers per
second it is paid for, so it is mean-based, and a periodic stall counts. Step time gives the mean (the step
the throughput is made of) beside the median and p95 (robust to stalls), for the whole step and for each
phase: the phase means add up to the mean step, and where a few slow steps carry a mean (a contended host
can make a 0.5 ms optimizer step average 9 ms) the figure is marked noisy (`is_noisy`) so the report shows
the median beside it. The report, `tuneup show`, `tuneup compare` and the trainer's loggers all take their
figures from here.

Past the record's detail only one step in `sample_stride` is kept: each kept step stands for the steps
since the one kept before it (`kept_weights`), so a long run's mean, median and rates are those of all
its steps, not of its first, densely kept thousand (1,000 dense steps and 3 kept ones of a 1,300-step run
gave the last 300 steps 0.3% of the weight).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence

from tuneup._stats import finite, quantile, rate_per_s, weighted_quantile
from tuneup.analyze.model import PhaseTime, Quantiles, RankStepTime, RankThroughput, StepTime, Throughput
from tuneup.analyze.ranks import RankProfile
from tuneup.record.schema import PHASE_NAMES, PHASES, TUNEUP_PHASE, Run, StepRecord

# A mean more than this many times its median is carried by a minority of slow steps: it still sums to
# the step and prices the run, but it is not what a typical step spends. 1.25 leaves room for the
# right-skew every step time has (a steady GPU step's mean sits within a few per cent of its median).
NOISY_MEAN_OVER_MEDIAN = 1.25
# ...and more than this far above it: below half a millisecond a gap is timer resolution and scheduler
# jitter, too small to mislead anyone about where the step goes.
NOISY_MIN_GAP_MS = 0.5
# ...and by more than this share of the mean step: a smaller gap moves the phase's share of the step by
# under two points, which misleads no one (a 0.6 ms tail on an 88 ms step is not worth a label).
NOISY_MIN_GAP_SHARE = 0.02
# Fewer steady steps than this (over all ranks) and a median or p95 is a handful of steps, not a
# distribution: nothing is marked noisy.
MIN_STEPS_FOR_SPREAD = 20


def is_noisy(mean_ms: float | None, median_ms: float | None, steps: int, step_mean_ms: float) -> bool:
    """Whether a mean (of a phase, or of the whole step) is carried by a few slow steps: more than
    NOISY_MEAN_OVER_MEDIAN times its median, and above it by more than NOISY_MIN_GAP_MS and
    NOISY_MIN_GAP_SHARE of the mean step, over at least MIN_STEPS_FOR_SPREAD steps."""
    if mean_ms is None or median_ms is None or steps < MIN_STEPS_FOR_SPREAD:
        return False
    gap_ms = mean_ms - median_ms
    return (
        mean_ms > NOISY_MEAN_OVER_MEDIAN * median_ms
        and gap_ms > NOISY_MIN_GAP_MS
        and gap_ms > NOISY_MIN_GAP_SHARE * step_mean_ms
    )


def _mean(values: list[float], weights: Sequence[int] | None = None) -> float:
    # statistics.fmean's own arithmetic (an exact sum over the count), without its per-item counting over
    # a generator: a 1,024-rank run has a million steady steps, each read six times.
    if weights is None:
        return math.fsum(values) / len(values)
    return math.fsum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)


def kept_weights(steps: Sequence[StepRecord]) -> list[int]:
    """How many steps each of one rank's kept steps stands for: 1 where every step is kept, the gap since
    the step kept before it where the record samples. A gap is at most the sampling stride (the most common
    gap above 1), so that steps missing for another reason (a restart, a killed segment) are not filled in."""
    gaps = [max(1, b.step - a.step) for a, b in itertools.pairwise(steps)]
    sampled = [g for g in gaps if g > 1]
    if not sampled:
        return [1] * len(steps)
    stride = statistics.mode(sampled)
    return [1, *(g if g <= stride else 1 for g in gaps)]


def steps_rates(steps: Sequence[StepRecord]) -> RankThroughput:
    """One rank's samples/s, tokens/s and steps/s over `steps` (rank -1: not yet known), each kept step
    counted for the steps it stands for."""
    weights = kept_weights(steps)
    wall_ms = math.fsum(s.wall_ms * w for s, w in zip(steps, weights, strict=True))
    samples = [s.samples for s in steps]
    tokens = [s.tokens for s in steps]

    def total(counts: list[float | None]) -> float | None:
        return None if None in counts else math.fsum(c * w for c, w in zip(counts, weights, strict=True))  # type: ignore[operator]

    return RankThroughput(
        rank=-1,
        samples_per_s=finite(rate_per_s(total(samples), wall_ms)),  # type: ignore[arg-type]
        tokens_per_s=finite(rate_per_s(total(tokens), wall_ms)),  # type: ignore[arg-type]
        steps_per_s=finite(rate_per_s(sum(weights), wall_ms)),
    )


def _total(values: Iterable[float | None]) -> float | None:
    listed = list(values)
    return finite(sum(listed)) if listed and None not in listed else None  # type: ignore[arg-type]


def throughput(steady: dict[int, list[StepRecord]]) -> Throughput:
    per_rank = []
    for rank, steps in sorted(steady.items()):
        rates = steps_rates(steps)
        per_rank.append(RankThroughput(rank, rates.samples_per_s, rates.tokens_per_s, rates.steps_per_s))
    steps_per_s = [r.steps_per_s for r in per_rank if r.steps_per_s is not None]
    return Throughput(
        samples_per_s=_total(r.samples_per_s for r in per_rank),
        tokens_per_s=_total(r.tokens_per_s for r in per_rank),
        # Ranks step together: the job's rate is its slowest rank's.
        steps_per_s=finite(min(steps_per_s)) if steps_per_s else None,
        per_rank=per_rank,
    )


def _quantile(values: Sequence[float], weights: Sequence[int], q: float) -> float:
    """Interpolated where every step was kept (as the window aggregates are), weighted where some stand
    for others."""
    if all(w == 1 for w in weights):
        return quantile(sorted(values), q)
    return weighted_quantile(values, weights, q)


def quantiles(values: Iterable[float]) -> Quantiles:
    ordered = sorted(values)
    return Quantiles(
        *(quantile(ordered, q) for q in (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0))  # type: ignore[arg-type]
    )


def phases_not_timed(run: Run) -> list[str]:
    """The phases some rank's adapter did not time, in the phase list's order: its info's `phases_timed`
    (written only where an adapter times fewer than all; "other" is the rest of the step and always
    measured)."""
    missing: set[str] = set()
    for rec in run.ranks.values():
        timed = rec.info.raw.get("phases_timed")
        if isinstance(timed, list):
            missing |= {p for p in PHASE_NAMES if p != "other" and p not in timed}
    return [p for p in PHASE_NAMES if p in missing]


def step_time(steady: dict[int, list[StepRecord]], profiles: list[RankProfile]) -> StepTime:
    all_steps = [s for steps in steady.values() for s in steps]
    if not all_steps:
        return StepTime(median_ms=None, mean_ms=None, p95_ms=None, phases={}, per_rank=[])
    rank_weights = {rank: kept_weights(steps) for rank, steps in steady.items()}
    weights = [w for rank in steady for w in rank_weights[rank]]
    mean_wall = _mean([s.wall_ms for s in all_steps], weights)
    n = len(all_steps)
    per_phase = {p.removesuffix("_ms"): [getattr(s, p) for s in all_steps] for p in PHASES}
    if any(s.tuneup_ms is not None for s in all_steps):
        # tuneup's own time, where the record keeps it out of the phases: a line of its own, so that the
        # phases are the user's and the lines still add up to the step.
        per_phase[TUNEUP_PHASE] = [s.tuneup_ms or 0.0 for s in all_steps]
    phases = {}
    for name, values in per_phase.items():
        ms = _mean(values, weights)
        median = finite(_quantile(values, weights, 0.5))
        phases[name] = PhaseTime(
            ms=finite(ms),  # type: ignore[arg-type]
            share=finite(ms / mean_wall if mean_wall else 0.0),  # type: ignore[arg-type]
            median_ms=median,
            p95_ms=finite(_quantile(values, weights, 0.95)),
            noisy=is_noisy(finite(ms), median, n, mean_wall),
        )
    walls = [s.wall_ms for s in all_steps]
    median_wall = finite(_quantile(walls, weights, 0.5))
    return StepTime(
        median_ms=median_wall,
        mean_ms=finite(mean_wall),
        noisy=is_noisy(finite(mean_wall), median_wall, n, mean_wall),
        p95_ms=finite(_quantile(walls, weights, 0.95)),
        phases=phases,
        per_rank=[
            RankStepTime(
                rank=p.rank,
                steps=p.steps,
                median_ms=finite(p.median_step_ms),  # type: ignore[arg-type]
                p95_ms=finite(p.p95_step_ms),  # type: ignore[arg-type]
                phase_median_ms={k.removesuffix("_ms"): finite(v) for k, v in p.phase_median_ms.items()},  # type: ignore[misc]
                phase_mean_ms={
                    k.removesuffix("_ms"): finite(  # type: ignore[misc]
                        _mean([getattr(s, k) or 0.0 for s in steady[p.rank]], rank_weights[p.rank])
                    )
                    for k in (*PHASES, "tuneup_ms")
                    if k != "tuneup_ms" or TUNEUP_PHASE in phases
                },
                distribution_ms=quantiles(s.wall_ms for s in steady[p.rank]),
            )
            for p in profiles
        ],
    )
