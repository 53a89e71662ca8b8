"""When a metric will reach a target, projected from a curve fitted to its recent history.

One question: given the values a metric has recorded so far (a validation loss falling, an accuracy
rising) and a target it has not reached yet, at which step will it reach it, with an interval, or why no
projection can be given. Pure: the standard library only (tuneup/analyze never imports numpy or torch).

The rule, in order (the first that applies decides the status):

1. Recent history. The fit uses the last half of the recorded values (at least `MIN_POINTS`): the early
   part of a training curve (warm-up, the first fast fall) follows no law that holds later on, and a fit
   that includes it extrapolates with a confidence it has not earned (on a known power law with a fast
   early transient added, the longest window a Chow test could not tell from one curve, mostly the last
   90%, put the true step inside a 90% interval for 21 of 50 curves; the last half, for 40). A NaN or an
   inf among those values is "diverging"; one before them is not looked at (a run that recovered from a
   spike is fitted on what came after). Steps that are not positive cannot sit on a power law in steps
   and are left out. Fewer than `MIN_POINTS` values left, or fewer than three distinct steps, is
   "too_few_points". Above `MAX_FIT_POINTS` values, the window is averaged in that many consecutive bins
   (every value keeps its weight; a 10,000-value history takes about 0.1 s).
2. Trend: plateau, moving away. A Mann-Kendall trend test over the last third of the history (at least
   `MIN_POINTS` values): a rank test of whether later values are lower than earlier ones, with no
   assumption on the shape of the curve or on the noise, which a single spike moves by little. Only a
   fall significant at the one-sided 5% level (z <= -`TREND_Z`) lets the projection go on. A rise
   significant at 0.1% (z >= `WORSE_Z`) is "moving_away". Anything in between is "plateau": the recent
   values show no fall that can be told from their noise, and a plateaued curve is never projected as if
   it were still falling, whatever it did before.
3. Fit. v(s) = a + b·s^-c with b > 0, c > 0 (for a metric that rises, the same law mirrored: v = a - b·s^-c),
   by variable projection: for each c on a log-spaced grid over [`C_MIN`, `C_MAX`], a and b by linear
   least squares; the best c refined by a parabola through its neighbours (in log c). A fitted b <= 0
   (no fall at all) is "plateau".
4. Bootstrap. `BOOTSTRAP_RESAMPLES` refits (fixed seed, so a report is reproducible) to the fitted curve
   plus its residuals drawn with replacement (scaled by sqrt(n/(n-3)) for the three fitted parameters),
   each giving the step at which its curve reaches the target, or never (its asymptote a short of the
   target). The projected step is their median: where more than half never reach the target, the status
   is "beyond_asymptote" (the curve levels off short of it). The median rather than the one fit to the
   recorded values: where the target lies near the asymptote, that fit says "never" or "soon" on the
   strength of noise, and the median says what most curves the data allow do.
5. Horizon. A median step further out than `MAX_EXTRAPOLATION` times the last recorded step is "plateau":
   a curve fitted to the last half of the steps says nothing about ten times as many, and a curve that
   falls that slowly towards the target is flat for the purpose of reaching it.
6. Interval. The central `confidence` share of the refits' steps. When more than (1-confidence)/2 of the
   refits never reach the target, the interval is open above (step_high None): reachable, with no upper
   bound to give. The step and both bounds are at least the next step at which a value could be recorded
   (the last step plus the median spacing): the caller only asks while the recorded values have not reached
   the target, so the earliest it can be seen reached is there.

Measured on curves from a known law v = a + b·s^-c with 0.3% multiplicative noise, recorded every 50 steps
to step 5,000 and a target the noiseless law reaches at 1.5-3 times that (tests/test_projection.py): over
200 curves, 187 were projected and the true step was inside the 80% interval for 159 (85% of those
projected), inside the 90% one for 173 (93%); the rest were "beyond_asymptote" (a target close to where
the curve levels off). About a third of the 80% intervals are open above. Fell-then-flat curves (400, noise
0.2-2%) were never projected to reach a target below their floor. A 10,000-value history takes about 0.1 s.

One form, not several: an exponential a + b·exp(-k·s) was not added. A power law fits the late part of
training curves at least as well (a loss keeps falling slowly long after an exponential has levelled off),
and a second form would need its own rule for choosing between them, and its own tests.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from operator import mul

from tuneup._stats import mann_kendall_z
from tuneup.target import Target

# Fewer values than this cannot tell a curve from noise: three parameters are fitted, and a trend test on
# five values can only just reach 5% significance (all five in order).
MIN_POINTS = 5
# The fit window: the last half of the history (rule 1).
FIT_SHARE = 0.5
# The trend test's tail: the last third of the history. Long enough to see a slow fall through noise of
# half a per cent (the last quarter called 3 of 50 still-falling curves of the known-law test a plateau),
# short enough that a curve flat for the last third of the run is called a plateau.
TAIL_SHARE = 1 / 3
# A fall significant at the one-sided 5% level of the Mann-Kendall statistic lets a projection go on.
TREND_Z = 1.645
# "Getting worse" is a claim a user acts on (stop the run, roll back): it needs the one-sided 0.1% level, so
# that a flat stretch of noise is called a plateau, not a rise (at 1%, 1 to 2 flat curves in 100 were
# called rising). It takes 8 values in the tail to reach it; a shorter rise reads as a plateau.
WORSE_Z = 3.09
# Values fitted at most; a longer window is averaged in this many consecutive bins. Enough to resolve the
# shape of the curve, few enough that the bootstrap's refits take a fraction of a second in pure Python.
MAX_FIT_POINTS = 200
# The exponent c is searched over [C_MIN, C_MAX]: below 0.05 the law is indistinguishable from a straight
# line in log(step) (and its asymptote from minus infinity); above 3 it has levelled off within a few
# steps, which any flat stretch also fits.
C_MIN = 0.05
C_MAX = 3.0
C_GRID_POINTS = 48
# A projection further out than this multiple of the last recorded step is not a projection (rule 5).
MAX_EXTRAPOLATION = 10.0
BOOTSTRAP_RESAMPLES = 200
BOOTSTRAP_SEED = 28

_C_GRID = tuple(C_MIN * (C_MAX / C_MIN) ** (i / (C_GRID_POINTS - 1)) for i in range(C_GRID_POINTS))
# exp() of more than this overflows a float: a step that far out is never.
_MAX_LOG = 700.0
# u^-c is capped at exp(_MAX_EXP), so that its square still fits in a float (only absurd inputs reach it:
# a first step 10^-43 times the last).
_MAX_EXP = 300.0


@dataclass(frozen=True, slots=True)
class Projection:
    """Where a metric's fitted curve reaches a target, or why no projection is given.

    status: "projected", "plateau", "diverging", "too_few_points", "moving_away" or "beyond_asymptote".
    step, step_low, step_high: the step at which the target is reached and its interval, only when
    projected; step_high None means the interval is open above (reachable, with no upper bound to give).
    form: the fitted law in words (empty where no curve was fitted); reason: one sentence on the status.
    points_used: the recorded values the fit (or, before a fit, the test that decided) was made on.
    asymptote: the value the fitted curve levels off at, where a curve was fitted.
    """

    status: str
    step: float | None
    step_low: float | None
    step_high: float | None
    form: str
    reason: str
    points_used: int
    asymptote: float | None = None


@dataclass(frozen=True, slots=True)
class _Fit:
    a: float
    b: float
    c: float
    sse: float


class _Design:
    """The window's steps, with u^-c (u = step / last step) for each c of the grid worked out once:
    every refit (the bootstrap's 200) then costs one dot product per grid point."""

    def __init__(self, steps: Sequence[float]) -> None:
        last = steps[-1]
        self.log_u = [math.log(s) - math.log(last) for s in steps]
        self.n = len(steps)
        self.columns: list[tuple[float, float, list[float]]] = []  # (mean x, Sxx, centred x) per grid c
        for c in _C_GRID:
            self.columns.append(self._column(c))

    def _column(self, c: float) -> tuple[float, float, list[float]]:
        x = [math.exp(min(-c * lu, _MAX_EXP)) for lu in self.log_u]
        mean_x = math.fsum(x) / self.n
        centred = [xi - mean_x for xi in x]
        return mean_x, math.fsum(xc * xc for xc in centred), centred

    def fit(self, y: Sequence[float]) -> _Fit | None:
        """The least-squares a + b·u^-c over the grid of c, refined; None where no c gives a fit."""
        mean_y = math.fsum(y) / self.n
        syy = math.fsum((yi - mean_y) * (yi - mean_y) for yi in y)
        sse: list[float] = []
        for _, sxx, centred in self.columns:
            if not 0.0 < sxx < math.inf:
                sse.append(math.inf)
                continue
            sxy = sum(map(mul, centred, y))
            sse.append(syy - sxy * sxy / sxx)
        best = min(range(len(sse)), key=sse.__getitem__)
        if not math.isfinite(sse[best]):
            return None
        candidates = [_C_GRID[best]]
        if 0 < best < len(sse) - 1:
            refined = _parabola_min(
                [math.log(_C_GRID[i]) for i in (best - 1, best, best + 1)], sse[best - 1 : best + 2]
            )
            if refined is not None:
                candidates.insert(0, math.exp(refined))
        for c in candidates:
            column = self.columns[best] if c == _C_GRID[best] else self._column(c)
            mean_x, sxx, centred = column
            if not 0.0 < sxx < math.inf:
                continue
            sxy = sum(map(mul, centred, y))
            b = sxy / sxx
            a = mean_y - b * mean_x
            fit_sse = max(0.0, syy - sxy * b)
            if math.isfinite(a) and math.isfinite(b) and fit_sse <= sse[best] * (1 + 1e-12) + 1e-300:
                return _Fit(a=a, b=b, c=c, sse=fit_sse)
        return None

    def fitted(self, fit: _Fit) -> list[float]:
        return [fit.a + fit.b * math.exp(min(-fit.c * lu, _MAX_EXP)) for lu in self.log_u]


def _parabola_min(x: Sequence[float], y: Sequence[float]) -> float | None:
    """The vertex of the parabola through three points, where it is a minimum between x[0] and x[2]."""
    (x0, x1, x2), (y0, y1, y2) = x, y
    denominator = (x0 - x1) * (x0 - x2) * (x1 - x2)
    if denominator == 0.0 or not all(math.isfinite(v) for v in y):
        return None
    curvature = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / denominator
    if curvature <= 0.0:
        return None
    slope = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / denominator
    vertex = -slope / (2 * curvature)
    return vertex if x0 <= vertex <= x2 else None


def _reach_step(fit: _Fit, target: float, last_step: float) -> float:
    """The step at which a + b·u^-c (u = step / last step) comes down to `target`; inf where it never does."""
    if not (fit.b > 0.0 and target > fit.a):
        return math.inf
    ratio = (target - fit.a) / fit.b
    if ratio <= 0.0:  # underflow: b so large that the curve takes for ever
        return math.inf
    log_u = -math.log(ratio) / fit.c
    if log_u > _MAX_LOG:
        return math.inf
    return last_step * math.exp(max(log_u, -_MAX_LOG))


def _binned(steps: Sequence[float], values: Sequence[float], bins: int) -> tuple[list[float], list[float]]:
    """Means of `bins` consecutive, near-equal groups of (step, value)."""
    n = len(steps)
    out_steps: list[float] = []
    out_values: list[float] = []
    for k in range(bins):
        lo, hi = k * n // bins, (k + 1) * n // bins
        # Each term divided first: a sum of huge steps or values must not overflow (fsum would raise).
        out_steps.append(sum(s / (hi - lo) for s in steps[lo:hi]))
        out_values.append(sum(v / (hi - lo) for v in values[lo:hi]))
    return out_steps, out_values


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of a sorted sequence (inf stays inf: never reached)."""
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


def _fmt_step(step: float) -> str:
    return f"{step:,.0f}"


def _no_projection(
    status: str, reason: str, points: int, form: str = "", asymptote: float | None = None
) -> Projection:
    return Projection(status, None, None, None, form, reason, points, asymptote)


@dataclass(frozen=True, slots=True)
class _Window:
    """A stretch of the history, mirrored and scaled, averaged into bins where long."""

    steps: list[float]
    y: list[float]  # lower is better, at most 1 in size
    points: int  # recorded values in it, before binning
    text: str


def _window(pairs: Sequence[tuple[float, float]], sign: float, scale: float) -> _Window:
    points = len(pairs)
    steps = [s for s, _ in pairs]
    y = [sign * v / scale for _, v in pairs]
    text = f"the last {points} values (steps {_fmt_step(steps[0])}-{_fmt_step(steps[-1])})"
    if points > MAX_FIT_POINTS:
        steps, y = _binned(steps, y, MAX_FIT_POINTS)
        text += f", averaged in {MAX_FIT_POINTS} bins"
    return _Window(steps, y, points, text)


def _last(pairs: Sequence[tuple[float, float]], share: float) -> list[tuple[float, float]]:
    return list(pairs[-max(MIN_POINTS, math.ceil(share * len(pairs))) :])


def project_to_target(
    steps: Sequence[float], values: Sequence[float], target: Target, *, confidence: float = 0.8
) -> Projection:
    """The step at which `values` (one metric, recorded at `steps`) will reach `target`, with an interval at
    `confidence`, or the reason none can be given (see the module's rules). Never raises on finite or
    non-finite numbers; raises ValueError on steps and values of different lengths or a confidence outside
    (0, 1)."""
    if len(steps) != len(values):
        raise ValueError(
            f"steps and values must pair up one to one: got {len(steps)} steps and {len(values)} values"
        )
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence is a share between 0 and 1 (such as 0.8), got {confidence!r}")
    metric = target.metric
    pairs = sorted(
        ((float(s), float(v)) for s, v in zip(steps, values, strict=True) if math.isfinite(float(s))),
        key=lambda p: p[0],
    )
    recent = _last(pairs, FIT_SHARE)
    for s, v in recent:
        if not math.isfinite(v):
            return _no_projection(
                "diverging",
                f"{metric} was {v} at step {_fmt_step(s)}, within its recent history: the run is diverging",
                len(recent),
            )
    # Steps that are not positive cannot sit on a power law in steps.
    usable = [(s, v) for s, v in recent if s > 0.0]
    distinct = len({s for s, _ in usable})
    if len(usable) < MIN_POINTS or distinct < 3:
        return _no_projection(
            "too_few_points",
            f"{metric} has {len(usable)} usable recent values (at {distinct} distinct positive steps); "
            f"a curve needs at least {MIN_POINTS} values at 3 or more steps",
            len(usable),
        )

    # Mirrored, a rising metric falls; scaled to at most 1 in size, huge or tiny values fit as well as any.
    sign = 1.0 if target.lower_is_better else -1.0
    scale = max(abs(v) for _, v in usable) or 1.0
    goal = sign * target.value / scale
    tail = _window([(s, v) for s, v in _last(pairs, TAIL_SHARE) if s > 0.0], sign, scale)
    z = mann_kendall_z(tail.y)
    if z >= WORSE_Z:
        return _no_projection(
            "moving_away",
            f"{metric} is getting worse over {tail.text} (Mann-Kendall z = {sign * z:+.1f}), away from {target}",
            tail.points,
        )
    if z > -TREND_Z:
        return _no_projection(
            "plateau",
            f"{metric} shows no significant improvement over {tail.text} "
            f"(Mann-Kendall z = {sign * z:+.1f}, {sign * -TREND_Z:+.3g} needed): it has plateaued",
            tail.points,
        )

    window = _window(usable, sign, scale)
    design = _Design(window.steps)
    fit = design.fit(window.y)
    if fit is None or fit.b <= 0.0:
        return _no_projection(
            "plateau",
            f"a curve fitted to {window.text} of {metric} does not fall: it has plateaued",
            window.points,
        )
    last_step = window.steps[-1]
    asymptote = sign * fit.a * scale
    form = (
        f"a power law in steps, v = a {'+' if sign > 0 else '-'} b·s^-c "
        f"(a = {asymptote:.4g}, c = {fit.c:.2f}), fitted to {window.text}"
    )

    fitted = design.fitted(fit)
    residuals = [yi - fi for yi, fi in zip(window.y, fitted, strict=True)]
    mean_residual = math.fsum(residuals) / len(residuals)
    inflate = math.sqrt(len(residuals) / (len(residuals) - 3))
    residuals = [(r - mean_residual) * inflate for r in residuals]
    rng = random.Random(BOOTSTRAP_SEED)
    reach: list[float] = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        resample = [f + r for f, r in zip(fitted, rng.choices(residuals, k=len(residuals)), strict=True)]
        refit = design.fit(resample)
        reach.append(math.inf if refit is None else _reach_step(refit, goal, last_step))
    reach.sort()
    never = sum(1 for r in reach if not r < math.inf)
    step = _quantile(reach, 0.5)
    if not step < math.inf:
        return _no_projection(
            "beyond_asymptote",
            f"the fitted curve levels off at {metric} = {asymptote:.4g}, short of the target {target} "
            f"({never} of {BOOTSTRAP_RESAMPLES} bootstrap refits never reach it)",
            window.points,
            form,
            asymptote,
        )
    recorded = [s for s, _ in usable]
    spacing = statistics.median(b - a for a, b in pairwise(recorded) if b > a)
    # nextafter: past 2**53 a spacing of one step is lost in rounding, and the earliest must still be later.
    earliest = max(recorded[-1] + spacing, math.nextafter(recorded[-1], math.inf))
    if not (step <= MAX_EXTRAPOLATION * recorded[-1] and earliest < math.inf):
        return _no_projection(
            "plateau",
            f"{metric} falls too slowly to project: the fitted curve reaches {target} only past "
            f"{MAX_EXTRAPOLATION:g} times the last recorded step, {_fmt_step(recorded[-1])}",
            window.points,
            form,
            asymptote,
        )
    share_out = (1.0 - confidence) / 2.0
    low = _quantile(reach, share_out)
    high = _quantile(reach, 1.0 - share_out)
    step = max(step, earliest)
    low = max(min(low, step), earliest)
    step_high = max(high, step) if high < math.inf else None
    bounds = (
        f"{_fmt_step(low)}-{_fmt_step(step_high)}" if step_high is not None else f"{_fmt_step(low)} or later"
    )
    note = ""
    if fit.a >= goal:
        note = f"; the one fit to the recorded values levels off at {asymptote:.4g}, but most refits reach it"
    return Projection(
        "projected",
        step,
        low,
        step_high,
        form,
        f"the fitted curve reaches {target} at step {_fmt_step(step)} ({confidence:.0%} interval {bounds}: "
        f"the median and spread of {BOOTSTRAP_RESAMPLES} bootstrap refits{note})",
        window.points,
        asymptote,
    )
