"""Quantiles, and what counts as a figure, in one definition for the record's window aggregates and the
report's figures (report.json rounds them at the edge: tuneup/analyze/model.py)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of non-empty, sorted values, interpolating linearly between closest ranks (numpy's
    default), so a p95 in a window aggregate and in a report mean the same thing."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float | None:
    """The mean of `values`, or None (not measured) when there are none."""
    return statistics.fmean(values) if values else None


def rate_per_s(count: float | None, wall_ms: float) -> float | None:
    """`count` per second over `wall_ms` of steps; None where the count is unknown or no time passed. The one
    definition of a rate: the report's throughput and the loggers' headline figures both take it from here
    (the recording side imports this module, not the analysis, whose typed model is slow to import)."""
    if count is None or wall_ms <= 0:
        return None
    return count / (wall_ms / 1000.0)


def number(value: object) -> float | None:
    """A JSON value as a figure: a finite int or float (not a bool) as a float, anything else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return finite(float(value))


def finite(value: float | None) -> float | None:
    """`value` as a figure: None (not measured) for None, and for NaN or infinity (a rate over a duration
    too small to divide by). The analysis keeps full precision; report.json rounds at the edge."""
    return None if value is None or not math.isfinite(value) else float(value)


def weighted_quantile(values: Sequence[float], weights: Sequence[int], q: float) -> float:
    """The q-quantile of `values`, each counted `weights` times (as plain `quantile` where all weigh 1)."""
    if all(w == 1 for w in weights):
        return quantile(sorted(values), q)
    pairs = sorted(zip(values, weights, strict=True))
    total = sum(weights)
    seen = 0
    for value, weight in pairs:
        seen += weight
        if seen >= q * total:
            return value
    return pairs[-1][0]


def mann_kendall_z(y: Sequence[float]) -> float:
    """The Mann-Kendall trend statistic as a normal score (negative: falling), with the tie correction: a
    trend test that assumes no shape and no distribution (the projection's gate, the CI history's drift)."""
    n = len(y)
    s = 0
    for i in range(n - 1):
        yi = y[i]
        for yj in y[i + 1 :]:
            s += (yj > yi) - (yj < yi)
    ties: dict[float, int] = {}
    for v in y:
        ties[v] = ties.get(v, 0) + 1
    variance = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values())) / 18
    if variance <= 0.0 or s == 0:
        return 0.0
    return (s - 1) / math.sqrt(variance) if s > 0 else (s + 1) / math.sqrt(variance)
