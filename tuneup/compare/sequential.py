"""When an A/B may stop before its planned blocks: a group-sequential design whose false-alarm rate holds.

Testing after every block and stopping at the first p < alpha flags an A/A pair far more often than
alpha: each look is one more chance (benchmarks/ab_resample.py measures it). The design here is the one
of Jennison & Turnbull, "Group Sequential Methods with Applications to Clinical Trials" (2000):

- Looks at equal shares of the planned blocks (`look_blocks`); the last look is the planned end.
- A change is claimed at a look only past that look's efficacy boundary. Alpha is spent over the looks
  by Lan & DeMets's O'Brien-Fleming-type function (Biometrika 70, 1983), alpha(t) = 2 - 2 Phi(z_{1 -
  alpha/2} / sqrt(t)) at the share t of the blocks: an early look claims only an overwhelming change
  (a 20% slowdown stops at the first look), and the last look keeps nearly all of alpha. The boundaries
  are exact for the joint distribution of the looks' statistics (Z_j and Z_k correlate as
  sqrt(t_j / t_k)), found by recursive numerical integration (J&T, chapter 19). The blocks' sd is not
  known, so each look's t-test is held to its boundary's nominal level 1 - Phi(c_k) (J&T section 11.3,
  the significance-level approach, which keeps the error rates close to the design's).
- "No change" settles at an interim look when the blocks rule out the change to detect in both
  directions: each one-sided t-test of a mean log ratio of +-log(1 + min_detectable) gives p below
  `futility_level`, the futility budget split evenly over the interim looks. By Bonferroni, a true
  change of exactly min_detectable stops for futility with probability at most the budget. The
  futility stop is non-binding: the efficacy boundaries are computed as if it never happened, so the
  false-alarm rate is at most alpha whether or not the job stops early.
- The plan (tuneup.compare.ab.plan) accounts for both: it plans the blocks at the last look's level for
  the power plus the futility budget.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from statistics import NormalDist

# Resampled from the 304 measured A/A blocks of the compute trials (benchmarks/ab_resample.py, 1,500
# trials each; the fixed design: 27 blocks, 0.9% of A/A flagged, 93.2% of 5% slowdowns): 3 looks and a
# futility budget of 0.05 plan 32 blocks and run 19.7 of them on average in A/A (0.9-1.1% flagged), 25.0
# on a 5% slowdown (93.1% flagged) and 12.3 on a 20% one. A budget of 0.02 plans 29 and runs 22.4 in A/A;
# 4 looks stop a 20% slowdown later (15.7 blocks; the first look's t-test has too few blocks to stop on).
DEFAULT_LOOKS = 3
# The chance, under a true change of exactly the one to detect, that a futility stop ends the job at an
# interim look: the plan adds it to the power it plans for, so the job keeps its power.
DEFAULT_FUTILITY_BUDGET = 0.05
MIN_LOOK_BLOCKS = 4  # a t-test on fewer blocks (3 degrees of freedom) is too loose to stop on

_NORMAL = NormalDist()
# The integration grid: the density of a look's z statistic, from Z_LOW (under "no change" the mass below
# it is ~1e-9) to its boundary, Simpson's rule with steps of at most GRID_STEP.
Z_LOW = -6.0
GRID_STEP = 0.04


def upper_tail(z: float) -> float:
    """1 - Phi(z), accurate far into the tail."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def alpha_spent(fraction: float, alpha: float) -> float:
    """The O'Brien-Fleming-type alpha spent by the share `fraction` (0 < f <= 1) of the blocks."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"a look's share of the blocks must be in (0, 1], got {fraction}")
    return 2.0 * upper_tail(_NORMAL.inv_cdf(1.0 - alpha / 2.0) / math.sqrt(fraction))


def _simpson(low: float, high: float) -> tuple[list[float], list[float]]:
    """Points and Simpson weights on [low, high], steps of at most GRID_STEP."""
    intervals = max(2, 2 * math.ceil((high - low) / (2.0 * GRID_STEP)))
    h = (high - low) / intervals
    points = [low + i * h for i in range(intervals + 1)]
    weights = [h / 3.0 * (1 if i in (0, intervals) else 4 if i % 2 else 2) for i in range(intervals + 1)]
    return points, weights


def _crossing(bound: float, points: list[float], mass: list[float], t_before: float, t_now: float) -> float:
    """P(Z_{k-1} in the continuation region (its weighted density `mass` at `points`), Z_k >= bound):
    sqrt(t_k) Z_k = sqrt(t_{k-1}) Z_{k-1} + N(0, t_k - t_{k-1}), independent increments."""
    step_sd, root_before, root_now = math.sqrt(t_now - t_before), math.sqrt(t_before), math.sqrt(t_now)
    return math.fsum(
        m * upper_tail((bound * root_now - u * root_before) / step_sd)
        for u, m in zip(points, mass, strict=True)
    )


def _carried(
    points: list[float], mass: list[float], t_before: float, t_now: float, bound: float
) -> tuple[list[float], list[float]]:
    """The weighted density of Z_k on its continuation region (Z_k < bound), from Z_{k-1}'s."""
    step_sd, root_before, root_now = math.sqrt(t_now - t_before), math.sqrt(t_before), math.sqrt(t_now)
    new_points, new_weights = _simpson(Z_LOW, bound)
    scale = root_now / step_sd
    new_mass = [
        w
        * scale
        * math.fsum(
            m * _NORMAL.pdf((z * root_now - u * root_before) / step_sd)
            for u, m in zip(points, mass, strict=True)
        )
        for z, w in zip(new_points, new_weights, strict=True)
    ]
    return new_points, new_mass


@functools.lru_cache(maxsize=64)
def efficacy_boundaries(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    """The z boundaries c_1..c_K at the looks' shares of the planned blocks (increasing, at most 1): under
    no change, P(Z_j < c_j for j < k, Z_k >= c_k) = alpha(t_k) - alpha(t_{k-1}) for every k but the last,
    which spends what is left of alpha. A job that ends before its plan (out of time: an end that does
    not depend on what the blocks said) so keeps alpha whole, and its earlier looks' boundaries are the
    ones it used, since c_k depends on t_1..t_k only (Lan & DeMets's point)."""
    if not fractions or fractions[-1] > 1.0 or any(b <= a for a, b in itertools.pairwise(fractions)):
        raise ValueError(f"looks' shares must increase, to at most 1, got {fractions}")
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    if len(fractions) == 1:
        return (_NORMAL.inv_cdf(1.0 - alpha),)
    bounds = [_NORMAL.inv_cdf(1.0 - alpha_spent(fractions[0], alpha))]
    # Z_1's density on the continuation region (Z_1 < c_1), weighted for Simpson's rule.
    points, weights = _simpson(Z_LOW, bounds[0])
    mass = [w * _NORMAL.pdf(z) for z, w in zip(points, weights, strict=True)]
    for t_before, t_now in itertools.pairwise(fractions):
        spent = alpha if t_now == fractions[-1] else alpha_spent(t_now, alpha)
        target = spent - alpha_spent(t_before, alpha)
        low, high = -10.0, 40.0
        for _ in range(80):  # bisection: the crossing probability falls as the boundary rises
            mid = 0.5 * (low + high)
            low, high = (mid, high) if _crossing(mid, points, mass, t_before, t_now) > target else (low, mid)
        bounds.append(0.5 * (low + high))
        if t_now < fractions[-1]:
            points, mass = _carried(points, mass, t_before, t_now, bounds[-1])
    return tuple(bounds)


def look_blocks(planned: int, looks: int) -> tuple[int, ...]:
    """The block counts at which the job looks: equal shares of `planned`, none below MIN_LOOK_BLOCKS
    but the last (which is `planned`)."""
    if looks < 1:
        raise ValueError(f"looks must be at least 1, got {looks}")
    counts = {math.ceil(planned * k / looks) for k in range(1, looks)}
    return (*sorted(n for n in counts if MIN_LOOK_BLOCKS <= n < planned), planned)


@dataclass(frozen=True)
class Look:
    """One look: the blocks seen, and the levels a t-test of them is held to."""

    number: int  # from 1
    of: int
    blocks: int
    planned_blocks: int
    alpha: float  # nominal one-sided level of the efficacy boundary
    futility: float | None  # nominal level of the futility tests; None at the last look (it decides)

    @property
    def last(self) -> bool:
        return self.number == self.of

    def text(self) -> str:
        return f"look {self.number} of {self.of}, at block {self.blocks} of {self.planned_blocks}"


@dataclass(frozen=True)
class Design:
    """A job's looks, the last at its planned end, and what was asked of them."""

    looks: tuple[Look, ...]
    alpha: float
    futility_budget: float
    looks_asked: int  # --looks; more than len(looks) where the blocks are too few for them

    def look_at(self, blocks: int) -> Look | None:
        return next((look for look in self.looks if look.blocks == blocks), None)

    def text(self) -> str:
        if len(self.looks) == 1:
            if self.looks_asked > 1:
                return (
                    f"one look, at the end: too few blocks to look earlier (a look needs {MIN_LOOK_BLOCKS})"
                )
            return "one look, at the end (--looks 1): no early stop"
        at = ", ".join(str(look.blocks) for look in self.looks)
        return (
            f"looks after blocks {at}: stops early on a change past the look's level (alpha {self.alpha:g} "
            f"spent O'Brien-Fleming-style: {', '.join(f'{look.alpha:.2g}' for look in self.looks)}), or "
            f"when the change to detect is ruled out both ways (p < {self.looks[0].futility or 0:.2g} at "
            "a look, and no change by the rule)"
        )


def design(
    planned_blocks: int,
    alpha: float,
    looks: int = DEFAULT_LOOKS,
    futility_budget: float = DEFAULT_FUTILITY_BUDGET,
    *,
    end_blocks: int | None = None,
) -> Design:
    """The looks of a job that plans `planned_blocks` blocks, with each look's levels; `end_blocks`: the
    job ended there instead (out of time), its last look, the planned looks before it unchanged."""
    if not 0.0 <= futility_budget < 1.0:
        raise ValueError(f"the futility budget must be in [0, 1), got {futility_budget}")
    counts = look_blocks(planned_blocks, looks)
    # The futility level as planned: the looks already made keep theirs when the job ends early.
    futility = futility_budget / (len(counts) - 1) if len(counts) > 1 and futility_budget > 0 else None
    if end_blocks is not None and end_blocks < planned_blocks:
        counts = (*(n for n in counts if n < end_blocks), end_blocks)
    fractions = tuple(n / planned_blocks for n in counts)
    levels = [upper_tail(c) for c in efficacy_boundaries(fractions, alpha)]
    interim = len(counts) - 1
    return Design(
        looks=tuple(
            Look(
                number=i + 1,
                of=len(counts),
                blocks=n,
                planned_blocks=planned_blocks,
                alpha=level,
                futility=None if i == interim else futility,
            )
            for i, (n, level) in enumerate(zip(counts, levels, strict=True))
        ),
        alpha=alpha,
        futility_budget=futility_budget if interim else 0.0,
        looks_asked=looks,
    )


def final_level(alpha: float, looks: int) -> float:
    """The last look's nominal level with `looks` looks at equal shares: what the plan plans blocks at."""
    if looks <= 1:
        return alpha
    fractions = tuple(k / looks for k in range(1, looks + 1))
    return upper_tail(efficacy_boundaries(fractions, alpha)[-1])
