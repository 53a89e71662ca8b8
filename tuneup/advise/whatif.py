"""What would the same workload cost on another instance? Every instance of the catalog (packaged and the
user's CSV), as the step-time model predicts it at the same global batch:

    compute      the run's compute × peak(run GPU) / peak(target GPU), at the run's precision (same MFU)
    optimizer    the run's optimizer step × memory bandwidth(run GPU) / memory bandwidth(target GPU)
    data, other  as measured (the loader and the loop run on the host, not the GPU)
    collectives  ring all-reduce of DDP's buckets over the instance's link (alpha-beta, see `link_fit`)
    memory       peak(b) = m0 + m1·b per GPU, against the GPU's memory less 10%
    spot         the spot price, and the share of paid time lost to interruptions at the Young/Daly
                 checkpoint interval: sqrt(2·C/MTBF)

Rows are ranked by $ per 1M samples (per 1M samples' worth of progress where the gradient noise scale was
measured: the same thing at the run's own global batch). Each figure has an interval from the model's fit,
the cross-GPU compute band and the link's bandwidth range; `WhatIf.assumptions` says every assumption.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuneup.advise.checkpoint import waste_share
from tuneup.advise.context import AdviceContext
from tuneup.advise.memory import (
    DDP_BUCKET_BYTES_PER_PARAMETER,
    MEMORY_HEADROOM,
    MemoryModel,
    memory_model,
)
from tuneup.advise.model import Considered, Predicted, Range, Setting, WhatIf, WhatIfRow
from tuneup.advise.outcomes import Economics, outcome
from tuneup.advise.step_model import StepPrediction, StepTimeModel, with_link
from tuneup.analyze.interruptions import young_daly_interval_s
from tuneup.analyze.model import CollectiveFit
from tuneup.catalog.csv_text import CatalogError
from tuneup.catalog.gpus import PRECISION_TO_COLUMN, GpuSpec, load_gpu_specs, match_gpu
from tuneup.catalog.instances import Instance, InstanceCatalog, load_instances
from tuneup.catalog.interconnects import Interconnect, load_interconnects

GIB = 1024**3

# Compute on another GPU type = compute here × the ratio of dense peaks (same MFU). Habitat (Yu et al.,
# USENIX ATC '21) predicts across six GPU types with 11.8% mean error using per-kernel wave scaling and
# MLPs; a bare peak ratio is cruder (memory-bound kernels follow memory bandwidth, a small model may not
# fill a bigger GPU), so the band is about twice Habitat's mean error.
COMPUTE_SCALE_ERROR = 0.25
# NCCL's own latency model (src/graph/tuning.cc, Ring/Simple, the protocol of MB-sized buckets): per ring
# step on each kind of hop, and once per collective.
NCCL_RING_STEP_LATENCY_US = {"nvlink": 3.4, "pcie": 5.7, "net": 9.6}
NCCL_RING_BASE_LATENCY_US = 8.4
# Where a link has no typical nccl-tests bus bandwidth, this share of its nominal rate per direction
# (low, value, high): the catalog's typical figures sit at 0.32-0.76 of nominal for PCIe Gen4, 0.67-0.77
# for NVLink3 and 0.82 for NVLink4 rings.
NOMINAL_BUSBW_SHARE = (0.5, 0.65, 0.8)
# Spot interruptions without a rate given: one a day. GCP's preemptible VMs stop within 24 h by design,
# and tuneup's interruption analysis shows its example checkpoint interval at this MTBF too.
DEFAULT_INTERRUPTIONS_PER_HOUR = 1 / 24
# A checkpoint's save time where the run timed none: fp32 weights and Adam's moments (12 bytes per
# parameter) written at 0.5 GB/s (between a cloud block volume's baseline, ~0.125 GB/s on AWS gp3, and a
# local NVMe's few GB/s), and never under a second.
CHECKPOINT_BYTES_PER_PARAMETER = 12
CHECKPOINT_WRITE_BYTES_PER_S = 0.5e9
MIN_CHECKPOINT_SAVE_S = 1.0

if TYPE_CHECKING:
    from tuneup.advise.model import AdviceOptions

_NVLINK_GENERATION = re.compile(r"nvlink\s*(\d)", re.IGNORECASE)
_PCIE_GENERATION = re.compile(r"pcie\s*gen\s*(\d)", re.IGNORECASE)
_FIRST_NUMBER = re.compile(r"(\d+(?:\.\d+)?)")


class _Excluded(Exception):
    """An instance the what-if cannot or must not predict for; the message is the reason."""


# -- links -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Link:
    """A link's ring bus bandwidth (low, value, high), bytes per second, and its hop latency."""

    name: str
    hop: str  # "nvlink", "pcie" or "net": which of NCCL's latencies applies
    busbw_bytes_per_s: tuple[float, float, float]
    basis: str  # where the bandwidth comes from


def _catalog_link(row: Interconnect, hop: str) -> Link | None:
    low, high = row.typical_busbw_low_bytes_per_s, row.typical_busbw_high_bytes_per_s
    if low is not None and high is not None:
        return Link(
            row.name, hop, (low, (low + high) / 2, high), f"{row.name}: typical nccl-tests bus bandwidth"
        )
    if row.nominal_bytes_per_s is not None:
        shares = tuple(s * row.nominal_bytes_per_s for s in NOMINAL_BUSBW_SHARE)
        return Link(
            row.name,
            hop,
            (shares[0], shares[1], shares[2]),
            f"{row.name}: {NOMINAL_BUSBW_SHARE[0]:.0%}-{NOMINAL_BUSBW_SHARE[2]:.0%} of its nominal rate (no "
            "typical figure in the catalog)",
        )
    return None


def intra_node_link(instance: Instance, spec: GpuSpec | None, links: Sequence[Interconnect]) -> Link | None:
    """The link between the GPUs of one instance: a catalog key named in the instance's row, else the
    NVLink or PCIe generation of its GPU; None when neither names one."""
    by_key = {row.key.lower(): row for row in links}
    text = instance.intra_node_link.strip()
    named = by_key.get(text.lower())
    if named is not None:
        hop = (
            "nvlink" if "nvlink" in named.key.lower() else ("net" if named.scope == "inter-node" else "pcie")
        )
        return _catalog_link(named, hop)
    lowered = text.lower()
    gpu_link = spec.intra_node_link if spec is not None else ""
    if "nvlink" in lowered or "nvswitch" in lowered:
        match = _NVLINK_GENERATION.search(gpu_link) or _NVLINK_GENERATION.search(text)
        row = by_key.get(f"nvlink{match.group(1)}") if match else None
        return _catalog_link(row, "nvlink") if row is not None else None
    if "pcie" in lowered or "pcie" in gpu_link.lower():
        match = _PCIE_GENERATION.search(gpu_link) or _PCIE_GENERATION.search(text)
        row = by_key.get(f"pcie{match.group(1)}_x16") if match else None
        return _catalog_link(row, "pcie") if row is not None else None
    return None


def inter_node_link(instance: Instance) -> Link | None:
    """The network between nodes, from the instance's `inter_node_gbps` (Gb/s per node): a ring across
    nodes crosses each node's boundary once per channel, and NCCL spreads its channels over the node's
    NICs, so the node's network rate bounds the ring's bus bandwidth."""
    if not instance.inter_node_gbps:
        return None
    match = _FIRST_NUMBER.search(instance.inter_node_gbps)
    if match is None:
        return None
    nominal = float(match.group(1)) * 1e9 / 8
    shares = tuple(s * nominal for s in NOMINAL_BUSBW_SHARE)
    up_to = "up to" in instance.inter_node_gbps.lower()
    return Link(
        f"{instance.inter_node_gbps} Gb/s network",
        "net",
        (shares[0], shares[1], shares[2]),
        f"{NOMINAL_BUSBW_SHARE[0]:.0%}-{NOMINAL_BUSBW_SHARE[2]:.0%} of the node's {match.group(1)} Gb/s"
        + (" (a burst figure: 'up to')" if up_to else ""),
    )


def link_fit(link: Link, world_size: int, end: int) -> CollectiveFit:
    """The all-reduce alpha-beta fit of `link` at one end of its bandwidth range (0 low, 1 value, 2 high):
    α per ring step from NCCL's latency model, its per-collective base latency spread over the 2(p−1)
    steps; β = 1 / bus bandwidth (the ring form of the model makes 1/β the bus bandwidth)."""
    steps = max(1, 2 * (world_size - 1))
    alpha_us = NCCL_RING_STEP_LATENCY_US[link.hop] + NCCL_RING_BASE_LATENCY_US / steps
    busbw = link.busbw_bytes_per_s[end]
    return CollectiveFit(
        kind="all_reduce",
        alpha_us=alpha_us,
        beta_ns_per_byte=1e9 / busbw,
        busbw_gbytes_per_s=busbw / 1e9,
        r_squared=None,
        points=0,
        sizes=0,
        notes=[f"from the catalog, not measured: {link.basis}"],
    )


def slower_link(a: Link, b: Link) -> Link:
    """A ring through both links runs at the slower one's bandwidth and waits on the slower hop."""
    bw = tuple(min(x, y) for x, y in zip(a.busbw_bytes_per_s, b.busbw_bytes_per_s, strict=True))
    latency = max((a, b), key=lambda link: NCCL_RING_STEP_LATENCY_US[link.hop])
    slow = a if a.busbw_bytes_per_s[1] <= b.busbw_bytes_per_s[1] else b
    return Link(f"{a.name} + {b.name}", latency.hop, (bw[0], bw[1], bw[2]), f"the slower of: {slow.basis}")


# -- memory ------------------------------------------------------------------------------------------


# -- batch -------------------------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def split_batch(global_batch: int, gpus: int, accumulation: int) -> tuple[int, int, str | None]:
    """(micro-batch per rank, accumulation, note) that keep `global_batch` over `gpus`: the run's
    accumulation where it divides the rank's share, else the largest divisor under it; where the global
    batch does not divide over the GPUs, the nearest per-rank share (at least 1) and a note."""
    note = None
    if global_batch % gpus == 0:
        per_rank = global_batch // gpus
    else:
        per_rank = max(1, round(global_batch / gpus))
        note = (
            f"global batch {global_batch} does not divide over {gpus} GPUs: {per_rank} per rank, global batch "
            f"{per_rank * gpus}"
        )
    s = max(d for d in _divisors(per_rank) if d <= max(1, accumulation))
    if s != accumulation and note is None:
        note = f"accumulation {accumulation} -> {s} to keep global batch {global_batch}"
    return per_rank // s, s, note


# -- spot --------------------------------------------------------------------------------------------


def rework_share(checkpoint_save_s: float, mtbf_s: float) -> float:
    """Share of paid time lost to interruptions at the Young/Daly interval τ = sqrt(2·C·MTBF): saving
    (C/τ) plus redoing half an interval per interruption (τ/(2·MTBF)), which is sqrt(2·C/MTBF) at τ."""
    return waste_share(young_daly_interval_s(checkpoint_save_s, mtbf_s), checkpoint_save_s, mtbf_s)


# -- prediction --------------------------------------------------------------------------------------


def _widen(predictions: Sequence[StepPrediction], model: StepTimeModel) -> StepPrediction:
    """The first prediction's value with an interval over all of them (the ends of each band)."""
    mid = predictions[0]
    mean = Range(
        mid.mean_ms.value,
        min(p.mean_ms.low for p in predictions),
        max(p.mean_ms.high for p in predictions),
    )
    return StepPrediction(mean, mean.scaled(model.median_over_mean), mid.terms_ms)


@dataclass(frozen=True, slots=True)
class _RunDevice:
    peak_tflops: float
    column: str  # the precision column of the GPU catalog the peak is from
    spec: GpuSpec | None


def _run_device(ctx: AdviceContext, specs: Sequence[GpuSpec]) -> _RunDevice | str:
    """The run's GPU and peak at its precision, or why compute cannot be scaled."""
    o = ctx.observation
    if not o.on_gpu:
        return (
            "this run trained on CPUs: its compute cannot be scaled to a GPU (no peak, no MFU to carry over), "
            "so no instance is predicted. Record a short run on one GPU (any in the catalog) and the what-if "
            "ranks every instance from it"
        )
    spec = match_gpu(o.gpu_name, specs=specs) if o.gpu_name else None
    cost = ctx.analysis.cost
    flops = cost.flops if cost is not None else None
    column = getattr(flops, "peak_precision", None) or PRECISION_TO_COLUMN.get(
        str(o.precision or "32-true").lower()
    )
    # The catalog's own peak where it knows the GPU, so that both ends of the ratio come from one source.
    peak = spec.peak_tflops.get(column) if spec is not None and column is not None else None
    peak = peak or o.peak_tflops_per_device
    if peak is None or column is None:
        return (
            f"the run's GPU ({o.gpu_name or 'unnamed'}) has no dense peak at precision {o.precision} in the GPU "
            "catalog, so its compute cannot be scaled to another GPU; no instance is predicted"
        )
    return _RunDevice(peak, column, spec)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the what-if holds for every row: the workload, its economics and the spot assumptions."""

    ctx: AdviceContext
    options_target: float | None
    global_batch: int
    nodes: int
    device: _RunDevice
    memory: MemoryModel | None
    gradient_bytes: float
    checkpoint_save_s: float
    mtbf_s: float


def _economics(plan: _Plan, usd_per_device_hour: float) -> Economics:
    e = plan.ctx.economics
    return dataclasses.replace(
        e, usd_per_device_hour=usd_per_device_hour, b_reference=plan.ctx.observation.samples_per_step
    )


def _fit_setting(
    plan: _Plan, gpus: int, memory_bytes: float | None
) -> tuple[Setting, str | None, float | None]:
    o = plan.ctx.observation
    b, s, note = split_batch(plan.global_batch, gpus, o.accumulation)
    if plan.memory is None or memory_bytes is None:
        return Setting(b, s, gpus, o.precision, o.num_workers), note, None
    usable = memory_bytes * (1 - MEMORY_HEADROOM)
    per_rank = b * s
    # Where the micro-batch does not fit, more accumulation of smaller micro-batches keeps the global batch.
    for more in (d for d in _divisors(per_rank) if d >= s):
        micro = per_rank // more
        peak = plan.memory.peak_bytes(micro, gpus)
        if peak <= usable:
            if more != s:
                note = f"accumulation {s} -> {more} (micro-batch {micro}) to fit in memory"
            return Setting(micro, more, gpus, o.precision, o.num_workers), note, peak
    smallest = plan.memory.peak_bytes(1, gpus)
    raise _Excluded(
        f"does not fit in memory: {smallest / GIB:.1f} GiB predicted per GPU at micro-batch 1, "
        f"{usable / GIB:.1f} GiB usable of {memory_bytes / GIB:.1f} GiB ({MEMORY_HEADROOM:.0%} kept free)"
    )


def _rows_for(
    plan: _Plan, instance: Instance, specs: Sequence[GpuSpec], links: Sequence[Interconnect]
) -> list[WhatIfRow]:
    ctx, o, device = plan.ctx, plan.ctx.observation, plan.device
    spec = instance.gpu_spec(specs)
    if spec is None:
        raise _Excluded(f"GPU {instance.gpu!r} is not in the GPU catalog: no peak to scale compute by")
    target_peak = spec.peak_tflops.get(device.column)
    if target_peak is None:
        raise _Excluded(
            f"{spec.name} has no {device.column} peak: precision {o.precision} does not run at speed there"
        )
    gpus = instance.gpu_count * plan.nodes
    memory_gib = instance.gpu_mem_gib or spec.mem_gib
    setting, note, peak_bytes = _fit_setting(plan, gpus, memory_gib * GIB if memory_gib else None)
    notes = [note] if note else []

    same_gpu = device.spec is not None and device.spec.name == spec.name
    band = 0.0 if same_gpu else COMPUTE_SCALE_ERROR
    k = device.peak_tflops / target_peak
    compute_scale = Range(k, k * (1 - band), k * (1 + band))
    if device.spec is not None:
        kb = device.spec.mem_bw_gbytes_per_s / spec.mem_bw_gbytes_per_s
        optimizer_scales = (kb, kb * (1 - band), kb * (1 + band))
    else:
        optimizer_scales = (1.0, 1.0, 1.0)
        notes.append("optimizer step kept as measured (the run's GPU is not in the catalog)")

    link: Link | None = None
    if gpus > 1:
        intra = intra_node_link(instance, spec, links) if instance.gpu_count > 1 else None
        if instance.gpu_count > 1 and intra is None:
            raise _Excluded(
                f"the catalog names no bandwidth for its link ({instance.intra_node_link or 'none given'})"
            )
        if plan.nodes > 1:
            inter = inter_node_link(instance)
            if inter is None:
                raise _Excluded("the catalog gives no network between nodes for it")
            link = inter if intra is None else slower_link(intra, inter)
        else:
            link = intra
        if not plan.gradient_bytes and not ctx.model.bucket_bytes:
            notes.append("collectives unknown (the run recorded no parameter count): step time without them")

    base = ctx.model if link is None else with_link(ctx.model, [], plan.gradient_bytes)
    predictions: list[StepPrediction] = []
    for opt_end, link_end in ((0, 1), (1, 0), (1, 2), (2, 0), (2, 2)):  # the value first, then the corners
        model = dataclasses.replace(base, optimizer_ms=base.optimizer_ms * optimizer_scales[opt_end])
        fits = [link_fit(link, gpus, link_end)] if link is not None else None
        predictions.append(model.predict(setting, compute_scale, None, fits))
    step = _widen(predictions, base)

    if not instance.host_included:
        notes.append("GPU-only price: the host VM costs extra")
    if instance.doubt:
        notes.append(f"catalog doubt: {instance.doubt}")

    def row(spot: bool) -> WhatIfRow | None:
        price = instance.spot_usd_per_hour if spot else instance.on_demand_usd_per_hour
        if price is None:
            return None
        predicted: Predicted = outcome(setting, step, _economics(plan, price / instance.gpu_count))
        usd_samples, usd_tokens = predicted.usd_per_million_samples, predicted.usd_per_million_tokens
        share = None
        row_notes = list(notes)
        if spot:
            share = rework_share(plan.checkpoint_save_s, plan.mtbf_s)
            # Paid time over useful time: every $ figure rises by 1/(1 - lost share).
            factor = 1 / (1 - share)
            usd_samples = usd_samples.scaled(factor) if usd_samples else None
            usd_tokens = usd_tokens.scaled(factor) if usd_tokens else None
            interval_s = young_daly_interval_s(plan.checkpoint_save_s, plan.mtbf_s)
            row_notes.append(f"checkpoint every {interval_s / 60:.0f} min (Young/Daly)")
        to_target = None
        if plan.options_target is not None and usd_samples is not None:
            # Samples to the target grow as statistical efficiency falls (E = 1 at the run's global batch).
            efficiency = predicted.statistical_efficiency or 1.0
            to_target = usd_samples.scaled(plan.options_target / 1e6 / efficiency)
        return WhatIfRow(
            instance=instance.qualified_key,
            provider=instance.provider,
            gpu=spec.name,
            gpus=gpus,
            nodes=plan.nodes,
            usd_per_hour=price * plan.nodes,
            fits_in_memory=None if peak_bytes is None else True,
            step_ms=predicted.step_ms,
            samples_per_s=predicted.samples_per_s,
            goodput_samples_per_s=predicted.goodput_samples_per_s,
            usd_per_million_samples=usd_samples,
            usd_to_target=to_target,
            spot=spot,
            rework_share=share,
            note="; ".join(row_notes) or None,
            usd_per_million_tokens=usd_tokens,
            global_batch=setting.global_batch,
            batch_size=setting.batch_size,
            accumulate_grad_batches=setting.accumulate_grad_batches,
            link=link.name if link is not None else None,
            compute_scale=k,
            peak_memory_gib=peak_bytes / GIB if peak_bytes is not None else None,
            statistical_efficiency=predicted.statistical_efficiency,
        )

    spot_viable = rework_share(plan.checkpoint_save_s, plan.mtbf_s) < 1
    return [r for r in (row(False), row(True) if spot_viable else None) if r is not None]


def _rank_key(row: WhatIfRow) -> tuple[int, float]:
    if row.usd_per_million_samples is None:
        return (1, 0.0)
    efficiency = row.statistical_efficiency or 1.0
    return (0, row.usd_per_million_samples.value / efficiency)


def _select(catalog: InstanceCatalog, keys: Sequence[str]) -> tuple[list[Instance], list[Considered]]:
    if not keys:
        return list(catalog), []
    chosen: list[Instance] = []
    missing: list[Considered] = []
    for key in keys:
        try:
            instance = catalog.lookup(key)
        except CatalogError as exc:
            missing.append(Considered(key, str(exc)))
            continue
        if instance not in chosen:
            chosen.append(instance)
    return chosen, missing


def _checkpoint_save_s(ctx: AdviceContext) -> tuple[float, str]:
    interruptions = ctx.analysis.interruptions
    measured = interruptions.checkpoint_save_s if interruptions is not None else None
    if measured:
        return measured, f"checkpoint save {measured:.1f} s, as this run timed it"
    parameters = ctx.observation.parameters
    if parameters:
        save_s = max(
            MIN_CHECKPOINT_SAVE_S, CHECKPOINT_BYTES_PER_PARAMETER * parameters / CHECKPOINT_WRITE_BYTES_PER_S
        )
        return save_s, (
            f"checkpoint save {save_s:.1f} s assumed (the run timed none): {CHECKPOINT_BYTES_PER_PARAMETER} bytes "
            f"per parameter written at {CHECKPOINT_WRITE_BYTES_PER_S / 1e9:g} GB/s"
        )
    return 60.0, "checkpoint save 60 s assumed (the run timed none and recorded no parameter count)"


def what_if(
    ctx: AdviceContext,
    options: AdviceOptions,
    *,
    catalog: InstanceCatalog | None = None,
    gpu_specs: Sequence[GpuSpec] | None = None,
    links: Sequence[Interconnect] | None = None,
    global_batch: int | None = None,
    nodes: int | None = None,
) -> WhatIf:
    """The same workload on every instance of the catalog (or `options.instances`), best first.

    From `options`: user_catalog, instances, target_samples, interruptions_per_hour, and global_batch and
    nodes where AdviceOptions has them (the keywords here win; defaults: the run's global batch, 1 node). `catalog`, `gpu_specs` and `links` replace the packaged
    catalogs (tests, a user's GPU rows)."""
    o = ctx.observation
    specs = list(gpu_specs) if gpu_specs is not None else load_gpu_specs()
    link_rows = list(links) if links is not None else load_interconnects()
    global_batch = global_batch or options.global_batch or o.samples_per_step
    nodes = nodes or options.nodes or 1
    target_samples = options.target_samples
    target = None
    if target_samples is not None:
        target = f"{target_samples:.3g} samples"
        if ctx.economics.tokens_per_sample:
            target += f" ({target_samples * ctx.economics.tokens_per_sample:.3g} tokens)"
    noise_known = ctx.economics.b_noise is not None
    ranked_by = (
        "$ per 1M samples' worth of progress (the noise scale weighs each global batch)"
        if noise_known
        else "$ per 1M samples"
    )
    device = _run_device(ctx, specs)
    if isinstance(device, str):
        return WhatIf(global_batch, nodes, target, [device], [], [], ranked_by)
    if o.sharding is not None:
        # The rows scale DDP's gradient all-reduce over each instance's GPUs: not a sharded run's collectives.
        why = (
            f"this run was sharded ({o.sharding}): other instances are not predicted, since the what-if scales "
            "DDP's gradient all-reduce over each instance's GPUs and not the all-gathers and reduce-scatters of "
            "sharded units"
        )
        return WhatIf(global_batch, nodes, target, [why], [], [], ranked_by)
    if catalog is None:
        catalog = load_instances(options.user_catalog)
    instances, excluded = _select(catalog, options.instances)

    # Gradients are in the parameters' dtype: fp32 under mixed precision, 16-bit only for "*-true" 16-bit.
    bytes_per_element = 2 if o.precision in ("bf16-true", "16-true") else 4
    gradient_bytes = float(o.parameters * bytes_per_element) if o.parameters else 0.0
    memory = memory_model(ctx.model_observations or [o], o)
    save_s, save_basis = _checkpoint_save_s(ctx)
    rate = options.interruptions_per_hour
    rate_given = rate is not None and rate > 0
    per_hour = rate if rate_given else DEFAULT_INTERRUPTIONS_PER_HOUR
    plan = _Plan(
        ctx, target_samples, global_batch, nodes, device, memory, gradient_bytes, save_s, 3600.0 / per_hour
    )

    rows: list[WhatIfRow] = []
    for instance in instances:
        try:
            rows.extend(_rows_for(plan, instance, specs, link_rows))
        except _Excluded as why:
            excluded.append(Considered(instance.qualified_key, str(why)))
    rows.sort(key=_rank_key)

    mfu = f"{o.mfu:.0%}" if o.mfu is not None else "unmeasured"
    assumptions = [
        f"compute scales with the GPUs' dense {device.column} peak ({device.peak_tflops:g} TFLOP/s on the run's "
        f"{o.gpu_name or 'GPU'}) at the run's MFU ({mfu}), within ±{COMPUTE_SCALE_ERROR:.0%} on another GPU type "
        "(about twice Habitat's 11.8% mean error across GPU types, USENIX ATC '21, since a bare peak ratio "
        "ignores memory-bound kernels)",
        "the optimizer step scales with the GPUs' memory bandwidth (Adam's update reads and writes every "
        "parameter's state), within the same band; data loading and the loop's own time stay as measured "
        "(they run on the host: an instance with fewer CPUs may load slower)",
        "the gradients' all-reduce is a ring over DDP's 25 MiB buckets at the link's typical nccl-tests bus "
        "bandwidth (or a share of its nominal rate), with NCCL's own ring latencies (3.4 us per NVLink step, "
        "5.7 PCIe, 9.6 network); across nodes the slower of the node's link and its network"
        + (
            "; overlap with backward is unknown (one rank measured), so the interval spans none to full"
            if o.world_size == 1
            else ""
        ),
        f"global batch {global_batch} on {nodes} node(s) of each instance, all of its GPUs, the run's "
        "accumulation where it divides; more accumulation of smaller micro-batches where memory requires",
    ]
    if memory is not None:
        assumptions.append(
            f"{memory.basis}; {MEMORY_HEADROOM:.0%} of the GPU's memory kept free (CUDA context, allocator "
            f"fragmentation); DDP's gradient buckets add {DDP_BUCKET_BYTES_PER_PARAMETER} bytes per parameter on "
            "several GPUs"
            if memory.ddp_bucket_bytes
            else f"{memory.basis}; {MEMORY_HEADROOM:.0%} of the GPU's memory kept free"
        )
    else:
        assumptions.append("the run recorded no GPU memory peak: whether each instance fits is unknown")
    rate_text = (
        f"{per_hour:g} interruptions per hour, as given"
        if rate_given
        else "one interruption per 24 h assumed (GCP preemptible VMs stop within 24 h; pass "
        "interruptions_per_hour for your provider's rate)"
    )
    lost = rework_share(save_s, plan.mtbf_s)
    assumptions.append(
        f"spot rows: {rate_text}; {save_basis}; checkpoints at the Young/Daly interval, losing "
        f"sqrt(2·C/MTBF) = {lost:.1%} of paid time, in their $ figures"
        if lost < 1
        else f"no spot rows: at {rate_text} and {save_basis}, interruptions come faster than checkpoints can "
        "keep up (sqrt(2·C/MTBF) >= 1)"
    )
    if target_samples is not None and noise_known:
        assumptions.append("$ to the target counts the samples a global batch needs: target / E(B)")
    version = catalog.version + (f" + {catalog.user_catalog}" if catalog.user_catalog else "")
    return WhatIf(global_batch, nodes, target, assumptions, rows, excluded, ranked_by, version)
