"""Where one metric's CI history changed: steps (change points) and slow drifts, each with its size.

The series is taken in logs, so that a step is a ratio and the noise of a metric measured at 1-2% CV is
about the same size whatever its unit.

0. Outliers. A record far from the median of the records around it (a Hampel filter: more than
   `OUTLIER_SDS` noise SDs from the median of `OUTLIER_WINDOW`) is left out, and named: one CI job on a
   busy runner must not cost a segment of its own (see OUTLIER_SDS for what it did). A change needs
   `MIN_SEGMENT_RECORDS` records after it, so a slow last record is an outlier until more follow.
1. Segments. Binary segmentation (ruptures' `Binseg`) with a piecewise-linear cost: each segment is a
   line in the record index (a level and a slope), so a slow drift is one sloping segment rather than a
   staircase of small steps (a piecewise-constant cost, the one of E-Divisive means and of PELT with an L2
   cost, put one or two boundaries into a 5% drift over 50 records in 5 of 5 synthetic histories). The
   penalty is BIC's for the three parameters a segment adds (level, slope, where it starts):
   3·ln(n)·σ², σ the noise, estimated robustly from the median absolute difference of consecutive values
   (a step or a drift moves few of those). Binary segmentation, not PELT: PELT's exact search took 6 s on
   2,000 records in ruptures' Python, binary segmentation 0.2 s, and on 20 synthetic histories (200
   records, 1.5% noise) both found the two 5% steps within 2 records of where they were injected.
2. Where each step is. The linear cost lets a segment's slope take up part of a step (at 2% noise some
   steps came out 3-6 records off), so each boundary is placed again by the one change of level in the
   `STEP_WINDOW` records each side of it (ruptures' exact `Dynp`, L2 cost), within its two segments.
3. How large. Over those records, each side its own line: the jump is the right line's value at the
   boundary over the left line's, with its t-interval and two-sided p-value (a Chow test at a known break):
   one figure, bounded and tested by one fit. Lines, not means: a drift through a boundary, or one that
   starts there, moves the means of 20 records a side by 1-2% (at 1% noise 5 of 20 histories had such a
   2% "step" inside their drift) and the lines not at all; the price is an interval twice as wide. The
   boundary was chosen where the data changed most, so the p-value is smaller than an honest one:
   `STEP_P` (5%) is a threshold, not a rate of false alarms. A boundary whose step is below `min_effect`,
   or whose p-value is not below `STEP_P`, is no change point: a change of slope, where a drift starts.
4. Drift. Over the stretch since each change point (or, where the segmentation saw a change of slope in
   it, from there, the latest first: a drift that starts late is measured where it is), at least
   `MIN_DRIFT_RECORDS` long: a Mann-Kendall trend test (the one the projection of a training curve uses:
   tuneup/analyze/projection.py) and a Theil-Sen slope with its interval (scipy). A drift is reported where
   |z| >= `DRIFT_Z` and the slope moves the metric by at least `min_effect` over the stretch; both are
   rank-based, so a few outliers (a CI job on a busy runner) move them by little. Where the drift starts
   inside a stretch and no change of slope was seen there, the slope is the stretch's, diluted by the
   flat records before the drift (at 1.5-2% noise, -0.07% per record for a drift of -0.1%).

numpy, scipy and ruptures come with the `ci` extra (`pip install tuneup[ci]`); they are imported when a
series is analysed, so that `tuneup --help` stays fast.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

from tuneup._stats import mann_kendall_z

# A segment shorter than this cannot tell a line from noise (and a step of one or two odd records is an
# outlier, not a change).
MIN_SEGMENT_RECORDS = 5
# BIC: each segment adds a level, a slope and its start.
PARAMETERS_PER_SEGMENT = 3
# Fewer records than this in a series: no change point can be told from noise.
MIN_RECORDS = 2 * MIN_SEGMENT_RECORDS
# A step is placed and measured on this many records each side of it at most (fewer where a segment is
# shorter): enough for each side's line to put a 5% step's 95% interval at about +-2.5% at 2% noise, near
# enough that a history's older stretches do not weigh on it.
STEP_WINDOW = 20
# A step is reported where its p-value is below this. The boundary was put where the data changed most,
# which makes any p-value there smaller than it should be; but a line each side makes the test weak (see
# _step), and at 1%, both 5% steps were found in 15 of 20 histories at 2% noise, against 19 at 5%. The price
# of 5%: now and then a drift is reported with a small step inside it (a 2.2% step at p = 0.049, in one
# drift of 0.1% a record at 1.5% noise), which fails a CI job no less rightly than the drift does.
STEP_P = 0.05
# A side of a step has at least this many records, for its line.
MIN_STEP_SIDE = 3
# A drift needs this many records in its segment: the Mann-Kendall test reaches DRIFT_Z only from 8 on.
MIN_DRIFT_RECORDS = 10
# A drift is a claim a team acts on (bisect a month of commits): the two-sided 0.2% level of the trend test,
# so that a flat segment is called flat (the projection uses the same level to call a curve "getting worse").
DRIFT_Z = 3.09
# A record more than OUTLIER_SDS noise SDs from the median of the OUTLIER_WINDOW records around it is left
# out. Each one left in cost a penalty's worth of fit: in 20 flat histories with 3% of their records 15-40%
# slow (a CI job on a busy runner), binary segmentation cut a 5-record segment around nearly every one, and
# all 20 histories reported false steps. 5 SDs: a normal record is that far from its neighbours' median
# about once in a million (the median of 11 is itself noisy: the difference's SD is 1.07 of the noise's);
# a 5% step at 1.5% noise is 3.3 SDs from the level before it, and a run of up to 5 slow jobs in a row is
# still outvoted in the window of 11. A step is never an outlier: the window's median moves with it.
OUTLIER_WINDOW = 11
OUTLIER_SDS = 5.0
# The median absolute deviation of a normal sample is this share of its standard deviation.
_MAD_TO_SD = 1.4826


@dataclass(frozen=True)
class ChangePoint:
    """A step in the series: `index` is the first record after it (an index into the series given);
    records_before/records_after: the records, outliers not counted, of the segments either side.
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
    record-to-record noise it was judged against (a share, 0.015 = 1.5%). Every index is into the series
    given, outliers included."""

    records: int
    change_points: tuple[ChangePoint, ...]
    drifts: tuple[Drift, ...]
    boundaries: tuple[int, ...]
    noise_cv: float
    outliers: tuple[int, ...] = ()  # records left out as outliers (see _outliers), indices into the series


def _noise_sd(logs: Sequence[float]) -> float:
    """The noise's standard deviation, from consecutive differences (their SD is sqrt(2) times it), by the
    median absolute deviation: a step moves one difference, a drift shifts them all by a little."""
    import numpy as np

    differences = np.diff(np.asarray(logs))
    mad = float(np.median(np.abs(differences - np.median(differences))))
    return _MAD_TO_SD * mad / math.sqrt(2.0)


def _outliers(logs: Sequence[float], noise_sd: float) -> list[int]:
    """The records far from their neighbours' median (a Hampel filter): one CI job on a busy runner, say."""
    import numpy as np
    from scipy.ndimage import median_filter

    y = np.asarray(logs, dtype=float)
    # The ends are mirrored without repeating the last record ('mirror', not 'nearest', which made a slow
    # last record six of the window's eleven, its own median, and a false step).
    local = median_filter(y, size=OUTLIER_WINDOW, mode="mirror")
    return [int(i) for i in np.flatnonzero(np.abs(y - local) > OUTLIER_SDS * max(noise_sd, 1e-12))]


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


def _located(logs: Sequence[float], start: int, boundary: int, end: int) -> int:
    """Where near `boundary` the level steps: the one change of mean (ruptures' exact `Dynp`, L2 cost) in the
    `STEP_WINDOW` records each side, within the two segments. The linear cost lets a segment's slope take up
    part of a step, which moved some of the steps it found by 3-6 records at 2% noise; a level's change is
    located better by levels."""
    import numpy as np
    import ruptures

    low, high = max(start, boundary - STEP_WINDOW), min(end, boundary + STEP_WINDOW)
    window = np.asarray(logs[low:high], dtype=float).reshape(-1, 1)
    if len(window) < 2 * MIN_STEP_SIDE:
        return boundary
    split = ruptures.Dynp(model="l2", min_size=MIN_STEP_SIDE, jump=1).fit(window).predict(n_bkps=1)[0]
    return low + int(split)


def _step(
    logs: Sequence[float], start: int, boundary: int, end: int, confidence: float
) -> tuple[float, float, float, float]:
    """(ratio, low, high, p) of the step at `boundary`: the `STEP_WINDOW` records each side (within the two
    segments), each side its own line; the jump is the right line's value at the boundary minus the left
    line's, with its t-interval and two-sided p-value (a Chow test at a known break)."""
    import numpy as np
    from scipy import stats

    low, high = max(start, boundary - STEP_WINDOW), min(end, boundary + STEP_WINDOW)
    y = np.asarray(logs[low:high], dtype=float)
    t = np.arange(low, high, dtype=float) - boundary + 0.5  # both lines are read half-way between the sides
    right = (t > 0).astype(float)
    # Left line a + b·t, right line (a + c) + (b + d)·t: c is the jump.
    design = np.column_stack([np.ones_like(t), t, right, right * t])
    coefficients, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
    residuals = y - design @ coefficients
    dof = len(y) - int(rank)
    jump = float(coefficients[2])
    variance = float(residuals @ residuals) / dof if dof > 0 else 0.0
    se = math.sqrt(max(float(np.linalg.pinv(design.T @ design)[2, 2]) * variance, 0.0))
    if se == 0.0:
        ratio = math.exp(jump)
        return ratio, ratio, ratio, 0.0 if jump != 0.0 else 1.0
    half = float(stats.t.ppf(0.5 + confidence / 2.0, dof)) * se
    p = float(2.0 * stats.t.sf(abs(jump) / se, dof))
    return math.exp(jump), math.exp(jump - half), math.exp(jump + half), p


def _drift(logs: Sequence[float], start: int, end: int, min_effect: float, confidence: float) -> Drift | None:
    from scipy import stats

    segment = list(logs[start:end])
    if len(segment) < MIN_DRIFT_RECORDS:
        return None
    z = mann_kendall_z(segment)
    if abs(z) < DRIFT_Z:
        return None
    slope, _, low, high = stats.theilslopes(segment, alpha=confidence)
    total = math.exp(slope * (len(segment) - 1))
    if abs(total - 1.0) < min_effect:
        return None
    return Drift(
        start_index=start,
        end_index=end - 1,
        start_commit="",
        end_commit="",
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
    if len(logs) < MIN_RECORDS:
        return SeriesChanges(len(logs), (), (), (), 0.0)
    noise_sd = _noise_sd(logs)
    outliers = set(_outliers(logs, noise_sd))
    kept = [i for i in range(len(logs)) if i not in outliers]
    found = _changes([logs[i] for i in kept], noise_sd, min_effect, confidence)
    back = kept.__getitem__  # an index among the records kept -> the index into the series given

    change_points = tuple(
        replace(c, index=back(c.index), commit=commits[back(c.index)]) for c in found.change_points
    )
    drifts = tuple(
        replace(
            d,
            start_index=back(d.start_index),
            end_index=back(d.end_index),
            start_commit=commits[back(d.start_index)],
            end_commit=commits[back(d.end_index)],
        )
        for d in found.drifts
    )
    boundaries = tuple(back(k) for k in found.boundaries)
    return SeriesChanges(
        len(logs), change_points, drifts, boundaries, math.expm1(noise_sd), tuple(sorted(outliers))
    )


def _changes(logs: Sequence[float], noise_sd: float, min_effect: float, confidence: float) -> SeriesChanges:
    """find_changes on the records kept; commits are filled in by the caller."""
    n = len(logs)
    if n < MIN_RECORDS:
        return SeriesChanges(n, (), (), (), 0.0)
    starts = _segment_starts(logs, noise_sd)
    edges = [0, *starts, n]
    change_points = []
    slope_changes = []  # boundaries that are no step: where a drift starts or stops, say
    for i, found in enumerate(starts, start=1):
        boundary = _located(logs, edges[i - 1], found, edges[i + 1])
        ratio, low, high, p = _step(logs, edges[i - 1], boundary, edges[i + 1], confidence)
        if abs(ratio - 1.0) < min_effect or p >= STEP_P:
            slope_changes.append(found)
            continue
        change_points.append(
            ChangePoint(
                index=boundary,
                commit="",
                ratio=ratio,
                ratio_low=low,
                ratio_high=high,
                p_value=p,
                records_before=boundary - edges[i - 1],
                records_after=edges[i + 1] - boundary,
            )
        )
    drifts = []
    for a, b in pairwise([0, *(c.index for c in change_points), n]):
        # The stretch since a change point, or its end from a change of slope in it (the latest first): a
        # drift that starts late in a stretch is measured where it is, not diluted by the flat records
        # before it; one that the segmentation cut in two (binary segmentation is greedy) is still found whole.
        inner = [k for k in reversed(slope_changes) if a < k and b - k >= MIN_DRIFT_RECORDS]
        for start in [*inner, a]:
            drift = _drift(logs, start, b, min_effect, confidence)
            if drift is not None:
                drifts.append(drift)
                break
    return SeriesChanges(n, tuple(change_points), tuple(drifts), tuple(starts), math.expm1(noise_sd))
