"""What the sections about ranks, GPUs and hosts share to read as well at 1,024 ranks as at 2.

Up to `PER_ROW_LIMIT` ranks (GPUs, hosts) a table keeps one row each; beyond, it becomes the spread of
each figure (`spread_table`: min, p5, median, p95, max) and the few entries at the extremes. A figure
with one line per host or GPU draws, beyond `MAX_LINES`, the median and the p5–p95 band instead
(`band_over_time`, `draw_band`). Not a section: the ranks, hardware and communication sections use it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from tuneup._stats import quantile
from tuneup.analyze.model import RunAnalysis
from tuneup.report.blocks import Table, table
from tuneup.report.format import MISSING, is_number, plural

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# Up to this many ranks (GPUs, hosts) a table has one row each, as it always had. Beyond, a row per
# rank is read by nobody and buries the page: the spread and the extremes stand in for it.
PER_ROW_LIMIT = 32
# Beyond this many hosts (or GPUs) a figure stops drawing one line each: a hundred lines on top of one
# another show only their envelope, so the median and the p5–p95 band are drawn instead.
MAX_LINES = 16
# How many entries each end of an extremes table names.
EXTREMES = 3
# Time bins for a band across hosts: about one per 4 px of a report-wide plot.
BAND_BINS = 200

T = TypeVar("T")

STATISTICS = (("min", 0.0), ("p5", 0.05), ("median", 0.5), ("p95", 0.95), ("max", 1.0))


def finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if is_number(v)]


def spread(values: Iterable[Any]) -> list[float] | None:
    """min, p5, median, p95, max of the finite values (the analysis' quantile definition); None if none."""
    ordered = sorted(finite(values))
    if not ordered:
        return None
    return [quantile(ordered, q) for _, q in STATISTICS]


def spread_table(
    title: str, rows: Sequence[tuple[str, Sequence[Any], Callable[[object], str]]], **kw: Any
) -> Table:
    """One row per figure (label, the values across ranks, how to write one), a column per statistic."""
    body = []
    for label, values, write in rows:
        stats = spread(values)
        cells = [write(v) for v in stats] if stats else [MISSING] * len(STATISTICS)
        body.append((label, *cells))
    header = ("", *(name for name, _ in STATISTICS))
    return table(title, header, body, range(1, 1 + len(STATISTICS)), **kw)


def across(n: int, word: str) -> str:
    return f"across {plural(n, word)}"


def lowest(items: Sequence[Any], key: Callable[[Any], Any], k: int = EXTREMES) -> list[Any]:
    """The k items with the smallest finite key, smallest first; items without one are left out. None
    when every item has the same key: then no item is at an extreme, and naming three says nothing."""
    known = [i for i in items if is_number(key(i))]
    if len({key(i) for i in known}) < 2:
        return []
    return sorted(known, key=key)[:k]


def highest(items: Sequence[Any], key: Callable[[Any], Any], k: int = EXTREMES) -> list[Any]:
    known = [i for i in items if is_number(key(i))]
    if len({key(i) for i in known}) < 2:
        return []
    return sorted(known, key=key, reverse=True)[:k]


def rank_to_watch(analysis: RunAnalysis) -> tuple[int, str] | None:
    """The rank that holds the others back, and what to call it: the straggler, or else the rank with
    the slowest median step. Each section at scale shows its row, whatever else it summarises."""
    if analysis.ranks.straggler is not None:
        return analysis.ranks.straggler.rank, "straggler"
    if analysis.ranks.slowest:
        return analysis.ranks.slowest[0].rank, "slowest step"
    return None


def pick_extremes(
    analysis: RunAnalysis,
    items: Sequence[T],
    rank_of: Callable[[T], int],
    criteria: Sequence[tuple[str, Callable[[T], Any], bool]],
) -> list[tuple[str, T]]:
    """The entries at each extreme, labelled, per (label, key, highest first?) criterion, then the rank that
    holds the others back (`rank_to_watch`): whatever else a table summarises, that rank's row is in it."""
    picked = [(label, i) for label, key, high in criteria for i in (highest if high else lowest)(items, key)]
    watch = rank_to_watch(analysis)
    by_rank = {rank_of(i): i for i in items}
    if watch is not None and watch[0] in by_rank:
        picked.append((watch[1], by_rank[watch[0]]))
    return picked


def signed_percent(value: float, reference: float | None) -> str:
    """How far `value` lies from `reference`, in percent with a sign: "+1.2%", "-0.4%"."""
    if reference is None or not is_number(reference) or reference == 0:
        return MISSING
    diff = (value / reference - 1) * 100
    return f"{diff:+.1f}%" if abs(diff) >= 0.05 else "0.0%"


# ---------------------------------------------------------------------------------------------------
# Bands across many series.


def band_over_time(
    series: Sequence[tuple[Sequence[float], Sequence[float]]], bins: int = BAND_BINS
) -> tuple[Any, Any, Any, Any, int] | None:
    """The median and p5–p95 across series sampled at their own times: each series is averaged into
    common time bins first, so hosts sampled a few ms apart still line up. Returns (bin centres, p5,
    median, p95, series counted), or None with fewer than two bins holding data."""
    import numpy as np

    kept = [(np.asarray(t, float), np.asarray(v, float)) for t, v in series if len(t) and len(t) == len(v)]
    kept = [(t[m], v[m]) for t, v in kept if (m := np.isfinite(t) & np.isfinite(v)).any()]
    if not kept:
        return None
    lo = min(float(t.min()) for t, _ in kept)
    hi = max(float(t.max()) for t, _ in kept)
    if not hi > lo:
        return None
    # No more bins than a series has samples, or every other bin would be empty.
    n_bins = max(2, min(bins, max(len(t) for t, _ in kept)))
    edges = np.linspace(lo, hi, n_bins + 1)
    grid = np.full((len(kept), n_bins), np.nan)
    t_sum = np.zeros(n_bins)
    t_count = np.zeros(n_bins)
    for row, (t, v) in enumerate(kept):
        idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, n_bins - 1)
        sums = np.bincount(idx, weights=v, minlength=n_bins)
        counts = np.bincount(idx, minlength=n_bins)
        t_sum += np.bincount(idx, weights=t, minlength=n_bins)
        t_count += counts
        grid[row] = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    has = t_count > 0
    if has.sum() < 2:
        return None
    # Each bin drawn at the mean time of its samples, not its centre: the band spans what was sampled.
    centres = t_sum[has] / t_count[has]
    p5, p50, p95 = np.nanpercentile(grid[:, has], [5, 50, 95], axis=0)
    return centres, p5, p50, p95, len(kept)


def draw_band(
    ax: Axes, band: tuple[Any, Any, Any, Any, int], color: Any, what: str, ls: str = "-"
) -> list[Any]:
    """The median line and the p5–p95 band of `band_over_time`; the legend handles."""
    from matplotlib.patches import Patch

    t, p5, p50, p95, _ = band
    ax.fill_between(t, p5, p95, color=color, alpha=0.22, lw=0)
    (line,) = ax.plot(t, p50, color=color, lw=1.3, ls=ls, label=f"{what}: median")
    return [line, Patch(facecolor=color, alpha=0.22, label=f"{what}: p5 to p95")]


def robust_limits(values: Any) -> tuple[float, float] | None:
    """Colour limits at the 1st and 99th percentiles: one slow step must not wash out the rest."""
    import numpy as np

    data = np.asarray(values, float)
    data = data[np.isfinite(data)]
    if not data.size:
        return None
    lo, hi = (float(x) for x in np.percentile(data, [1, 99]))
    if not hi > lo:
        pad = max(abs(lo) * 0.01, 1e-6)
        lo, hi = lo - pad, hi + pad
    return lo, hi


def every(n: int, most: int) -> int:
    """The stride that shows at most `most` of n labels."""
    return max(1, math.ceil(n / max(1, most)))
