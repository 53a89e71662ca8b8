"""The report's cost section: money per sample, token and epoch, projections, MFU and energy.

Pure arithmetic over the analysis's figures, the manifest and the rank streams; no torch. Each figure is
None when what it needs was not recorded, and `notes` says why, so a reader never mistakes a missing
input for a zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tuneup.cost.catalog import CatalogError, load_gpu_specs, match_gpu, peak_tflops_for_precision
from tuneup.cost.pricing import JobPrice, PriceChoice, price_for_run
from tuneup.record.schema import Run

J_PER_KWH = 3.6e6
S_PER_HOUR = 3600.0


@dataclass(frozen=True)
class CostInputs:
    """What the report's caller adds to the run: a price, an electricity price, targets to project to."""

    price: JobPrice | None = None
    not_priced_reason: str | None = None
    electricity_usd_per_kwh: float | None = None
    target_tokens: float | None = None
    target_steps: int | None = None


@dataclass(frozen=True)
class CostOptions:
    """What `tuneup report` may add or replace: a price, a user catalog, electricity, targets."""

    price: PriceChoice | None = None
    catalog: str | None = None
    electricity_usd_per_kwh: float | None = None
    target_tokens: float | None = None
    target_steps: int | None = None


def cost_inputs(run: Run, options: CostOptions | None) -> tuple[CostInputs, list[str]]:
    """The report's price and electricity: the command line's, else what the run recorded."""
    options = options or CostOptions()
    recorded = run.manifest.raw.get("pricing")
    recorded = recorded if isinstance(recorded, dict) else None
    price, reason, warnings = price_for_run(
        recorded,
        options.price,
        devices=run.manifest.world_size,
        nodes=run.manifest.num_nodes,
        catalog_path=options.catalog,
    )
    electricity = options.electricity_usd_per_kwh
    if electricity is None and recorded is not None:
        value = recorded.get("electricity_usd_per_kwh")
        valid = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        electricity = float(value) if valid and value >= 0 else None
    inputs = CostInputs(price, reason, electricity, options.target_tokens, options.target_steps)
    return inputs, warnings


def _r(value: float | None, digits: int = 9) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


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


def _projections(
    report: dict[str, Any], run: Run, inputs: CostInputs, epoch_steps: float | None
) -> list[dict[str, Any]]:
    """Time and money to reach the run's end (max_steps or max_epochs) or the user's targets."""
    tp = report.get("throughput") or {}
    steps_per_s = tp.get("steps_per_s")
    last = report["run"].get("last_step")
    done = (last + 1) if isinstance(last, int) else 0
    t = run.manifest.trainer
    targets: list[tuple[str, float | None]] = []
    max_steps, max_epochs = t.get("max_steps"), t.get("max_epochs")
    if isinstance(max_steps, int) and max_steps > 0:
        targets.append((f"max_steps={max_steps:,}", float(max_steps)))
    elif isinstance(max_epochs, int) and max_epochs > 0:
        targets.append((f"max_epochs={max_epochs}", max_epochs * epoch_steps if epoch_steps else None))
    if inputs.target_steps:
        targets.append((f"{inputs.target_steps:,} steps", float(inputs.target_steps)))
    if inputs.target_tokens:
        tokens_per_step = tp["tokens_per_s"] / steps_per_s if tp.get("tokens_per_s") and steps_per_s else None
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
            {
                "target": label,
                "total_steps": _r(total_steps),
                "steps_remaining": _r(remaining),
                "time_s": _r(time_s),
                "usd": _r(_usd(time_s, price.usd_per_hour if price else None)),
                "usd_spot": _r(_usd(time_s, price.spot_usd_per_hour if price else None)),
            }
        )
    return out


def _money(report: dict[str, Any], usd_per_hour: float | None, epoch_steps: float | None) -> dict[str, Any]:
    tp = report.get("throughput") or {}
    steps_per_s = tp.get("steps_per_s")
    epoch_s = epoch_steps / steps_per_s if epoch_steps and steps_per_s else None
    tokens_per_usd = _per_usd(tp.get("tokens_per_s"), usd_per_hour)
    return {
        "usd_per_hour": _r(usd_per_hour),
        "samples_per_usd": _r(_per_usd(tp.get("samples_per_s"), usd_per_hour)),
        "tokens_per_usd": _r(tokens_per_usd),
        "usd_per_million_tokens": _r(1e6 / tokens_per_usd) if tokens_per_usd else None,
        "usd_per_epoch": _r(_usd(epoch_s, usd_per_hour)),
        "usd_so_far": _r(_usd(report["run"].get("duration_s"), usd_per_hour)),
    }


def _flops(report: dict[str, Any], run: Run) -> dict[str, Any]:
    """Achieved FLOP/s from the FLOPs of one micro-batch (counted, or the user's per sample), and MFU."""
    tp = report.get("throughput") or {}
    steps_per_s = tp.get("steps_per_s")
    accumulate = max(1, int(run.manifest.trainer.get("accumulate_grad_batches") or 1))
    user = (run.manifest.raw.get("flops") or {}).get("flops_per_sample")
    out: dict[str, Any] = {"source": None, "flops_per_step": None, "achieved_tflops_per_s": None}
    total_flops_per_s: float | None = None
    if isinstance(user, (int, float)) and user > 0:
        out.update(source="user (flops_per_sample)", flops_per_sample=_r(float(user)))
        if tp.get("samples_per_s"):
            total_flops_per_s = float(user) * tp["samples_per_s"]
            if steps_per_s:
                out["flops_per_step"] = _r(total_flops_per_s / steps_per_s)
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
            out.update(
                source="counted (FlopCounterMode, one micro-batch per rank)",
                flops_per_step=_r(per_step),
                flops_per_sample=_r(sum(e["flops"] for e in counted.values()) / sum(samples))
                if known
                else None,
            )
            if steps_per_s:
                total_flops_per_s = per_step * steps_per_s
    if out["source"] is None:
        out["note"] = (
            "FLOPs were not counted: TuneupCallback(count_flops=True) or flops_per_sample= records them"
        )
        return out
    devices = max(1, int(run.manifest.world_size))
    out["achieved_tflops_per_s"] = _r(total_flops_per_s / 1e12) if total_flops_per_s else None
    per_device = total_flops_per_s / devices if total_flops_per_s else None
    out["achieved_tflops_per_s_per_device"] = _r(per_device / 1e12) if per_device else None
    gpus = (run.manifest.gpus or {}).get("gpus") or []
    accelerator = str(run.manifest.trainer.get("accelerator") or "")
    if "CPU" in accelerator or (not gpus and "CUDA" not in accelerator):
        out["mfu"] = None
        out["note"] = (
            "MFU is not defined on CPU (no dense tensor peak to compare with); achieved FLOP/s is shown"
        )
        return out
    if not gpus:
        out["mfu"] = None
        out["note"] = (
            "the GPUs were not identified (NVML unavailable): their peak is unknown, MFU is left out"
        )
        return out
    gpu = gpus[0] if isinstance(gpus[0], dict) else {}
    try:
        spec = match_gpu(gpu.get("name"), gpu.get("pci_device_id"), load_gpu_specs())
    except CatalogError:
        spec = None
    precision = str(run.manifest.trainer.get("precision") or "32-true")
    if spec is None:
        out.update(
            mfu=None,
            gpu=gpu.get("name"),
            note=f"no peak for {gpu.get('name')!r} in the GPU catalog: MFU left out",
        )
        return out
    try:
        peak_tflops, column = peak_tflops_for_precision(spec, precision)
    except ValueError:
        peak_tflops, column = None, precision
    out.update(gpu=spec.name, peak_precision=column, peak_tflops_per_device=peak_tflops, gpu_doubt=spec.doubt)
    if peak_tflops is None:
        out.update(
            mfu=None,
            note=f"{spec.name} has no dense {column} peak: MFU is not defined at precision {precision}",
        )
    elif per_device is not None:
        out["mfu"] = _r(per_device / (peak_tflops * 1e12), 4)
        if column == "fp32":
            out["note"] = "peak taken at fp32; if TF32 matmuls are on, the tf32 peak is the fairer one"
    return out


def _energy(report: dict[str, Any], inputs: CostInputs) -> dict[str, Any]:
    """Energy of the GPUs over the span they were measured (the total-energy counter's rise, or the power
    samples integrated where a GPU has no counter); per step and per token from the mean power."""
    measured = [
        g
        for g in (report.get("telemetry") or {}).get("gpus") or []
        if isinstance(g.get("energy_j"), (int, float)) and (g.get("energy_span_s") or 0) > 0
    ]
    if not measured:
        return {"source": None, "note": "no GPU energy or power was recorded (no NVML on this machine)"}
    energy_j = sum(g["energy_j"] for g in measured)
    # Each GPU's mean power over its own span, summed: the job's draw while all of them ran.
    mean_power_w = sum(g["energy_j"] / g["energy_span_s"] for g in measured)
    span_s = max(g["energy_span_s"] for g in measured)
    tp = report.get("throughput") or {}
    per_step_j = mean_power_w / tp["steps_per_s"] if tp.get("steps_per_s") else None
    per_mtok_kwh = mean_power_w / tp["tokens_per_s"] * 1e6 / J_PER_KWH if tp.get("tokens_per_s") else None
    run_kwh = energy_j / J_PER_KWH
    price = inputs.electricity_usd_per_kwh
    return {
        "source": " and ".join(sorted({str(g.get("energy_source")) for g in measured})),
        "gpus": len(measured),
        "span_s": _r(span_s),
        "energy_kwh": _r(run_kwh),
        "mean_power_w": _r(mean_power_w),
        "j_per_step": _r(per_step_j),
        "kwh_per_million_tokens": _r(per_mtok_kwh),
        "electricity_usd_per_kwh": price,
        "electricity_usd": _r(run_kwh * price) if price is not None else None,
        "electricity_usd_per_million_tokens": _r(per_mtok_kwh * price)
        if price is not None and per_mtok_kwh
        else None,
        "note": "GPUs only: host CPUs, memory, networking and cooling are not in it",
    }


def cost_section(report: dict[str, Any], run: Run, inputs: CostInputs) -> dict[str, Any]:
    epoch_steps, epoch_basis = steps_per_epoch(run)
    price = inputs.price
    tp = report.get("throughput") or {}
    section: dict[str, Any] = {
        "priced": price is not None,
        "price": price.as_dict() if price is not None else None,
        "not_priced_reason": None if price is not None else inputs.not_priced_reason,
        "steps_per_epoch": _r(epoch_steps),
        "steps_per_epoch_basis": epoch_basis,
        "epoch_s": _r(epoch_steps / tp["steps_per_s"]) if epoch_steps and tp.get("steps_per_s") else None,
    }
    section["figures"] = _money(report, price.usd_per_hour if price else None, epoch_steps)
    section["figures_spot"] = (
        _money(report, price.spot_usd_per_hour, epoch_steps)
        if price is not None and price.spot_usd_per_hour is not None and not price.spot
        else None
    )
    section["projections"] = _projections(report, run, inputs, epoch_steps)
    section["flops"] = _flops(report, run)
    section["energy"] = _energy(report, inputs)
    return section
