"""Synthetic run records, written through the real writer, for tests that need a run without training."""

from __future__ import annotations

from pathlib import Path

from tuneup.record import RankWriter, RecordingPolicy, write_manifest


def step_record(step: int, wall_ms: float = 10.0) -> dict:
    return {
        "step": step,
        "epoch": 0,
        "t_end": 1000.0 + step * wall_ms / 1000.0,
        "wall_ms": wall_ms,
        "data_ms": 1.0,
        "forward_ms": 3.0,
        "backward_ms": 4.0,
        "optimizer_ms": 1.5,
        "other_ms": wall_ms - 9.5,
        "micro_batches": 1,
        "samples": 8,
        "tokens": 256,
        "loss": 2.0 - step * 0.001,
        "grad_norm": None,
        "peak_mem_bytes": None,
    }


def make_run(path: Path, world_size: int = 1, steps: int = 20, policy: RecordingPolicy | None = None) -> Path:
    write_manifest(path, {"run_id": "r1", "created_unix": 1.0, "world_size": world_size, "num_nodes": 1})
    for rank in range(world_size):
        w = RankWriter(path, rank, policy)
        w.open({"host": f"node{rank}"})
        for s in range(steps):
            w.add_step(step_record(s, wall_ms=10.0 + rank))
        w.add_telemetry({"t": 1.0, "process": {"cpu_percent": 50.0}})
        w.close(status="completed")
    return path
