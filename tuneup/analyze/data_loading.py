"""Data loading: how long steps wait for input, and the stalls where a batch came far too late."""

from __future__ import annotations

import statistics

from tuneup._stats import finite
from tuneup.analyze.model import DataLoading, Stall
from tuneup.record.schema import Run, StepRecord

# A step whose data wait exceeds both of these is a data-loader stall.
STALL_FACTOR_OF_MEDIAN = 3.0
STALL_SHARE_OF_STEP = 0.25
WORST_STALLS = 10


def data_loading(run: Run, steady: dict[int, list[StepRecord]], step_median_ms: float | None) -> DataLoading:
    data_all = [s.data_ms for steps in steady.values() for s in steps]
    median_data = statistics.median(data_all) if data_all else 0.0
    threshold = max(STALL_FACTOR_OF_MEDIAN * median_data, STALL_SHARE_OF_STEP * (step_median_ms or 0.0))
    stalls = [
        Stall(rank=rank, step=s.step, data_ms=finite(s.data_ms), wall_ms=finite(s.wall_ms))  # type: ignore[arg-type]
        for rank, steps in sorted(steady.items())
        for s in steps
        if s.data_ms > threshold and not s.checkpoint
    ]
    stalls.sort(key=lambda x: -x.data_ms)
    dl = run.manifest.dataloader
    return DataLoading(
        median_data_ms=finite(median_data),
        stall_threshold_ms=finite(threshold),
        stall_count=len(stalls),
        stall_total_ms=finite(sum(x.data_ms for x in stalls)),
        worst_stalls=stalls[:WORST_STALLS],
        num_workers=dl.get("num_workers"),
        pin_memory=dl.get("pin_memory"),
        persistent_workers=dl.get("persistent_workers"),
        batch_size=dl.get("batch_size"),
    )
