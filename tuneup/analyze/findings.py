"""Findings in plain words, each with the evidence that supports it.

A finding states what was measured, not what to do about it (recommendations are their own module).
Thresholds are named here, with the reason for each, so a reader of a finding can see why it fired.
"""

from __future__ import annotations

import dataclasses

from tuneup.analyze.contention import CONTENDED_HOST_BUSY_PERCENT, CONTENDED_OTHERS_PERCENT
from tuneup.analyze.model import (
    Communication,
    DataLoading,
    Finding,
    RunInfo,
    StepTime,
    StragglerInfo,
    Telemetry,
    Warmup,
)
from tuneup.analyze.throughput import MIN_STEPS_FOR_SPREAD

# Input waits above this share of the step leave the accelerator idle often enough to matter.
DATA_WAIT_SHARE = 0.10
# Time outside the named phases above this share points at per-batch overhead (callbacks, logging).
OTHER_SHARE = 0.15
# Waiting in the trainer's own per-batch collectives above this share: ranks arrive at the batch boundary
# at different times, by a margin worth finding (a straggler, uneven data).
SYNC_SHARE = 0.10
# Below this average utilization a GPU is idle for a large part of the run.
LOW_GPU_UTIL_PERCENT = 50.0
# Communication the step waits for, above this share of the step, is worth overlapping or shrinking.
EXPOSED_COMM_SHARE = 0.10
# Warm-up longer than this share of the recorded steps distorts short benchmark runs.
LONG_WARMUP_SHARE = 0.10
# GPU memory above this share of its total leaves no room for a larger batch.
GPU_MEMORY_FULL_SHARE = 0.95
# Throttle reasons that mean the GPU ran slower than it could for reasons outside the workload.
SERIOUS_THROTTLES = frozenset({"hw_slowdown", "hw_thermal", "sw_thermal", "hw_power_brake"})
# A p95 step more than twice the median: one step in twenty takes twice the typical one or longer, so the
# mean (and the throughput) is carried by the tail, and a second run of the same job can read differently.
# A steady GPU step's p95 sits within ~10% of its median; a loaded CPU host's within ~50%.
HEAVY_TAIL_P95_OVER_MEDIAN = 2.0
# A slow period (slow_periods.py) is a finding from this share of the steady time: a shorter one moves the
# figures by less than their run-to-run noise. At most this many are named, the costliest first.
SLOW_PERIOD_SHARE = 0.02
MAX_SLOW_PERIOD_FINDINGS = 3
# Up to this many contended hosts get a finding each; more (a shared cluster) get one finding together.
MAX_CONTENDED_HOSTS_NAMED = 3


def lightning_max_workers(cpu_count: int, local_ranks: int) -> int:
    """Lightning's `suggested_max_num_workers`: max(1, CPUs // local ranks − 1). More loader workers than
    this take turns on the CPUs with the training (and each other)."""
    return max(1, cpu_count // max(1, local_ranks) - 1)


def findings(
    run: RunInfo,
    warmup: Warmup,
    step_time: StepTime,
    data_loader: DataLoading,
    telemetry: Telemetry,
    communication: Communication | None,
    straggler: StragglerInfo | None,
) -> list[Finding]:
    """Every finding the run's figures support, most costly first within each kind."""
    out: list[Finding] = []
    phases = step_time.phases
    step_ms = step_time.mean_ms or 0.0
    if straggler is not None:
        out.append(
            Finding(
                "straggler",
                "warning",
                f"Rank {straggler.rank} holds the other ranks back in {straggler.phase}",
                straggler.summary,
            )
        )
    data = phases.get("data")
    if data and data.share >= DATA_WAIT_SHARE:
        out.append(
            Finding(
                "data_wait",
                "warning",
                f"Data wait is {data.share:.0%} of step time",
                f"{data.ms:.1f} ms of the {step_ms:.1f} ms mean step is spent fetching batches "
                f"(num_workers={data_loader.num_workers}).",
            )
        )
    if data_loader.stall_count:
        worst = data_loader.worst_stalls[0]
        out.append(
            Finding(
                "data_stalls",
                "info",
                f"{data_loader.stall_count} data-loader stall(s)",
                f"Steps whose data wait exceeded {data_loader.stall_threshold_ms:.1f} ms; the worst, "
                f"{worst.data_ms:.1f} ms, at step {worst.step} on rank {worst.rank}.",
            )
        )
    sync = phases.get("sync")
    if sync and sync.share >= SYNC_SHARE:
        out.append(
            Finding(
                "sync_wait",
                "info",
                f"{sync.share:.0%} of step time is spent in the trainer's own collectives between batches",
                f"{sync.ms:.1f} ms per step in Lightning's per-batch SIGTERM flag broadcast and strategy "
                "barriers: a rank waits there for slower ranks, so the time is the others' extra data, forward "
                "or optimizer time (see the per-rank breakdown), not the collective's own cost.",
            )
        )
    other = phases.get("other")
    if other and other.share >= OTHER_SHARE:
        out.append(
            Finding(
                "other_time",
                "info",
                f"{other.share:.0%} of step time is outside data, forward, backward, optimizer and sync",
                f"{other.ms:.1f} ms per step goes to the trainer's per-batch work after the optimizer step "
                "and between batches: other callbacks, logging, learning-rate schedulers, progress.",
            )
        )
    for gpu in telemetry.gpus:
        name = f"GPU {gpu.index}" + (f" on {gpu.host}" if gpu.host else "")
        if gpu.util_percent_mean is not None and gpu.util_percent_mean < LOW_GPU_UTIL_PERCENT:
            out.append(
                Finding(
                    "low_gpu_util",
                    "warning",
                    f"{name} was busy {gpu.util_percent_mean:.0f}% of the time",
                    f"GPU utilization averaged {gpu.util_percent_mean:.0f}% "
                    # Not the series' length: at scale the series is thinned for the plots.
                    f"(max {gpu.util_percent_max or 0:.0f}%) over the run.",
                )
            )
        if (
            gpu.mem_used_bytes_max
            and gpu.mem_total_bytes
            and gpu.mem_used_bytes_max / gpu.mem_total_bytes >= GPU_MEMORY_FULL_SHARE
        ):
            out.append(
                Finding(
                    "gpu_memory_full",
                    "info",
                    f"{name} memory was nearly full",
                    f"Peak {gpu.mem_used_bytes_max / 2**30:.1f} GiB of {gpu.mem_total_bytes / 2**30:.1f} GiB.",
                )
            )
        serious = sorted(set(gpu.throttle_reasons) & SERIOUS_THROTTLES)
        if serious:
            out.append(
                Finding(
                    "gpu_throttled",
                    "warning",
                    f"{name} was throttled",
                    f"Clock throttle reasons seen: {', '.join(serious)}.",
                )
            )
        if gpu.lost:
            out.append(
                Finding(
                    "gpu_lost", "warning", f"{name} stopped answering NVML", "NVML reported the GPU lost."
                )
            )
    out.extend(_contention_findings(telemetry))
    out.extend(_worker_findings(run, data_loader))
    out.extend(_slow_period_findings(step_time))
    out.extend(_noise_findings(step_time))
    out.extend(_communication_findings(communication))
    if warmup.share >= LONG_WARMUP_SHARE and warmup.steps > 1:
        out.append(
            Finding(
                "long_warmup",
                "info",
                f"Warm-up took {warmup.steps} steps",
                f"{warmup.share:.0%} of the recorded steps were slower than 1.5x the steady step time "
                "and are left out of throughput.",
            )
        )
    if run.missing_ranks:
        out.append(
            Finding(
                "missing_ranks",
                "warning",
                f"{len(run.missing_ranks)} rank(s) left no record",
                f"Rank(s) {', '.join(map(str, run.missing_ranks))} of {run.world_size} wrote nothing here"
                + _missing_hosts(run)
                + "; every figure covers the ranks present only.",
            )
        )
    unclosed = [r for r, s in run.status.items() if s == "not closed"]
    if unclosed:
        out.append(
            Finding(
                "unclosed_ranks",
                "warning",
                f"{len(unclosed)} rank(s) stopped without closing",
                f"Rank(s) {', '.join(unclosed)} were killed or are still running; "
                "their last flush interval is missing.",
            )
        )
    return out


def _missing_hosts(run: RunInfo) -> str:
    """Where the missing ranks ran (their hosts, gathered at setup), and what a whole missing host most
    likely means."""
    by_host: dict[str, list[int]] = {}
    for rank in run.missing_ranks:
        host = run.hosts.get(str(rank))
        if host:
            by_host.setdefault(host, []).append(rank)
    if not by_host:
        return ""
    where = "; ".join(
        f"host {host} ran rank(s) {', '.join(map(str, ranks))}" for host, ranks in by_host.items()
    )
    present = {run.hosts.get(str(r)) for r in run.ranks_present}
    if present.isdisjoint(by_host):
        # No rank of those hosts is here: they wrote to a directory of the same name on their own disk.
        return (
            f" ({where}): no rank of those hosts recorded here, so they most likely wrote to their own disk. "
            "Copy their rank-* directories into this one, or record to a path every node shares"
        )
    return f" ({where})"


def _worker_findings(run: RunInfo, loader: DataLoading) -> list[Finding]:
    """More DataLoader workers than the host's CPUs allow (a DataModule's num_workers=16 on 2 CPUs): said
    where the user looks, whatever the advice can predict of it."""
    workers, cpus = loader.num_workers, run.hardware.cpu_count
    if not workers or not cpus:
        return []
    local_ranks = max(1, run.world_size // max(1, run.num_nodes))
    bound = lightning_max_workers(cpus, local_ranks)
    if workers <= bound:
        return []
    return [
        Finding(
            "too_many_workers",
            "warning",
            f"num_workers={workers} on {cpus} CPU(s) for {local_ranks} rank(s): more loader workers than CPUs",
            f"Lightning's bound is max(1, {cpus} CPUs // {local_ranks} local rank(s) − 1) = {bound} worker(s) per "
            f"rank. The {workers} workers take turns on the CPUs with the training, and each holds a copy of the "
            f"Dataset and its prefetched batches: set `DataLoader(num_workers={bound})` at most (`tuneup advise` "
            "names the number the CPUs the run left allow: 0 where none were spare).",
        )
    ]


def _contention_findings(telemetry: Telemetry) -> list[Finding]:
    contended = sorted((c for c in telemetry.cpu_contention if c.contended), key=lambda c: -c.contended_share)
    if len(contended) > MAX_CONTENDED_HOSTS_NAMED:
        # A shared cluster: one finding for all of them, not one per host.
        worst = contended[:MAX_CONTENDED_HOSTS_NAMED]
        return [
            Finding(
                "cpu_contention",
                "warning",
                f"{len(contended)} of {len(telemetry.cpu_contention)} hosts had their CPU taken by other processes",
                f"Other processes used at least {CONTENDED_OTHERS_PERCENT:.0f}% of the cores of a host at least "
                f"{CONTENDED_HOST_BUSY_PERCENT:.0f}% busy; the most contended: "
                + "; ".join(
                    f"{c.host or '?'} for {c.contended_share:.0%} of the run (others "
                    f"{c.others_percent_mean or 0:.0f}% of its {c.cores} cores on average)"
                    for c in worst
                ),
            )
        ]
    out = []
    for c in contended:
        where = f"Host {c.host}" if c.host else "The host"
        ranks = "rank" if len(c.ranks) == 1 else "ranks"
        its = "its" if len(c.ranks) == 1 else "their"
        out.append(
            Finding(
                "cpu_contention",
                "warning",
                f"{where}'s CPU was taken by other processes for {c.contended_share:.0%} of the run",
                f"In {c.contended_share:.0%} of {c.samples} telemetry samples the host was at least "
                f"{CONTENDED_HOST_BUSY_PERCENT:.0f}% busy while processes other than the training's used at "
                f"least {CONTENDED_OTHERS_PERCENT:.0f}% of its {c.cores} cores. Mean over the run, in shares "
                f"of the host's {c.cores} cores: host busy {c.host_busy_percent_mean or 0:.0f}%, the training "
                f"({ranks} {', '.join(map(str, c.ranks))} with {its} workers) "
                f"{c.training_percent_mean or 0:.0f}%, others {c.others_percent_mean or 0:.0f}%. Step times "
                "measured on a contended host are slower and noisier than the job's own",
            )
        )
    return out


def _slow_period_findings(step_time: StepTime) -> list[Finding]:
    periods = step_time.slow_periods
    worth = [p for p in periods if p.share_of_time >= SLOW_PERIOD_SHARE]
    named = sorted(
        sorted(worth, key=lambda p: -p.share_of_time)[:MAX_SLOW_PERIOD_FINDINGS], key=lambda p: p.first_step
    )
    out = []
    for p in named:
        out.append(
            Finding(
                "slow_period",
                "warning",
                f"Slow period: steps {p.first_step}–{p.last_step} ran {p.slowdown:.1f}× the steady step "
                f"time ({p.steps} steps, {p.share_of_time:.0%} of the time)",
                f"For {p.duration_s:,.0f} s the median step was {p.median_ms:.2f} ms against a steady step "
                f"time of {p.baseline_ms:.2f} ms (the lower quartile of the steady steps: the pace kept when "
                "nothing slows the job). These steps are not warm-up (a flat stretch, not a leading transient), and "
                "they stay in the throughput and step-time figures: they are part of what the job delivered",
            )
        )
    if len(periods) > len(named) and out:
        last = out[-1]
        out[-1] = dataclasses.replace(
            last, evidence=f"{last.evidence}; Where step time goes lists all {len(periods)} slow periods"
        )
    return out


def _noise_findings(step_time: StepTime) -> list[Finding]:
    steps = sum(r.steps for r in step_time.per_rank)
    median, p95, mean = step_time.median_ms, step_time.p95_ms, step_time.mean_ms
    if steps < MIN_STEPS_FOR_SPREAD or not median or not mean or p95 is None:
        return []
    out = []
    if p95 > HEAVY_TAIL_P95_OVER_MEDIAN * median:
        out.append(
            Finding(
                "heavy_tailed_steps",
                "info",
                f"Step times are heavy-tailed: the p95 step is {p95 / median:.1f}× the median",
                f"The p95 step took {p95:.2f} ms, the median {median:.2f} ms (mean {mean:.2f} ms): slow "
                "steps carry much of the mean, so the step-time figures of this run are noisy and a rerun "
                "can read differently",
            )
        )
    # Every phase the step-time table labels noisy (throughput.is_noisy), so the label has its evidence.
    noisy = [(name, ph) for name, ph in step_time.phases.items() if ph.noisy and ph.median_ms is not None]
    if noisy:
        names = [name for name, _ in noisy]
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        out.append(
            Finding(
                "noisy_phases",
                "info",
                f"The {listed} time is noisy: slow steps pull its mean above its median"
                if len(names) == 1
                else f"The {listed} times are noisy: slow steps pull their means above their medians",
                "; ".join(
                    f"{name}: mean {ph.ms:.2f} ms ({ph.share:.0%} of the mean step), median "
                    f"{ph.median_ms:.2f} ms, p95 {ph.p95_ms or 0:.2f} ms"
                    for name, ph in noisy
                )
                + ". The means still add up to the step; the median is what a typical step spends",
            )
        )
    return out


def _communication_findings(comm: Communication | None) -> list[Finding]:
    if comm is None:
        return []
    out: list[Finding] = []
    exposed_share = comm.exposed_share_of_step
    if exposed_share is not None and exposed_share >= EXPOSED_COMM_SHARE:
        share = comm.share_of_step or 0.0
        out.append(
            Finding(
                "exposed_communication",
                "warning",
                f"The step waits {exposed_share:.0%} of its time for communication",
                f"{comm.exposed_ms_per_step or 0:.1f} ms per step of the {comm.comm_ms_per_step or 0:.1f} ms of "
                f"collectives is not overlapped with {'compute' if comm.exposed_by_phase else 'backward compute'} "
                f"({share:.0%} of the step is communication)"
                + (
                    f"; most of it is waiting for rank {comm.late_rank.rank}, which arrives late."
                    if comm.late_rank
                    else "."
                ),
            )
        )
    if comm.link is not None and comm.link.far_below:
        out.append(
            Finding(
                "slow_link",
                "warning",
                f"Collectives run far below what {comm.link.name} gives",
                comm.link.summary or "",
            )
        )
    if comm.late_rank is not None:
        out.append(
            Finding(
                "late_rank",
                "warning",
                f"Rank {comm.late_rank.rank} arrives late at the collectives",
                comm.late_rank.summary,
            )
        )
    return out
