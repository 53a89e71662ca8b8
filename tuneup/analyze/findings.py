"""Findings in plain words, each with the evidence that supports it.

A finding states what was measured, not what to do about it (recommendations are their own module).
Thresholds are named here, with the reason for each, so a reader of a finding can see why it fired.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class Finding:
    id: str
    severity: str  # "warning" (costs time now) or "info"
    title: str
    evidence: str

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "severity": self.severity, "title": self.title, "evidence": self.evidence}
