"""What one run's analysis says about its workload, in the terms the step-time model and the advice use:
per-step phase times, the batch, the collectives, compute, price and memory. Read from `RunAnalysis`
alone, so that advice can be given from a report.json as well as from a run directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tuneup.analyze.model import CollectiveFit, RunAnalysis
from tuneup.analyze.sharding import sharding

# How far a rerun of one setting lands from another on the same quiet machine (mean step).
RUN_TO_RUN_NOISE = 0.03


class AdviceInputError(ValueError):
    """A run cannot be advised on (no steady steps, no batch size): names the problem and the fix."""


@dataclass(frozen=True, slots=True)
class Observation:
    run_id: str
    batch_size: int  # per rank and micro-batch
    accumulation: int
    world_size: int
    num_nodes: int
    precision: str | None
    on_gpu: bool
    gpu_name: str | None
    step_mean_ms: float
    step_median_ms: float
    # Mean per training step over all ranks (phases of the step clock); backward holds the wait for
    # exposed gradient collectives (`exposed_in_backward_ms`), "other" local SGD's parameter averages
    # (`averaging_per_step_ms`).
    data_ms: float
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    sync_ms: float
    other_ms: float
    # The gradient collectives' summed durations, the part the step waited for after backward, and their
    # bytes (per rank), per step that all-reduced gradients: under local SGD its exact warm-up's steps
    # (`synced_share` of the steady steps), whose all-reduce the model holds its collectives to.
    comm_ms: float | None
    exposed_ms: float | None
    comm_bytes: float | None
    bucket_bytes: tuple[int, ...]  # one steady step's collectives, in launch order
    fits: tuple[CollectiveFit, ...]
    backend: str | None
    samples_per_s: float | None
    tokens_per_sample: float | None
    flops_per_sample: float | None
    mfu: float | None
    peak_tflops_per_device: float | None
    usd_per_hour: float | None  # the whole run (every device it used)
    devices_priced: int | None
    parameters: int | None
    gpu_peak_allocated_bytes: int | None
    gpu_mem_total_bytes: int | None
    cpu_count: int | None
    ranks_per_node: int
    num_workers: int | None
    pin_memory: bool | None
    persistent_workers: bool | None
    # TuneupDDPStrategy as the run used it (None: DDP's exact all-reduce), so that advice never proposes what
    # the run already has, and the parameter average's measured time where the run averaged (per average).
    local_sgd_period: int | None = None
    compression: str | None = None  # "fp16", "bf16" or "powersgd"
    averaging_ms: float | None = None
    # The share of the steady steps that all-reduced gradients: 1.0 but under local SGD, whose local steps
    # (the rest) sent none and waited for none in backward.
    synced_share: float = 1.0
    # The exact steps TuneupDDPStrategy took before it started, as this run set it (None: no strategy).
    strategy_start_step: int | None = None
    run_steps: int | None = None  # optimizer steps the run was set to take (max_steps), else took
    # Whether the host's CPU has bf16 arithmetic (AVX512-BF16 or AMX); None: not recorded.
    cpu_bf16: bool | None = None
    # Host contention (tuneup/analyze/contention.py): whether some host of the run had its CPU taken by other
    # processes, and the largest share of its CPUs they took (0-1); None: no telemetry read it.
    contended: bool | None = None
    others_cpu_share: float | None = None
    # "FSDP2" or "FSDP" where the run sharded its model (tuneup.analyze.sharding), None otherwise. Its
    # collectives (`comm_ms`) are all-gathers and reduce-scatters inside forward and backward at every
    # micro-batch, `exposed_ms` the wait for them (None: not measured), and it has no `bucket_bytes`.
    sharding: str | None = None
    # FSDP2's units reshard their parameters after forward (the run's manifest); None: not said, or mixed.
    reshard_after_forward: bool | None = None

    @property
    def step_noise(self) -> float:
        """How far this run's mean step may sit from its setting's true one, as a relative error: the
        run-to-run noise of a quiet host, the tail's pull on the mean (mean over median: slow steps that
        another run may or may not have), and, on a contended host, half the share of its CPUs other
        processes took (others at 77% of a 2-CPU host moved one setting's mean step 25% between runs, and
        a quiet moment ran it 13x faster)."""
        tail = abs(self.step_mean_ms / self.step_median_ms - 1) if self.step_median_ms > 0 else 0.0
        noise = max(RUN_TO_RUN_NOISE, tail)
        if self.contended:
            noise = max(noise, (self.others_cpu_share or 0.0) / 2)
        return noise

    @property
    def samples_per_step(self) -> int:
        return self.batch_size * self.accumulation * self.world_size

    @property
    def exposed_in_backward_ms(self) -> float:
        """The wait for gradient collectives per steady step, as the phases count (a mean over all of them):
        in backward, on the steps that synced gradients (a sharded run's, in forward and backward)."""
        return (self.exposed_ms or 0.0) * self.synced_share

    @property
    def averaging_per_step_ms(self) -> float:
        """Local SGD's parameter averages per steady step: one every `local_sgd_period` local steps, in the
        "other" phase (the average runs after the optimizer step); 0 without local SGD."""
        if self.local_sgd_period is None or self.averaging_ms is None:
            return 0.0
        return self.averaging_ms / self.local_sgd_period * (1.0 - self.synced_share)

    @property
    def compute_per_micro_batch_ms(self) -> float:
        """Forward and backward of one micro-batch, without the exposed wait for collectives (only what
        backward waited: a local SGD run's averages wait in "other", not here)."""
        return max(0.0, self.forward_ms + self.backward_ms - self.exposed_in_backward_ms) / self.accumulation


def observe(analysis: RunAnalysis) -> Observation:
    """The workload figures of an analysed run. Raises AdviceInputError when the run cannot carry advice."""
    run = analysis.run
    step = analysis.step_time
    if analysis.warmup.no_steady_state or step.mean_ms is None or step.median_ms is None:
        why = analysis.warmup.no_steady_state or "no steady steps were recorded"
        raise AdviceInputError(
            f"run {run.run_id} has no steady state to advise on ({why}); record more steps (100 or more "
            "after warm-up) and run tuneup advise again"
        )
    batch = run.batch_size_per_rank or analysis.data_loader.batch_size
    tp = analysis.throughput
    if not batch and tp.samples_per_s and tp.steps_per_s:
        # No batch size in the manifest: the samples each rank counted per micro-batch.
        per_step = tp.samples_per_s / tp.steps_per_s / max(1, run.world_size)
        batch = round(per_step / max(1, run.accumulate_grad_batches)) or None
    if not batch:
        raise AdviceInputError(
            f"run {run.run_id} did not record its batch size; give the DataLoader a batch_size (or the "
            "LightningModule a `batch_size` attribute) so tuneup can record it"
        )
    phases = step.phases

    def phase(name: str) -> float:
        p = phases.get(name)
        return p.ms if p is not None else 0.0

    comm = analysis.communication
    comm_ms = exposed = comm_bytes = None
    bucket_bytes: tuple[int, ...] = ()
    fits: tuple[CollectiveFit, ...] = ()
    backend = None
    if comm is not None and run.world_size > 1:
        comm_ms, exposed = comm.comm_ms_per_step, comm.exposed_ms_per_step
        per_step = [r.bytes_per_step for r in comm.per_rank if r.bytes_per_step is not None]
        comm_bytes = sum(per_step) / len(per_step) if per_step else None
        # The steady step's buckets: the most frequent size of each bucket index (DDP rebuilds its buckets
        # once, after the first step, so the first step's sizes differ).
        by_bucket: dict[int, tuple[int, int]] = {}
        for b in comm.per_bucket:
            if b.bucket not in by_bucket or b.count > by_bucket[b.bucket][1]:
                by_bucket[b.bucket] = (b.bytes, b.count)
        bucket_bytes = tuple(v[0] for _, v in sorted(by_bucket.items()))
        fits = tuple(comm.fits)
        backend = comm.backend
    cost = analysis.cost
    flops = cost.flops if cost is not None else None
    price = cost.price if cost is not None and cost.priced else None
    throughput = analysis.throughput
    tokens_per_sample = (
        throughput.tokens_per_s / throughput.samples_per_s
        if throughput.tokens_per_s and throughput.samples_per_s
        else None
    )
    loader = analysis.data_loader
    hw = run.hardware
    mem_totals = [g.mem_total_bytes for g in analysis.telemetry.gpus if g.mem_total_bytes]
    ranks_per_node = max(1, run.world_size // max(1, run.num_nodes))
    strategy = _sync_strategy(analysis)
    if strategy.local_sgd_period is not None:
        # Local SGD sends no gradient: the collectives the model holds its gradient all-reduce to are the
        # exact warm-up's, per step that ran them; the averages are `averaging_ms`.
        comm_ms, exposed, comm_bytes = strategy.exact_comm_ms, strategy.exact_exposed_ms, strategy.exact_bytes
    host = analysis.environment.host or {}
    cpu_bf16 = host.get("cpu_bf16")
    contention = [c for c in analysis.telemetry.cpu_contention if c.samples]
    others = [c.others_percent_mean / 100.0 for c in contention if c.others_percent_mean is not None]
    run_steps = run.max_steps if run.max_steps and run.max_steps > 0 else None
    if run_steps is None and run.last_step is not None:
        run_steps = run.last_step + 1
    return Observation(
        run_id=run.run_id,
        batch_size=int(batch),
        accumulation=max(1, run.accumulate_grad_batches),
        world_size=run.world_size,
        num_nodes=run.num_nodes,
        precision=run.precision,
        on_gpu=bool(run.accelerator and "cuda" in run.accelerator.lower())
        or bool(run.accelerator and "gpu" in run.accelerator.lower()),
        gpu_name=hw.gpu_names[0] if hw.gpu_names else None,
        step_mean_ms=step.mean_ms,
        step_median_ms=step.median_ms,
        data_ms=phase("data"),
        forward_ms=phase("forward"),
        backward_ms=phase("backward"),
        optimizer_ms=phase("optimizer"),
        sync_ms=phase("sync"),
        other_ms=phase("other"),
        comm_ms=comm_ms,
        exposed_ms=exposed,
        comm_bytes=comm_bytes,
        bucket_bytes=bucket_bytes,
        fits=fits,
        backend=backend,
        samples_per_s=throughput.samples_per_s,
        tokens_per_sample=tokens_per_sample,
        flops_per_sample=flops.flops_per_sample if flops is not None else None,
        mfu=flops.mfu if flops is not None else None,
        peak_tflops_per_device=flops.peak_tflops_per_device if flops is not None else None,
        usd_per_hour=price.usd_per_hour if price is not None else None,
        devices_priced=price.devices if price is not None else None,
        parameters=run.parameters,
        gpu_peak_allocated_bytes=analysis.telemetry.gpu_allocated_peak_bytes,
        gpu_mem_total_bytes=min(mem_totals) if mem_totals else None,
        cpu_count=hw.cpu_count,
        ranks_per_node=ranks_per_node,
        num_workers=loader.num_workers,
        pin_memory=loader.pin_memory,
        persistent_workers=loader.persistent_workers,
        local_sgd_period=strategy.local_sgd_period,
        compression=strategy.compression,
        averaging_ms=strategy.averaging_ms,
        synced_share=strategy.synced_share,
        strategy_start_step=analysis.sync_strategy.start_step if analysis.sync_strategy is not None else None,
        run_steps=run_steps,
        cpu_bf16=cpu_bf16 if isinstance(cpu_bf16, bool) else None,
        contended=any(c.contended for c in contention) if contention else None,
        others_cpu_share=min(1.0, max(others)) if others else None,
        sharding=sharding(run),
        reshard_after_forward=(
            run.fsdp.reshard_after_forward
            if run.fsdp is not None and isinstance(run.fsdp.reshard_after_forward, bool)
            else None
        ),
    )


_LOCAL_SGD = re.compile(r"local SGD, H=(\d+)")


@dataclass(frozen=True, slots=True)
class _Strategy:
    """The TuneupDDPStrategy a run used, as the model reads it (all None: DDP's exact all-reduce)."""

    local_sgd_period: int | None = None
    compression: str | None = None  # "fp16", "bf16" or "powersgd"
    averaging_ms: float | None = None  # per parameter average, as the local phase measured it
    # Local SGD: the exact warm-up's collectives per step, and its share of the steady steps.
    exact_comm_ms: float | None = None
    exact_exposed_ms: float | None = None
    exact_bytes: float | None = None
    synced_share: float = 1.0


def _sync_strategy(analysis: RunAnalysis) -> _Strategy:
    """The TuneupDDPStrategy the run used, from its section's label (tuneup.sync.config.SyncConfig.label
    spells it). Under local SGD each figure is of the phase it was measured in: the gradient all-reduce of
    the exact warm-up's steady steps, and the average's cost from the local steps that averaged against
    those that did not (a median over both phases once read it as 0: the warm-up's exact steps are the
    slower ones)."""
    sync = analysis.sync_strategy
    if sync is None:
        return _Strategy()
    label = sync.label
    match = _LOCAL_SGD.search(label)
    if match:
        timed = sync.exact_steps_timed + sync.strategy_steps_timed
        return _Strategy(
            local_sgd_period=int(match.group(1)),
            averaging_ms=sync.averaging_ms,
            exact_comm_ms=sync.exact_comm_ms,
            exact_exposed_ms=sync.exact_exposed_comm_ms,
            exact_bytes=sync.exact_bytes_per_step,
            synced_share=sync.exact_steps_timed / timed if timed else 1.0,
        )
    lowered = label.lower()
    for name in ("fp16", "bf16", "powersgd"):
        if name in lowered:
            return _Strategy(compression=name)
    return _Strategy()
