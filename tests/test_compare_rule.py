"""The statistics and the decision rule of `tuneup compare` (tuneup/compare/stats.py, rule.py).

Reference values of the t distribution were computed with mpmath at 40 digits
(`betainc(df/2, 1/2, 0, df/(df+t^2), regularized=True) / 2`) and are written out here, so the test
needs neither mpmath nor scipy.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuneup.compare import (
    MetricComparison,
    Rule,
    Verdict,
    WelchResult,
    bootstrap_ratio_of_medians,
    coefficient_of_variation,
    decide,
    simulate_flag_rate,
    student_t_sf,
    welch,
)

# -- Student's t upper tail ------------------------------------------------------------------------------

T_REFERENCE = [
    # (t, df, P(T > t))
    (2.0, 5, 0.050969739414929178123),
    (1.812461, 10, 0.050000010018875038961),  # the one-sided 5% critical value at df = 10
    (2.5, 1.5, 0.084903251307348032408),
    (2.2, 5.73, 0.036107227948073826904),  # non-integer df, as Welch gives
    (0.7, 3.234, 0.26547944894333864394),
    (-3.0, 4.2, 0.98123376980156685308),
    (1.96, 1e6, 0.024998033792634895343),
]


@pytest.mark.parametrize(("t", "df", "expected"), T_REFERENCE)
def test_t_sf_matches_reference_values(t: float, df: float, expected: float) -> None:
    assert student_t_sf(t, df) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("t", "df", "expected"),
    [(30.0, 7.3, 3.2444026595639803343e-9), (1000.0, 3.3, 1.8397417621685486384e-10)],
)
def test_t_sf_is_relatively_accurate_far_in_the_tail(t: float, df: float, expected: float) -> None:
    assert student_t_sf(t, df) == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("t", [-50.0, -3.0, -1.0, -0.1, 1e-9, 0.5, 1.0, 2.0, 6.3, 100.0])
def test_t_sf_matches_closed_forms_at_df_1_and_2(t: float) -> None:
    # df = 1 is the Cauchy distribution; df = 2 has the tail 1/2 - t / (2 sqrt(2 + t^2)).
    assert student_t_sf(t, 1) == pytest.approx(0.5 - math.atan(t) / math.pi, abs=1e-13)
    assert student_t_sf(t, 2) == pytest.approx(0.5 - t / (2 * math.sqrt(2 + t * t)), abs=1e-13)


@pytest.mark.parametrize("df", [1, 2.5, 7, 30, 1e4, 1e9, math.inf])
def test_t_sf_is_one_half_at_zero_and_symmetric(df: float) -> None:
    assert student_t_sf(0.0, df) == 0.5
    for t in (0.3, 1.7, 4.0, 12.0):
        assert student_t_sf(t, df) + student_t_sf(-t, df) == pytest.approx(1.0, abs=1e-14)


def test_t_sf_tends_to_the_normal_for_large_df() -> None:
    for t in (0.5, 1.645, 1.96, 3.0):
        normal = 0.5 * math.erfc(t / math.sqrt(2))
        assert student_t_sf(t, math.inf) == normal
        assert student_t_sf(t, 1e12) == pytest.approx(normal, abs=1e-12)
        # The t tail is heavier than the normal's, by about phi(t) (t^3 + t) / (4 df).
        assert student_t_sf(t, 1e4) > normal


def test_t_sf_edges() -> None:
    assert student_t_sf(math.inf, 3) == 0.0
    assert student_t_sf(-math.inf, 3) == 1.0
    assert student_t_sf(1e200, 1) == pytest.approx(1 / (math.pi * 1e200), rel=1e-10)  # Cauchy tail
    with pytest.raises(ValueError, match="NaN"):
        student_t_sf(math.nan, 3)
    for df in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="df > 0"):
            student_t_sf(1.0, df)


@settings(max_examples=300, deadline=None)
@given(
    t=st.floats(allow_nan=False),
    df=st.floats(min_value=1e-3, allow_nan=False),
)
def test_t_sf_is_a_probability_for_any_t_and_df(t: float, df: float) -> None:
    p = student_t_sf(t, df)
    assert 0.0 <= p <= 1.0
    assert (p <= 0.5) if t >= 0 else (p >= 0.5)


# -- Welch's test -----------------------------------------------------------------------------------------


def test_welch_against_a_hand_computed_example() -> None:
    # a = 1, 2, 3, 4: mean 2.5, variance 5/3; b = 2, 4, 6: mean 4, variance 4.
    # se^2 = (5/3)/4 + 4/3 = 1.75; t = (4 - 2.5) / sqrt(1.75) = 1.1338934190276817;
    # df = 1.75^2 / ((5/12)^2 / 3 + (4/3)^2 / 2) = 3.0625 / 0.94675925... = 3.2347188264058680;
    # P(T > t) at that df = 0.16691185003875066 (mpmath).
    result = welch([1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0])
    assert isinstance(result, WelchResult)
    assert result.t == pytest.approx(1.1338934190276817, rel=1e-13)
    assert result.df == pytest.approx(3.2347188264058680, rel=1e-13)
    assert result.p_b_greater == pytest.approx(0.16691185003875066, abs=1e-12)
    assert result.p_b_less == pytest.approx(0.83308814996124934, abs=1e-12)
    # Swapping the sides swaps the directions.
    swapped = welch([2.0, 4.0, 6.0], [1.0, 2.0, 3.0, 4.0])
    assert swapped.t == pytest.approx(-result.t)
    assert swapped.p_b_less == pytest.approx(result.p_b_greater)


def test_welch_with_no_variance() -> None:
    # Neither side varies: the difference is certain, in its direction only.
    lower = welch([2.0, 2.0, 2.0], [1.0, 1.0])
    assert (lower.t, lower.p_b_less, lower.p_b_greater) == (-math.inf, 0.0, 1.0)
    higher = welch([2.0, 2.0], [3.0, 3.0, 3.0])
    assert (higher.t, higher.p_b_less, higher.p_b_greater) == (math.inf, 1.0, 0.0)
    # Equal constant sides: no evidence either way.
    same = welch([0.1, 0.1, 0.1], [0.1, 0.1])
    assert (same.t, same.p_b_less, same.p_b_greater) == (0.0, 1.0, 1.0)
    # One side constant: the test runs on the other side's variance (df = its n - 1).
    one = welch([5.0, 5.0, 5.0], [4.0, 4.5, 5.0, 4.2])
    assert one.df == pytest.approx(3.0)
    assert one.p_b_less < 0.05


def test_welch_needs_two_values_a_side() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        welch([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        welch([1.0, math.nan], [1.0, 2.0])


def test_coefficient_of_variation() -> None:
    assert coefficient_of_variation([3.0]) == 0.0
    assert coefficient_of_variation([7.0, 7.0, 7.0]) == 0.0
    # sd of 2, 4 is sqrt(2), mean 3.
    assert coefficient_of_variation([2.0, 4.0]) == pytest.approx(math.sqrt(2) / 3, rel=1e-14)
    # Scale-free, and no overflow near the float maximum.
    assert coefficient_of_variation([1e308, 1.5e308]) == pytest.approx(coefficient_of_variation([2.0, 3.0]))
    with pytest.raises(ValueError):
        coefficient_of_variation([])


# -- bootstrap interval of the ratio of medians -----------------------------------------------------------

BASE = [100.0, 101.2, 99.1, 100.4, 98.8, 100.9, 99.6, 100.2]
SLOWER = [v * 0.9 for v in [100.3, 99.2, 101.0, 99.8, 100.6, 98.9, 100.1, 99.5]]


def test_bootstrap_is_reproducible() -> None:
    first = bootstrap_ratio_of_medians(BASE, SLOWER)
    assert bootstrap_ratio_of_medians(BASE, SLOWER) == first
    assert bootstrap_ratio_of_medians(BASE, SLOWER, seed=0, resamples=2000) == first
    assert bootstrap_ratio_of_medians(BASE, SLOWER, seed=1) != first


def test_bootstrap_contains_the_true_ratio_in_a_clear_case() -> None:
    low, high = bootstrap_ratio_of_medians(BASE, SLOWER)
    assert low <= 0.9 <= high < 1.0
    narrow_low, narrow_high = bootstrap_ratio_of_medians(BASE, SLOWER, confidence=0.5)
    assert low <= narrow_low <= narrow_high <= high
    assert bootstrap_ratio_of_medians([5.0, 5.0], [5.0, 5.0, 5.0]) == (1.0, 1.0)


def test_bootstrap_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        bootstrap_ratio_of_medians([], [1.0])
    with pytest.raises(ValueError):
        bootstrap_ratio_of_medians([0.0, 1.0], [1.0])
    with pytest.raises(ValueError):
        bootstrap_ratio_of_medians([1.0], [1.0], resamples=0)
    with pytest.raises(ValueError):
        bootstrap_ratio_of_medians([1.0], [1.0], confidence=1.0)


# -- the rule ---------------------------------------------------------------------------------------------

STEADY = [100.0, 101.0, 99.0, 100.5, 99.5]  # CV about 0.8%: the threshold is the 5% minimum


def test_rule_defaults_threshold_and_description() -> None:
    rule = Rule()
    assert (rule.alpha, rule.min_effect, rule.cv_multiplier) == (0.05, 0.05, 2.0)
    assert rule.threshold(0.01) == 0.05
    assert rule.threshold(0.04) == pytest.approx(0.08)
    assert rule.describe() == (
        "one-sided Welch t-test on log values, p < 0.05, and a change beyond max(5%, 2 x the baseline's CV)"
    )
    assert "max(2.5%, 3 x" in Rule(min_effect=0.025, cv_multiplier=3).describe()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("alpha", 0.0),
        ("alpha", 1.0),
        ("alpha", math.nan),
        ("min_effect", -0.01),
        ("min_effect", 1.0),
        ("cv_multiplier", -1.0),
        ("resamples", -1),
        ("resamples", 10.5),
        ("confidence", 1.0),
        ("seed", 1.5),
        ("max_no_change", -0.01),
        ("max_no_change", 1.0),
        ("deterministic_tolerance", -0.01),
    ],
)
def test_rule_rejects_bad_settings_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"Rule.{field}"):
        Rule(**{field: value})


def test_clear_regression() -> None:
    r = decide("throughput", STEADY, [90.0, 91.0, 89.0, 90.5, 89.2], higher_is_better=True, unit="samples/s")
    assert r.verdict is Verdict.REGRESSION
    assert r.change == pytest.approx(0.101, abs=0.002)
    assert r.ratio == pytest.approx(1.0 - r.change)  # one figure: the change the test tests
    assert r.ci_low is not None and r.ci_high is not None and r.ci_low <= r.ratio <= r.ci_high
    assert r.p_worse is not None and r.p_worse < 1e-6
    assert r.p_better is not None and r.p_better > 0.99
    assert r.threshold == 0.05
    # p is below 1e-6: said as "p < 0.001", in compare's one number format (no "4.3e-07").
    assert r.reason == "throughput 10.1% lower (p < 0.001), beyond the 5.0% threshold"


def test_clear_improvement() -> None:
    r = decide("throughput", STEADY, [110.0, 111.0, 109.0, 110.5, 109.2], higher_is_better=True)
    assert r.verdict is Verdict.IMPROVEMENT
    assert r.change is not None and r.change < -0.05
    assert "9.9% higher" in r.reason


def test_noise_is_no_change() -> None:
    r = decide("throughput", [100, 105, 95, 102, 98], [99, 104, 97, 101, 100], higher_is_better=True)
    assert r.verdict is Verdict.NO_CHANGE
    assert r.baseline_cv == pytest.approx(0.0381, abs=1e-3)
    assert r.threshold == pytest.approx(2 * r.baseline_cv)  # the CV term wins over the 5% minimum
    assert "within the 7.6% threshold (2 x the baseline's 3.8% CV)" in r.reason


def test_big_but_noisy_is_inconclusive() -> None:
    # 9.7% lower (geometric means), beyond the 6% threshold, but one candidate run is far off the others.
    r = decide("throughput", [100, 103, 97], [70, 105, 100], higher_is_better=True)
    assert r.verdict is Verdict.INCONCLUSIVE
    assert r.change is not None and r.change > r.threshold
    assert r.p_worse is not None and r.p_worse >= 0.05
    assert "not significant" in r.reason and "run more repeats" in r.reason and "3 runs a side" in r.reason


def test_one_run_a_side_is_inconclusive_with_the_reason() -> None:
    r = decide("throughput", [100.0], [80.0], higher_is_better=True)
    assert r.verdict is Verdict.INCONCLUSIVE
    assert r.reason == (
        "throughput 20.0% lower on 1 run on the baseline and 1 run on the candidate: "
        "a test needs at least 2 runs a side (better 5), so no verdict"
    )
    assert (r.p_worse, r.p_better, r.ci_low, r.ci_high, r.baseline_cv) == (None, None, None, None, None)
    assert r.ratio == pytest.approx(0.8)
    one_side = decide("throughput", STEADY, [80.0], higher_is_better=True)
    assert one_side.verdict is Verdict.INCONCLUSIVE
    assert "5 runs on the baseline and 1 run on the candidate" in one_side.reason
    empty = decide("throughput", [], [80.0, 81.0], higher_is_better=True)
    assert empty.verdict is Verdict.INCONCLUSIVE
    assert (empty.ratio, empty.change, empty.baseline_median) == (None, None, None)


def test_significant_but_tiny_is_no_change() -> None:
    base = [100.0, 100.2, 99.9, 100.1, 99.8] * 2
    r = decide("throughput", base, [0.98 * v for v in base], higher_is_better=True)
    assert r.verdict is Verdict.NO_CHANGE
    assert r.p_worse is not None and r.p_worse < 1e-6
    assert r.reason.startswith(("throughput 2.0% lower (p = ", "throughput 2.0% lower (p < 0.001)"))
    assert "a real change, but within the 5.0% minimum effect" in r.reason


def test_a_real_change_within_the_noise_threshold_is_inconclusive_not_no_change() -> None:
    """The issue's case: step time 22.9% higher at p = 0.047 against a 25.5% threshold (2 x the baseline's
    CV) was called NO CHANGE. Real, beyond the 5% minimum, within the noise threshold: INCONCLUSIVE."""
    base = [100.0, 120.0, 84.0, 100.0, 116.0, 86.0]
    r = decide("step time", base, [121.0, 123.0, 122.0], higher_is_better=False, unit="ms")
    assert r.baseline_cv == pytest.approx(0.1470, abs=5e-4)
    assert r.change == pytest.approx(0.2188, abs=5e-4)
    assert Rule().min_effect < r.change < r.threshold == pytest.approx(0.2940, abs=5e-4)
    assert r.p_worse == pytest.approx(0.0108, abs=5e-4)
    assert r.verdict is Verdict.INCONCLUSIVE
    assert r.reason.startswith(
        "step time 21.9% higher (p = 0.011 < 0.05): a real change, but within the 29.4% threshold "
        "(2 x the baseline's 14.7% CV), the runs' own noise"
    )


@pytest.mark.parametrize("slowdown", [0.16, 0.20, 0.30, 0.50])
@pytest.mark.parametrize("cv", [0.02, 0.10, 0.20, 0.40])
def test_a_slowdown_above_15_percent_is_never_no_change(slowdown: float, cv: float) -> None:
    """Whatever the noise and the p-value: an observed slowdown beyond max_no_change (15%) is a REGRESSION
    or INCONCLUSIVE, never NO CHANGE, including not-significant ones inside a wide noise threshold."""
    spread = [1.0 - cv, 1.0, 1.0 + cv]
    base = [100.0 * f for f in spread]
    cand = [100.0 * (1.0 + slowdown) * f for f in reversed(spread)]
    r = decide("step time", base, cand, higher_is_better=False)
    assert r.change == pytest.approx(slowdown, rel=1e-9)
    assert r.verdict in (Verdict.REGRESSION, Verdict.INCONCLUSIVE), r.reason


def test_a_min_effect_above_max_no_change_is_a_valid_rule() -> None:
    """`--min-effect 0.2` must not fail on the 15% ceiling: within 20% is NO CHANGE, as asked."""
    rule = Rule(min_effect=0.2)
    assert decide(
        "step time", STEADY, [v * 1.18 for v in STEADY], higher_is_better=False, rule=rule
    ).verdict is (Verdict.NO_CHANGE)


def test_not_significant_within_the_threshold_and_below_15_percent_is_still_no_change() -> None:
    base, cand = [100.0, 125.0, 80.0], [110.0, 90.0, 120.0]  # 9.4% higher, CV 22%: noise
    r = decide("step time", base, cand, higher_is_better=False)
    assert r.verdict is Verdict.NO_CHANGE
    assert r.change is not None and Rule().min_effect < r.change < Rule().max_no_change
    big = decide("step time", base, [v * 1.1 for v in cand], higher_is_better=False)  # 20.4% higher
    assert big.change is not None and big.change < big.threshold  # within the 44% noise threshold
    assert big.verdict is Verdict.INCONCLUSIVE
    assert "more than the 15% ever called no change: run more repeats" in big.reason


def test_the_table_effect_and_the_sentence_state_one_figure() -> None:
    r = decide("step time", STEADY, [121.3, 121.0, 121.6, 121.2, 121.4], higher_is_better=False)
    assert r.effect_text == "+21.3%"
    assert r.reason.startswith("step time 21.3% higher")
    assert abs(r.ratio - 1.0) == pytest.approx(r.change)  # type: ignore[operator]  # the one compared
    t = decide("throughput", STEADY, [80.0, 81.0, 79.0, 80.5, 79.5], higher_is_better=True)
    assert t.effect_text == "-20.0%" and t.reason.startswith("throughput 20.0% lower")


def test_a_deterministic_metric_decides_from_one_run_a_side() -> None:
    """Peak memory repeats from run to run: 1 run a side at a ratio of 1.000 is NO CHANGE (it was
    INCONCLUSIVE), beyond the 2% tolerance a REGRESSION or IMPROVEMENT, with no test."""
    same = decide("peak memory", [4e9], [4e9], higher_is_better=False, deterministic=True)
    assert same.verdict is Verdict.NO_CHANGE and same.deterministic
    assert same.threshold == 0.02 and same.p_worse is None
    assert same.reason == (
        "peak memory unchanged: within the 2.0% tolerance of a figure that repeats from run to run (1 run a side)"
    )
    close = decide("peak memory", [4e9], [4.06e9], higher_is_better=False, deterministic=True)
    assert close.verdict is Verdict.NO_CHANGE  # 1.5%
    grown = decide("peak memory", [4e9, 4e9], [4.12e9], higher_is_better=False, deterministic=True)
    assert grown.verdict is Verdict.REGRESSION and grown.effect_text == "+3.0%"
    assert grown.reason.startswith("peak memory 3.0% higher: beyond the 2.0% tolerance")
    shrunk = decide("peak memory", [4e9], [3e9], higher_is_better=False, deterministic=True)
    assert shrunk.verdict is Verdict.IMPROVEMENT
    # Not deterministic (the flag off), the same figures need a test: one run a side says nothing.
    assert decide("peak memory", [4e9], [4e9], higher_is_better=False).verdict is Verdict.INCONCLUSIVE


def test_a_deterministic_metric_whose_runs_vary_gets_the_statistical_rule() -> None:
    base = [4.0e9, 4.2e9, 3.9e9]  # 7.7% apart: not deterministic on this machine
    r = decide("peak memory", base, [4.1e9, 4.0e9, 4.15e9], higher_is_better=False, deterministic=True)
    assert not r.deterministic and r.threshold == pytest.approx(0.076, abs=1e-3)
    assert r.p_worse is not None and r.verdict is Verdict.NO_CHANGE


def test_lower_is_better_metric() -> None:
    slower = [110.0, 111.0, 109.0, 110.5, 109.5]
    r = decide("step time", STEADY, slower, higher_is_better=False, unit="ms")
    assert r.verdict is Verdict.REGRESSION
    assert r.change == pytest.approx(0.10, abs=0.002)  # positive: worse
    assert "step time 10.0% higher" in r.reason
    assert r.unit == "ms"
    faster = decide("step time", slower, STEADY, higher_is_better=False)
    assert faster.verdict is Verdict.IMPROVEMENT
    # The same numbers as a higher-is-better metric read the other way.
    assert decide("throughput", STEADY, slower, higher_is_better=True).verdict is Verdict.IMPROVEMENT


def test_sides_without_variance() -> None:
    # Deterministic metrics (peak memory) often repeat exactly: a consistent change is certain.
    same = decide("peak memory", [4e9, 4e9, 4e9], [4e9, 4e9, 4e9], higher_is_better=False)
    assert same.verdict is Verdict.NO_CHANGE
    assert (same.p_worse, same.p_better, same.change, same.baseline_cv) == (1.0, 1.0, 0.0, 0.0)
    assert same.reason == "peak memory unchanged (p = 1), within the 5.0% threshold"
    grown = decide("peak memory", [4e9, 4e9, 4e9], [4.4e9, 4.4e9], higher_is_better=False)
    assert grown.verdict is Verdict.REGRESSION
    assert grown.p_worse == 0.0
    assert "neither side varies" in grown.reason
    slightly = decide("peak memory", [4e9, 4e9, 4e9], [4.08e9, 4.08e9], higher_is_better=False)
    assert slightly.verdict is Verdict.NO_CHANGE
    assert "a real change, but within the 5.0% minimum effect" in slightly.reason


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, "fast"])
def test_bad_values_raise_naming_the_metric(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^cost per sample: candidate run 2 has value"):
        decide("cost per sample", [1.0, 1.1], [1.0, bad], higher_is_better=False)
    with pytest.raises(ValueError, match=r"^throughput: baseline run 1"):
        decide("throughput", [bad], [1.0], higher_is_better=True)


def test_as_dict_is_json() -> None:
    r = decide("throughput", STEADY, [90.0, 91.0, 89.0, 90.5, 89.2], higher_is_better=True)
    d = json.loads(json.dumps(r.as_dict(), allow_nan=False))
    assert d["verdict"] == "REGRESSION"
    assert d["baseline"] == STEADY
    assert set(d) == {f for f in MetricComparison.__dataclass_fields__}
    assert Verdict("NO CHANGE") is Verdict.NO_CHANGE


def test_resamples_zero_leaves_the_interval_out() -> None:
    r = decide("throughput", STEADY, STEADY, higher_is_better=True, rule=Rule(resamples=0))
    assert (r.ci_low, r.ci_high) == (None, None)
    assert r.verdict is Verdict.NO_CHANGE


# -- what the rule can see: the simulation requirements -------------------------------------------


def test_a_a_comparisons_are_rarely_flagged() -> None:
    """Identical sides at CV 5%, 5 runs a side: at most 5% flagged (the test alone allows 5%; the
    threshold can only lower that)."""
    assert simulate_flag_rate(0.05, 0.0, runs=5, trials=2000) <= 0.05


@pytest.mark.parametrize(("cv", "runs"), [(0.05, 2), (0.05, 3), (0.05, 10), (0.01, 5), (0.20, 5)])
def test_a_a_guarantee_holds_for_other_run_counts_and_noise(cv: float, runs: int) -> None:
    assert simulate_flag_rate(cv, 0.0, runs=runs, trials=2000, seed=1) <= 0.05


def test_a_ten_percent_slowdown_is_caught_where_the_rule_is_designed_to_catch_it() -> None:
    """A 10% slowdown, 5 runs a side, is flagged at least 80% of the time at CV 2%.

    The rule claims only changes beyond max(5%, 2 x the baseline's CV). At CV 2% that is 5%, and a 10%
    slowdown is well beyond it: caught nearly always. At CV 5% the threshold is 2 x 5% = 10%, so a true
    10% slowdown sits right at it and is flagged only about half the time, by design (the rule does not
    claim changes as small as twice the run-to-run noise; lowering the bar would raise the A/A rate).
    Both figures are asserted, so the one the README states is itself tested.
    """
    assert simulate_flag_rate(0.02, 0.10, runs=5, trials=2000) >= 0.80
    assert 0.30 <= simulate_flag_rate(0.05, 0.10, runs=5, trials=2000) <= 0.70


def test_simulation_is_seeded_and_checks_its_arguments() -> None:
    assert simulate_flag_rate(0.05, 0.1, 5, 300, seed=3) == simulate_flag_rate(0.05, 0.1, 5, 300, seed=3)
    assert simulate_flag_rate(0.05, 0.5, runs=1, trials=10) == 0.0  # one run a side: never a verdict
    with pytest.raises(ValueError):
        simulate_flag_rate(-0.1, 0.0, 5, 10)
    with pytest.raises(ValueError):
        simulate_flag_rate(0.05, 1.0, 5, 10)


# -- decide never raises on valid input -------------------------------------------------------------------

positive = st.floats(min_value=0.0, exclude_min=True, allow_nan=False, allow_infinity=False)
QUICK = Rule(resamples=50)


@settings(max_examples=300, deadline=None)
@given(
    baseline=st.lists(positive, max_size=8),
    candidate=st.lists(positive, max_size=8),
    higher_is_better=st.booleans(),
)
def test_decide_never_raises_on_positive_finite_values(
    baseline: list[float], candidate: list[float], higher_is_better: bool
) -> None:
    r = decide("m", baseline, candidate, higher_is_better=higher_is_better, rule=QUICK)
    assert r.verdict in set(Verdict)
    if len(baseline) < 2 or len(candidate) < 2:
        assert r.verdict is Verdict.INCONCLUSIVE
    else:
        assert r.p_worse is not None and 0.0 <= r.p_worse <= 1.0
        assert r.p_better is not None and 0.0 <= r.p_better <= 1.0
    assert r.reason
    json.dumps(r.as_dict(), allow_nan=False)
