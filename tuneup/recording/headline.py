"""The run's headline figures every few steps, for the trainer's own loggers (TensorBoard, W&B...): means
over the steps since the last log, by the report's definitions (tuneup._stats.rate_per_s, as tuneup.analyze.throughput).

The windows are summed on the drainer's thread, where step records are resolved; the adapter hands the
queued figures to its loggers on the training thread (loggers are not all safe to call from another)."""

from __future__ import annotations

from collections import deque

from tuneup._stats import rate_per_s
from tuneup.record.schema import StepRecord

Metrics = tuple[int, dict[str, float]]  # (the last step of the window, name -> value)


class HeadlineMetrics:
    def __init__(self, every_steps: int, world_size: int) -> None:
        self.every_steps = every_steps
        self.world_size = world_size
        self.gpu_util_percent: float | None = None  # the latest telemetry sample's mean, set by its sink
        self._window: list[StepRecord] = []
        self.queue: deque[Metrics] = deque()  # figures waiting for the loggers, oldest first

    def add(self, record: StepRecord) -> None:
        """A resolved step (drainer's thread)."""
        self._window.append(record)
        if (record.step + 1) % self.every_steps == 0:
            self.queue.append(self.figures(self._window))
            self._window = []

    def figures(self, records: list[StepRecord]) -> Metrics:
        wall_ms = sum(r.wall_ms for r in records)
        n = len(records)
        metrics: dict[str, float] = {
            "tuneup/step_time_ms": wall_ms / n,
            "tuneup/data_wait_ms": sum(r.data_ms for r in records) / n,
            "tuneup/forward_ms": sum(r.forward_ms for r in records) / n,
            "tuneup/backward_ms": sum(r.backward_ms for r in records) / n,
            "tuneup/optimizer_ms": sum(r.optimizer_ms for r in records) / n,
        }
        # Rank 0's count times the world size: exact when ranks see equal batches, as DDP's sampler makes them.
        for counts, name in (
            ([r.samples for r in records], "tuneup/samples_per_s"),
            ([r.tokens for r in records], "tuneup/tokens_per_s"),
        ):
            if None not in counts and sum(counts):  # type: ignore[arg-type]
                rate = rate_per_s(sum(counts) * self.world_size, wall_ms)  # type: ignore[arg-type]
                if rate is not None:
                    metrics[name] = rate
        if self.gpu_util_percent is not None:
            metrics["tuneup/gpu_util_percent"] = self.gpu_util_percent
        return records[-1].step, metrics
