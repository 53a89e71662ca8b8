"""Interleaved A/B in one job: the schedule, the decision on paired block differences, and the plan.

The runs of a CI job drift with whatever else the runner does, and a drift of 20% over the minutes of a
job hides a 5% change from a test that pools each side's runs. Here the runs come in blocks of four,
A B B A or B A A B (the order of each block drawn from a seeded RNG, so neither side always goes first),
and each block gives one figure: the log ratio of the candidate's (B) over the baseline's (A), each the
mean of the logs of its two runs in the block, i.e. the ratio of geometric means. A drift that is linear
over a block cancels exactly in A B B A (both sides' mean position is the block's middle); a slower drift
cancels between blocks. The decision is a one-sided one-sample t-test on the block log ratios (Student's
t from tuneup.compare.stats), the change exp(mean) - 1 with its 90% interval, and the verdict by the
same rule as `tuneup compare` (tuneup.compare.rule): REGRESSION only when p < alpha AND the change is
beyond the threshold.

The threshold here is half the `--min-detectable` change and the run-to-run CV does not raise it: the
paired test already carries the noise, and a threshold equal to the change to detect would catch it only
half the time, since the measured change is as often below the true one as above it.

The plan (`plan`): from an A/A calibration (the same workload on both sides) the standard deviation of
the block log ratio gives the number of blocks n needed to detect a change d with power 0.9 at alpha: the
smallest n with sqrt(n) x log(1 + d) / sd >= t(alpha, n - 1) + t(0.1, n - 1). This is the usual normal
approximation of the power of a one-sided t-test with Student's quantiles in place of the normal's. It
treats sd as known, and a few calibration blocks estimate it loosely, so the sd planned on is the
estimate's upper confidence limit (SD_CONFIDENCE says why). With the measured time per block and
`--max-minutes`, it says before starting what change can be detected in the time given.

Early stop (tuneup.compare.sequential): the job looks at the blocks a few times (`--looks`, 3 by
default) and stops at a look once the verdict is settled: a change past that look's level (alpha spent
over the looks, so the false-alarm rate stays at most alpha), or the change to detect ruled out in both
directions. At each look the test is the same paired t-test, held to the look's level.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

from tuneup.compare.rule import (
    Rule,
    Verdict,
    change_text,
    effect_percent,
    evidence_text,
    signed_change,
    verdict_fields,
    verdict_for,
)
from tuneup.compare.sequential import (
    DEFAULT_FUTILITY_BUDGET,
    DEFAULT_LOOKS,
    Design,
    Look,
    design,
    final_level,
    look_blocks,
)
from tuneup.compare.stats import chi2_quantile, student_t_sf, t_quantile

if TYPE_CHECKING:
    from tuneup.compare.bench import Workload

BASELINE = "baseline"  # side A
CANDIDATE = "candidate"  # side B
SLOT = {BASELINE: "A", CANDIDATE: "B"}  # the run directories' names: block-01/A-1/run-01
OTHER = {BASELINE: CANDIDATE, CANDIDATE: BASELINE}
RUNS_PER_BLOCK = 4  # A B B A: two runs a side
MIN_BLOCKS = 2  # a t-test needs a variance of the block figures
DEFAULT_POWER = 0.9
# A gate that runs on every pull request: at alpha 0.05, one job in 20 without a change fails, and a team
# learns to rerun it. At 0.01 the A/A trials' target (at most 1 of 20 flagged) holds with room, for about
# 1.5x the blocks of 0.05 at the same power ((z_0.01 + z_0.1)^2 / (z_0.05 + z_0.1)^2 = 13.0 / 8.6);
# measured: 1 of 4 A/A trials flagged at 0.05 (p = 0.040, +3.4%; benchmarks/ab_trials.py), none at 0.01.
DEFAULT_ALPHA = 0.01
# The plan's sd is the calibration's upper confidence limit at this level, not its estimate: a few A/A
# blocks estimate the sd loosely (from 6 blocks, the true sd is above the estimate in about half the
# calibrations), and a plan on a low estimate runs too few blocks. Browne (1995), "On the use of a pilot
# sample for sample size determination", Statistics in Medicine 14: the 80% upper limit gives at least the
# planned power in about 80% of plans. Measured (benchmarks/ab_trials.py): a 6-block calibration of
# sd 0.042 against trials whose blocks varied with sd 0.056-0.12; 1 of 3 slowdowns of 5% flagged.
SD_CONFIDENCE = 0.8


def schedule(blocks: int, seed: int) -> list[tuple[int, str]]:
    """(block number from 0, side) in running order: each block A B B A or B A A B, drawn by `seed`."""
    return [
        (block, side)
        for block, first in enumerate(_first_sides(blocks, seed))
        for side in (first, OTHER[first], OTHER[first], first)
    ]


def _first_sides(blocks: int, seed: int) -> list[str]:
    """The side that goes first in each block, drawn by `seed` (a block's order is A B or B A first)."""
    if blocks < 1:
        raise ValueError(f"blocks must be at least 1, got {blocks}")
    rng = random.Random(seed)
    return [BASELINE if rng.random() < 0.5 else CANDIDATE for _ in range(blocks)]


def block_log_ratio(baseline: Sequence[float], candidate: Sequence[float]) -> float:
    """log(gm(candidate) / gm(baseline)) of one block's runs (ValueError for a value <= 0)."""
    if not baseline or not candidate:
        raise ValueError("a block needs at least one run a side")
    if min(*baseline, *candidate) <= 0.0 or not all(math.isfinite(v) for v in (*baseline, *candidate)):
        raise ValueError("block figures must be finite and > 0 (they are compared on a log scale)")
    mean_log_b = math.fsum(math.log(v) for v in candidate) / len(candidate)
    mean_log_a = math.fsum(math.log(v) for v in baseline) / len(baseline)
    return mean_log_b - mean_log_a


@dataclass(frozen=True)
class PairedTest:
    """One-sample t-test of the block log ratios against 0 (log values: B over A)."""

    blocks: int
    mean_log_ratio: float
    sd_log_ratio: float
    p_greater: float  # one-sided: B's figure is higher than A's
    p_less: float
    ci_low_log: float  # two-sided interval of the mean log ratio at `confidence`
    ci_high_log: float


def paired_t(log_ratios: Sequence[float], confidence: float = 0.90) -> PairedTest:
    """The test on at least MIN_BLOCKS block log ratios. A constant set of ratios (no variance) is the
    degenerate test, as `welch` takes it: p = 0 in the direction of a nonzero mean, 1 otherwise."""
    n = len(log_ratios)
    if n < MIN_BLOCKS:
        raise ValueError(f"a paired test needs at least {MIN_BLOCKS} blocks, got {n}")
    mean = math.fsum(log_ratios) / n
    if min(log_ratios) == max(log_ratios):
        mean = log_ratios[0]
        return PairedTest(n, mean, 0.0, 0.0 if mean > 0 else 1.0, 0.0 if mean < 0 else 1.0, mean, mean)
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in log_ratios) / (n - 1))
    se = sd / math.sqrt(n)
    t = mean / se
    df = float(n - 1)
    half = t_quantile((1.0 - confidence) / 2.0, df) * se
    return PairedTest(n, mean, sd, student_t_sf(t, df), student_t_sf(-t, df), mean - half, mean + half)


def ab_rule(alpha: float, min_detectable: float) -> Rule:
    """The rule of an A/B: threshold and minimum effect half of the change to detect, no CV term (the
    module's docs say why)."""
    if not 0.0 < min_detectable < 1.0:
        raise ValueError(f"--min-detectable must be a fraction in (0, 1) (0.05 = 5%), got {min_detectable}")
    return Rule(alpha=alpha, min_effect=min_detectable / 2.0, cv_multiplier=0.0, resamples=0)


@dataclass(frozen=True)
class PairedComparison:
    """One metric's verdict from the blocks. `ratio` is exp(mean block log ratio), B over A; `change` the
    same as a signed fraction, positive = worse; the table and the sentence state it as `effect_text`."""

    metric: str
    unit: str
    higher_is_better: bool
    log_ratios: tuple[float, ...]
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    change: float | None
    p_worse: float | None
    p_better: float | None
    sd_log_ratio: float | None
    threshold: float
    verdict: Verdict
    reason: str
    # False only at an interim look whose blocks leave the verdict open: the job runs on.
    settled: bool = True
    level: float | None = None  # the level its p-values were held to (the look's, or the rule's alpha)

    @property
    def effect_text(self) -> str:
        return "-" if self.ratio is None else effect_percent(self.ratio)

    @property
    def interval_text(self) -> str:
        """The change's 90% interval as the table and the Markdown print it."""
        if self.ci_low is None or self.ci_high is None:
            return "-"
        return f"{effect_percent(self.ci_low)} .. {effect_percent(self.ci_high)}"

    def as_dict(self) -> dict[str, Any]:
        return {**verdict_fields(self), "effect_text": self.effect_text}


def block_shape(side_by_side: bool) -> str:
    """What one block runs, in words."""
    if side_by_side:
        return "A|B then B|A (A and B at once, each on half of the CPUs, the halves swapped)"
    return "A B B A or B A A B"


def _blocks(n: int) -> str:
    return f"{n} block" if n == 1 else f"{n} blocks"


def ruled_out_p(test: PairedTest, worse_sign: float, change: float) -> tuple[float, float]:
    """One-sided p-values that the mean log ratio lies below log(1 + change) in the worse direction and
    above -log(1 + change) in the better one (`worse_sign`: +1 when a higher figure is worse, -1 when
    lower is): both small rule out a change of `change` either way. Blocks that do not vary give 0 or 1."""
    bound = math.log1p(change)
    worse = worse_sign * test.mean_log_ratio  # > 0: worse
    if test.sd_log_ratio == 0.0:
        return (0.0 if worse < bound else 1.0), (0.0 if worse > -bound else 1.0)
    se = test.sd_log_ratio / math.sqrt(test.blocks)
    df = float(test.blocks - 1)
    return student_t_sf((bound - worse) / se, df), student_t_sf((worse + bound) / se, df)


def decide_paired(
    metric: str,
    blocks: Sequence[tuple[Sequence[float], Sequence[float]]],
    *,
    higher_is_better: bool,
    rule: Rule,
    unit: str = "",
    look: Look | None = None,
) -> PairedComparison:
    """The verdict on one metric from (baseline runs, candidate runs) of each block, by rule.py's
    `verdict_for` on the paired test's p-values and the ratio of its mean log ratio. At a `look` of a
    sequential design the p-values are held to the look's level, and at an interim look the result says
    whether the verdict is settled (tuneup.compare.sequential)."""
    log_ratios = tuple(block_log_ratio(a, b) for a, b in blocks)
    threshold = rule.threshold(0.0)
    if look is not None:
        rule = dataclasses.replace(rule, alpha=look.alpha)
    interim = look is not None and not look.last

    def result(
        verdict: Verdict, reason: str, test: PairedTest | None = None, **figures: Any
    ) -> PairedComparison:
        return PairedComparison(
            metric=metric,
            unit=unit,
            higher_is_better=higher_is_better,
            log_ratios=log_ratios,
            threshold=threshold,
            verdict=verdict,
            reason=reason,
            sd_log_ratio=None if test is None else test.sd_log_ratio,
            level=rule.alpha,
            **{
                "ratio": None,
                "ci_low": None,
                "ci_high": None,
                "change": None,
                "p_worse": None,
                "p_better": None,
                "settled": not interim,
                **figures,
            },
        )

    if len(log_ratios) < MIN_BLOCKS:
        return result(
            Verdict.INCONCLUSIVE,
            f"{_blocks(len(log_ratios))}: a paired test needs at least {MIN_BLOCKS}, so no verdict",
        )
    test = paired_t(log_ratios, rule.confidence)
    ratio = math.exp(test.mean_log_ratio)
    change = signed_change(ratio, higher_is_better)
    p_worse, p_better = (test.p_less, test.p_greater) if higher_is_better else (test.p_greater, test.p_less)
    verdict = verdict_for(change, p_worse, p_better, threshold, rule)
    p_direction = p_worse if change > 0 else p_better
    significant = p_direction < rule.alpha
    if significant and test.sd_log_ratio == 0.0:
        evidence = "p = 0: the blocks do not vary"
    else:
        evidence = evidence_text(p_direction, rule.alpha)
    seen = change_text(metric, ratio)
    paired = f"paired over {_blocks(test.blocks)}"
    settled = not interim
    if verdict in (Verdict.REGRESSION, Verdict.IMPROVEMENT):
        reason = f"{seen} ({evidence}, {paired}), beyond the {threshold:.1%} threshold"
        settled = True
    elif verdict is Verdict.NO_CHANGE:
        real = ": a real change, but" if significant else ","
        reason = f"{seen} ({evidence}, {paired}){real} within the {rule.min_effect:.1%} minimum effect"
    else:
        reason = (
            f"{seen}, beyond the {threshold:.1%} threshold, but not significant ({evidence}, {paired}): "
            "run more blocks"
        )
    if interim and verdict is Verdict.NO_CHANGE and look is not None and look.futility is not None:
        # The change to detect is twice the minimum effect (ab_rule). Ruled out both ways at the look's
        # futility level, the job stops; how often that stops a true change of that size is bounded by
        # the futility budget, which the plan's power already pays (tuneup.compare.sequential).
        to_detect = 2.0 * rule.min_effect
        p_up, p_down = ruled_out_p(test, -1.0 if higher_is_better else 1.0, to_detect)
        if max(p_up, p_down) < look.futility:
            settled = True
            ruled_out = evidence_text(max(p_up, p_down), look.futility)
            reason += f"; a change of {to_detect:.0%} either way is ruled out ({ruled_out})"
    if look is not None and look.of > 1:
        reason += f" [{look.text()}{', settled' if settled and interim else ''}]"
    return result(
        verdict,
        reason,
        test,
        ratio=ratio,
        ci_low=math.exp(test.ci_low_log),
        ci_high=math.exp(test.ci_high_log),
        change=change,
        p_worse=p_worse,
        p_better=p_better,
        settled=settled,
    )


def _power_quantiles(blocks: int, alpha: float, power: float) -> float:
    """t(alpha, n - 1) + t(1 - power, n - 1): the standardized distance a change must lie from 0."""
    df = float(blocks - 1)
    return t_quantile(alpha, df) + t_quantile(1.0 - power, df)


def blocks_needed(
    sd_log_ratio: float,
    min_detectable: float,
    alpha: float,
    power: float = DEFAULT_POWER,
    *,
    max_blocks: int = 10_000,
) -> int | None:
    """The fewest blocks (at least MIN_BLOCKS) whose one-sided paired test detects a change of
    `min_detectable` with `power` at `alpha`, given the A/A block log ratios' sd (the module's docs:
    normal approximation with Student's quantiles); None if more than max_blocks would be needed."""
    if sd_log_ratio < 0.0 or not math.isfinite(sd_log_ratio):
        raise ValueError(f"the A/A sd must be finite and >= 0, got {sd_log_ratio}")
    if not 0.5 < power < 1.0:
        raise ValueError(f"power must be in (0.5, 1), got {power}")
    effect = math.log1p(min_detectable)
    for n in range(MIN_BLOCKS, max_blocks + 1):
        if math.sqrt(n) * effect >= _power_quantiles(n, alpha, power) * sd_log_ratio:
            return n
    return None


def sd_upper_limit(sd_log_ratio: float, blocks: int, confidence: float = SD_CONFIDENCE) -> float:
    """The one-sided upper confidence limit of the sd estimated from `blocks` blocks:
    sd x sqrt(nu / chi2(1 - confidence, nu)), nu = blocks - 1."""
    if blocks < MIN_BLOCKS:
        raise ValueError(f"an sd needs at least {MIN_BLOCKS} blocks, got {blocks}")
    nu = float(blocks - 1)
    return sd_log_ratio * math.sqrt(nu / chi2_quantile(1.0 - confidence, nu))


def detectable_change(sd_log_ratio: float, blocks: int, alpha: float, power: float = DEFAULT_POWER) -> float:
    """The change (fraction) that `blocks` blocks detect with `power` at `alpha`: the inverse of
    `blocks_needed`."""
    if blocks < MIN_BLOCKS:
        return math.inf
    return math.expm1(_power_quantiles(blocks, alpha, power) * sd_log_ratio / math.sqrt(blocks))


def normal_blocks_needed(sd_log_ratio: float, min_detectable: float, alpha: float, power: float) -> float:
    """The textbook closed form with normal quantiles, ((z_alpha + z_beta) sd / log(1 + d))^2: the lower
    bound that `blocks_needed` approaches for many blocks (for checking it)."""
    z = NormalDist().inv_cdf
    return ((z(1.0 - alpha) + z(power)) * sd_log_ratio / math.log1p(min_detectable)) ** 2


@dataclass(frozen=True)
class Plan:
    """What the A/B will run and what it can see, from an A/A calibration."""

    calibration_blocks: int
    sd_log_ratio: float  # the calibration's estimate
    sd_planned: float  # its upper confidence limit at SD_CONFIDENCE, what the blocks are planned on
    seconds_per_block: float | None
    min_detectable: float
    blocks_needed: int | None  # None: more than any job would run
    blocks_in_time: int | None  # None: no time limit given
    blocks: int  # what will run at most
    detectable: float  # the change those blocks detect with the power
    power: float
    looks: int = 1  # the sequential design's (tuneup.compare.sequential); 1: no early stop
    level: float | None = None  # the last look's nominal level, which the blocks are planned at
    planned_power: float | None = None  # the power planned for: `power` plus the futility budget

    def text(self) -> str:
        lines = [
            f"A/A calibration: {_blocks(self.calibration_blocks)}, sd of the block log ratio "
            f"{self.sd_log_ratio:.4f} (about {math.expm1(self.sd_log_ratio):.1%} a block)"
            + ("" if self.seconds_per_block is None else f", {self.seconds_per_block:.1f} s a block"),
            f"planned on sd {self.sd_planned:.4f}, its {SD_CONFIDENCE:.0%} upper confidence limit "
            f"(so few blocks estimate it loosely)",
        ]
        needed = "more blocks than a job runs" if self.blocks_needed is None else _blocks(self.blocks_needed)
        how = "normal approximation with Student's quantiles"
        if self.looks > 1 and self.level is not None and self.planned_power is not None:
            how += (
                f"; {self.looks} looks: planned at the last look's level {self.level:.2g} for power "
                f"{self.planned_power:g}, as an early 'no change' may cost {self.planned_power - self.power:g}"
            )
        lines.append(f"to detect {self.min_detectable:.1%} with power {self.power:g}: {needed} ({how})")
        if self.blocks_in_time is not None:
            lines.append(f"{_blocks(self.blocks_in_time)} fit in the time given")
        most = "at most " if self.looks > 1 else ""
        lines.append(
            f"running {most}{_blocks(self.blocks)}: can detect {self.detectable:.1%} in the time given"
        )
        if self.detectable > self.min_detectable and self.blocks_needed and self.seconds_per_block:
            minutes = self.blocks_needed * self.seconds_per_block / 60.0
            lines.append(
                f"not {self.min_detectable:.1%}: that needs {_blocks(self.blocks_needed)}, about "
                f"{minutes:.1f} min after the calibration (raise --max-minutes)"
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class NoiseSeen:
    """After the job: the planned metric's blocks varied more than the plan assumed (a calibration from a
    quieter day or another runner), so much that they could not detect the change asked for. What they
    could at their own noise, and what the change asked for would take."""

    metric: str
    sd_log_ratio: float  # the job's own blocks'
    sd_planned: float
    blocks: int
    detectable: float  # what `blocks` detect at sd_log_ratio, with the plan's power at its level
    min_detectable: float
    blocks_needed: int | None  # for min_detectable at sd_log_ratio; None: more than any job would run
    seconds_per_block: float | None

    def text(self) -> str:
        line = (
            f"{self.metric}'s blocks varied more than the plan assumed (sd {self.sd_log_ratio:.4f} a block "
            f"against {self.sd_planned:.4f}): at that noise these {_blocks(self.blocks)} detect "
            f"{self.detectable:.1%}, not {self.min_detectable:.1%}"
        )
        if self.blocks_needed is None:
            line += ", which is beyond what a job can run"
        else:
            line += f", which needs {_blocks(self.blocks_needed)}"
            if self.seconds_per_block:
                minutes = self.blocks_needed * self.seconds_per_block / 60.0
                line += f" (about {minutes:.0f} min at {self.seconds_per_block:.0f} s a block)"
        return line + "; calibrate again on this runner (--calibrate-blocks) before trusting a NO CHANGE"


def noise_seen(
    plan: Plan, result: PairedComparison, seconds_per_block: float | None, alpha: float
) -> NoiseSeen | None:
    """The planned metric's `result`, where its blocks varied more than `plan.sd_planned`
    (the calibration's upper confidence limit) and so much that they could not detect the change asked
    for: None where they could. `alpha`: the rule's, the level of a plan made without looks."""
    sd, blocks = result.sd_log_ratio, len(result.log_ratios)
    if sd is None or sd <= plan.sd_planned or blocks < MIN_BLOCKS:
        return None
    level = plan.level if plan.level is not None else alpha
    power = plan.planned_power if plan.planned_power is not None else plan.power
    detectable = detectable_change(sd, blocks, level, power)
    if detectable <= plan.min_detectable:
        return None
    return NoiseSeen(
        metric=result.metric,
        sd_log_ratio=sd,
        sd_planned=plan.sd_planned,
        blocks=blocks,
        detectable=detectable,
        min_detectable=plan.min_detectable,
        blocks_needed=blocks_needed(sd, plan.min_detectable, level, power),
        seconds_per_block=seconds_per_block,
    )


def _planned_power(power: float, futility_budget: float, looks: int) -> float:
    """The power a design of `looks` looks plans for: with interim looks, the futility stops' cost on top."""
    return min(power + futility_budget, 0.99) if looks > 1 else power


def plan(
    calibration_log_ratios: Sequence[float],
    *,
    min_detectable: float,
    alpha: float,
    seconds_per_block: float | None = None,
    max_seconds: float | None = None,
    blocks: int | None = None,
    power: float = DEFAULT_POWER,
    looks: int = DEFAULT_LOOKS,
    futility_budget: float = DEFAULT_FUTILITY_BUDGET,
) -> Plan:
    """The blocks to run: `blocks` if given, else as many as detect `min_detectable`, no more than fit in
    `max_seconds` (at least MIN_BLOCKS); and the change they can detect. With looks > 1 the blocks are
    planned at the last look's level, for the power plus the futility budget (tuneup.compare.sequential)."""
    if len(calibration_log_ratios) < MIN_BLOCKS:
        raise ValueError(
            f"an A/A calibration needs at least {MIN_BLOCKS} blocks, got {len(calibration_log_ratios)}"
        )
    sd = paired_t(calibration_log_ratios).sd_log_ratio
    sd_planned = sd_upper_limit(sd, len(calibration_log_ratios))
    # Planned at the last look's level for the power plus the futility budget; with fewer looks where
    # the blocks needed are too few for them (one look: the fixed test at alpha).
    for fewer in range(looks, 0, -1):
        needed = blocks_needed(
            sd_planned,
            min_detectable,
            final_level(alpha, fewer),
            _planned_power(power, futility_budget, fewer),
        )
        if needed is None or len(look_blocks(needed, looks)) >= fewer:
            break
    in_time = None
    if max_seconds is not None and seconds_per_block is not None and seconds_per_block > 0:
        in_time = max(0, int(max_seconds // seconds_per_block))
    if blocks is None:
        candidates = [n for n in (needed, in_time) if n is not None]
        blocks = max(MIN_BLOCKS, min(candidates)) if candidates else 50
    running = design(blocks, alpha, looks, futility_budget)
    level = running.looks[-1].alpha if len(running.looks) > 1 else alpha
    planned_power = _planned_power(power, futility_budget, len(running.looks))
    return Plan(
        calibration_blocks=len(calibration_log_ratios),
        sd_log_ratio=sd,
        sd_planned=sd_planned,
        seconds_per_block=seconds_per_block,
        min_detectable=min_detectable,
        blocks_needed=needed,
        blocks_in_time=in_time,
        blocks=blocks,
        detectable=detectable_change(sd_planned, blocks, level, planned_power),
        power=power,
        looks=len(running.looks),
        level=level,
        planned_power=planned_power,
    )


def side_by_side_schedule(blocks: int, seed: int) -> list[tuple[int, str]]:
    """(block number from 0, the side on the first half of the CPUs) for each of a block's two rounds, in
    running order; the other side runs at the same time on the second half. Each block runs both sides on
    both halves, so that a half that is faster (another job's threads, a busier physical core) hits both
    alike; which side takes the first half first is drawn by `seed`."""
    return [
        (block, side)
        for block, first in enumerate(_first_sides(blocks, seed))
        for side in (first, OTHER[first])
    ]


def cpu_halves(cpus: Iterable[int] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The CPUs this process may use (or `cpus`), split into two halves for the two sides of a
    side-by-side block; ValueError when there are fewer than two or the system cannot pin processes."""
    if cpus is None:
        if not hasattr(os, "sched_getaffinity"):
            raise ValueError(
                "side by side pins each side to its CPUs, which this system does not allow (Linux)"
            )
        cpus = os.sched_getaffinity(0)
    ordered = tuple(sorted(cpus))
    if len(ordered) < 2:
        raise ValueError(f"side by side needs at least 2 CPUs, one a side; this job may use {len(ordered)}")
    middle = len(ordered) // 2
    return ordered[:middle], ordered[middle:]


def run_blocks(
    baseline: Workload,
    candidate: Workload,
    blocks: int,
    seed: int,
    out_dir: Path,
    *,
    timeout_s: float,
    echo: Callable[[str], None] = print,
    stop: Callable[[list[dict[str, list[Path]]]], bool] | None = None,
    side_by_side: bool = False,
) -> tuple[list[dict[str, list[Path]]], float]:
    """Run the schedule's blocks with bench's runner (`run_once`: one run each, recorded through
    TUNEUP_DIR); returns each block's run directories by side, in running order, and the mean seconds a
    block took. `stop`, asked with the blocks done after each block, ends the job early when it says so.
    `side_by_side`: each block is two rounds of A and B at once, each pinned to half of the CPUs, the
    halves swapped in the second round (`side_by_side_schedule`), instead of A B B A one after another."""
    from tuneup.compare.bench import BenchError, run_once

    workloads = {BASELINE: baseline, CANDIDATE: candidate}
    runs: list[dict[str, list[Path]]] = [{BASELINE: [], CANDIDATE: []} for _ in range(blocks)]
    halves = cpu_halves() if side_by_side else None
    started_s = time.monotonic()

    def run(block: int, side: str, cpus: Sequence[int] | None, cancel: Callable[[], bool] | None) -> None:
        position = len(runs[block][side]) + 1
        # Its own label per slot. The two sides' labels are of one length (A-1, B-1): the run directory
        # reaches the workload through the environment, and an environment one byte longer moves the
        # process's stack and can change its speed by itself (Mytkowicz et al., "Producing wrong data
        # without doing anything obviously wrong!", ASPLOS 2009), a bias no number of blocks averages out.
        label = f"{SLOT[side]}-{position}"
        run_dir = out_dir / f"block-{block + 1:02d}" / label / "run-01"
        if run_dir.exists() and any(run_dir.iterdir()):
            raise BenchError(f"{run_dir} already holds a run; give --out an empty or new directory")
        runs[block][side].append(run_dir)
        run_once(
            workloads[side], run_dir, f"block {block + 1}", timeout_s=timeout_s, cpus=cpus, cancel=cancel
        )

    def block_done(block: int, sides: str) -> bool:
        echo(f"block {block + 1}/{blocks} ({sides}): {time.monotonic() - started_s:.1f} s so far")
        return stop is not None and block + 1 < blocks and stop(runs[: block + 1])

    if halves is None:
        order = schedule(blocks, seed)
        for i, (block, side) in enumerate(order):
            run(block, side, None, None)
            if i % RUNS_PER_BLOCK != RUNS_PER_BLOCK - 1:
                continue
            if block_done(block, " ".join(SLOT[s] for _, s in order[i - 3 : i + 1])):
                return runs[: block + 1], (time.monotonic() - started_s) / (block + 1)
    else:
        order = side_by_side_schedule(blocks, seed)
        for i, (block, first) in enumerate(order):
            _together(
                functools.partial(run, block, first, halves[0]),
                functools.partial(run, block, OTHER[first], halves[1]),
            )
            if i % 2 == 0:
                continue
            rounds = " then ".join(f"{SLOT[s]}|{SLOT[OTHER[s]]}" for _, s in order[i - 1 : i + 1])
            if block_done(block, rounds):
                return runs[: block + 1], (time.monotonic() - started_s) / (block + 1)
    return runs, (time.monotonic() - started_s) / blocks


def _together(*jobs: Callable[[Callable[[], bool]], None]) -> None:
    """Run the jobs at once, each in a thread of its own, and wait for all of them. The first to fail
    cancels the others (each job asks the callable it is given whether to stop) and its error is raised
    once they have ended; so is a KeyboardInterrupt while they run."""
    cancelled = threading.Event()
    first_error: BaseException | None = None
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(job, cancelled.is_set) for job in jobs]
        try:
            for future in as_completed(futures):
                if (error := future.exception()) is not None and first_error is None:
                    first_error = error
                    cancelled.set()
        except BaseException:
            cancelled.set()
            raise
    if first_error is not None:
        raise first_error


def exit_code(results: Sequence[PairedComparison], *, inconclusive_fails: bool, detailed: bool) -> int:
    """As `tuneup compare`'s (tuneup.compare.compare.Comparison.exit_code): 1 regression; detailed: 3
    inconclusive, 4 improvement; 0 otherwise."""
    verdicts = {r.verdict for r in results}
    if Verdict.REGRESSION in verdicts:
        return 1
    if detailed:
        if Verdict.INCONCLUSIVE in verdicts:
            return 3
        return 4 if Verdict.IMPROVEMENT in verdicts else 0
    return 1 if inconclusive_fails and Verdict.INCONCLUSIVE in verdicts else 0


def gate_settled(results: Sequence[PairedComparison]) -> bool:
    """Whether the job may stop at this look: a regression is settled (the gate fails whatever the
    blocks to come say of the other metrics), or every metric's verdict is."""
    if any(r.settled and r.verdict is Verdict.REGRESSION for r in results):
        return True
    return bool(results) and all(r.settled for r in results)


def verdict_word(results: Sequence[PairedComparison]) -> str:
    """The gate's word, as the CI history keeps it (regression, inconclusive, improvement, no_change)."""
    verdicts = {r.verdict for r in results}
    if Verdict.REGRESSION in verdicts:
        return "regression"
    if Verdict.INCONCLUSIVE in verdicts:
        return "inconclusive"
    return "improvement" if Verdict.IMPROVEMENT in verdicts else "no_change"


def format_table(results: Sequence[PairedComparison]) -> str:
    """The verdicts: one effect figure a metric (the table's and the sentence's), its interval and p."""
    from tuneup.report.format import aligned_table

    rows = []
    for r in results:
        interval = r.interval_text
        p = "-" if r.p_worse is None else f"{r.p_worse:.3g}"
        rows.append([r.metric, r.effect_text, interval, p, f"{r.threshold:.1%}", r.verdict.value])
    header = ["metric", "change", "90% interval", "p (worse)", "threshold", "verdict"]
    lines = aligned_table(header, rows, right={1, 2, 3, 4})
    lines.append("")
    lines.extend(f"{r.verdict.value}: {r.reason}" for r in results)
    return "\n".join(lines)


def describe_rule(rule: Rule, design: Design | None = None) -> str:
    """The A/B's rule in words (Rule.describe states `tuneup compare`'s unpaired one)."""
    level = f"p < {rule.alpha:g}"
    if design is not None and len(design.looks) > 1:
        levels = ", ".join(f"{look.alpha:.2g}" for look in design.looks)
        level = f"p < the look's level (alpha {rule.alpha:g} spent over {len(design.looks)} looks: {levels})"
    return (
        f"one-sided paired t-test on the blocks' log ratios, {level}, and a change beyond "
        f"{rule.threshold(0.0):.1%} (half the change to detect)"
    )


def gate_head(results: Sequence[PairedComparison]) -> str:
    """The summary's first line: how many metrics regressed, and how many are undecided."""
    regressions = sum(r.verdict is Verdict.REGRESSION for r in results)
    inconclusive = sum(r.verdict is Verdict.INCONCLUSIVE for r in results)
    head = (
        f"tuneup bench --ab: {regressions} regression(s)"
        if regressions
        else "tuneup bench --ab: no regression"
    )
    return head + (f" ({inconclusive} inconclusive)" if inconclusive else "")


def format_markdown(
    results: Sequence[PairedComparison],
    *,
    baseline: str,
    candidate: str,
    blocks: int,
    seed: int,
    rule: Rule,
    plan: Plan | None,
    skipped: Mapping[str, str] | None = None,
    design: Design | None = None,
    noise: NoiseSeen | None = None,
    side_by_side: bool = False,
) -> str:
    """For a GitHub job summary or a pull-request comment: the verdicts (one effect figure a metric, as
    the table), the two sides, the blocks and what they could detect (planned, and with `noise` seen)."""
    from tuneup.report.markdown import markdown_text

    header = ["metric", "verdict", "change", "90% interval", "p (worse)", "threshold"]
    lines = [f"**{gate_head(results)}**", ""]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("| --- | --- | " + " | ".join("---:" for _ in header[2:]) + " |")
    for r in results:
        interval = r.interval_text
        verdict = (
            f"**{r.verdict.value}**"
            if r.verdict in (Verdict.REGRESSION, Verdict.INCONCLUSIVE)
            else r.verdict.value
        )
        p = "-" if r.p_worse is None else f"{r.p_worse:.3g}"
        cells = [
            markdown_text(r.metric),
            verdict,
            *map(markdown_text, (r.effect_text, interval, p)),
            f"{r.threshold:.1%}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.extend(
        f"- {markdown_text(r.metric)}: **{r.verdict.value}**, {markdown_text(r.effect_text)}: {markdown_text(r.reason)}"
        for r in results
    )

    lines.extend(
        f"- {markdown_text(metric)}: not compared, {markdown_text(why)}"
        for metric, why in (skipped or {}).items()
    )

    def code(text: str) -> str:
        return markdown_text(text) if "`" in text else f"`{text}`"

    lines.append(f"- baseline (A): {code(baseline)}")
    lines.append(f"- candidate (B): {code(candidate)}")
    lines.append(f"- {_blocks(blocks)} of {block_shape(side_by_side)}, order drawn with seed {seed}")
    if design is not None:
        last = design.looks[-1]
        if last.blocks < last.planned_blocks:
            short = last.planned_blocks - last.blocks
            lines.append(
                f"- stopped {_blocks(short)} short of the {last.planned_blocks} planned: out of time"
            )
        elif blocks < last.blocks:
            lines.append(f"- stopped early, of at most {last.blocks}: the verdict was settled")
        if len(design.looks) > 1:
            lines.append(f"- {markdown_text(design.text())}")
    if plan is not None:
        lines.extend(f"- {markdown_text(line)}" for line in plan.text().splitlines())
    else:
        lines.append("- no A/A calibration: what change these blocks can detect is not known")
    if noise is not None:
        lines.append(f"- **{markdown_text(noise.text())}**")
    lines.append(f"- rule: {markdown_text(describe_rule(rule))}")
    return "\n".join(lines) + "\n"
