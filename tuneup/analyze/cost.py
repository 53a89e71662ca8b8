"""The report's cost section: money per sample, token and epoch, projections, MFU and energy.

Part of the analysis, as every section is: it reads the analysis's own figures (throughput, telemetry, the
timeline) and the price tuneup.cost resolved (`CostInputs`), and nothing below it reads back. Pure
arithmetic over the analysis's figures, the manifest and the rank streams; no torch. Each figure is None
when what it needs was not recorded, and `notes` says why, so a reader never mistakes a missing input for
a zero.
"""

from __future__ import annotations

import dataclasses
import math

from tuneup._stats import finite
from tuneup.analyze.model import (
    Compute,
    Cost,
    Energy,
    Money,
    Price,
    PricedInstance,
    Projection,
    RunInfo,
    Telemetry,
    Throughput,
    Timeline,
)
from tuneup.catalog import CATALOG_VERSION, CatalogError, load_gpu_specs, match_gpu, peak_tflops_for_precision
from tuneup.cost.options import CostInputs
from tuneup.cost.pricing import JobPrice
from tuneup.record.schema import Run

J_PER_KWH = 3.6e6
S_PER_HOUR = 3600.0


def _per_usd(rate_per_s: float | None, usd_per_hour: float | None) -> float | None:
    if rate_per_s is None or not usd_per_hour:
        return None
    return rate_per_s * S_PER_HOUR / usd_per_hour


def _usd(seconds: float | None, usd_per_hour: float | None) -> float | None:
    if seconds is None or usd_per_hour is None:
        return None
    return seconds / S_PER_HOUR * usd_per_hour


def steps_per_epoch(run: Run) -> tuple[float | None, str]:
    """Optimizer steps in one epoch, and how that was found: from the dataset, batch size, ranks and
    accumulation (DistributedSampler splits the dataset across ranks)."""
    m = run.manifest
    d, t = m.dataloader, m.trainer
    length, batch = d.get("dataset_len"), d.get("batch_size")
    if not isinstance(length, int) or not isinstance(batch, int) or batch <= 0 or length <= 0:
        return None, "the dataset's length or the batch size was not recorded"
    world = max(1, int(m.world_size))
    per_rank = math.ceil(length / world) if d.get("sampler") == "DistributedSampler" or world > 1 else length
    batches = per_rank // batch if d.get("drop_last") else math.ceil(per_rank / batch)
    limit = t.get("limit_train_batches")
    if isinstance(limit, float) and 0 < limit < 1:
        batches = int(batches * limit)
    elif isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
        batches = min(batches, limit)
    accumulate = max(1, int(t.get("accumulate_grad_batches") or 1))
    steps = math.ceil(batches / accumulate) if batches else 0
    return (
        float(steps) if steps else None,
        f"{length:,} samples / {world} rank(s) / batch {batch} / accumulation {accumulate}",
    )


def optimizer_steps_per_step(run: Run) -> float:
    """Optimizer steps per training step: Lightning's max_steps counts every optimizer's steps, so a GAN
    stepping two optimizers per batch reaches max_steps in half as many batches. 1 where not recorded."""
    ratios = []
    for rec in run.ranks.values():
        raw = rec.info.raw
        opt0, opt1 = raw.get("optimizer_steps_at_start"), raw.get("optimizer_steps_at_end")
        s0, s1 = raw.get("global_step_at_start"), raw.get("steps_at_end")
        if all(isinstance(v, int) for v in (opt0, opt1, s0, s1)) and s1 > s0 and opt1 > opt0:  # type: ignore[operator]
            ratios.append((opt1 - opt0) / (s1 - s0))  # type: ignore[operator]
    return max(ratios) if ratios else 1.0


def _loop_factor(fit: Timeline | None) -> float:
    """Seconds of the fit per second of training steps: 1 plus the validation, saves and fit-loop time
    each step brought along in this run (1 where the run recorded no timeline)."""
    return 1.0 + ((fit.loop_overhead_share or 0.0) if fit is not None else 0.0)


def _projections(
    throughput: Throughput,
    last_step: int | None,
    run: Run,
    inputs: CostInputs,
    epoch_steps: float | None,
    fit: Timeline | None,
) -> list[Projection]:
    """Time and money to reach the run's end (max_steps or max_epochs) or the user's targets, at the
    steady step rate plus the validation, saves and fit-loop time each step brings along. A run that has
    ended has nothing to go: only the user's targets are projected, from step 0."""
    steps_per_s = throughput.steps_per_s / _loop_factor(fit) if throughput.steps_per_s else None
    ended = fit is not None and fit.ended
    done = 0 if ended else (last_step + 1) if isinstance(last_step, int) else 0
    t = run.manifest.trainer
    targets: list[tuple[str, float | None]] = []
    max_steps, max_epochs = t.get("max_steps"), t.get("max_epochs")
    if ended:
        pass
    elif isinstance(max_steps, int) and max_steps > 0:
        per_step = optimizer_steps_per_step(run)
        label = f"max_steps={max_steps:,}" + (
            f" ({per_step:g} optimizer steps per step)" if per_step != 1 else ""
        )
        targets.append((label, max_steps / per_step))
    elif isinstance(max_epochs, int) and max_epochs > 0:
        targets.append((f"max_epochs={max_epochs}", max_epochs * epoch_steps if epoch_steps else None))
    if inputs.target_steps:
        targets.append((f"{inputs.target_steps:,} steps", float(inputs.target_steps)))
    if inputs.target_tokens:
        tokens_per_step = (
            throughput.tokens_per_s / steps_per_s if throughput.tokens_per_s and steps_per_s else None
        )
        targets.append(
            (
                f"{inputs.target_tokens:,.0f} tokens",
                inputs.target_tokens / tokens_per_step if tokens_per_step else None,
            )
        )
    price = inputs.price
    out = []
    for label, total_steps in targets:
        remaining = max(0.0, total_steps - done) if total_steps is not None else None
        time_s = remaining / steps_per_s if remaining is not None and steps_per_s else None
        out.append(
            Projection(
                target=label,
                total_steps=finite(total_steps),
                steps_remaining=finite(remaining),
                time_s=finite(time_s),
                usd=finite(_usd(time_s, price.usd_per_hour if price else None)),
                usd_spot=finite(_usd(time_s, price.spot_usd_per_hour if price else None)),
            )
        )
    return out


def _epoch_s(throughput: Throughput, epoch_steps: float | None, fit: Timeline | None) -> float | None:
    """An epoch's time: its steps at the steady rate, plus validation, saves and fit-loop time at this
    run's share of them."""
    steps_per_s = throughput.steps_per_s
    if not epoch_steps or not steps_per_s:
        return None
    return epoch_steps / steps_per_s * _loop_factor(fit)


def _money(
    throughput: Throughput,
    duration_s: float | None,
    usd_per_hour: float | None,
    epoch_steps: float | None,
    fit: Timeline | None,
) -> Money:
    epoch_s = _epoch_s(throughput, epoch_steps, fit)
    tokens_per_usd = _per_usd(throughput.tokens_per_s, usd_per_hour)
    return Money(
        usd_per_hour=finite(usd_per_hour),
        samples_per_usd=finite(_per_usd(throughput.samples_per_s, usd_per_hour)),
        tokens_per_usd=finite(tokens_per_usd),
        usd_per_million_tokens=finite(1e6 / tokens_per_usd) if tokens_per_usd else None,
        usd_per_epoch=finite(_usd(epoch_s, usd_per_hour)),
        usd_so_far=finite(_usd(duration_s, usd_per_hour)),
    )


def compute_figures(throughput: Throughput, run: Run) -> Compute:
    """Achieved FLOP/s from the FLOPs of one micro-batch (counted, or the user's per sample), and MFU."""
    steps_per_s = throughput.steps_per_s
    samples_per_s = throughput.samples_per_s
    accumulate = max(1, int(run.manifest.trainer.get("accumulate_grad_batches") or 1))
    user = (run.manifest.raw.get("flops") or {}).get("flops_per_sample")
    source: str | None = None
    flops_per_step = flops_per_sample = None
    total_flops_per_s: float | None = None
    if isinstance(user, (int, float)) and user > 0:
        source, flops_per_sample = "user (flops_per_sample)", finite(float(user))
        if samples_per_s:
            total_flops_per_s = float(user) * samples_per_s
            if steps_per_s:
                flops_per_step = finite(total_flops_per_s / steps_per_s)
    else:
        counted = {}
        for rank, rec in run.ranks.items():
            for e in rec.events:
                if e.get("kind") == "flops" and isinstance(e.get("flops"), (int, float)) and e["flops"] > 0:
                    counted[rank] = e
                    break
        if counted:
            # Every rank that counted runs as many micro-batches per step; a rank that did not count is
            # taken to do what the others do (DDP and FSDP ranks compute the same model on equal batches).
            mean_flops = sum(e["flops"] for e in counted.values()) / len(counted)
            per_step = mean_flops * accumulate * run.manifest.world_size
            samples = [e.get("samples") for e in counted.values()]
            known = all(isinstance(n, int) and n > 0 for n in samples)
            source = "counted (FlopCounterMode, one micro-batch per rank)"
            flops_per_step = finite(per_step)
            flops_per_sample = (
                finite(sum(e["flops"] for e in counted.values()) / sum(samples)) if known else None
            )
            if steps_per_s:
                total_flops_per_s = per_step * steps_per_s
    if source is None:
        return Compute(
            source=None,
            flops_per_step=None,
            achieved_tflops_per_s=None,
            note="FLOPs were not counted: TuneupCallback(count_flops=True) or flops_per_sample= records them",
        )
    devices = max(1, int(run.manifest.world_size))
    per_device = total_flops_per_s / devices if total_flops_per_s else None
    counted_figures = {
        "source": source,
        "flops_per_step": flops_per_step,
        "flops_per_sample": flops_per_sample,
        "achieved_tflops_per_s": finite(total_flops_per_s / 1e12) if total_flops_per_s else None,
        "achieved_tflops_per_s_per_device": finite(per_device / 1e12) if per_device else None,
    }
    gpus = (run.manifest.gpus or {}).get("gpus") or []
    accelerator = str(run.manifest.trainer.get("accelerator") or "")
    if "CPU" in accelerator or (not gpus and "CUDA" not in accelerator):
        return Compute(
            **counted_figures,
            note="MFU is not defined on CPU (no dense tensor peak to compare with); achieved FLOP/s is shown",
        )
    if not gpus:
        return Compute(
            **counted_figures,
            note="the GPUs were not identified (NVML unavailable): their peak is unknown, MFU is left out",
        )
    gpu = gpus[0] if isinstance(gpus[0], dict) else {}
    try:
        spec = match_gpu(gpu.get("name"), gpu.get("pci_device_id"), load_gpu_specs())
    except CatalogError:
        spec = None
    precision = str(run.manifest.trainer.get("precision") or "32-true")
    if spec is None:
        name = gpu.get("name")
        return Compute(
            **counted_figures,
            gpu=None if name is None else str(name),
            note=f"no peak for {name!r} in the GPU catalog: MFU left out",
        )
    try:
        peak_tflops, column = peak_tflops_for_precision(spec, precision)
    except ValueError:
        peak_tflops, column = None, precision
    peak = {
        "gpu": spec.name,
        "peak_precision": column,
        "peak_tflops_per_device": peak_tflops,
        "gpu_doubt": spec.doubt,
    }
    if peak_tflops is None:
        return Compute(
            **counted_figures,
            **peak,
            note=f"{spec.name} has no dense {column} peak: MFU is not defined at precision {precision}",
        )
    return Compute(
        **counted_figures,
        **peak,
        mfu=finite(per_device / (peak_tflops * 1e12)) if per_device is not None else None,
        note="peak taken at fp32; if TF32 matmuls are on, the tf32 peak is the fairer one"
        if column == "fp32" and per_device is not None
        else None,
    )


def energy_figures(telemetry: Telemetry, throughput: Throughput, inputs: CostInputs) -> Energy:
    """Energy of the GPUs over the span they were measured (the total-energy counter's rise, or the power
    samples integrated where a GPU has no counter); per step and per token from the mean power."""
    measured = [g for g in telemetry.gpus if g.energy_j is not None and (g.energy_span_s or 0) > 0]
    if not measured:
        return Energy(source=None, note="no GPU energy or power was recorded (no NVML on this machine)")
    energy_j = sum(g.energy_j for g in measured)  # type: ignore[misc]
    # Each GPU's mean power over its own span, summed: the job's draw while all of them ran.
    mean_power_w = sum(g.energy_j / g.energy_span_s for g in measured)  # type: ignore[operator]
    span_s = max(g.energy_span_s for g in measured)  # type: ignore[type-var]
    per_step_j = mean_power_w / throughput.steps_per_s if throughput.steps_per_s else None
    per_mtok_kwh = (
        mean_power_w / throughput.tokens_per_s * 1e6 / J_PER_KWH if throughput.tokens_per_s else None
    )
    run_kwh = energy_j / J_PER_KWH
    price = inputs.electricity_usd_per_kwh
    return Energy(
        source=" and ".join(sorted({str(g.energy_source) for g in measured})),
        gpus=len(measured),
        span_s=finite(span_s),
        energy_kwh=finite(run_kwh),
        mean_power_w=finite(mean_power_w),
        j_per_step=finite(per_step_j),
        kwh_per_million_tokens=finite(per_mtok_kwh),
        electricity_usd_per_kwh=price,
        electricity_usd=finite(run_kwh * price) if price is not None else None,
        electricity_usd_per_million_tokens=finite(per_mtok_kwh * price)
        if price is not None and per_mtok_kwh
        else None,
        note="GPUs only: host CPUs, memory, networking and cooling are not in it",
    )


def price_figures(price: JobPrice) -> Price:
    instance = price.instance
    packaged = instance is not None and instance.origin == "packaged"
    return Price(
        usd_per_hour=price.usd_per_hour,
        spot_usd_per_hour=price.spot_usd_per_hour,
        basis=price.basis,
        source=price.source,
        devices=price.devices,
        nodes=price.nodes,
        instance=None if instance is None else PricedInstance(**dataclasses.asdict(instance)),
        spot=price.spot,
        doubts=list(price.doubts),
        catalog_version=CATALOG_VERSION if packaged else None,
    )


def cost_section(
    run: Run,
    inputs: CostInputs,
    info: RunInfo,
    throughput: Throughput,
    telemetry: Telemetry,
    fit: Timeline | None = None,
) -> Cost:
    """What the job costs and what it buys, from the run's typed figures and the price it was given;
    `fit` (the job timeline) adds validation, saves and fit-loop time to epochs and projections."""
    epoch_steps, epoch_basis = steps_per_epoch(run)
    price = inputs.price
    return Cost(
        priced=price is not None,
        price=price_figures(price) if price is not None else None,
        not_priced_reason=None if price is not None else inputs.not_priced_reason,
        steps_per_epoch=finite(epoch_steps),
        steps_per_epoch_basis=epoch_basis,
        epoch_s=finite(_epoch_s(throughput, epoch_steps, fit)),
        figures=_money(throughput, info.duration_s, price.usd_per_hour if price else None, epoch_steps, fit),
        figures_spot=_money(throughput, info.duration_s, price.spot_usd_per_hour, epoch_steps, fit)
        if price is not None and price.spot_usd_per_hour is not None and not price.spot
        else None,
        projections=_projections(throughput, info.last_step, run, inputs, epoch_steps, fit),
        flops=compute_figures(throughput, run),
        energy=energy_figures(telemetry, throughput, inputs),
        loop_overhead_share=fit.loop_overhead_share if fit is not None else None,
        run_ended=fit is not None and fit.ended,
        stop_reason=fit.stop_reason if fit is not None else None,
    )
