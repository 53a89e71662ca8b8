"""Where one metric's CI history changed: steps (change points) and slow drifts, each with its size.

The series is taken in logs, so that a step is a ratio and the noise of a metric measured at 1-2% CV is
about the same size whatever its unit.

1. Segments. Binary segmentation (ruptures' `Binseg`) with a piecewise-linear cost: each segment is a
   line in the record index (a level and a slope), so a slow drift is one sloping segment rather than a
   staircase of small steps (a piecewise-constant cost, the one of E-Divisive means and of PELT with an L2
   cost, cut a 5% drift over 50 records into two or three 2-3% "steps" in 5 of 5 synthetic histories).
   The penalty is BIC's for the three parameters a segment adds (level, slope, where it starts):
   3·ln(n)·σ², σ the noise, estimated robustly from the median absolute difference of consecutive values
   (a step or a drift moves few of those). Binary segmentation, not PELT: PELT's exact search took 6 s on
   2,000 records in ruptures' Python, binary segmentation 0.2 s, and both put the steps of the synthetic
   histories at the same records (tests/test_regressions.py).
2. The step at each boundary: the ratio of the geometric means of the `STEP_WINDOW` records after it and
   of those before it (each side within its own segment), with the Welch t-interval and two-sided p-value
   of `tuneup compare` on their logs (tuneup/compare/stats.py): one figure, tested and bounded by one test.
   Near the boundary, not over the whole segments nor by the segments' fitted lines: a segment that is
   flat and then drifts (its kink too small for the penalty) is no line, and a line's end made a +3%
   "step" out of the start of a drift in one of three synthetic histories. The boundary was chosen where
   the data changed most, so the p-value is smaller than an honest one: it ranks, the BIC penalty
   decides. A boundary whose step is below `min_effect` (a change of slope, where a drift starts) stays a
   boundary, and its segments are tested for drift, but it is not reported as a change point.
3. Drift. Over each segment of at least `MIN_DRIFT_RECORDS`, a Mann-Kendall trend test (the one the
   projection of a training curve uses: tuneup/analyze/projection.py) and a Theil-Sen slope with its
   interval (scipy): a drift is reported where |z| >= `DRIFT_Z` and the slope moves the metric by at least
   `min_effect` over the segment. Both are rank-based: a few outliers (a CI job on a busy runner) move
   them by little.

numpy, scipy and ruptures come with the `ci` extra (`pip install tuneup[ci]`); they are imported when a
series is analysed, so that `tuneup --help` stays fast.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from tuneup.analyze.projection import _mann_kendall_z

# A segment shorter than this cannot tell a line from noise (and a step of one or two odd records is an
# outlier, not a change).
MIN_SEGMENT_RECORDS = 5
# BIC: each segment adds a level, a slope and its start.
PARAMETERS_PER_SEGMENT = 3
# Fewer records than this in a series: no change point can be told from noise.
MIN_RECORDS = 2 * MIN_SEGMENT_RECORDS
# A step is measured on this many records each side of it at most (fewer where a segment is shorter): near
# enough that a drift within a segment adds little (0.1% a record moves the medians by about 1.5%), far
# enough that a 5% step stands well out of 1-2% noise (the medians' interval is about +-1.5% at 2% CV).
STEP_WINDOW = 15
# A drift needs this many records in its segment: the Mann-Kendall test reaches DRIFT_Z only from 8 on.
MIN_DRIFT_RECORDS = 10
# A drift is a claim a team acts on (bisect a month of commits): the two-sided 0.2% level of the trend test,
# so that a flat segment is called flat (the projection uses the same level to call a curve "getting worse").
DRIFT_Z = 3.09
# The median absolute deviation of a normal sample is this share of its standard deviation.
_MAD_TO_SD = 1.4826


@dataclass(frozen=True)
class ChangePoint:
    """A step in the series: `index` is the first record after it (an index into the series given).
    ratio: the level after the step over the level before it (0.95: 5% lower), with its interval at the
    analysis' confidence; p_value: two-sided, of "no step here" (see the module's note on its bias)."""

    index: int
    commit: str
    ratio: float
    ratio_low: float
    ratio_high: float
    p_value: float
    records_before: int
    records_after: int


@dataclass(frozen=True)
class Drift:
    """A slow, steady change over the records start_index..end_index (inclusive), no step of which stands out.
    percent_per_record: the Theil-Sen slope as % of the metric per record, with its interval; total_ratio:
    the metric at the segment's end over its start, by that slope; z: the Mann-Kendall statistic (its sign is
    the slope's)."""

    start_index: int
    end_index: int
    start_commit: str
    end_commit: str
    percent_per_record: float
    percent_low: float
    percent_high: float
    total_ratio: float
    z: float


@dataclass(frozen=True)
class SeriesChanges:
    """What one series did: its change points and drifts, oldest first; `boundaries` are every segment start
    the segmentation found (change points, and changes of slope too small to report), `noise_cv` the
    record-to-record noise it was judged against (a share, 0.015 = 1.5%)."""

    records: int
    change_points: tuple[ChangePoint, ...]
    drifts: tuple[Drift, ...]
    boundaries: tuple[int, ...]
    noise_cv: float


def _noise_sd(logs: Sequence[float]) -> float:
    """The noise's standard deviation, from consecutive differences (their SD is sqrt(2) times it), by the
    median absolute deviation: a step moves one difference, a drift shifts them all by a little."""
    import numpy as np

    differences = np.diff(np.asarray(logs))
    mad = float(np.median(np.abs(differences - np.median(differences))))
    return _MAD_TO_SD * mad / math.sqrt(2.0)


def _segment_starts(logs: Sequence[float], noise_sd: float) -> list[int]:
    import numpy as np
    import ruptures

    n = len(logs)
    if noise_sd <= 0.0:  # a series that does not vary: any other value is a step; a tiny floor keeps BIC sane
        noise_sd = 1e-9
    position = np.arange(n, dtype=float) / n  # scaled, so the slope's column is of the level's size
    signal = np.column_stack([np.asarray(logs, dtype=float), np.ones(n), position])
    penalty = PARAMETERS_PER_SEGMENT * math.log(n) * noise_sd * noise_sd
    algorithm = ruptures.Binseg(model="linear", min_size=MIN_SEGMENT_RECORDS, jump=1).fit(signal)
    return [int(k) for k in algorithm.predict(pen=penalty)[:-1]]  # the last "boundary" is the end


def _step(
    values: Sequence[float], start: int, boundary: int, end: int, confidence: float
) -> tuple[float, float, float, float]:
    """(ratio, low, high, p) of the step at `boundary`: the last `STEP_WINDOW` values before it against the
    first after it, each side within its own segment."""
    from tuneup.compare.stats import geometric_gain, welch

    width = min(STEP_WINDOW, boundary - start, end - boundary)
    before, after = values[boundary - width : boundary], values[boundary : boundary + width]
    # Never None here: the values are positive, and a segment has MIN_SEGMENT_RECORDS (2 or more) of them.
    gain, low, high = geometric_gain(before, after, confidence) or (0.0, None, None)
    low, high = (gain if low is None else low), (gain if high is None else high)
    test = welch([math.log(v) for v in before], [math.log(v) for v in after])
    p = min(1.0, 2.0 * min(test.p_b_less, test.p_b_greater))
    return 1.0 + gain, 1.0 + low, 1.0 + high, p


def _drift(
    logs: Sequence[float], commits: Sequence[str], start: int, end: int, min_effect: float, confidence: float
) -> Drift | None:
    from scipy import stats

    segment = list(logs[start:end])
    if len(segment) < MIN_DRIFT_RECORDS:
        return None
    z = _mann_kendall_z(segment)
    if abs(z) < DRIFT_Z:
        return None
    slope, _, low, high = stats.theilslopes(segment, alpha=confidence)
    total = math.exp(slope * (len(segment) - 1))
    if abs(total - 1.0) < min_effect:
        return None
    return Drift(
        start_index=start,
        end_index=end - 1,
        start_commit=commits[start],
        end_commit=commits[end - 1],
        percent_per_record=100.0 * math.expm1(slope),
        percent_low=100.0 * math.expm1(low),
        percent_high=100.0 * math.expm1(high),
        total_ratio=total,
        z=z,
    )


def find_changes(
    values: Sequence[float], commits: Sequence[str], *, min_effect: float = 0.02, confidence: float = 0.95
) -> SeriesChanges:
    """The change points and drifts of one metric's series (oldest first, one commit per value; positive
    values). Steps and drifts smaller than `min_effect` (a share: 0.02 = 2%) are not reported; intervals are
    at `confidence`. ValueError for values that are not positive and finite, or mismatched lengths."""
    values = [float(v) for v in values]
    if len(values) != len(commits):
        raise ValueError(f"one commit per value: got {len(values)} values and {len(commits)} commits")
    if not all(math.isfinite(v) and v > 0.0 for v in values):
        raise ValueError("a series for change points has positive, finite values only")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence is a share between 0 and 1 (such as 0.95), got {confidence!r}")
    if min_effect < 0.0:
        raise ValueError(f"min_effect is a share of at least 0 (such as 0.02), got {min_effect!r}")
    logs = [math.log(v) for v in values]
    n = len(logs)
    if n < MIN_RECORDS:
        return SeriesChanges(n, (), (), (), 0.0)
    noise_sd = _noise_sd(logs)
    starts = _segment_starts(logs, noise_sd)
    edges = [0, *starts, n]
    change_points = []
    for i, boundary in enumerate(starts, start=1):
        ratio, low, high, p = _step(values, edges[i - 1], boundary, edges[i + 1], confidence)
        if abs(ratio - 1.0) < min_effect or p >= 1.0 - confidence:
            continue
        change_points.append(
            ChangePoint(
                index=boundary,
                commit=commits[boundary],
                ratio=ratio,
                ratio_low=low,
                ratio_high=high,
                p_value=p,
                records_before=boundary - edges[i - 1],
                records_after=edges[i + 1] - boundary,
            )
        )
    drifts = [
        d
        for a, b in pairwise(edges)
        if (d := _drift(logs, commits, a, b, min_effect, confidence)) is not None
    ]
    return SeriesChanges(n, tuple(change_points), tuple(drifts), tuple(starts), math.expm1(noise_sd))
