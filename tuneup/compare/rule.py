"""The decision rule of `tuneup compare`: one metric, a few runs a side, one verdict with its reason.

The rule (DESIGN.md, "CI regression"): one number per run; a REGRESSION only when a one-sided Welch
t-test on the log of the metric gives p < alpha AND the change is beyond max(min_effect, cv_multiplier x
the baseline's run-to-run CV). Both halves are needed: the test alone flags real but tiny changes once
runs are many or quiet, and the threshold alone flags noise when runs are few. The log scale makes a
change a ratio (10% slower is the same evidence at 100 or 10,000 samples/s) and suits positive,
right-skewed figures such as step times.

NO CHANGE is a claim too, and is made only where the data support it: a change within min_effect, or one
within the threshold that the test cannot tell from noise and that is no larger than max_no_change (15%).
A change the test finds real but within the noise threshold, or a change above max_no_change that the
rule cannot claim, is INCONCLUSIVE: a 20% slowdown is never "no change" (3 runs a side at +22.9%,
p = 0.047, against a 25.5% threshold was called NO CHANGE). Only REGRESSION's condition flags a run,
and it is unchanged, so the false-alarm rate is too.

A deterministic metric (peak memory: the allocator's peak repeats from run to run) needs no noise
threshold: where each side's runs agree within `deterministic_tolerance`, equal within it is NO CHANGE
and beyond it a REGRESSION or IMPROVEMENT, even from one run a side. Where a side's runs spread wider
than that, the figure is not deterministic on this machine and the statistical rule decides.

What it can and cannot see, measured by `simulate_flag_rate` (benchmarks/compare_power.py): with 5 runs
a side, identical sides (A/A) are flagged at most 5% of the time; a true 10% slowdown is caught nearly
always when the baseline's CV is 3% or less, but only about half the time at CV 5%, because the threshold
is then 2 x 5% = 10%: the rule does not claim changes the size of the run-to-run noise.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any

from tuneup.compare.stats import coefficient_of_variation, geometric_gain, median, welch

# A test needs a variance on each side, so at least 2 runs; 5 give it useful power (see the module docs).
MIN_RUNS_FOR_TEST = 2
RECOMMENDED_RUNS = 5


class Verdict(str, Enum):
    REGRESSION = "REGRESSION"
    IMPROVEMENT = "IMPROVEMENT"
    NO_CHANGE = "NO CHANGE"
    INCONCLUSIVE = "INCONCLUSIVE"


def _percent(fraction: float) -> str:
    """5% rather than 5.0%, for a rule's settings (figures use one decimal)."""
    return f"{fraction * 100:g}%"


@dataclass(frozen=True)
class Rule:
    """The decision rule's settings.

    alpha: one-sided significance level of the Welch t-test on log values.
    min_effect: the smallest change (a fraction: 0.05 = 5%) ever reported as a regression or improvement.
    cv_multiplier: the threshold grows to this many times the baseline's run-to-run coefficient of
        variation where that is larger than min_effect: a change within the noise of single runs is not
        claimed, however significant the test.
    confidence: the interval shown for the ratio: two-sided at this level, from the test's own t on log
        values (at 1 - 2 x alpha, 0.90, it leaves out "no change" exactly when the test in that direction
        gives p < alpha).
    max_no_change: the largest change ever called NO CHANGE; a larger one the rule cannot claim is
        INCONCLUSIVE (a noisy runner's threshold of 2 x CV can exceed 20%).
    deterministic_tolerance: for a deterministic metric (`decide(deterministic=True)`), the change within
        which the sides are equal; beyond it a REGRESSION or IMPROVEMENT without a test.
    resamples, seed: resamples = 0 leaves the interval out. (They set a bootstrap interval of the ratio of
        medians, a second figure for the same comparison beside the test's; the interval is now the test's,
        and `bootstrap_ratio_of_medians` is kept for callers of its own.)
    """

    alpha: float = 0.05
    min_effect: float = 0.05
    cv_multiplier: float = 2.0
    resamples: int = 2000
    confidence: float = 0.90
    seed: int = 0
    max_no_change: float = 0.15
    deterministic_tolerance: float = 0.02

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"Rule.{f.name} must be a finite number, got {value!r}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"Rule.alpha must be between 0 and 1 (exclusive), got {self.alpha}")
        if not 0.0 <= self.min_effect < 1.0:
            raise ValueError(
                f"Rule.min_effect must be a fraction in [0, 1) (0.05 = 5%), got {self.min_effect}"
            )
        if not 0.0 <= self.max_no_change < 1.0:
            # Below min_effect it changes nothing: a change within min_effect is NO CHANGE first.
            raise ValueError(f"Rule.max_no_change must be a fraction in [0, 1), got {self.max_no_change}")
        if not 0.0 <= self.deterministic_tolerance < 1.0:
            raise ValueError(
                f"Rule.deterministic_tolerance must be a fraction in [0, 1), got {self.deterministic_tolerance}"
            )
        if self.cv_multiplier < 0.0:
            raise ValueError(f"Rule.cv_multiplier must be >= 0, got {self.cv_multiplier}")
        if not isinstance(self.resamples, int) or self.resamples < 0:
            raise ValueError(
                f"Rule.resamples must be a whole number >= 0 (0: no interval), got {self.resamples}"
            )
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"Rule.confidence must be between 0 and 1 (exclusive), got {self.confidence}")
        if not isinstance(self.seed, int):
            raise ValueError(f"Rule.seed must be a whole number, got {self.seed!r}")

    def threshold(self, baseline_cv: float) -> float:
        """The smallest change (fraction) this rule reports, given the baseline's run-to-run CV."""
        return max(self.min_effect, self.cv_multiplier * baseline_cv)

    def describe(self) -> str:
        return (
            f"one-sided Welch t-test on log values, p < {self.alpha:g}, and a change beyond "
            f"max({_percent(self.min_effect)}, {self.cv_multiplier:g} x the baseline's CV)"
        )


def verdict_fields(comparison: Any) -> dict[str, Any]:
    """A comparison's fields for JSON: the verdict as its text, tuples as lists, and a figure that overflowed
    (only possible for values near the float limits) as None, since JSON has no infinity."""
    out: dict[str, Any] = {}
    for f in fields(comparison):
        value = getattr(comparison, f.name)
        if isinstance(value, Verdict):
            value = value.value
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, float) and not math.isfinite(value):
            value = None
        out[f.name] = value
    return out


@dataclass(frozen=True)
class MetricComparison:
    """One metric's verdict and the figures behind it.

    One comparison, one figure: `ratio` is gm(candidate) / gm(baseline), the ratio of the geometric means
    that the test on log values tests, with that test's interval, and `change` the same ratio as a signed
    fraction, positive = worse (1 - ratio where higher is better, ratio - 1 where lower is better), whose
    size is what the threshold is compared with. The table, the verdict's sentence, the Markdown and the
    JUnit XML all state it as `effect_text`, the candidate's change in percent (a table's 'ratio 1.213'
    beside a '21.1%' threshold and a sentence's '16.4% higher' were two figures for one comparison). The
    medians are kept for reading. Means, medians, ratio and change are None only when a side has no runs; the interval and the
    p-values when a side has fewer than 2 (or, for the interval, resamples = 0).
    """

    metric: str
    unit: str
    higher_is_better: bool
    baseline: tuple[float, ...]
    candidate: tuple[float, ...]
    baseline_median: float | None
    candidate_median: float | None
    ratio: float | None  # candidate geometric mean / baseline geometric mean
    ci_low: float | None  # the Welch test's interval of `ratio`, at the rule's confidence
    ci_high: float | None
    change: float | None
    p_worse: float | None  # one-sided Welch p-value on the logs: the candidate is worse
    p_better: float | None
    baseline_cv: float | None  # sample sd / mean of the baseline runs; None with fewer than 2
    threshold: float  # the change (fraction) beyond which a verdict is claimed
    verdict: Verdict
    reason: str
    baseline_mean: float | None = None  # geometric mean of the runs' figures
    candidate_mean: float | None = None
    deterministic: bool = False  # decided by the deterministic metric's tolerance, without a test

    @property
    def effect_text(self) -> str:
        """The one effect figure, signed as the values moved: '+21.3%' (the candidate's is higher)."""
        return "-" if self.ratio is None else effect_percent(self.ratio)

    def as_dict(self) -> dict[str, Any]:
        return verdict_fields(self)


def _exp(x: float) -> float:
    """exp that gives inf instead of raising: a log ratio can exceed 709 only for absurd inputs."""
    return math.inf if x > 709.0 else math.exp(x)


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _counts(n_baseline: int, n_candidate: int) -> str:
    if n_baseline == n_candidate:
        return f"{_runs(n_baseline)} a side"
    return f"{_runs(n_baseline)} on the baseline and {_runs(n_candidate)} on the candidate"


def p_value_text(p: float, alpha: float) -> str:
    """p with as few digits as keep its side of alpha visible (0.0496 must not print as 0.05 < 0.05)."""
    if p == 0.0:
        return "p = 0"
    if p < 0.001 < alpha:
        # Below a thousandth the digits say nothing more, and an exponent ("4.3e-07") reads as a different
        # number format from every other figure of compare's output.
        return "p < 0.001"
    for digits in range(2, 8):
        text = f"{p:.{digits}g}"
        if (float(text) < alpha) == (p < alpha):
            break
    return f"p = {text}"


def evidence_text(p: float, alpha: float) -> str:
    """p against alpha as a verdict's reason states it: 'p = 0.019 < 0.05', 'p = 0.12 >= 0.05'; 'p < 0.001'
    already says its side of alpha."""
    text = p_value_text(p, alpha)
    # alpha to 3 digits: a sequential look's level (tuneup.compare.sequential) is no round number.
    return text if text.startswith("p <") else f"{text} {'<' if p < alpha else '>='} {alpha:.3g}"


def effect_percent(ratio: float) -> str:
    """The candidate's change as the table states it: '+21.3%', '-4.0%'. The sentence states the same
    digits (`change_text`), and the threshold is compared with the same ratio's distance from 1."""
    return f"{ratio - 1.0:+.1%}"


def change_text(metric: str, geometric_ratio: float) -> str:
    if geometric_ratio == 1.0:
        return f"{metric} unchanged"
    word = "higher" if geometric_ratio > 1.0 else "lower"
    return f"{metric} {effect_percent(geometric_ratio)[1:]} {word}"


def _threshold_text(rule: Rule, baseline_cv: float | None, threshold: float) -> str:
    if baseline_cv is not None and rule.cv_multiplier * baseline_cv > rule.min_effect:
        return f"the {threshold:.1%} threshold ({rule.cv_multiplier:g} x the baseline's {baseline_cv:.1%} CV)"
    return f"the {threshold:.1%} threshold"


def _log_test(
    log_baseline: Sequence[float], log_candidate: Sequence[float], higher_is_better: bool
) -> tuple[float, float]:
    """(p_worse, p_better): one-sided Welch p-values on log values, oriented by the metric's direction."""
    result = welch(log_baseline, log_candidate)
    if higher_is_better:
        return result.p_b_less, result.p_b_greater
    return result.p_b_greater, result.p_b_less


def _geometric_ratio(log_baseline: Sequence[float], log_candidate: Sequence[float]) -> float:
    return _exp(math.fsum(log_candidate) / len(log_candidate) - math.fsum(log_baseline) / len(log_baseline))


def signed_change(geometric_ratio: float, higher_is_better: bool) -> float:
    return 1.0 - geometric_ratio if higher_is_better else geometric_ratio - 1.0


def verdict_for(change: float, p_worse: float, p_better: float, threshold: float, rule: Rule) -> Verdict:
    """The rule itself, shared by `decide` and `simulate_flag_rate` so that the simulation measures it."""
    if p_worse < rule.alpha and change > threshold:
        return Verdict.REGRESSION
    if p_better < rule.alpha and -change > threshold:
        return Verdict.IMPROVEMENT
    size = abs(change)
    if size <= rule.min_effect:
        return Verdict.NO_CHANGE  # too small to act on, whatever the test says
    if (p_worse if change > 0 else p_better) < rule.alpha:
        return Verdict.INCONCLUSIVE  # real, but within the run-to-run noise: neither claimed nor denied
    if size > threshold or size > rule.max_no_change:
        return Verdict.INCONCLUSIVE
    return Verdict.NO_CHANGE


def _spread(values: Sequence[float]) -> float:
    """How far a side's runs are apart, as a fraction of the smallest: 0 for one run."""
    return max(values) / min(values) - 1.0


def _checked(metric: str, side: str, values: Sequence[float]) -> tuple[float, ...]:
    checked = []
    for i, value in enumerate(values):
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan  # reported below, with the metric's name
        if not (math.isfinite(number) and number > 0.0):
            raise ValueError(
                f"{metric}: {side} run {i + 1} has value {value!r}; compared values must be finite and > 0 "
                "(they are compared on a log scale)"
            )
        checked.append(number)
    return tuple(checked)


def decide(
    metric: str,
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    higher_is_better: bool,
    unit: str = "",
    rule: Rule = Rule(),  # frozen: one shared default is safe
    deterministic: bool = False,
) -> MetricComparison:
    """The verdict on one metric, one figure per run on each side (ValueError for a value <= 0 or not finite).

    REGRESSION: p_worse < alpha and change > threshold. IMPROVEMENT: p_better < alpha and -change >
    threshold. NO CHANGE: a change within min_effect, or one within the threshold that is not significant
    and at most max_no_change. INCONCLUSIVE: everything else: fewer than 2 runs on a side, a change beyond
    the threshold that the test cannot tell from noise, a real change within the noise threshold, a change
    above max_no_change that is not claimed. `deterministic` (peak memory): where each side's runs agree
    within rule.deterministic_tolerance, the change decides against that tolerance alone, from one run a
    side too.
    """
    base = _checked(metric, "baseline", baseline)
    cand = _checked(metric, "candidate", candidate)
    baseline_median = median(base) if base else None
    candidate_median = median(cand) if cand else None
    log_base = [math.log(v) for v in base]
    log_cand = [math.log(v) for v in cand]
    geometric_ratio = _geometric_ratio(log_base, log_cand) if base and cand else None
    ratio = geometric_ratio
    baseline_mean = _exp(math.fsum(log_base) / len(log_base)) if base else None
    candidate_mean = _exp(math.fsum(log_cand) / len(log_cand)) if cand else None
    change = None if geometric_ratio is None else signed_change(geometric_ratio, higher_is_better)
    baseline_cv = coefficient_of_variation(base) if len(base) >= MIN_RUNS_FOR_TEST else None
    threshold = rule.threshold(baseline_cv or 0.0)
    exact = (
        deterministic
        and bool(base and cand)
        and max(_spread(base), _spread(cand)) <= rule.deterministic_tolerance
    )
    if exact:
        threshold = rule.deterministic_tolerance

    def result(
        verdict: Verdict,
        reason: str,
        p_worse: float | None = None,
        p_better: float | None = None,
        ci: tuple[float, float] | tuple[None, None] = (None, None),
    ) -> MetricComparison:
        return MetricComparison(
            metric=metric,
            unit=unit,
            higher_is_better=higher_is_better,
            baseline=base,
            candidate=cand,
            baseline_median=baseline_median,
            candidate_median=candidate_median,
            ratio=ratio,
            ci_low=ci[0],
            ci_high=ci[1],
            change=change,
            p_worse=p_worse,
            p_better=p_better,
            baseline_cv=baseline_cv,
            threshold=threshold,
            verdict=verdict,
            reason=reason,
            baseline_mean=baseline_mean,
            candidate_mean=candidate_mean,
            deterministic=exact,
        )

    if exact:
        assert geometric_ratio is not None and change is not None  # both sides have runs here
        runs = _counts(len(base), len(cand))
        tolerance = f"the {threshold:.1%} tolerance of a figure that repeats from run to run"
        if abs(change) <= threshold:
            return result(
                Verdict.NO_CHANGE, f"{change_text(metric, geometric_ratio)}: within {tolerance} ({runs})"
            )
        verdict = Verdict.REGRESSION if change > 0 else Verdict.IMPROVEMENT
        return result(verdict, f"{change_text(metric, geometric_ratio)}: beyond {tolerance} ({runs})")

    if len(base) < MIN_RUNS_FOR_TEST or len(cand) < MIN_RUNS_FOR_TEST:
        seen = "" if geometric_ratio is None else f"{change_text(metric, geometric_ratio)} on "
        return result(
            Verdict.INCONCLUSIVE,
            f"{seen}{_runs(len(base))} on the baseline and {_runs(len(cand))} on the candidate: "
            f"a test needs at least {MIN_RUNS_FOR_TEST} runs a side "
            f"(better {RECOMMENDED_RUNS}), so no verdict",
        )

    assert geometric_ratio is not None and change is not None  # both sides have runs here
    p_worse, p_better = _log_test(log_base, log_cand, higher_is_better)
    ci: tuple[float, float] | tuple[None, None] = (None, None)
    gain = geometric_gain(base, cand, rule.confidence) if rule.resamples > 0 else None
    if gain is not None and gain[1] is not None and gain[2] is not None:
        ci = (1.0 + gain[1], 1.0 + gain[2])
    verdict = verdict_for(change, p_worse, p_better, threshold, rule)
    seen = change_text(metric, geometric_ratio)
    beyond = _threshold_text(rule, baseline_cv, threshold)
    p_direction = p_worse if change > 0 else p_better  # the test of the direction the data moved
    significant = p_direction < rule.alpha
    if significant and min(base) == max(base) and min(cand) == max(cand):
        evidence = "p = 0: neither side varies"  # the degenerate test (see `welch`), said plainly
    else:
        evidence = evidence_text(p_direction, rule.alpha)
    if verdict in (Verdict.REGRESSION, Verdict.IMPROVEMENT):
        reason = f"{seen} ({evidence}), beyond {beyond}"
    elif verdict is Verdict.NO_CHANGE and significant:
        reason = f"{seen} ({evidence}): a real change, but within the {rule.min_effect:.1%} minimum effect"
    elif verdict is Verdict.NO_CHANGE:
        reason = f"{seen} ({p_value_text(p_direction, rule.alpha)}), within {beyond}"
    elif significant:
        # Real, beyond min_effect, but no larger than single runs vary: calling it NO CHANGE hid a 23%
        # slowdown; calling it a REGRESSION would flag the noise of a noisy runner.
        reason = (
            f"{seen} ({evidence}): a real change, but within {beyond}, the runs' own noise: "
            "neither a regression nor no change; quieter runs (longer, or on a quieter machine) would decide"
        )
    elif abs(change) > threshold:
        runs = _counts(len(base), len(cand))
        reason = f"{seen}, beyond {beyond}, but not significant ({evidence} with {runs}): run more repeats"
    else:
        runs = _counts(len(base), len(cand))
        reason = (
            f"{seen} ({evidence} with {runs}), within {beyond}, but more than the "
            f"{rule.max_no_change:.0%} ever called no change: run more repeats"
        )
    return result(verdict, reason, p_worse, p_better, ci)


def simulate_flag_rate(
    cv: float,
    slowdown: float,
    runs: int,
    trials: int,
    *,
    rule: Rule = Rule(),  # frozen: one shared default is safe
    seed: int = 0,
) -> float:
    """The fraction of simulated comparisons the rule calls a REGRESSION.

    Each trial draws `runs` baseline and `runs` candidate throughputs (higher is better) with lognormal
    run-to-run noise of coefficient of variation `cv` (sigma = sqrt(log(1 + cv^2))), the candidate's
    scaled by (1 - slowdown), and applies the rule's test, threshold and verdict (`verdict_for`, as `decide`
    does; the bootstrap interval, which no verdict uses, is skipped). slowdown = 0 measures the false
    alarm rate, slowdown > 0 the power. Seeded: the same arguments give the same rate.
    """
    if not (math.isfinite(cv) and cv >= 0.0):
        raise ValueError(f"cv must be a finite fraction >= 0, got {cv}")
    if not 0.0 <= slowdown < 1.0:
        raise ValueError(f"slowdown must be a fraction in [0, 1), got {slowdown}")
    if runs < 1 or trials < 1:
        raise ValueError(f"runs and trials must be >= 1, got runs={runs}, trials={trials}")
    if runs < MIN_RUNS_FOR_TEST:
        return 0.0  # never a verdict with one run a side
    rng = random.Random(seed)
    sigma = math.sqrt(math.log1p(cv * cv))
    shift = math.log1p(-slowdown)
    flagged = 0
    for _ in range(trials):
        log_base = [rng.gauss(0.0, sigma) for _ in range(runs)]
        log_cand = [shift + rng.gauss(0.0, sigma) for _ in range(runs)]
        threshold = rule.threshold(coefficient_of_variation([math.exp(v) for v in log_base]))
        p_worse, p_better = _log_test(log_base, log_cand, higher_is_better=True)
        change = signed_change(_geometric_ratio(log_base, log_cand), higher_is_better=True)
        flagged += verdict_for(change, p_worse, p_better, threshold, rule) is Verdict.REGRESSION
    return flagged / trials
