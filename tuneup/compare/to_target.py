"""`tuneup compare --target`: which side reaches a quality target sooner, in hours and dollars, beside samples/s.

Samples per second is not what a user buys: a bigger batch can raise it and still take longer to reach the
same val_loss. Each run's time and cost to the target is its analysis's (tuneup/analyze/convergence.py:
measured where the run reached it, projected with an interval where it did not, or why neither); this
module only puts the two sides side by side and says, in one sentence, who is faster to the target and
whether samples/s ranks them the same way.

A side's figure: with runs that reached the target, the median of those runs' hours and dollars (how many
reached it is said), their range as its interval; with none, the median of the projected runs' figures and
of their intervals' bounds; with neither, no figure and the reasons.

The rule for a regression (exit code 1): the candidate is slower to the target by more than the decision
rule's minimum effect, AND either both sides reached it (two measured figures) or their intervals do not
overlap (a projection that could still land either way fails nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tuneup.analyze.model import TargetOutcome, to_json
from tuneup.compare.stats import median
from tuneup.report.format import usd
from tuneup.report.sections.convergence import elapsed, span

REACHED = "reached"
PROJECTED = "projected"
NO_FIGURE = "none"


@dataclass(frozen=True)
class RunToTarget:
    """One run's time and cost to the target, as its analysis gives it (TargetOutcome).

    status: "reached" (measured), "projected" (with its interval: high None is open above),
    "not_projected" or "not_recorded" (reason says why), or "unknown" (a baseline file keeps no curve)."""

    run_id: str
    status: str
    reason: str
    step: float | None = None
    hours: float | None = None
    hours_low: float | None = None
    hours_high: float | None = None
    usd: float | None = None
    usd_low: float | None = None
    usd_high: float | None = None


def run_to_target(run_id: str, outcome: TargetOutcome | None) -> RunToTarget:
    """The run's figure from its analysis's target outcome (None: the analysis had no target)."""
    if outcome is None:
        return RunToTarget(run_id, "unknown", "no target in its analysis")
    if outcome.status == "reached" and outcome.reached is not None:
        p = outcome.reached
        return RunToTarget(
            run_id, REACHED, "reached", float(p.step), p.hours, p.hours, p.hours, p.usd, p.usd, p.usd
        )
    if outcome.status == "projected" and outcome.hours is not None:
        return RunToTarget(
            run_id,
            PROJECTED,
            outcome.reason if not outcome.form else f"{outcome.form}: {outcome.reason}",
            outcome.step,
            outcome.hours,
            outcome.hours_low,
            outcome.hours_high,
            outcome.usd,
            outcome.usd_low,
            outcome.usd_high,
        )
    if outcome.status == "projected":  # a projected step without a step time: no hours to compare
        return RunToTarget(
            run_id, "not_projected", "projected in steps only: the run has no steady step time", outcome.step
        )
    return RunToTarget(run_id, outcome.status, outcome.reason)


@dataclass(frozen=True)
class SideToTarget:
    """A side's figure: `status` "reached" (median of the runs that reached it), "projected" (median of the
    projections; low/high the medians of their bounds, high None where any is open), or "none"."""

    side: str  # "baseline" or "candidate"
    runs: int
    reached: int  # runs that reached the target
    projected: int  # runs that did not, with a projection in hours
    status: str
    hours: float | None
    hours_low: float | None
    hours_high: float | None
    usd: float | None
    usd_low: float | None
    usd_high: float | None
    samples_per_s: float | None  # median of the runs' steady throughput
    throughput_unit: str
    reasons: tuple[str, ...]  # why runs have no figure, one per distinct reason
    per_run: tuple[RunToTarget, ...]


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return median(known) if known and len(known) == len(values) else None


def _with_range(values: Sequence[float | None]) -> tuple[float | None, float | None, float | None]:
    """(median, min, max); all None where any run lacks the figure (an unpriced run has no $)."""
    known = [v for v in values if v is not None]
    if not known or len(known) != len(values):
        return None, None, None
    return median(known), min(known), max(known)


def side_to_target(
    side: str, runs: Sequence[RunToTarget], throughputs: Sequence[float | None], throughput_unit: str
) -> SideToTarget:
    reached = [r for r in runs if r.status == REACHED]
    projected = [r for r in runs if r.status == PROJECTED]
    reasons = tuple(dict.fromkeys(r.reason for r in runs if r.status not in (REACHED, PROJECTED)))
    if reached:
        # The runs that reached it: their median, and their range as the interval.
        status, figures = (
            REACHED,
            (*_with_range([r.hours for r in reached]), *_with_range([r.usd for r in reached])),
        )
    elif projected:
        status = PROJECTED
        figures = (
            _median([r.hours for r in projected]),
            _median([r.hours_low for r in projected]),
            _median([r.hours_high for r in projected]),
            _median([r.usd for r in projected]),
            _median([r.usd_low for r in projected]),
            _median([r.usd_high for r in projected]),
        )
    else:
        status, figures = NO_FIGURE, (None,) * 6
    return SideToTarget(
        side,
        len(runs),
        len(reached),
        len(projected),
        status,
        *figures,
        samples_per_s=_median(list(throughputs)),
        throughput_unit=throughput_unit,
        reasons=reasons,
        per_run=tuple(runs),
    )


@dataclass(frozen=True)
class TargetComparison:
    """Time and cost to the target, side by side, and the one-sentence verdict on it.

    faster: the side with the shorter time to the target (None: no ratio, or within the minimum effect).
    time_ratio: the slower side's hours / the faster side's (>= 1). throughput_ratio: candidate / baseline
    samples/s. figures_agree: whether samples/s ranks the sides as time to the target does (None where
    either is unknown). regression: the candidate fails the comparison on it (the module docs' rule)."""

    target: str
    baseline: SideToTarget
    candidate: SideToTarget
    faster: str | None
    time_ratio: float | None
    throughput_ratio: float | None
    figures_agree: bool | None
    regression: bool
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        """As JSON: the analysis's own conversion (tuples as lists, a figure that overflowed as null)."""
        return to_json(self)  # type: ignore[no-any-return]


# -- the verdict -------------------------------------------------------------------------------------


def side_figure(s: SideToTarget) -> str:
    """'0.42 h [0.38, 0.47] and $0.50 (projected)', or why there is none."""
    if s.status == NO_FIGURE:
        return "no figure: " + ("; ".join(s.reasons) or "no run")
    spread = s.status == PROJECTED or s.reached > 1
    hours = elapsed(s.hours) + (span(s.hours_low, s.hours_high, elapsed) if spread else "")
    money = (
        f" and {usd(s.usd)}" + (span(s.usd_low, s.usd_high, usd) if spread else "")
        if s.usd is not None
        else " ($ unknown: not priced)"
    )
    if s.status == REACHED:
        how = "reached" if s.runs == 1 else f"median of the {s.reached} of {s.runs} runs that reached it"
    else:
        how = (
            "projected" if s.runs == 1 else f"median of {s.projected} projected; none of {s.runs} reached it"
        )
    return f"{hours}{money} ({how})"


def run_figure(r: RunToTarget) -> str:
    """One run's line under its side: 'reached at step 120 after 0.42 h and $0.50', or why not."""
    money = f" and {usd(r.usd)}" if r.usd is not None else ""
    at = f" at step {r.step:,.0f}" if r.step is not None else ""
    if r.status == REACHED:
        return f"reached{at} after {elapsed(r.hours)}{money}"
    if r.status == PROJECTED:
        return (
            f"projected{at}, {elapsed(r.hours)}{span(r.hours_low, r.hours_high, elapsed)}{money} ({r.reason})"
        )
    return f"{r.status.replace('_', ' ')}: {r.reason}"


def _rate_change(ratio: float, unit: str) -> str:
    word = "higher" if ratio > 1.0 else "lower"
    return f"its {unit} is {abs(ratio - 1.0):.0%} {word}"


def compare_to_target(
    target: str,
    baseline: SideToTarget,
    candidate: SideToTarget,
    *,
    min_effect: float,
    throughput_comparable: bool = True,
) -> TargetComparison:
    """The sides ranked by time to the target, with both figures (time and samples/s) said and whether
    they disagree. `min_effect`: the compare rule's smallest change that counts (a fraction)."""
    b, c = baseline, candidate
    throughput_ratio = (
        c.samples_per_s / b.samples_per_s
        if throughput_comparable and b.samples_per_s and c.samples_per_s
        else None
    )
    unit = b.throughput_unit
    head = f"time to {target}: "
    if b.hours is None and c.hours is None:
        verdict = (
            head + "neither side reached it nor can be projected (baseline: "
            f"{side_figure(b).removeprefix('no figure: ')}; candidate: {side_figure(c).removeprefix('no figure: ')}): "
            "no verdict on time to the target; the throughput verdict stands"
        )
        return TargetComparison(target, b, c, None, None, throughput_ratio, None, False, verdict)
    if b.hours is None or c.hours is None:
        has, lacks = (c, b) if b.hours is None else (b, c)
        verdict = (
            head + f"the {has.side} reaches it in {side_figure(has)}; the {lacks.side} has "
            f"{side_figure(lacks)}: no ratio, so no verdict on time to the target"
        )
        return TargetComparison(target, b, c, None, None, throughput_ratio, None, False, verdict)
    if b.hours <= 0 or c.hours <= 0:
        verdict = head + "a side reached it at its first record (0 h): no ratio"
        return TargetComparison(target, b, c, None, None, throughput_ratio, None, False, verdict)
    fast, slow = (c, b) if c.hours < b.hours else (b, c)
    ratio = slow.hours / fast.hours  # type: ignore[operator]
    figures = f"the {fast.side} reaches it in {side_figure(fast)}, the {slow.side} in {side_figure(slow)}"
    agree: bool | None = None
    if ratio <= 1.0 + min_effect:
        verdict = (
            head + f"{figures}: about as fast to the target (within {min_effect:.0%})"
            + (f"; the candidate's {unit} is {abs(throughput_ratio - 1):.0%} "
               f"{'higher' if throughput_ratio > 1 else 'lower'}" if throughput_ratio else "")
        )  # fmt: skip
        return TargetComparison(target, b, c, None, ratio, throughput_ratio, None, False, verdict)
    tail = ""
    if throughput_ratio is not None:
        fast_rate = throughput_ratio if fast is c else 1.0 / throughput_ratio
        agree = fast_rate > 1.0
        if abs(fast_rate - 1.0) <= min_effect:
            agree = None  # samples/s does not tell them apart: neither agrees nor disagrees
            tail = f" at about the same {unit} (within {min_effect:.0%}): only time to the target tells them apart"
        elif agree:
            tail = f", and {_rate_change(fast_rate, unit)}: both figures rank it first"
        else:
            tail = (
                f" although {_rate_change(fast_rate, unit)}: {unit} alone would rank the {slow.side} first, "
                f"time to the target ranks the {fast.side} first"
            )
    elif not throughput_comparable:
        tail = "; the sides' throughput is not comparable"
    verdict = head + f"{figures}: the {fast.side} is {ratio:.2f}x faster to the target{tail}"
    both_measured = b.status == REACHED and c.status == REACHED
    apart = slow.hours_low is not None and fast.hours_high is not None and slow.hours_low > fast.hours_high
    regression = slow is c and (both_measured or apart)
    if slow is c and not regression:
        verdict += " (not a regression: a projection's interval overlaps the other side's figure)"
    return TargetComparison(target, b, c, fast.side, ratio, throughput_ratio, agree, regression, verdict)
