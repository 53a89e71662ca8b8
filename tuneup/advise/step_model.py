"""How long is a training step at another batch size, accumulation, world size, gradient compression or
link? A step-time model fitted from one or more recorded runs of the same workload.

The model (Pollux/AdaptDL's, with the terms tuneup measures):

    micro-batch compute  C(b) = α + β·b            forward and backward, per rank
    data wait            D(b) = δ₀ + δ·b           per micro-batch, the loader as it ran
    the loop's own time  L(b) = λ₀ + λ·b           per micro-batch: other, sync, and what the phases miss
    collectives          S    = Σ_buckets T(kind, p, bytes·f; α_link, β_link)   the link's alpha-beta fit
    last micro-batch     T_opt = F + (B^γ + S^γ)^(1/γ) + I·S/S₀
    step                 T = s·D(b) + (s−1)·C(b) + T_opt + optimizer + s·L(b)

D and L are lines in the batch size like C (least squares over the runs' batch sizes), so that the model
gives back the mean step of every run it was fitted to; with one batch size seen, each is either fixed or
proportional to the batch (the point: the wait proportional, the loop fixed) and the interval spans both.

F and B are the forward and backward shares of C(b); s the micro-batches per step; p the world size; f the
bytes a compressing hook sends per byte of gradient. S is held to what the run measured (the link fit only
says how it changes with bytes, world size or link). γ ≥ 1 says how well the collectives overlap backward
(γ = 1: not at all; large: fully), fitted from the exposed wait the run measured against S. I is
*interference*: compute made slower by concurrent collectives (on CPU they share cores and memory
bandwidth; on GPUs NCCL kernels share SMs). It is measured where runs at one rank and at several ranks are
both given (the same batch size's compute, with and without collectives). From multi-rank runs alone it is
not, and the model keeps two readings of the run: "overlapped" (the collectives cost backward nothing; γ
fitted) and "serialized" (every millisecond they overlapped was taken from backward; γ = 1 on a compute line
without it). Both reproduce the run; they differ on what changes, such as accumulation (whose first
micro-batches run without collectives). The point takes the serialized reading for a CPU rank without a
spare core and the overlapped one on GPUs; the interval spans both.

Local SGD with period H (`Setting.local_sgd_period`) sends no gradient: S = 0 in T_opt and no interference,
and the step gains A/H, A = T(all_reduce, p, Σ bytes) the parameters' average (one flat buffer, as many bytes
as the gradients, held to the measured time as S is) run after the optimizer with nothing to hide behind.
That is the mean step, which throughput follows; for H > 2 the median step is a local one, without A.
A is taken as a run that averaged measured it; unmeasured, between the link fit and 8x it (one flat buffer
of every parameter costs more than DDP's buckets suggest). The strategy's exact warm-up steps are spread
over the base run's length: its mean step over a run as long as this one.

With one batch size seen, α and β cannot both be known: AdaptDL fixes α at half the compute, and the
interval spans α from 0 (compute proportional to the batch) to all of it (compute fixed), and beyond twice
the batch seen, compute growing faster than the batch. The model's own error widens both ends as a factor
(the low end divided by 1 + err), so that no interval reaches a step of zero or less.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from tuneup.advise.model import ModelTerms, Range, Setting
from tuneup.advise.observe import Observation
from tuneup.analyze.interconnect import model_time_s
from tuneup.analyze.model import CollectiveFit

# The model's own error where nothing better is known: how far Pollux-style models land on held-out
# settings (Echo 8%, Habitat 12% across GPU types; 3-5% for a refit on the same hardware).
MODEL_ERROR = 0.05
# Two-sided ~90% interval from a standard error.
Z90 = 1.645
GAMMA_MAX = 20.0  # beyond this the overlap is complete for any practical purpose
# Beyond twice the one batch size seen, compute can grow faster than the batch (caches and memory bandwidth
# overrun at large batches): the prior's upper end grows by (b / 2b₀)^this on top of proportional. Measured:
# batch 256 -> 1024 of a CPU MLP gained +6% and +20% where compute proportional to the batch gave +11% at least.
SUPERLINEAR_EXPONENT = 0.25
# Local SGD's parameter average where no run measured it. The link fit comes from DDP's buckets; one flat
# buffer of every parameter on gloo adds CPU copies and overlaps nothing: measured 350 ms against 55 ms by the
# fit held to the run's collectives (2 gloo ranks, a large embedding). Unmeasured, its time spans the fit to
# this many times it, the point their geometric mean.
UNMEASURED_AVERAGE_FACTOR = 8.0
# The shortest step the interval may reach (ms): a defect upstream must not turn into a negative rate.
MIN_STEP_MS = 1e-6


class ModelError(ValueError):
    """The runs cannot make one model (different workloads): names them."""


@dataclass(frozen=True, slots=True)
class StepPrediction:
    mean_ms: Range
    median_ms: Range
    terms_ms: dict[str, float]


@dataclass(frozen=True, slots=True)
class _Line:
    intercept_ms: float
    slope_ms: float
    # For the interval: (intercept, slope) pairs at the ends of what the data allow, or a standard error.
    extremes: tuple[tuple[float, float], ...] = ()
    se_ms: float | None = None
    n: int = 0
    mean_b: float = 0.0
    sxx: float = 0.0
    prior: str | None = None
    seen_b: float | None = None  # the one batch size seen, where the line is a prior
    # The least-squares slope before it was held at zero or above: at or below zero, the runs' compute did
    # not grow with their batch (their noise is larger than the difference), and the fit says little.
    raw_slope_ms: float | None = None

    @property
    def flat(self) -> bool:
        return self.raw_slope_ms is not None and self.raw_slope_ms <= 0

    def at(self, b: float) -> float:
        """The term at batch size `b`; a time, never below zero."""
        return max(0.0, self.intercept_ms + self.slope_ms * b)

    def spread(self, b: float) -> tuple[float, float]:
        """(low, high) of the term at `b` from the fit alone, never below zero."""
        value = self.at(b)
        if self.extremes:
            values = [max(0.0, a + s * b) for a, s in self.extremes]
            low, high = min(*values, value), max(*values, value)
            if self.seen_b and b > 2 * self.seen_b:
                high *= (b / (2 * self.seen_b)) ** SUPERLINEAR_EXPONENT
            return low, high
        if self.se_ms is not None and self.n > 2:
            half = Z90 * self.se_ms * math.sqrt(1 / self.n + (b - self.mean_b) ** 2 / max(self.sxx, 1e-12))
            return max(0.0, value - half), value + half
        return value, value


def _fit_line(points: Sequence[tuple[float, float]], noise_ms: Sequence[float] = ()) -> _Line:
    """C(b) from (batch size, compute ms) points; one distinct batch size -> AdaptDL's prior. `noise_ms`:
    how far each point may sit from its setting's true compute (its run's own noise); with two points, where
    no standard error exists, the interval spans the lines through every combination of their ends."""
    sizes = {b for b, _ in points}
    if len(sizes) == 1:
        b = points[0][0]
        c = statistics.fmean(v for _, v in points)
        return _Line(
            intercept_ms=c / 2,
            slope_ms=c / (2 * b),
            extremes=((0.0, c / b), (c, 0.0)),
            prior=(
                f"one batch size seen ({int(b)}): compute at batch size 0 fixed at half the measured compute "
                "(AdaptDL's prior); the interval spans compute proportional to the batch and compute fixed "
                "(and, beyond twice the batch, compute growing faster than it), the data wait and the loop's "
                "own time each fixed or proportional"
            ),
            seen_b=b,
        )
    n = len(points)
    mean_b, sxx = statistics.fmean(b for b, _ in points), _sxx(points)
    mean_c, raw_slope = _mean_and_slope(points, mean_b, sxx)
    slope = max(0.0, raw_slope)  # compute never falls as the batch grows
    intercept = max(0.0, mean_c - slope * mean_b)
    se = _standard_error(points, intercept, slope)
    extremes: tuple[tuple[float, float], ...] = ()
    if se is None and len(noise_ms) == n and any(noise_ms):
        ends = []
        for signs in itertools.product((-1.0, 1.0), repeat=n):
            moved = [
                (b, max(0.0, c + sign * e)) for (b, c), sign, e in zip(points, signs, noise_ms, strict=True)
            ]
            m, k = _mean_and_slope(moved, mean_b, sxx)
            k = max(0.0, k)
            ends.append((max(0.0, m - k * mean_b), k))
        extremes = tuple(ends)
    return _Line(
        intercept, slope, extremes=extremes, se_ms=se, n=n, mean_b=mean_b, sxx=sxx, raw_slope_ms=raw_slope
    )


def _fit_term(points: Sequence[tuple[float, float]], proportional: bool) -> _Line:
    """A per-micro-batch time other than compute (the data wait, the loop's own time) against batch size.
    Two or more batch sizes: the least-squares line through them, a slope of either sign (a loader's wait
    can shrink as the compute it hides behind grows), so that the model reproduces each run it was fitted
    to. One: `proportional` picks the point (the term grows with the batch, or stays fixed), and the
    interval spans both."""
    sizes = {b for b, _ in points}
    mean_v = statistics.fmean(v for _, v in points)
    if len(sizes) == 1:
        b = points[0][0]
        fixed, scaled = (mean_v, 0.0), (0.0, mean_v / b)
        a, k = scaled if proportional else fixed
        return _Line(a, k, extremes=(fixed, scaled))
    mean_b, sxx = statistics.fmean(b for b, _ in points), _sxx(points)
    _, slope = _mean_and_slope(points, mean_b, sxx)
    intercept = mean_v - slope * mean_b
    se = _standard_error(points, intercept, slope)
    return _Line(intercept, slope, se_ms=se, n=len(points), mean_b=mean_b, sxx=sxx)


def _sxx(points: Sequence[tuple[float, float]]) -> float:
    """The batch sizes' sum of squared deviations from their mean (least squares' denominator)."""
    mean_b = statistics.fmean(b for b, _ in points)
    return sum((b - mean_b) ** 2 for b, _ in points)


def _mean_and_slope(points: Sequence[tuple[float, float]], mean_b: float, sxx: float) -> tuple[float, float]:
    """The points' mean time and their least-squares slope against batch size (unclamped)."""
    mean_v = statistics.fmean(v for _, v in points)
    return mean_v, sum((b - mean_b) * (v - mean_v) for b, v in points) / sxx


def _standard_error(points: Sequence[tuple[float, float]], intercept: float, slope: float) -> float | None:
    """The residuals' standard error about a line (None with two points: no degree of freedom left)."""
    n = len(points)
    if n <= 2:
        return None
    return math.sqrt(sum((v - (intercept + slope * b)) ** 2 for b, v in points) / (n - 2))


def _solve_gamma(backward_ms: float, sync_ms: float, exposed_ms: float) -> float:
    """γ with (B^γ + S^γ)^(1/γ) = B + E: how well the collectives overlapped backward."""
    if sync_ms <= 0 or backward_ms <= 0:
        return GAMMA_MAX
    target = backward_ms + exposed_ms
    if target >= backward_ms + sync_ms:  # nothing overlapped
        return 1.0
    if target <= max(backward_ms, sync_ms) * (1 + 1e-9):
        return GAMMA_MAX

    lo, hi = 1.0, GAMMA_MAX  # the combined time falls as γ grows
    for _ in range(60):
        mid = (lo + hi) / 2
        if overlapped_ms(backward_ms, sync_ms, mid) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def overlapped_ms(backward_ms: float, sync_ms: float, gamma: float) -> float:
    if sync_ms <= 0:
        return backward_ms
    if backward_ms <= 0:
        return sync_ms
    top = max(backward_ms, sync_ms)
    return top * ((backward_ms / top) ** gamma + (sync_ms / top) ** gamma) ** (1 / gamma)


def sync_ms(
    fits: Sequence[CollectiveFit], bucket_bytes: Sequence[float], world_size: int, bytes_factor: float = 1.0
) -> float | None:
    """The collectives of one step, from the link's alpha-beta fit: the sum over buckets (DDP runs its
    buckets' all-reduces one after another on one stream)."""
    if world_size <= 1:
        return 0.0
    fit = next((f for f in fits if f.kind == "all_reduce"), None) or (fits[0] if fits else None)
    if fit is None or fit.alpha_us is None or fit.beta_ns_per_byte is None or not bucket_bytes:
        return None
    total_s = sum(
        model_time_s(fit.kind, world_size, b * bytes_factor, fit.alpha_us * 1e-6, fit.beta_ns_per_byte * 1e-9)
        for b in bucket_bytes
    )
    return total_s * 1000.0


@dataclass(frozen=True, slots=True)
class Overlap:
    """One reading of how the collectives shared the step with backward: the compute line it implies, γ
    (None: unknown, anywhere from none to complete), and interference per world size (ms per step at the
    base run's collectives)."""

    line: _Line
    gamma: float | None
    interference_ms: dict[int, float]
    name: str


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    base: Observation  # the run whose setting is "current"
    backward_share: float
    data_ms_per_sample: float  # at the base run's batch (what a loader change replaces: δ·b)
    optimizer_ms: float
    other_ms: float  # per micro-batch at the base run's batch: Lightning's per-batch collectives and the loop
    # Per micro-batch against batch size, fitted like compute (one batch size: fixed or proportional).
    data_line: _Line
    other_line: _Line
    fits: tuple[CollectiveFit, ...]
    bucket_bytes: tuple[float, ...]
    # The measured collective time per step over the link model's, at the base run: the model predicts
    # how the collectives change, the measurement says how long they took (1.0 where none was measured).
    sync_scale: float
    base_sync_ms: float | None  # the collectives per step at the base run, as measured (or modelled)
    # variants[0] is the point; the interval spans them all. Several where interference was not measured.
    variants: tuple[Overlap, ...]
    interference_known: bool  # measured against a one-rank run
    median_over_mean: float
    fit_error: float | None
    runs: int
    world_sizes: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    notes: list[str] = field(default_factory=list)
    # Local SGD's parameter average as measured (ms per average) by world size, where a run used it.
    averaging_ms: dict[int, float] = field(default_factory=dict)
    run_steps: int | None = None  # the base run's length, over which the strategy's warm-up is spread

    @property
    def line(self) -> _Line:
        return self.variants[0].line

    @property
    def gamma(self) -> float | None:
        return self.variants[0].gamma

    @property
    def gamma_known(self) -> bool:
        return self.variants[0].gamma is not None

    @property
    def interference_ms(self) -> dict[int, float]:
        return self.variants[0].interference_ms

    # -- prediction ----------------------------------------------------------------------------------

    def setting(self) -> Setting:
        return observed_setting(self.base)

    def predict(
        self,
        setting: Setting,
        compute_scale: Range | None = None,
        data_ms_per_sample: float | None = None,
        fits: Sequence[CollectiveFit] | None = None,
    ) -> StepPrediction:
        """The step at `setting`. `compute_scale` multiplies compute (another precision or GPU);
        `data_ms_per_sample` replaces the loader's wait; `fits` another link's alpha-beta.

        Held to physics: the step at a larger batch is never shorter than at a smaller one (compute, the
        wait and the loop never shrink as a batch grows). Anchored at the base run (the step the advice is
        for stays its own): a batch above the base's has its point at least the step's point at the base's
        batch and at every batch the runs measured between them, and its low end at least that less the
        model's own error; a batch below, at most those (×k the batch gains at most k − 1 in samples/s at
        the point, and ÷k loses at most 1 − 1/k). A fit's line between noisy runs can say otherwise."""
        raw = self._predict(setting, compute_scale, data_ms_per_sample, fits)
        mean, median = raw.mean_ms, raw.median_ms
        b, b0 = setting.batch_size, self.base.batch_size
        between = {x for x in (*self.batch_sizes, b0) if min(b, b0) <= x <= max(b, b0) and x != b}
        for x in sorted(between):
            ref = self._predict(
                dataclasses.replace(setting, batch_size=x), compute_scale, data_ms_per_sample, fits
            )
            bound = _at_least if x < b else _at_most
            # The bound holds the expected step (the point); the interval's ends keep the model's error
            # beyond it, as every interval does: a gain whose truth sits at the bound (a step that hardly
            # grows with the batch) measures on both sides of it (the accuracy benchmark's doublings: +100%
            # bound, +100.2%, +105.6%, +111.1% measured).
            err = self.base_error
            mean = bound(mean, ref.mean_ms.value, err)
            median = bound(median, ref.median_ms.value, err)
        if (mean, median) == (raw.mean_ms, raw.median_ms):
            return raw
        return StepPrediction(mean, median, {**raw.terms_ms, "physics_bound": 1.0})

    @property
    def base_error(self) -> float:
        """The model's own relative error at any setting: its fit's on the runs, at least MODEL_ERROR."""
        return MODEL_ERROR if self.fit_error is None else max(MODEL_ERROR, self.fit_error)

    def _predict(
        self,
        setting: Setting,
        compute_scale: Range | None = None,
        data_ms_per_sample: float | None = None,
        fits: Sequence[CollectiveFit] | None = None,
    ) -> StepPrediction:
        """The model's step at `setting`, before `predict` holds it to physics."""
        b, s, p = setting.batch_size, setting.accumulate_grad_batches, setting.world_size
        scale = compute_scale or Range(1.0, 1.0, 1.0)
        if data_ms_per_sample is None:
            data_mid = s * self.data_line.at(b)
            data_ends = tuple(s * d for d in self.data_line.spread(b))
        else:
            data_mid = s * data_ms_per_sample * b
            data_ends = (data_mid, data_mid)
        other_mid = s * self.other_line.at(b)
        other_ends = tuple(s * o for o in self.other_line.spread(b))
        link = fits if fits is not None else self.fits
        # Another link's fit is taken as it is; the run's own is held to what the run measured.
        link_scale = self.sync_scale if fits is None else 1.0
        period = setting.local_sgd_period
        # A sharded run's gathers and scatters: per micro-batch, as measured. Known only at its own world size
        # and link, with nothing else changed about them; elsewhere they are held, with a wide error.
        sharded = self.base.sharding is not None and p > 1
        if sharded:
            sync = (self.base_sync_ms or 0.0) / self.base.accumulation
            sync_unknown = (
                self.base_sync_ms is None
                or p != self.base.world_size
                or setting.comm_bytes_factor != 1.0
                or fits is not None
                or period is not None
            )
        else:
            modelled = sync_ms(link, self.bucket_bytes, p, setting.comm_bytes_factor)
            sync_unknown = modelled is None
            sync = (modelled or 0.0) * link_scale
        averaging = (0.0, 0.0, 0.0)  # (point, low, high) per step
        averaging_measured = False
        if period is not None:
            # Local SGD: backward sends nothing, and every H-th step waits for one all-reduce of the
            # parameters (the strategy averages them as one flat buffer) after the optimizer, fully exposed.
            measured = self.averaging_ms.get(p) if fits is None else None
            if measured is not None:
                averaging_measured = True
                averaging = (measured / period,) * 3
            else:
                flat = sync_ms(link, (sum(self.bucket_bytes),), p) if self.bucket_bytes else None
                by_fit = (flat or 0.0) * link_scale / period
                f = UNMEASURED_AVERAGE_FACTOR
                averaging = (by_fit * math.sqrt(f), by_fit, by_fit * f)
            sync = 0.0

        def step(
            v: Overlap, c: float, k: float, gamma: float | None, data: float, other: float, average: float
        ) -> tuple[float, dict[str, float]]:
            c *= k
            g = gamma if gamma is not None else GAMMA_MAX
            if sharded:
                # Every micro-batch gathers and scatters beside its whole forward and backward.
                comm, first = s * sync, 0.0
                # Complete overlap is exact here: the reading whose compute holds the unmeasured waits must
                # give the run back (γ = 20's hair is up to 3.5% where the gathers take as long as compute).
                last = s * (max(c, sync) if g >= GAMMA_MAX else overlapped_ms(c, sync, g))
                exposed = last - s * c
            else:
                # DDP: only the last micro-batch all-reduces, its buckets beside its backward.
                fwd, bwd = c * (1 - self.backward_share), c * self.backward_share
                comm, first = sync, (s - 1) * c
                last = fwd + overlapped_ms(bwd, sync, g)
                exposed = last - fwd - bwd
            # The averaging runs alone, between steps: it slows no compute.
            interference = self._interference(p, comm, v.interference_ms) if period is None else 0.0
            total = data + first + last + interference + self.optimizer_ms + other + average
            terms = {
                "data": data,
                "compute": s * c,
                "exposed_comm": exposed,
                "interference": interference,
                "optimizer": self.optimizer_ms,
                "other": other,
                "sync_model": comm,
            }
            if period is not None:
                terms["averaging"] = average
            return total, terms

        point = self.variants[0]
        gamma = point.gamma
        if gamma is None and p > 1 and not self.base.on_gpu and (self.base.cpu_count or 0) / p < 2:
            # A CPU rank without a spare core: gloo's reduction and copies run on the cores that compute,
            # so the collectives add to backward instead of hiding behind it.
            gamma = 1.0
        mid, terms = step(point, point.line.at(b), scale.value, gamma, data_mid, other_mid, averaging[0])
        # The interval: every reading of the overlap; the fit's compute, data and loop ranges (the step
        # grows with each, so their low ends go together, and their high ends); the scale's ends; the
        # average's; and, where γ is unknown, overlap anywhere from none to complete.
        ends = [
            step(v, c, k, g, d, o, a)[0]
            for v in self.variants
            for c, d, o, a in zip(v.line.spread(b), data_ends, other_ends, averaging[1:], strict=True)
            for k in (scale.low, scale.high)
            for g in ((v.gamma,) if v.gamma is not None or p <= 1 else (1.0, GAMMA_MAX))
        ]
        lo, hi = min(*ends, mid), max(*ends, mid)
        err = self.base_error
        if not self.interference_known and p != self.base.world_size and p > 1:
            err = max(err, 0.10)
        if sync_unknown and p > 1:
            err = max(err, 0.25)
            if sharded:
                terms["sharded_comm_held"] = 1.0
        # The model's own error is a factor either way: dividing keeps the low end a time (a fit error of
        # 100% or more once made `lo·(1 − err)` negative, and samples/s with it).
        mean = _step_range(mid, lo, hi, err)
        typical = mean
        if period is not None and period > 2:
            # Most steps do not average: the median step is a local one.
            typical = _step_range(mid - averaging[0], lo - averaging[1], hi - averaging[2], err)
        if period is not None and not averaging_measured:
            terms["averaging_unmeasured"] = 1.0
        # A run already on this strategy keeps its own warm-up; one that would start it, the strategy's default.
        own = period is not None and period == self.base.local_sgd_period
        warmup = _local_sgd_warmup(period, self.run_steps, self.base.strategy_start_step if own else None)
        if warmup > 0:
            # The strategy's exact warm-up steps are part of the run: its mean step over the run's length.
            exact = self._predict(
                dataclasses.replace(setting, local_sgd_period=None), compute_scale, data_ms_per_sample, fits
            ).mean_ms
            mean = Range(
                warmup * exact.value + (1 - warmup) * mean.value,
                warmup * exact.low + (1 - warmup) * mean.low,
                warmup * exact.high + (1 - warmup) * mean.high,
            )
            terms["warmup_share"] = warmup
        return StepPrediction(mean, typical.scaled(self.median_over_mean), terms)

    def _interference(self, world_size: int, sync: float, table: dict[int, float]) -> float:
        if world_size <= 1 or not table:
            return 0.0
        base = table.get(world_size)
        if base is None:
            known = [v for k, v in table.items() if k > 1]
            base = statistics.fmean(known) if known else 0.0
        if self.base_sync_ms and self.base_sync_ms > 0:
            return base * sync / self.base_sync_ms
        return base

    def terms(self) -> ModelTerms:
        return ModelTerms(
            runs=self.runs,
            batch_sizes=list(self.batch_sizes),
            world_sizes=list(self.world_sizes),
            compute_intercept_ms=self.line.intercept_ms,
            compute_ms_per_sample=self.line.slope_ms,
            compute_prior=self.line.prior,
            backward_share=self.backward_share,
            data_ms_per_sample=self.data_ms_per_sample,
            optimizer_ms=self.optimizer_ms,
            other_ms=self.other_ms,
            sync_ms=self.base_sync_ms,
            exposed_comm_ms=self.base.exposed_ms,
            interference_ms=self.interference_ms.get(self.base.world_size) if self.interference_ms else None,
            overlap_gamma=self.gamma,
            fit_error=self.fit_error,
            median_over_mean=self.median_over_mean,
            notes=list(self.notes),
            interference_measured=self.interference_known,
            sharding=self.base.sharding,
        )


def _at_least(r: Range, floor: float, err: float = 0.0) -> Range:
    """`r` with its point at `floor` or above, and its low end at `floor` less the relative error `err`."""
    value = max(r.value, floor)
    return Range(value, min(max(r.low, floor / (1 + err)), value), max(r.high, value))


def _at_most(r: Range, ceiling: float, err: float = 0.0) -> Range:
    """`r` with its point at `ceiling` or below, and its high end at `ceiling` plus the relative error `err`."""
    value = min(r.value, ceiling)
    return Range(value, min(r.low, value), max(min(r.high, ceiling * (1 + err)), value))


def _step_range(mid: float, low: float, high: float, err: float) -> Range:
    """A step time and its interval: the ends widened by the model's relative error as a factor, and never
    at or below zero."""
    mid = max(mid, MIN_STEP_MS)
    return Range(mid, max(min(low, mid) / (1 + err), MIN_STEP_MS), max(high, mid) * (1 + err))


def _local_sgd_warmup(period: int | None, run_steps: int | None, start_step: int | None = None) -> float:
    """The share of a run of `run_steps` that TuneupDDPStrategy(local_sgd_period=period) spends in its exact
    warm-up: `start_step` steps where the run set it, else its defaults' (tuneup/sync/config.py); 0 where the
    run's length is unknown."""
    if period is None or not run_steps:
        return 0.0
    if start_step is None:
        from tuneup.sync.config import SyncConfig

        start_step = SyncConfig(local_sgd_period=period).start_step
    return min(1.0, start_step / run_steps)


# -- fitting -----------------------------------------------------------------------------------------


def _same_workload(observations: Sequence[Observation]) -> None:
    params = {o.parameters for o in observations if o.parameters is not None}
    if len(params) > 1:
        shown = ", ".join(f"{o.run_id}: {o.parameters:,} parameters" for o in observations if o.parameters)
        raise ModelError(
            f"these runs are not the same workload ({shown}); fit one model per workload: pass runs of one "
            "model to tuneup advise"
        )
    shardings = {o.sharding or "DDP" for o in observations if o.world_size > 1}
    if len(shardings) > 1:
        raise ModelError(
            f"these runs differ in how they spread the model over ranks ({', '.join(sorted(shardings))}); pass "
            "runs of one strategy: a change between DDP and sharding is not predicted from them"
        )
    precisions = {o.precision for o in observations}
    if len(precisions) > 1:
        raise ModelError(
            f"these runs differ in precision ({', '.join(sorted(str(p) for p in precisions))}); pass runs of one "
            "precision (the advice predicts a change of precision from them)"
        )


def fit_step_model(observations: Sequence[Observation], base_index: int = 0) -> StepTimeModel:
    """Fit the model to the runs (of one workload); `observations[base_index]` is the current setting."""
    if not observations:
        raise ModelError("no runs to fit the step-time model to")
    _same_workload(observations)
    base = observations[base_index]
    notes: list[str] = []
    by_world: dict[int, list[Observation]] = defaultdict(list)
    for o in observations:
        by_world[o.world_size].append(o)
    # The reference group: the world size with the most batch sizes seen (a tie goes to the fewest ranks,
    # whose compute carries no collectives).
    ref_world = max(by_world, key=lambda w: (len({o.batch_size for o in by_world[w]}), -w))
    ref = by_world[ref_world]
    line = _fit_line(
        [(o.batch_size, o.compute_per_micro_batch_ms) for o in ref],
        # Each run's own noise, on its whole step per micro-batch: compute is where the fit puts it.
        [o.step_noise * o.step_mean_ms / o.accumulation for o in ref],
    )
    if line.prior:
        notes.append(line.prior)
    compute_total = sum(o.forward_ms + o.backward_ms - o.exposed_in_backward_ms for o in observations)
    backward_total = sum(o.backward_ms - o.exposed_in_backward_ms for o in observations)
    backward_share = backward_total / compute_total if compute_total > 0 else 2 / 3
    # The data wait and the loop's own time (with Lightning's collectives between batches, sync) come with
    # every micro-batch: accumulation multiplies them. Each is a line in the batch size like compute, so
    # that the model gives back every run it was fitted to (averaged across runs, the terms of a run at 32
    # and one at 64 were each off by half their difference: "+19.5%" where the batch-64 run measured +31.9%).
    data_line = _fit_term(
        [(o.batch_size, o.data_ms / o.accumulation) for o in observations], proportional=True
    )
    # The optimizer's time does not depend on the batch: one mean, and each run's difference from it goes
    # with its loop's time, so that it too comes back as measured.
    optimizer = statistics.fmean(o.optimizer_ms for o in observations)
    # So does compute the line does not pass through (a fit held at zero slope where the runs' compute fell
    # as their batch grew): the model gives back each run's step, not the line's (a two-run fit once said
    # "now: 50.1 samples/s" of a run that measured 42.4).
    ref_ids = {id(o) for o in ref}

    def off_line(o: Observation) -> float:
        return o.compute_per_micro_batch_ms - line.at(o.batch_size) if id(o) in ref_ids else 0.0

    other_line = _fit_term(
        [
            (o.batch_size, (_loop_ms(o) + o.optimizer_ms - optimizer) / o.accumulation + off_line(o))
            for o in observations
        ],
        proportional=False,
    )
    data_per_sample = data_line.at(base.batch_size) / base.batch_size
    other = other_line.at(base.batch_size)
    averaging = {
        o.world_size: o.averaging_ms for o in observations if o.averaging_ms is not None and o.world_size > 1
    }
    # The typical step keeps the shape of the run the advice is for, so that its own median comes back.
    median_over_mean = base.step_median_ms / base.step_mean_ms

    # Collectives: the link fit and buckets of the multi-rank run closest to the base, held to the time
    # its collectives took (the fit's line need not pass through this run's bucket sizes).
    # A sharded run's collectives (no buckets) are held to their measured time (`sharded` below).
    multi = [
        o
        for o in observations
        if o.world_size > 1 and (o.bucket_bytes or (o.sharding and o.comm_ms)) and (o.fits or o.comm_ms)
    ]
    comm_source = base if base in multi else (multi[0] if multi else None)
    fits: tuple[CollectiveFit, ...] = ()
    sharded = base.sharding is not None
    if comm_source is not None and sharded:
        fits = comm_source.fits
    elif comm_source is not None:
        fits = comm_source.fits or (_bandwidth_through(comm_source),)
        if not comm_source.fits:
            notes.append(
                "the collectives came in one size, so the link has no alpha-beta fit: it is taken as pure "
                "bandwidth through their measured time (their time grows with bytes and the ring's share)"
            )
    buckets = tuple(float(b) for b in comm_source.bucket_bytes) if comm_source else ()
    sync_scale, base_sync = 1.0, (0.0 if base.world_size == 1 else None)
    if sharded and base.comm_ms:
        base_sync = base.comm_ms
        notes.append(
            f"{base.sharding} run: its all-gathers and reduce-scatters ({base.comm_ms or 0:.1f} ms per step) run "
            "inside forward and backward, at every micro-batch; the model holds them at their measured time per "
            "micro-batch at any batch size (they move parameters and gradients, not activations), and does not "
            "predict them at another world size or link, nor a change of sharding"
        )
    elif comm_source is not None:
        modelled = sync_ms(fits, buckets, comm_source.world_size)
        if modelled and comm_source.comm_ms:
            sync_scale = comm_source.comm_ms / modelled
        base_sync = sync_ms(fits, buckets, base.world_size)
        base_sync = base_sync * sync_scale if base_sync is not None else None
    if not multi:
        ranks = sorted({o.world_size for o in observations if o.world_size > 1})
        runs = f"the {'- and '.join(map(str, ranks))}-rank run" + ("s" if len(ranks) > 1 else "")
        missing = (
            (
                f"{runs} timed no collective (communication profiling off)"
                if sharded
                else f"{runs} timed no DDP gradient bucket (communication profiling off, or no comm hook)"
            )
            if ranks
            else "no multi-rank run given"
        )
        notes.append(
            f"{missing}: the collectives of a larger world size can only come from a link measured "
            "elsewhere (a `tuneup probe-network` run, as benchmarks/predict.py --link uses) and the gradient's "
            "size, with overlap unknown"
        )

    def measured_sync(o: Observation) -> float | None:
        return o.comm_ms if o.comm_ms else sync_ms(o.fits, o.bucket_bytes, o.world_size)

    def solve(interference: dict[int, float], one_rank: _Line | None = None) -> float | None:
        """γ from the multi-rank runs: the last micro-batch's backward (without the exposed wait, and
        without the interference it carried) against the collectives' time and the exposed wait. A sharded
        run's: each micro-batch's forward and backward against its gathers and scatters; where its wait
        was not measured, what its compute took above `one_rank`'s (less interference), else none."""
        gammas = []
        for o in multi:
            sync = measured_sync(o)
            if not sync:
                continue
            if o.sharding:
                per = o.accumulation
                busy = o.compute_per_micro_batch_ms - interference.get(o.world_size, 0.0) / per
                waited = o.exposed_ms
                if waited is None:
                    waited = max(0.0, busy - one_rank.at(o.batch_size)) * per if one_rank else 0.0
                    busy -= waited / per
                gammas.append(_solve_gamma(max(busy, 0.0), sync / per, waited / per))
                continue
            bwd = (
                o.backward_ms - o.exposed_in_backward_ms - interference.get(o.world_size, 0.0)
            ) / o.accumulation
            gammas.append(_solve_gamma(max(bwd, 0.0), sync, o.exposed_ms or 0.0))
        return statistics.median(gammas) if gammas else None

    # How the collectives shared the step with backward.
    if ref_world == 1 and len(by_world) > 1:
        # Measured: a multi-rank run's compute above the one-rank line is the collectives' interference.
        def above(o: Observation) -> float:
            excess = max(0.0, (o.compute_per_micro_batch_ms - line.at(o.batch_size)) * o.accumulation)
            if o.sharding and o.exposed_ms is None:
                # A sharded run's compute holds its unmeasured wait for the gathers: up to their time, the
                # excess is that wait; beyond it, interference.
                excess = max(0.0, excess - (o.comm_ms or 0.0))
            return excess

        interference = {
            w: statistics.fmean(above(o) for o in group) for w, group in by_world.items() if w > 1
        }
        variants: tuple[Overlap, ...] = (Overlap(line, solve(interference, line), interference, "measured"),)
        interference_known = True
    elif ref_world > 1:
        # Not measured: between two readings. "Overlapped": the collectives ran beside backward at no cost
        # to it (γ fitted to the exposed wait). "Serialized": every millisecond they overlapped was taken
        # from backward (γ = 1 on a compute line without that time). A CPU rank without a spare core takes
        # the second as the point (gloo reduces and copies on the cores that compute); a GPU the first
        # (NCCL runs on a few SMs and its own copy engines).
        def overlapped(o: Observation) -> float:
            """Per steady step, as compute is: only the steps that synced gradients overlapped any."""
            return max(0.0, (o.comm_ms or 0.0) - (o.exposed_ms or 0.0)) * o.synced_share

        serial_line = _fit_line(
            [(o.batch_size, o.compute_per_micro_batch_ms - overlapped(o) / o.accumulation) for o in ref]
        )
        overlap = Overlap(line, solve({}), {}, "overlapped")
        serial = Overlap(serial_line, 1.0, {}, "serialized")
        cpu_bound = not base.on_gpu and (base.cpu_count or 0) / max(1, base.ranks_per_node) < 2
        variants = (serial, overlap) if cpu_bound else (overlap, serial)
        interference_known = False
        notes.append(
            "interference (how much the collectives slowed "
            + ("forward and backward" if sharded else "backward")
            + ") was not measured: the interval spans none "
            "of it to all "
            "of their overlapped time; the point takes "
            + ("all of it (a CPU rank without a spare core)" if cpu_bound else "none (NCCL on GPUs)")
            + ". A run at one rank of the same batch size measures it"
        )
    else:
        variants = (Overlap(line, None, {}, "one rank"),)
        interference_known = False

    model = StepTimeModel(
        base=base,
        backward_share=backward_share,
        data_ms_per_sample=data_per_sample,
        optimizer_ms=optimizer,
        other_ms=other,
        data_line=data_line,
        other_line=other_line,
        fits=tuple(fits),
        bucket_bytes=buckets,
        sync_scale=sync_scale,
        base_sync_ms=base_sync,
        variants=variants,
        interference_known=interference_known,
        median_over_mean=median_over_mean,
        fit_error=None,
        runs=len(observations),
        world_sizes=tuple(sorted(by_world)),
        batch_sizes=tuple(sorted({o.batch_size for o in observations})),
        notes=notes,
        averaging_ms=averaging,
        run_steps=base.run_steps,
    )
    # Anchored at the base run: the step the advice is for is its own, whatever a least-squares fit through
    # three or more runs says there; what the fit leaves unexplained at the base goes with the loop's time
    # per micro-batch (a constant: no batch size's step moves against another's).
    off_base = base.step_mean_ms - model._predict(observed_setting(base)).mean_ms.value
    if abs(off_base) > 1e-9 * base.step_mean_ms:
        shifted = dataclasses.replace(
            other_line,
            intercept_ms=other_line.intercept_ms + off_base / base.accumulation,
            extremes=tuple((a + off_base / base.accumulation, k) for a, k in other_line.extremes),
        )
        model = dataclasses.replace(model, other_line=shifted, other_ms=shifted.at(base.batch_size))
    # In-sample error: how far the model lands on the runs it was fitted to.
    errors = []
    for o in observations:
        predicted = model._predict(observed_setting(o)).mean_ms.value
        errors.append(abs(predicted / o.step_mean_ms - 1) if o.step_mean_ms > 0 else 0.0)
    return dataclasses.replace(model, fit_error=max(errors) if len(observations) > 1 else None)


def _loop_ms(o: Observation) -> float:
    """The loop's own time per step (other and Lightning's sync), with whatever of the mean step the phases
    do not account for: the model gives back the step the run measured, not the sum of its phases. Less
    local SGD's averages, which "other" holds and the model adds as a term of their own (left in, they
    would grow with accumulation as the loop's time does, where one average serves the whole step)."""
    phases = o.data_ms + o.forward_ms + o.backward_ms + o.optimizer_ms + o.sync_ms + o.other_ms
    return o.other_ms + o.sync_ms + (o.step_mean_ms - phases) - o.averaging_per_step_ms


def observed_setting(o: Observation) -> Setting:
    """The setting a run measured, as the model predicts for it."""
    factor = 0.5 if o.compression in ("fp16", "bf16") else 1.0
    return Setting(
        o.batch_size,
        o.accumulation,
        o.world_size,
        o.precision,
        o.num_workers,
        comm_bytes_factor=factor,
        local_sgd_period=o.local_sgd_period,
    )


def _bandwidth_through(o: Observation) -> CollectiveFit:
    """A link with no latency whose bandwidth gives the run's buckets the collective time it measured:
    what one bucket size can say (an alpha-beta fit needs two)."""
    unit_s = sum(model_time_s("all_reduce", o.world_size, b, 0.0, 1.0) for b in o.bucket_bytes)
    beta_s = (o.comm_ms or 0.0) / 1000.0 / unit_s if unit_s > 0 else 0.0
    return CollectiveFit(
        kind="all_reduce",
        alpha_us=0.0,
        beta_ns_per_byte=beta_s * 1e9,
        busbw_gbytes_per_s=1.0 / beta_s / 1e9 if beta_s > 0 else None,
        r_squared=None,
        points=0,
        sizes=1,
        notes=["pure bandwidth through the measured collectives (one size: no alpha-beta fit)"],
    )


def with_link(model: StepTimeModel, fits: Sequence[CollectiveFit], gradient_bytes: float) -> StepTimeModel:
    """The model with a link measured elsewhere (a probe run) and, where the runs had one rank, the
    gradient's buckets assumed as DDP makes them (25 MiB each, the first 1 MiB)."""
    buckets = model.bucket_bytes or tuple(_ddp_buckets(gradient_bytes))
    return dataclasses.replace(model, fits=tuple(fits), bucket_bytes=buckets)


def _ddp_buckets(gradient_bytes: float, first_mb: float = 1.0, cap_mb: float = 25.0) -> list[float]:
    """DDP's bucket sizes for a gradient of `gradient_bytes` (after its rebuild: the first bucket small)."""
    mib = 1024 * 1024
    sizes, left = [], gradient_bytes
    cap = first_mb * mib
    while left > 0:
        take = min(cap, left)
        sizes.append(take)
        left -= take
        cap = cap_mb * mib
    return sizes
