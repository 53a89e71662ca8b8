"""DDP communication: when the collectives cost the step a material share, which change costs less.

What communication costs a step is more than what the step waited for after backward (exposed): the
collectives that ran beside backward slowed it too (interference), which the step-time model carries
where runs at one and several ranks were given. The candidates, each predicted through the model with
the link's alpha-beta fit:

- fp16 gradient compression over NCCL (half the bytes; bf16 too, which gloo cannot all-reduce), with
  `TuneupDDPStrategy(compression="fp16")`. Not on gloo: there the casts and the CPU's fp16 sums took what
  the halved bytes saved (measured);
- local SGD, `TuneupDDPStrategy(local_sgd_period=H)`: no gradient all-reduce, the parameters averaged every
  H steps (exposed);
- accumulation of two micro-batches, to communicate half as often per sample (the global batch doubles);
- a larger DDP bucket, where the per-collective latency (alpha) is a material share of the step.

Compression and local SGD are printed as tuneup's strategy rather than Lightning's
`DDPStrategy(ddp_comm_hook=...)`: Lightning applies that hook on CUDA only, and the strategy guards
convergence (it checks the result against exact averaging and falls back).

A sharded run (FSDP, FSDP2) gets none of these: its collectives are the units' all-gathers and
reduce-scatters, which no DDP knob changes; what they cost is said, and that the sharding knobs are not
advised yet.
"""

from __future__ import annotations

from dataclasses import replace

from tuneup.advise.context import AdviceContext
from tuneup.advise.model import Change, Recommendation
from tuneup.advise.observe import Observation
from tuneup.advise.step_model import UNMEASURED_AVERAGE_FACTOR
from tuneup.analyze.interconnect import model_time_s
from tuneup.sync.config import SyncConfig

# Communication is material when it costs the step at least this share.
MATERIAL_SHARE = 0.05
# Local SGD's period: steps between parameter averages. Small, because the ranks' models drift apart
# between averages; 4 is the period of torch's own post-local SGD example (PeriodicModelAverager).
LOCAL_SGD_PERIOD = 4
# What the printed strategy does when given only the recommended argument: the caveats quote its defaults
# (warm-up, check interval, fallback) from the one place they are set.
STRATEGY = SyncConfig()


def recommend(ctx: AdviceContext) -> list[Recommendation]:
    o = ctx.observation
    if o.world_size <= 1:
        ctx.skip("DDP communication", "one rank: no gradient communication")
        return []
    if o.sharding is not None:
        ctx.skip(f"{o.sharding} communication", _sharded(o))
        return []
    if o.comm_ms is None or o.exposed_ms is None:
        ctx.skip("DDP communication", "no collectives were recorded for this run (FSDP, or no DDP comm hook)")
        return []
    step = o.step_mean_ms
    interference = ctx.model.interference_ms.get(o.world_size)
    # What the mean step waited; under local SGD, the exact warm-up's wait and the averages, over every step.
    waited_ms = o.exposed_in_backward_ms + o.averaging_per_step_ms
    cost_ms = waited_ms + (interference or 0.0)
    share = cost_ms / step
    waited = f"collectives {o.comm_ms:.1f} ms per step, of which the step waited {o.exposed_ms:.1f} ms after backward"
    if o.local_sgd_period is not None:
        waited = (
            f"local SGD: the exact warm-up's {waited} ({o.synced_share:.0%} of the steps), then a parameter average "
            f"every {o.local_sgd_period} steps ({o.averaging_ms or 0:.1f} ms each): {waited_ms:.1f} ms waited a step"
        )
    evidence = [
        f"{waited} ({waited_ms / step:.1%} of the {step:.1f} ms step)",
        f"{len(o.bucket_bytes)} bucket(s), {(o.comm_bytes or 0) / 2**20:.2f} MiB per step over {o.backend or 'the'} "
        f"backend; link fit alpha {o.fits[0].alpha_us:.0f} us per collective, bus bandwidth "
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
    if o.compression is not None or o.local_sgd_period is not None:
        ctx.skip("fp16 gradient compression", f"the run already uses TuneupDDPStrategy ({_strategy(o)})")
    elif o.precision and o.precision.startswith("16"):
        ctx.skip("fp16 gradient compression", "gradients are already fp16")
    elif (o.backend or "").lower() == "gloo" or not o.on_gpu:
        # Measured, not modelled: gloo sums on the CPU, and the casts and the fp16 arithmetic took what the
        # halved bytes saved (benchmarks/advise_loop.py, 2 gloo ranks, torch's fp16_compress_hook: predicted
        # +20.5%, measured +0.4%). The strategy's fp16 mode casts and sums the same way.
        ctx.skip(
            "fp16 gradient compression",
            "on gloo the casts and the CPU's fp16 sums cost what the halved bytes save (measured +0.4% where "
            'bytes alone predicted +20%); TuneupDDPStrategy(compression="fp16") runs here, but pays over NCCL, '
            "on GPUs",
        )
    else:
        rec = ctx.recommendation(
            id="communication.fp16_compression",
            title="Compress DDP gradients to fp16",
            changes=[Change("compression", "none", "fp16")],
            proposed=ctx.predict(replace(current, comm_bytes_factor=0.5)),
            evidence=evidence,
            code=ctx.code.sync_strategy({"compression": "fp16"}),
            caveats=[
                "fp16 gradients lose precision below ~6e-8 and overflow above 65504: the strategy compresses "
                f"after {STRATEGY.warmup_steps} exact steps (warmup_steps), compares the compressed average "
                f"with an exact one every {STRATEGY.check_every_n_steps} steps (less often while they agree), "
                f"and falls back to exact all-reduce after {STRATEGY.breaches_to_fall_back} breached checks in "
                "a row",
                'compression="bf16" (fp32\'s range, fewer mantissa bits) needs NCCL and a GPU with bf16 '
                "(Ampere or newer): gloo cannot all-reduce bf16",
            ],
            confidence="medium" if ctx.model.gamma_known else "low",
        )
        if rec is not None:
            out.append(rec)

    local = _local_sgd(ctx, evidence)
    if local is not None:
        out.append(local)

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
        code=ctx.code.accumulation(doubled.accumulate_grad_batches),
        caveats=[
            f"the global batch doubles ({current.global_batch} → {doubled.global_batch}): scale the learning rate "
            "(linear for SGD, square root for Adam-family) and re-check convergence",
            "training steps halve for the same samples: adjust max_steps and schedulers",
        ],
        # Whether the first micro-batch runs faster without the collectives beside it is interference,
        # measured only against a one-rank run; else the interval spans both readings.
        confidence="medium" if ctx.model.interference_known else "low",
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
                f"{ctx.code.ddp_args({'bucket_cap_mb': 100})} and compare (buckets are fixed when DDP wraps the "
                "model)",
            )
        else:
            ctx.skip("bucket_cap_mb", f"per-collective latency is {alpha_ms:.2f} ms per step: not material")
    ctx.skip(
        "gradient_as_bucket_view",
        "saves one gradient-sized copy of memory, not time: "
        f"{ctx.code.ddp_args({'gradient_as_bucket_view': True})} where memory is short",
    )
    ctx.skip(
        "PowerSGD",
        "its bytes depend on the parameters' shapes, which the record does not hold, so no prediction: try "
        f'TuneupDDPStrategy(compression="powersgd") (rank {STRATEGY.powersgd_rank}, error feedback, exact for '
        f"the first {SyncConfig(compression='powersgd').start_step} steps; it runs on gloo too)"
        f"{ctx.code.sync_strategy_note()} and "
        "compare the runs with `tuneup compare BASELINE CANDIDATE`",
    )
    return out


def _local_sgd(ctx: AdviceContext, evidence: list[str]) -> Recommendation | None:
    """Local SGD: no gradient all-reduce, and the parameters averaged every H steps, exposed."""
    o, current = ctx.observation, ctx.setting
    if o.local_sgd_period is not None or o.compression is not None:
        ctx.skip("local_sgd_period", f"the run already uses TuneupDDPStrategy ({_strategy(o)})")
        return None
    if not o.bucket_bytes:
        ctx.skip(
            "local_sgd_period",
            "the gradient's size was not recorded (no buckets): its average cannot be timed",
        )
        return None
    period = LOCAL_SGD_PERIOD
    kwargs: dict[str, object] = {"local_sgd_period": period}
    local_config = SyncConfig(local_sgd_period=period)
    per_rank = current.batch_size * current.accumulate_grad_batches
    caveats = [
        f"the ranks train apart between averages: instead of one step on the global batch of "
        f"{current.global_batch} samples, each rank steps on its own {per_rank} and the models are averaged "
        f"every {period} steps; progress per sample can be lower. The prediction is of throughput, not of time "
        "to a loss: compare the loss curves",
        f"the strategy steps locally after {local_config.start_step} exact steps (warmup_steps; the gain "
        f"starts there), checks the ranks' divergence at an average and the loss every "
        f"{local_config.check_every_n_steps} steps (less often while the checks stay clean), and falls back "
        f"to exact all-reduce after {local_config.breaches_to_fall_back} breached checks in a row",
    ]
    if o.num_nodes > 1:
        # Across nodes the strategy defaults to hierarchical averaging, whose per-step intra-node all-reduce
        # this run's one link fit cannot tell from the inter-node one: the code asks for what is predicted.
        kwargs["hierarchical"] = False
        caveats.append(
            "across nodes the strategy's default (hierarchical=True) averages gradients within each node every "
            f"step and parameters across nodes every {period} steps: closer to exact training, slower by an "
            "intra-node all-reduce per step that this run cannot predict (one link fit for both links). The "
            "code sets hierarchical=False, which is what is predicted; try both and compare them with "
            "`tuneup compare`"
        )
    local = replace(current, local_sgd_period=period)
    proposed = ctx.predict(local)
    terms = proposed.breakdown_ms or {}
    averaging_ms = terms.get("averaging", 0.0) * period
    gradient_mib = sum(o.bucket_bytes) / 2**20
    unmeasured = bool(terms.get("averaging_unmeasured"))
    how = (
        f"{averaging_ms:.1f} ms: between the link fit held to the measured collectives and "
        f"{UNMEASURED_AVERAGE_FACTOR:g}x it (not measured: one flat buffer of every parameter costs more than DDP's "
        "buckets suggest, on gloo with CPU copies; measured once at 6x the fit)"
        if unmeasured
        else f"{averaging_ms:.1f} ms as measured in a run that averaged"
    )
    warmup = terms.get("warmup_share")
    if warmup:
        caveats.insert(
            0,
            f"the prediction is the mean step over a run of {ctx.model.run_steps} steps, as this one: its first "
            f"{local_config.start_step} are the strategy's exact warm-up ({warmup:.0%} of the run); a longer run "
            "gains more",
        )
    return ctx.recommendation(
        id="communication.local_sgd",
        title=f"Average the parameters every {period} steps (local SGD) instead of the gradients every step",
        changes=[Change("local_sgd_period", "None", str(period))],
        proposed=proposed,
        evidence=[
            *evidence,
            f"the average every {period} steps: one all-reduce of the parameters ({gradient_mib:.2f} MiB, as "
            f"many bytes as the gradients) over {o.world_size} ranks, {how}, after the optimizer with nothing to "
            f"overlap ({averaging_ms / period:.1f} ms per step)",
        ],
        code=ctx.code.sync_strategy(kwargs),
        caveats=caveats,
        # What local steps save is the exposed wait and the interference; the latter is a measurement only
        # against a one-rank run, else the interval spans none to all of it.
        confidence="medium" if ctx.model.interference_known and not unmeasured else "low",
        settle=(
            "measure first: the parameter average's time is not known from this run and may cost more than "
            "the collectives it saves; run it with the printed strategy and compare with `tuneup compare`"
            if unmeasured
            else "run it and compare with `tuneup compare`"
        ),
    )


def _sharded(o: Observation) -> str:
    """What a sharded run's collectives cost, as recorded, and why no knob of theirs is advised."""
    step = o.step_mean_ms
    if o.comm_ms is None:
        recorded = "no collective was timed for this sharded run (communication profiling off)"
    else:
        recorded = (
            f"the all-gathers and reduce-scatters took {o.comm_ms:.1f} ms per step ({o.comm_ms / step:.1%} of "
            f"the {step:.1f} ms mean step), inside forward and backward"
        )
        recorded += (
            f", of which the step waited {o.exposed_ms:.1f} ms ({o.exposed_ms / step:.1%})"
            if o.exposed_ms is not None
            else "; how much of it the step waited for was not measured"
        )
    return (
        f"{recorded}. Of the sharding knobs, reshard_after_forward is predicted (FSDP2, where the waits per "
        "phase were recorded) and DDP instead of sharding said as a change to measure; prefetching, what to "
        "wrap and HSDP are not advised yet. DDP's knobs (gradient compression, local SGD, bucket size, "
        "accumulation to communicate less) do not apply: Lightning gathers and scatters at every micro-batch"
    )


def _strategy(o: Observation) -> str:
    return (
        f"local_sgd_period={o.local_sgd_period}" if o.local_sgd_period else f'compression="{o.compression}"'
    )
