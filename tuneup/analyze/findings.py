"""Findings in plain words, each with the evidence that supports it.

A finding states what was measured, not what to do about it (recommendations are their own module).
Thresholds are named here, with the reason for each, so a reader of a finding can see why it fired.
"""

from __future__ import annotations

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

# Input waits above this share of the step leave the accelerator idle often enough to matter.
DATA_WAIT_SHARE = 0.10
# Time outside the four named phases above this share points at per-batch overhead (callbacks, logging,
# synchronizing collectives) or waiting for another rank.
OTHER_SHARE = 0.15
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
    other = phases.get("other")
    if other and other.share >= OTHER_SHARE:
        out.append(
            Finding(
                "other_time",
                "info",
                f"{other.share:.0%} of step time is outside data, forward, backward and optimizer",
                f"{other.ms:.1f} ms per step goes to other callbacks, logging, the trainer's "
                "per-batch work and waiting for other ranks between batches.",
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
                f"Rank(s) {', '.join(map(str, run.missing_ranks))} of {run.world_size} wrote nothing; "
                "every figure covers the ranks present only.",
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
                f"collectives is not hidden behind backward compute ({share:.0%} of the step is communication)"
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
