"""The gradient noise scale B_simple of a run, from the two gradient norms each step recorded.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", appendix A.1): for a gradient over
B samples, E|G_B|² = |G|² + tr(Σ)/B, with Σ the covariance of one sample's gradient. Two batch sizes
B_small < B_big give, per step, unbiased estimates of both terms:

    |G|²  ≈ (B_big·|G_big|² − B_small·|G_small|²) / (B_big − B_small)
    tr(Σ) ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)

and B_simple = tr(Σ)/|G|². One step's estimates swing wildly (|G|² is often negative), so each is averaged
over steps on its own and only then divided: a mean of per-step ratios would be dominated by the steps
whose |G|² estimate is near zero. The headline uses plain means over the steady steps; the plot, bias-
corrected exponential moving averages, so that it follows B_simple as training moves on.

With several ranks, each rank's local squared norm is one small-batch sample: their mean per step is the
small-batch figure. The big one is the same on every rank under DDP; under FSDP2 each rank records its
shards' part of it, and their sum over the ranks of the step is the figure (a step some rank did not
record is left out).

Only some steps carry the norms (the callback's `noise_scale_every` samples them; past `detail_steps` the
record keeps one step in `sample_every`): everything here uses the steps with both norms and nothing else.
A gap between them is no step at all, not a zero; the blocks of the interval are runs of consecutive
measured steps, and the EMAs advance once per measured step.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tuneup.analyze.model import NoiseScale, RunInfo
from tuneup.record.schema import Run, StepRecord

METHODS = {
    "ddp": "DDP bucket norms before/after all-reduce",
    "accumulation": "first micro-batch vs accumulated gradient",
    "fsdp2": "FSDP2 local gradient before the reduce-scatter vs the averaged gradient's shards summed over ranks",
}
# Methods whose big-batch norm is recorded in parts, one per rank, summed over the ranks of a step.
_SHARDED_METHODS = frozenset({"fsdp2"})
# The plot's EMAs: a time constant of a tenth of the measured steps, within these bounds (in measured steps).
EMA_MIN_STEPS = 10.0
EMA_MAX_STEPS = 200.0
# Fewer steady steps than this and the headline is flagged as rough.
FEW_STEPS = 50
Z_95 = 1.959964
# Comm hooks whose reduced gradient is not the exact average: its norm, and so |G_big|², is biased.
_LOSSY_HOOKS = ("powersgd", "compress", "quantiz")


@dataclass(frozen=True, slots=True)
class NoiseVerdict:
    """What a run says of its gradient noise scale, in one place for the report and the advice.

    kind: "measured" (B_simple with a bounded interval), "lower bound" (B_simple, unbounded above),
    "no signal" (measured, but the mean |G|² estimate was not positive: the gradient's signal is below its
    noise at these batches, or there is none, as with random labels), "not measured" (why says why)."""

    kind: str
    b_simple: float | None  # what goodput may weigh with: a positive estimate, else None
    text: str  # the verdict in words, a sentence without its full stop
    # B_simple's interval where goodput weighs with it: its low end, and its high end (None: unbounded above).
    b_low: float | None = None
    b_high: float | None = None


def noise_verdict(ns: NoiseScale | None, run: RunInfo) -> NoiseVerdict:
    if ns is None:
        strategy = (run.strategy or "").lower()
        if "fsdp" in strategy and "fully_shard" not in strategy and "modelparallel" not in strategy:
            why = (
                "FSDP1 runs (Lightning's FSDPStrategy) do not record it, since each rank holds only a flat shard "
                "of the gradient; FSDP2 (ModelParallelStrategy with fully_shard) does"
            )
        elif run.world_size <= 1 and run.accumulate_grad_batches < 2:
            why = (
                "it needs two batch sizes per step, which one rank without gradient accumulation does not give "
                "(DDP with 2 or more ranks, or accumulate_grad_batches of 2 or more, does)"
            )
        else:
            why = (
                "no steady step recorded the two gradient norms (TuneupCallback's noise scale off, or the "
                "collective probe off)"
            )
        return NoiseVerdict("not measured", None, f"the gradient noise scale was not measured: {why}")
    batches = f"batches {ns.small_batch} and {ns.big_batch}"
    if ns.b_simple is None or ns.b_simple <= 0:
        return NoiseVerdict(
            "no signal",
            None,
            f"the gradient noise scale was measured over {ns.steps} steps at {batches} and came out with no "
            "signal: the mean |G|² estimate is not positive, so the gradient's noise swamps its signal. B_simple "
            f"is larger than these batches can measure (far above {ns.big_batch}), or the gradient has no "
            "signal at all (random labels); a larger batch loses no statistical efficiency that can be "
            "measured here",
        )
    if ns.ci_high is None and (ns.ci_low is None or ns.ci_low <= 0):
        # An interval from zero (or nothing) to unbounded says nothing of B_simple: any batch is as consistent
        # with it as any other, so it weighs no figure (a 2-rank run's "about 61.62 (at least 0)" once switched
        # the whole advice to goodput).
        return NoiseVerdict(
            "no signal",
            None,
            f"the gradient noise scale was measured over {ns.steps} steps at {batches} and came out with no "
            f"signal: its estimate (about {ns.b_simple:.4g} samples) has an interval from "
            f"{max(0.0, ns.ci_low or 0.0):.4g} to unbounded above, because |G|² is barely above zero at these "
            "batches, so it says nothing of how a larger batch trades samples for steps",
        )
    if ns.ci_high is None:
        return NoiseVerdict(
            "lower bound",
            ns.b_simple,
            f"the gradient noise scale B_simple is about {ns.b_simple:.4g} samples (at least {ns.ci_low:.4g}, "
            f"unbounded above: |G|² is barely above zero at {batches})",
            b_low=ns.ci_low,
        )
    return NoiseVerdict(
        "measured",
        ns.b_simple,
        f"the gradient noise scale B_simple is about {ns.b_simple:.4g} samples (95% interval {ns.ci_low:.4g} "
        f"to {ns.ci_high:.4g}, {batches})",
        b_low=ns.ci_low,
        b_high=ns.ci_high,
    )


def statistical_efficiency(b_noise: float, b_reference: float, b: float) -> float:
    """How much progress a sample makes at batch size `b` relative to one at `b_reference` (Pollux, OSDI'21):
    (B_noise + B_reference) / (B_noise + B). Below 1 for b > b_reference: a bigger batch needs more samples
    to the same loss. Steps to a target scale as S_min(1 + B_noise/B), samples as E_min(1 + B/B_noise)."""
    return (b_noise + b_reference) / (b_noise + b)


def per_step_estimates(
    small_sq: float, big_sq: float, small_batch: int, big_batch: int
) -> tuple[float, float]:
    """(|G|², tr(Σ)) estimated from one step's two squared norms."""
    grad_sq = (big_batch * big_sq - small_batch * small_sq) / (big_batch - small_batch)
    trace_sigma = (small_sq - big_sq) / (1.0 / small_batch - 1.0 / big_batch)
    return grad_sq, trace_sigma


def _has_norms(s: StepRecord) -> bool:
    return (
        s.gns_small_sq is not None
        and s.gns_big_sq is not None
        and s.gns_small_batch is not None
        and s.gns_big_batch is not None
        and 0 < s.gns_small_batch < s.gns_big_batch
        and math.isfinite(s.gns_small_sq)
        and math.isfinite(s.gns_big_sq)
    )


def _per_step(
    steps_by_rank: dict[int, Sequence[StepRecord]], shards: int | None = None
) -> tuple[tuple[int, int] | None, list[tuple[int, float, float]]]:
    """((small, big) batch, [(step, |G|² estimate, tr(Σ) estimate)] in step order). Steps whose batch sizes
    are not the run's usual ones (a short last batch) or differ between ranks are left out. `shards`: the
    big-batch norm is recorded in that many parts, one per rank, summed (FSDP2); a step without all of
    them is left out."""
    by_step: dict[int, list[StepRecord]] = {}
    for steps in steps_by_rank.values():
        for s in steps:
            if _has_norms(s):
                by_step.setdefault(s.step, []).append(s)
    sizes = Counter((s.gns_small_batch, s.gns_big_batch) for recs in by_step.values() for s in recs)
    if not sizes:
        return None, []
    (small_batch, big_batch), _ = sizes.most_common(1)[0]
    out = []
    for step in sorted(by_step):
        recs = by_step[step]
        if any((s.gns_small_batch, s.gns_big_batch) != (small_batch, big_batch) for s in recs):
            continue
        if shards is not None and len(recs) != shards:
            continue
        small_sq = sum(s.gns_small_sq for s in recs) / len(recs)  # type: ignore[misc]
        big_sq = sum(s.gns_big_sq for s in recs) / (1 if shards is not None else len(recs))  # type: ignore[misc]
        out.append((step, *per_step_estimates(small_sq, big_sq, small_batch, big_batch)))  # type: ignore[arg-type]
    return (small_batch, big_batch), out  # type: ignore[return-value]


def ratio_of_means(
    grad_sq: Sequence[float], trace_sigma: Sequence[float]
) -> tuple[float | None, float | None, float | None]:
    """(B_simple, 95% low, 95% high) = mean tr(Σ) / mean |G|² over the steps, (None, None, None) when the
    mean |G|² is not positive.

    The interval is the delta method for a ratio of means, on batch means: consecutive steps are not
    independent in training (the parameters carry over), so the steps are cut into about √n blocks and the
    blocks' means are treated as the samples; the variance of the ratio is then that of
    tr(Σ)_block − R·|G|²_block over the blocks, divided by |G|²'s mean squared. This is deterministic (a
    report made twice says the same), needs no resampling, and for steps that are in fact independent
    gives the plain delta-method interval. When |G|²'s own interval reaches zero the ratio is unbounded
    above (Fieller): high is None then.
    """
    n = len(grad_sq)
    if n == 0:
        return None, None, None
    g_mean = sum(grad_sq) / n
    t_mean = sum(trace_sigma) / n
    if g_mean <= 0:
        return None, None, None
    ratio = t_mean / g_mean
    block = max(1, int(math.sqrt(n)))
    blocks = n // block
    if blocks < 3:
        return ratio, None, None
    g_blocks = [sum(grad_sq[i * block : (i + 1) * block]) / block for i in range(blocks)]
    t_blocks = [sum(trace_sigma[i * block : (i + 1) * block]) / block for i in range(blocks)]
    resid = [t - ratio * g for t, g in zip(t_blocks, g_blocks, strict=True)]
    var_resid = sum(r * r for r in resid) / (blocks - 1)
    se = math.sqrt(var_resid / blocks) / g_mean
    g_var = sum((g - g_mean) ** 2 for g in g_blocks) / (blocks - 1)
    g_se = math.sqrt(g_var / blocks)
    low = max(0.0, ratio - Z_95 * se)
    high = ratio + Z_95 * se if g_mean - Z_95 * g_se > 0 else None
    return ratio, low, high


def ema_series(
    grad_sq: Sequence[float], trace_sigma: Sequence[float], time_constant: float
) -> list[float | None]:
    """B_simple after each step from bias-corrected EMAs of the two estimates (Adam's correction: the EMA
    divided by 1 − βᵗ, so the first steps are not pulled towards zero); None where the |G|² EMA is not
    positive."""
    beta = 1.0 - 1.0 / time_constant
    g_ema = t_ema = 0.0
    out: list[float | None] = []
    for i, (g, t) in enumerate(zip(grad_sq, trace_sigma, strict=True), start=1):
        g_ema = beta * g_ema + (1.0 - beta) * g
        t_ema = beta * t_ema + (1.0 - beta) * t
        correction = 1.0 - beta**i
        g_hat, t_hat = g_ema / correction, t_ema / correction
        out.append(t_hat / g_hat if g_hat > 0 and t_hat >= 0 else None)
    return out


def _method_event(run: Run) -> tuple[str | None, str | None]:
    for rank in sorted(run.ranks):
        for e in run.ranks[rank].events:
            if e.get("kind") == "noise_scale":
                method, hook = e.get("method"), e.get("comm_hook")
                return (
                    method if isinstance(method, str) else None,
                    hook if isinstance(hook, str) else None,
                )
    return None, None


def noise_scale_section(run: Run, steady: dict[int, list[StepRecord]]) -> NoiseScale | None:
    """The run's noise scale, or None where no step recorded the two norms (or no step is steady)."""
    method, comm_hook = _method_event(run)
    shards = run.world_size if method in _SHARDED_METHODS else None
    sizes, headline = _per_step(steady, shards)
    if sizes is None or not headline:
        return None
    small_batch, big_batch = sizes
    _, every = _per_step({r: rec.steps for r, rec in run.ranks.items()}, shards)
    if method is None:
        method = "ddp" if run.world_size > 1 else "accumulation"
    grad_sq = [g for _, g, _ in headline]
    trace_sigma = [t for _, _, t in headline]
    b_simple, low, high = ratio_of_means(grad_sq, trace_sigma)
    g_mean = sum(grad_sq) / len(grad_sq)
    t_mean = sum(trace_sigma) / len(trace_sigma)
    notes = []
    if b_simple is None:
        notes.append(
            f"No signal: the mean |G|² estimate is not positive: at batch sizes {small_batch} and {big_batch} the "
            "gradient's signal is below its noise, so B_simple is larger than these batch sizes can measure "
            f"(far above {big_batch}), or the gradient has no signal at all (random labels)."
        )
    elif high is None:
        notes.append(
            "|G|² is barely above zero at these batch sizes: the interval is unbounded above (B_simple is at "
            "least the low end)."
        )
    if len(headline) < FEW_STEPS:
        note = f"Only {len(headline)} steady steps had both norms: a rough estimate."
        span = headline[-1][0] - headline[0][0]
        if len(headline) > 1 and span >= 1.5 * (len(headline) - 1):
            # Sampled: the callback's noise_scale_every (automatic: a 0.5% budget for the norms' cost).
            note += (
                f" The norms were taken on about one step in {round(span / (len(headline) - 1))}; a longer "
                "run, or TuneupCallback(noise_scale_every=1), measures more steps."
            )
        notes.append(note)
    if comm_hook and any(word in comm_hook.lower() for word in _LOSSY_HOOKS):
        notes.append(
            f"The DDP comm hook {comm_hook} does not return the exact average gradient: the big-batch norm, "
            "and so B_simple, is biased (a low-rank approximation loses part of |G_big|²)."
        )
    if method == "accumulation":
        notes.append(
            "One small-batch sample per step (the first micro-batch): noisier than DDP's one per rank."
        )
    time_constant = min(EMA_MAX_STEPS, max(EMA_MIN_STEPS, len(every) / 10.0))
    series = ema_series([g for _, g, _ in every], [t for _, _, t in every], time_constant)
    # The EMAs advance once per measured step: in training steps their time constant is that many times
    # the mean spacing of the measured steps (1 where every step was measured).
    spacing = (every[-1][0] - every[0][0]) / (len(every) - 1) if len(every) > 1 else 1.0
    return NoiseScale(
        method=METHODS.get(method, method),
        small_batch=small_batch,
        big_batch=big_batch,
        steps=len(headline),
        b_simple=b_simple,
        ci_low=low,
        ci_high=high,
        grad_sq=g_mean,
        trace_sigma=t_mean,
        series_step=[step for step, _, _ in every],
        series_b_simple=series,
        ema_steps=time_constant * max(1.0, spacing),
        comm_hook=comm_hook,
        notes=notes,
    )
