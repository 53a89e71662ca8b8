"""The headline figures of a run: steady-state throughput, where step time goes, how busy the hardware is.

Throughput is taken in steady state: the first steps of a run (allocator warm-up, autotuning, lazy
initialisation, compilation) are slower and would understate it. Warm-up ends after the last of the
first half of the steps that took more than 1.5x the median of the second half (and is at least one
step: the first always carries setup).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from tuneup.record.schema import PHASES, Run, StepRecord

WARMUP_FACTOR = 1.5


def warmup_steps(wall_ms: list[float]) -> int:
    """How many leading steps are warm-up, from the step times in order."""
    n = len(wall_ms)
    if n < 4:
        return min(1, n - 1) if n > 1 else 0
    steady = statistics.median(wall_ms[n // 2 :])
    last_slow = -1
    for i, value in enumerate(wall_ms[: n // 2]):
        if value > WARMUP_FACTOR * steady:
            last_slow = i
    return max(1, last_slow + 1)


@dataclass(slots=True)
class RankSummary:
    rank: int
    steps_recorded: int
    warmup_steps: int
    median_step_ms: float
    phase_ms: dict[str, float]  # mean per steady-state step, by phase
    samples_per_s: float | None
    tokens_per_s: float | None
    steps_per_s: float


@dataclass(slots=True)
class RunSummary:
    run_id: str
    world_size: int
    ranks: list[RankSummary]
    samples_per_s: float | None  # all ranks together
    tokens_per_s: float | None
    steps_per_s: float | None
    phase_share: dict[str, float]  # fraction of steady-state step time, over all ranks
    telemetry: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _rank_summary(rank: int, steps: list[StepRecord]) -> RankSummary | None:
    if not steps:
        return None
    warm = warmup_steps([s.wall_ms for s in steps])
    steady = steps[warm:]
    total_s = sum(s.wall_ms for s in steady) / 1000.0
    samples = [s.samples for s in steady]
    tokens = [s.tokens for s in steady]
    return RankSummary(
        rank=rank,
        steps_recorded=len(steps),
        warmup_steps=warm,
        median_step_ms=statistics.median(s.wall_ms for s in steady),
        phase_ms={p: statistics.fmean(getattr(s, p) for s in steady) for p in PHASES},
        samples_per_s=sum(samples) / total_s if total_s > 0 and all(x is not None for x in samples) else None,  # type: ignore[misc]
        tokens_per_s=sum(tokens) / total_s if total_s > 0 and all(x is not None for x in tokens) else None,  # type: ignore[misc]
        steps_per_s=len(steady) / total_s if total_s > 0 else 0.0,
    )


def _telemetry_means(run: Run) -> dict[str, float]:
    cpu, rss, gpu_util, gpu_power = [], [], [], []
    for rec in run.ranks.values():
        for sample in rec.telemetry:
            proc = sample.get("process")
            if isinstance(proc, dict):
                if isinstance(proc.get("cpu_percent"), (int, float)):
                    cpu.append(proc["cpu_percent"])
                if isinstance(proc.get("rss_bytes"), (int, float)):
                    rss.append(proc["rss_bytes"])
            for gpu in sample.get("gpus") or []:
                if isinstance(gpu, dict):
                    if isinstance(gpu.get("util_percent"), (int, float)):
                        gpu_util.append(gpu["util_percent"])
                    if isinstance(gpu.get("power_w"), (int, float)):
                        gpu_power.append(gpu["power_w"])
    out: dict[str, float] = {}
    if cpu:
        out["process_cpu_percent_mean"] = statistics.fmean(cpu)
    if rss:
        out["process_rss_bytes_max"] = max(rss)
    if gpu_util:
        out["gpu_util_percent_mean"] = statistics.fmean(gpu_util)
    if gpu_power:
        out["gpu_power_w_mean"] = statistics.fmean(gpu_power)
    return out


def summarize_run(run: Run) -> RunSummary:
    ranks = [s for r, rec in sorted(run.ranks.items()) if (s := _rank_summary(r, rec.steps)) is not None]
    total_ms = sum(sum(r.phase_ms.values()) for r in ranks)
    share = {p: sum(r.phase_ms[p] for r in ranks) / total_ms for p in PHASES} if total_ms > 0 else {}

    def total(attr: str) -> float | None:
        values = [getattr(r, attr) for r in ranks]
        return sum(values) if values and all(v is not None for v in values) else None

    return RunSummary(
        run_id=run.run_id,
        world_size=run.world_size,
        ranks=ranks,
        samples_per_s=total("samples_per_s"),
        tokens_per_s=total("tokens_per_s"),
        # Ranks step together: the job's step rate is the slowest rank's.
        steps_per_s=min(r.steps_per_s for r in ranks) if ranks else None,
        phase_share=share,
        telemetry=_telemetry_means(run),
        warnings=list(run.warnings),
    )
