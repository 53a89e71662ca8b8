"""The statistics behind `tuneup compare`, in pure Python: Student's t tail, Welch's test, CV, a bootstrap.

No scipy or numpy: comparisons run in CI jobs and on laptops that have neither, and the few functions
needed here are short. `student_t_sf` is checked against high-precision reference values in the tests.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Lentz's method replaces an exact zero denominator by this, so the recurrence can go on (Numerical Recipes).
_TINY = 1e-300
# Relative change of the continued fraction at which it has converged: near double precision.
_CF_EPSILON = 1e-15
# The fraction for I_x(a, b) converges in O(sqrt(max(a, b))) terms where x is on the convergent side
# (x < (a + 1) / (a + b + 2)): a few thousand at most for the t distribution below _EXPANSION_DF.
_CF_MAX_TERMS = 100_000
# Beyond this many degrees of freedom the fraction needs ~sqrt(df) terms and gathers rounding (5e-12 at
# 1e7, 1.5e-10 at 1e9), while the normal tail with its first 1/df term is within 3e-15 of the t tail.
_EXPANSION_DF = 1e7


def _incomplete_beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), evaluated with Lentz's method (Numerical Recipes `betacf`)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _CF_MAX_TERMS + 1):
        m2 = 2 * m
        # Even step of the fraction.
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        # Odd step.
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        step = d * c
        h *= step
        if abs(step - 1.0) < _CF_EPSILON:
            return h
    raise ArithmeticError(f"incomplete beta fraction did not converge for a={a}, b={b}, x={x}")


# Stirling series of ln Gamma(x) - [(x - 1/2) ln x - x + ln sqrt(2 pi)]: B_2k / (2k (2k - 1) x^(2k - 1)).
_STIRLING = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156, -3617 / 122400)
_LN_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _lgamma_correction(x: float) -> float:
    """ln Gamma(x) less Stirling's formula, for x >= 10 (the series' last term is then below 1e-16)."""
    inv, inv2 = 1.0 / x, 1.0 / (x * x)
    total, power = 0.0, inv
    for coefficient in _STIRLING:
        total += coefficient * power
        power *= inv2
    return total


def _log_beta(a: float, b: float) -> float:
    """ln B(a, b). lgamma(a) + lgamma(b) - lgamma(a + b) cancels catastrophically for a large parameter
    (lgamma(5e8) is about 1e10, so its last bit is worth 1e-6): the large terms are taken in closed form
    with Stirling corrections instead, as R's `lbeta` does."""
    p, q = min(a, b), max(a, b)
    if q < 10.0:
        return math.lgamma(p) + math.lgamma(q) - math.lgamma(p + q)
    ratio = p / (p + q)
    if p < 10.0:
        corr = _lgamma_correction(q) - _lgamma_correction(p + q)
        return math.lgamma(p) + corr + p - p * math.log(p + q) + (q - 0.5) * math.log1p(-ratio)
    corr = _lgamma_correction(p) + _lgamma_correction(q) - _lgamma_correction(p + q)
    return -0.5 * math.log(q) + _LN_SQRT_2PI + corr + (p - 0.5) * math.log(ratio) + q * math.log1p(-ratio)


def _incomplete_beta(a: float, b: float, x: float, y: float, log_x: float, log_y: float) -> float:
    """I_x(a, b), given y = 1 - x and both logarithms as precisely as the caller knows them."""
    if x == 0.0:
        return 0.0
    if y == 0.0:
        return 1.0
    # x^a (1-x)^b / B(a, b), in logs: the terms overflow and underflow separately for large a or b.
    front = math.exp(a * log_x + b * log_y - _log_beta(a, b))
    # The fraction converges fast only below the mean; use I_x(a, b) = 1 - I_{1-x}(b, a) above it.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _incomplete_beta_fraction(a, b, x) / a
    return 1.0 - front * _incomplete_beta_fraction(b, a, y) / b


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if not (a > 0.0 and b > 0.0):
        raise ValueError(f"incomplete beta needs a > 0 and b > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"incomplete beta needs 0 <= x <= 1, got x={x}")
    y = 1.0 - x
    if x == 0.0 or y == 0.0:
        return 0.0 if x == 0.0 else 1.0
    return _incomplete_beta(a, b, x, y, math.log(x), math.log1p(-x))


def student_t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom (any real df > 0, as Welch's test gives).

    Accurate to 1e-11 or better (absolute) for df >= 1, and to a few parts in 1e10 relative in the upper tail
    up to df = 1e7, where p-values live. t = +inf gives 0, t = -inf gives 1; df = inf is the normal.
    """
    if math.isnan(t):
        raise ValueError("student_t_sf: t is NaN")
    if math.isnan(df) or df <= 0.0:
        raise ValueError(f"student_t_sf needs df > 0, got {df}")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    if df > _EXPANSION_DF:
        normal_sf = 0.5 * math.erfc(t / math.sqrt(2.0))
        if math.isinf(df):
            return normal_sf
        if abs(t) > 40.0:  # the density has underflowed to 0, and t^3 could overflow
            return normal_sf
        # Fisher's expansion: F_df(t) = Phi(t) - phi(t) (t^3 + t) / (4 df) + O(1/df^2).
        density = math.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)
        return normal_sf + density * (t * t * t + t) / (4.0 * df)
    # P(|T| > |t|) = I_x(df/2, 1/2) with x = df / (df + t^2) = 1 / (1 + r), r = t^2 / df. x is near 1 for
    # small t, where 1 - x and log(x) lose digits if computed from x: take them from r directly.
    scaled = abs(t) / math.sqrt(df)
    if scaled < 1e150:
        r = scaled * scaled
        x, y = 1.0 / (1.0 + r), r / (1.0 + r)
        log_x = -math.log1p(r)
        log_y = (math.log(r) if r > 0.0 else -math.inf) + log_x
    else:  # r would overflow: x = 1 / r and y = 1 to double precision
        log_x = -2.0 * math.log(scaled)
        x, y, log_y = math.exp(log_x), 1.0, 0.0
    upper = 0.5 * _incomplete_beta(df / 2.0, 0.5, x, y, log_x, log_y)  # P(T > |t|)
    return upper if t >= 0 else 1.0 - upper


@dataclass(frozen=True)
class WelchResult:
    """Welch's unequal-variance t-test of b against a.

    `p_b_less` is the one-sided p-value for "mean(b) < mean(a)", `p_b_greater` for "mean(b) > mean(a)".
    """

    t: float  # (mean(b) - mean(a)) / standard error; +-inf when neither side varies but the means differ
    df: float  # Welch-Satterthwaite degrees of freedom
    p_b_less: float
    p_b_greater: float


def _mean_and_variance(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample variance (n - 1). Exactly 0.0 variance for equal values: a mean computed in floats
    can be an ulp off a constant sample, which would give a tiny variance and an infinite t."""
    mean = math.fsum(values) / len(values)
    if min(values) == max(values):
        return values[0], 0.0
    return mean, math.fsum((v - mean) * (v - mean) for v in values) / (len(values) - 1)


def welch(a: Sequence[float], b: Sequence[float]) -> WelchResult:
    """Welch's t-test of b against a, both one-sided p-values. Needs at least 2 finite values a side.

    When neither side varies, the standard error is 0 and the test degenerates: the difference of the
    means is then certain, so the p-value is 0.0 in its direction and 1.0 in the other; equal constant
    sides give 1.0 both ways (no evidence of a change in either direction), with t = 0.
    """
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"welch needs at least 2 values a side, got {len(a)} and {len(b)}")
    if not all(math.isfinite(v) for v in (*a, *b)):
        raise ValueError("welch needs finite values")
    mean_a, var_a = _mean_and_variance(a)
    mean_b, var_b = _mean_and_variance(b)
    n_a, n_b = len(a), len(b)
    diff = mean_b - mean_a
    se2_a, se2_b = var_a / n_a, var_b / n_b
    se2 = se2_a + se2_b
    if se2 == 0.0:
        df = float(n_a + n_b - 2)
        if diff == 0.0:
            return WelchResult(t=0.0, df=df, p_b_less=1.0, p_b_greater=1.0)
        t = math.copysign(math.inf, diff)
        return WelchResult(
            t=t, df=df, p_b_less=0.0 if diff < 0 else 1.0, p_b_greater=0.0 if diff > 0 else 1.0
        )
    # Welch-Satterthwaite, written with the shares of the squared standard error so that tiny variances
    # (whose squares underflow to 0) cannot divide zero by zero.
    share_a, share_b = se2_a / se2, se2_b / se2
    df = 1.0 / (share_a * share_a / (n_a - 1) + share_b * share_b / (n_b - 1))
    t = diff / math.sqrt(se2)
    p_greater = student_t_sf(t, df)
    p_less = student_t_sf(-t, df)
    return WelchResult(t=t, df=df, p_b_less=p_less, p_b_greater=p_greater)


@functools.lru_cache(maxsize=4096)  # a bisection of 100 survival functions; the A/B's looks ask the same few
def t_quantile(upper_tail: float, df: float) -> float:
    """t with P(T > t) = upper_tail for Student's t with `df` degrees of freedom (0 < upper_tail < 0.5)."""
    low, high = 0.0, 1.0
    while student_t_sf(high, df) > upper_tail:
        high *= 2.0
    for _ in range(100):  # bisection: the survival function falls as t grows
        mid = 0.5 * (low + high)
        low, high = (mid, high) if student_t_sf(mid, df) > upper_tail else (low, mid)
    return 0.5 * (low + high)


def chi2_quantile(lower_tail: float, df: float) -> float:
    """x with P(X < x) = lower_tail for the chi-square distribution with `df` degrees of freedom, by the
    Wilson-Hilferty cube-root normal approximation. At the 20% level the A/B's plan uses, within 1% of
    the exact quantile from 2 degrees of freedom on and 14% low at 1 (so a plan from 2 blocks errs on the
    safe side); farther in the tail it is worse at few degrees of freedom (23% low at 5%, 2 df)."""
    if not 0.0 < lower_tail < 1.0 or df <= 0:
        raise ValueError(f"need 0 < lower_tail < 1 and df > 0, got {lower_tail}, {df}")
    z = statistics.NormalDist().inv_cdf(lower_tail)
    c = 2.0 / (9.0 * df)
    return df * max(0.0, 1.0 - c + z * math.sqrt(c)) ** 3


def geometric_gain(
    baseline: Sequence[float], candidate: Sequence[float], confidence: float
) -> tuple[float, float | None, float | None] | None:
    """(gain, low, high) of candidate over baseline as fractions (0.05 = +5%): the ratio of geometric means
    - 1, the figure the compare rule's Welch test on logs tests, with that test's two-sided interval at
    `confidence` (Welch-Satterthwaite degrees of freedom). The interval always holds the gain; it is None
    with fewer than 2 values a side. None without positive values on both sides."""
    if not baseline or not candidate or min(*baseline, *candidate) <= 0:
        return None
    logs_a, logs_b = [math.log(v) for v in baseline], [math.log(v) for v in candidate]
    mean_a, mean_b = statistics.fmean(logs_a), statistics.fmean(logs_b)
    diff = mean_b - mean_a
    if len(logs_a) < 2 or len(logs_b) < 2:
        return _expm1(diff), None, None
    se2_a, se2_b = statistics.variance(logs_a) / len(logs_a), statistics.variance(logs_b) / len(logs_b)
    se2 = se2_a + se2_b
    if se2 == 0.0:
        return _expm1(diff), _expm1(diff), _expm1(diff)  # neither side varies
    # Welch-Satterthwaite, from the shares of the squared standard error (tiny variances square to 0).
    share_a, share_b = se2_a / se2, se2_b / se2
    df = 1.0 / (share_a * share_a / (len(logs_a) - 1) + share_b * share_b / (len(logs_b) - 1))
    half = t_quantile((1.0 - confidence) / 2.0, df) * math.sqrt(se2)
    return _expm1(diff), _expm1(diff - half), _expm1(diff + half)


def _expm1(x: float) -> float:
    """expm1 that gives inf instead of raising: a log ratio beyond 709 comes only from absurd inputs."""
    return math.inf if x > 709.0 else math.expm1(x)


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Sample standard deviation / mean of positive-mean values; 0.0 for one value (nothing varies)."""
    if not values:
        raise ValueError("coefficient_of_variation needs at least one value")
    if not all(math.isfinite(v) for v in values):
        raise ValueError("coefficient_of_variation needs finite values")
    if len(values) == 1 or min(values) == max(values):
        return 0.0
    # The CV does not depend on the scale: divide by the largest magnitude first, so values near the
    # float maximum cannot overflow the sum or the squares.
    scale = max(abs(v) for v in values)
    scaled = [v / scale for v in values]
    mean, variance = _mean_and_variance(scaled)
    if mean <= 0.0:
        raise ValueError(f"coefficient_of_variation needs a positive mean, got {mean * scale}")
    return math.sqrt(variance) / mean


def median(values: Sequence[float]) -> float:
    """Median of non-empty values. The midpoint of an even count is lo + (hi - lo) / 2, so that two values
    near the float maximum cannot overflow."""
    s = sorted(values)
    k = len(s) // 2
    if len(s) % 2:
        return s[k]
    lo, hi = s[k - 1], s[k]
    return lo + (hi - lo) / 2.0


def bootstrap_ratio_of_medians(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of median(candidate) / median(baseline).

    Each side is resampled with replacement, independently (the runs are not paired). The generator is
    `random.Random(seed)`, so the same input gives the same interval: a CI log must be reproducible.
    With few runs a side the interval is coarse (it can only take ratios of observed values) and tends to
    be too narrow; the verdict rests on the t-test, the interval is there to read.
    """
    if not baseline or not candidate:
        raise ValueError(
            f"bootstrap needs at least one value a side, got {len(baseline)} and {len(candidate)}"
        )
    if not all(math.isfinite(v) for v in (*baseline, *candidate)):
        raise ValueError("bootstrap needs finite values")
    if min(baseline) <= 0.0:
        raise ValueError("bootstrap needs positive baseline values (the ratio's denominator)")
    if resamples < 1:
        raise ValueError(f"bootstrap needs resamples >= 1, got {resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"bootstrap needs 0 < confidence < 1, got {confidence}")
    rng = random.Random(seed)
    n_b, n_c = len(baseline), len(candidate)
    ratios = sorted(
        median(rng.choices(candidate, k=n_c)) / median(rng.choices(baseline, k=n_b)) for _ in range(resamples)
    )
    tail = (1.0 - confidence) / 2.0
    return _percentile(ratios, tail), _percentile(ratios, 1.0 - tail)


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile, interpolating between closest ranks as numpy's default and `tuneup._stats.quantile`
    do, but without touching a rank that is not needed: a ratio that overflowed to inf (a side near the
    float maximum, the other near zero) must not turn the interpolation into inf - inf = NaN."""
    position = q * (len(sorted_values) - 1)
    lo = int(position)
    fraction = position - lo
    low = sorted_values[lo]
    if fraction == 0.0 or lo + 1 >= len(sorted_values) or sorted_values[lo + 1] == low:
        return low
    return low + (sorted_values[lo + 1] - low) * fraction
