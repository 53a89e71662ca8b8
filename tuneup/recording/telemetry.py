"""The telemetry sampler of a recorded fit: NVML and psutil samples into the rank's record, and the GPUs'
latest mean utilization for the headline figures."""

from __future__ import annotations

from typing import Any

from tuneup.collect.sampler import TelemetrySampler, default_sensors
from tuneup.record.writer import RankWriter
from tuneup.recording.headline import HeadlineMetrics


def start_sampler(
    writer: RankWriter, local_rank: int, interval_s: float, headline: HeadlineMetrics | None
) -> TelemetrySampler:
    def sink(sample: dict[str, Any]) -> None:
        if headline is not None:
            gpus = sample.get("gpus")
            if isinstance(gpus, list) and gpus:
                utils = [g["util_percent"] for g in gpus if isinstance(g.get("util_percent"), (int, float))]
                headline.gpu_util_percent = sum(utils) / len(utils) if utils else None
        writer.add_telemetry(sample)

    sampler = TelemetrySampler(default_sensors(local_rank=local_rank), sink, interval_s=interval_s)
    sampler.start()
    return sampler
