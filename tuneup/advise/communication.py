"""DDP communication: when the collectives cost the step a material share, which change costs less.

What communication costs a step is more than what the step waited for after backward (exposed): the
collectives that ran beside backward slowed it too (interference), which the step-time model carries
where runs at one and several ranks were given. The candidates, each predicted through the model with
the link's alpha-beta fit:

- fp16 gradient compression over NCCL (half the bytes; bf16 too, which gloo cannot all-reduce). Not on
  gloo: there the casts and the CPU's fp16 sums took what the halved bytes saved (measured);
- accumulation of two micro-batches, to communicate half as often per sample (the global batch doubles);
- a larger DDP bucket, where the per-collective latency (alpha) is a material share of the step.
"""

from __future__ import annotations

from dataclasses import replace

from tuneup.advise import code
from tuneup.advise.context import AdviceContext
from tuneup.advise.model import Change, Recommendation
from tuneup.analyze.interconnect import model_time_s

# Communication is material when it costs the step at least this share.
MATERIAL_SHARE = 0.05


def recommend(ctx: AdviceContext) -> list[Recommendation]:
    o = ctx.observation
    if o.world_size <= 1:
        ctx.skip("DDP communication", "one rank: no gradient communication")
        return []
    if o.comm_ms is None or o.exposed_ms is None:
        ctx.skip("DDP communication", "no collectives were recorded for this run (FSDP, or no DDP comm hook)")
        return []
    step = o.step_mean_ms
    interference = ctx.model.interference_ms.get(o.world_size)
    cost_ms = o.exposed_ms + (interference or 0.0)
    share = cost_ms / step
    evidence = [
        f"collectives {o.comm_ms:.1f} ms per step, of which the step waited {o.exposed_ms:.1f} ms after backward "
        f"({o.exposed_ms / step:.1%} of the {step:.1f} ms step)",
        f"{len(o.bucket_bytes)} bucket(s), {(o.comm_bytes or 0) / 2**20:.2f} MiB per step over {o.backend or 'the'} "
        f"backend; link fit alpha {o.fits[0].alpha_us:.0f} us per step, bus bandwidth "
        f"{o.fits[0].busbw_gbytes_per_s or 0:.3g} GB/s"
        if o.fits and o.fits[0].alpha_us is not None
        else f"{len(o.bucket_bytes)} bucket(s) per step",
    ]
    if interference is not None:
        measured = ctx.model.interference_known
        evidence.append(
            f"interference: compute {interference:.1f} ms per step slower "
            + (
                "than at one rank"
                if measured
                else "beside the collectives (assumed: their overlapped time on a CPU without a spare core)"
            )
        )
    if share < MATERIAL_SHARE:
        ctx.skip(
            "DDP communication",
            f"communication costs the step {share:.1%} ({cost_ms:.1f} ms), under {MATERIAL_SHARE:.0%}",
        )
        return []
    out: list[Recommendation] = []
    current = ctx.setting

    # fp16 compression: half the bytes on the wire.
    if o.precision and o.precision.startswith("16"):
        ctx.skip("fp16 gradient compression", "gradients are already fp16")
    elif (o.backend or "").lower() == "gloo" or not o.on_gpu:
        # Measured, not modelled: gloo sums on the CPU, and the casts and the fp16 arithmetic took what the
        # halved bytes saved (benchmarks/advise_loop.py, 2 gloo ranks: predicted +20.5%, measured +0.4%).
        ctx.skip(
            "fp16 gradient compression",
            "on gloo the casts and the CPU's fp16 sums cost what the halved bytes save (measured +0.4% where "
            "bytes alone predicted +20%); it pays over NCCL, on GPUs",
        )
    else:
        rec = ctx.recommendation(
            id="communication.fp16_compression",
            title="Compress DDP gradients to fp16",
            changes=[Change("ddp_comm_hook", "allreduce", "fp16_compress_hook")],
            proposed=ctx.predict(replace(current, comm_bytes_factor=0.5)),
            evidence=evidence,
            code=code.ddp_strategy(ctx.namespace, {"ddp_comm_hook": "default_hooks.fp16_compress_hook"}),
            caveats=[
                "fp16 gradients lose precision below ~6e-8 and overflow above 65504; watch the loss",
                "bf16 compression (bf16_compress_hook) needs NCCL: gloo cannot all-reduce bf16",
            ],
            confidence="medium" if ctx.model.gamma_known else "low",
        )
        if rec is not None:
            out.append(rec)

    # Accumulate: the same collectives carry twice the samples.
    doubled = replace(current, accumulate_grad_batches=current.accumulate_grad_batches * 2)
    rec = ctx.recommendation(
        id="communication.accumulate",
        title=f"Accumulate {doubled.accumulate_grad_batches} micro-batches per step to communicate less often",
        changes=[
            Change(
                "accumulate_grad_batches",
                str(current.accumulate_grad_batches),
                str(doubled.accumulate_grad_batches),
            )
        ],
        proposed=ctx.predict(doubled),
        evidence=evidence,
        code=code.trainer_args(ctx.namespace, {"accumulate_grad_batches": doubled.accumulate_grad_batches}),
        caveats=[
            f"the global batch doubles ({current.global_batch} → {doubled.global_batch}): scale the learning rate "
            "(linear for SGD, square root for Adam-family) and re-check convergence",
            "training steps halve for the same samples: adjust max_steps and schedulers",
        ],
        confidence="medium",
    )
    if rec is not None:
        out.append(rec)

    # Larger buckets: fewer collectives, less latency, where alpha is material.
    fit = o.fits[0] if o.fits else None
    if fit is not None and fit.alpha_us is not None and len(o.bucket_bytes) > 1:
        # The latency term of the ring model, once per bucket: a collective of no bytes.
        alpha_ms = (
            len(o.bucket_bytes) * model_time_s(fit.kind, o.world_size, 0.0, fit.alpha_us * 1e-6, 0.0) * 1e3
        )
        if alpha_ms / step >= MATERIAL_SHARE:
            ctx.skip(
                "bucket_cap_mb",
                f"latency is {alpha_ms:.1f} ms of the step over {len(o.bucket_bytes)} buckets; a larger "
                "bucket_cap_mb cuts it but delays the first collective: try "
                "DDPStrategy(bucket_cap_mb=100) and compare (buckets are fixed when DDP wraps the model)",
            )
        else:
            ctx.skip("bucket_cap_mb", f"per-collective latency is {alpha_ms:.2f} ms per step: not material")
    ctx.skip(
        "gradient_as_bucket_view",
        "saves one gradient-sized copy of memory, not time: DDPStrategy(gradient_as_bucket_view=True) where "
        "memory is short",
    )
    ctx.skip(
        "PowerSGD",
        "its bytes depend on the parameters' shapes, which the record does not hold; it needs error feedback "
        "and a start after warm-up (and after DDP's bucket rebuild), and hung on gloo in our tries",
    )
    return out
