"""Batch size and gradient accumulation: which per-rank batch and accumulation deliver the most, judged
by goodput where the gradient noise scale was measured (a batch far above it buys throughput that the
optimizer cannot use) and by samples/s where it was not, within the GPU's memory.

Candidates: the micro-batch halved, doubled and quadrupled at the same accumulation, and, where the run
accumulates, a larger micro-batch with fewer micro-batches (the same global batch: no learning-rate
change, no statistical cost). The best one is recommended if it clears the threshold; the rest are
listed as considered.
"""

from __future__ import annotations

from dataclasses import replace

from tuneup.advise.context import AdviceContext, describe
from tuneup.advise.memory import MEMORY_HEADROOM, memory_model
from tuneup.advise.model import Change, Recommendation, Setting

# From one batch size the model extrapolates on a prior: no further than this many times the batch seen.
MAX_PRIOR_FACTOR = 2


def _candidates(current: Setting, max_factor: int | None) -> list[Setting]:
    b, s = current.batch_size, current.accumulate_grad_batches
    factors = [k for k in (2, 4) if max_factor is None or k <= max_factor]
    out = [
        replace(current, batch_size=nb) for nb in (b // 2, *(b * k for k in factors)) if nb >= 1 and nb != b
    ]
    for k in factors:  # the same global batch in fewer, larger micro-batches
        if s % k == 0:
            out.append(replace(current, batch_size=b * k, accumulate_grad_batches=s // k))
    return out


def _confidence(ctx: AdviceContext, setting: Setting, measured: bool) -> str:
    seen = ctx.model.batch_sizes
    if measured:
        # A contended host's load moves each run (one setting measured 5.7 and 73.7 ms a step in two runs of
        # Lightning's CLI example): low, and the context says which runs and how it would settle.
        return "low" if _contended(ctx) else "high"
    if ctx.model.line.prior or ctx.model.line.flat or _contended(ctx):
        return "low"
    return "high" if min(seen) <= setting.batch_size <= max(seen) else "medium"


def _contended(ctx: AdviceContext) -> list[str]:
    """The runs of the fit whose host other processes took (tuneup's contention warning)."""
    return [o.run_id for o in ctx.model_observations or (ctx.observation,) if o.contended]


def _fit_caveats(ctx: AdviceContext) -> list[str]:
    """What makes a fit from several batch sizes weak: compute that did not grow with the batch, runs on a
    contended host."""
    out = []
    line = ctx.model.line
    if line.flat and len(ctx.model.batch_sizes) > 1:
        out.append(
            f"the fit's compute did not grow with the batch between batch sizes "
            f"{', '.join(map(str, ctx.model.batch_sizes))} (slope {line.raw_slope_ms or 0.0:+.3f} ms per sample, "
            "held at zero): the runs' noise is larger than the difference between them, so the interval spans "
            "the lines their noise allows, and the point, a step that does not grow, is the most a larger batch "
            "can gain"
        )
    busy = _contended(ctx)
    if busy:
        out.append(
            f"run(s) {', '.join(busy)} ran on a host whose CPU other processes took (tuneup's contention "
            "warning): their steps, and the fit, move with the host's load; rerun on a quiet host, interleaved"
        )
    return out


def measure_instruction(batch: int) -> str:
    """What settles a prediction from one batch size: a measurement at the proposed one."""
    return (
        f"run `tuneup advise --measure -- COMMAND` (short measuring trials, then advice from a fitted model), "
        f"or record a run at batch {batch} and pass both runs to tuneup advise"
    )


def recommend(ctx: AdviceContext) -> list[Recommendation]:
    o = ctx.observation
    current = ctx.setting
    memory = memory_model(ctx.model_observations or [o], o) if o.on_gpu else None
    best: Recommendation | None = None
    prior = ctx.model.line.prior is not None
    if prior:
        ctx.skip(
            f"batch_size {current.batch_size} → {current.batch_size * 4}",
            f"not predicted: from one batch size the model does not extrapolate beyond {MAX_PRIOR_FACTOR}x "
            f"(compute, data wait and the loop's time may each grow with the batch or not); "
            + measure_instruction(current.batch_size * 4),
        )
    for setting in _candidates(current, MAX_PRIOR_FACTOR if prior else None):
        changes = [Change("batch_size", str(current.batch_size), str(setting.batch_size))]
        accumulation = None
        if setting.accumulate_grad_batches != current.accumulate_grad_batches:
            accumulation = setting.accumulate_grad_batches
            changes.append(
                Change(
                    "accumulate_grad_batches",
                    str(current.accumulate_grad_batches),
                    str(setting.accumulate_grad_batches),
                )
            )
        caveats: list[str] = [] if prior else _fit_caveats(ctx)
        evidence = [
            # Means throughout (samples/s is made of the mean step), the median beside it.
            f"step {o.step_mean_ms:.1f} ms mean ({o.step_median_ms:.1f} ms median) at batch {o.batch_size} x "
            f"{o.accumulation} micro-batch(es) x {o.world_size} rank(s); compute per micro-batch "
            f"{o.compute_per_micro_batch_ms:.1f} ms mean",
            f"step-time model: compute {ctx.model.line.intercept_ms:.2f} ms + {ctx.model.line.slope_ms:.3f} ms "
            f"per sample per micro-batch, from batch sizes {', '.join(map(str, ctx.model.batch_sizes))}",
        ]
        if memory is not None and o.gpu_mem_total_bytes:
            need = memory.peak_bytes(setting.batch_size, setting.world_size)
            limit = o.gpu_mem_total_bytes * (1 - MEMORY_HEADROOM)
            if need > limit:
                ctx.skip(
                    describe(changes),
                    f"predicted peak memory {need / 2**30:.1f} GiB exceeds {limit / 2**30:.1f} GiB "
                    f"({1 - MEMORY_HEADROOM:.0%} of the GPU's {o.gpu_mem_total_bytes / 2**30:.0f} GiB)",
                )
                continue
            evidence.append(
                f"memory: peak allocated {o.gpu_peak_allocated_bytes / 2**30:.2f} GiB at batch {o.batch_size}; "
                f"predicted {need / 2**30:.2f} GiB of {o.gpu_mem_total_bytes / 2**30:.0f} GiB"
            )
        elif not o.on_gpu:
            caveats.append("memory was not checked: on CPU the batch lives in host RAM")
        proposed = ctx.predict(setting)
        if setting.global_batch != current.global_batch:
            k = setting.global_batch / current.global_batch
            caveats.append(
                f"the global batch changes from {current.global_batch} to {setting.global_batch}: scale the "
                f"learning rate with it (linear, x{k:g}, for SGD; square root, x{k**0.5:.2f}, for Adam-family "
                "optimizers) and re-check convergence"
            )
            if ctx.economics.b_noise is None:
                caveats.append(
                    "judged by samples/s (no positive gradient noise scale: the notes say why): a larger batch "
                    "may need more samples to reach the same loss, which samples/s does not show"
                )
            elif setting.global_batch > ctx.economics.b_noise:
                caveats.append(
                    f"above the gradient noise scale (B_simple ~ {ctx.economics.b_noise:.0f} samples) each extra "
                    "sample in the batch adds less progress; goodput accounts for it"
                )
        if ctx.economics.b_noise is not None:
            evidence.append(f"gradient noise scale B_simple ~ {ctx.economics.b_noise:.0f} samples")
        measured = proposed.measured_run is not None
        if measured:
            evidence.insert(
                0,
                f"measured: run {proposed.measured_run} ran this setting; the gain is that run's against this "
                "one, not the model's",
            )
        elif prior:
            caveats.insert(
                0,
                f"a hypothesis: one batch size was seen, so the figure rests on a prior (compute half fixed, "
                f"half proportional to the batch); test it: {measure_instruction(setting.batch_size)}",
            )
        rec = ctx.recommendation(
            id="batch.size",
            title=(
                f"Use a per-rank batch of {setting.batch_size}"
                + (f" with accumulation {accumulation}" if accumulation is not None else "")
            ),
            changes=changes,
            proposed=proposed,
            evidence=evidence,
            code=ctx.code.batch_size(setting.batch_size, accumulation),
            caveats=caveats,
            confidence=_confidence(ctx, setting, measured),
            settle=("; ".join(_fit_caveats(ctx)) + ". So " if not prior and _fit_caveats(ctx) else "")
            + measure_instruction(setting.batch_size)
            + ", which fits compute against batch size instead of "
            "assuming it",
        )
        if rec is None:
            continue
        if best is None or rec.gain.value > best.gain.value:
            if best is not None:
                ctx.skip(
                    best.title,
                    f"a better batch setting was found (+{best.gain.value:.1%} vs +{rec.gain.value:.1%})",
                )
            best = rec
        else:
            ctx.skip(rec.title, f"predicted +{rec.gain.value:.1%}, less than another batch setting")
    if (
        best is not None
        and best.predicted is not None
        and best.predicted.measured_run is None
        and ctx.not_credible
    ):
        # The fit rests on a run whose measured comparison went beyond physics: so does this prediction.
        ctx.skip(
            best.title,
            f"predicted {best.objective} {best.gain.value:+.1%} from a fit that includes run(s) "
            f"{', '.join(ctx.not_credible)}, whose comparison with this run is not credible (above): rerun both "
            "settings, interleaved, on a quiet host, then advise from those runs",
        )
        best = None
    return [best] if best else []
