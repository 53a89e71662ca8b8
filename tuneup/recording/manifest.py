"""The run's manifest (rank 0, once per segment): what ran, where, with which settings, and how it is
priced. The adapter says what it knows of the trainer, the data and the model; the rest is read here."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from tuneup._log import warn_once
from tuneup.cost.pricing import PriceChoice
from tuneup.record.segments import elastic_identity
from tuneup.record.writer import RecordingPolicy
from tuneup.recording.policies import ProfilingPolicy


def communication_environment(world_size: int, ranks_per_node: int, num_nodes: int) -> dict[str, Any]:
    """Backend, NCCL version, ranks per node and NCCL_* settings: what the collectives ran over."""
    import torch

    from tuneup.collect.environment import redact_value

    env: dict[str, Any] = {
        "world_size": world_size,
        "ranks_per_node": ranks_per_node,
        "num_nodes": num_nodes,
        "backend": None,
        "nccl_version": None,
    }
    try:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            env["backend"] = str(torch.distributed.get_backend())
        if torch.cuda.is_available():
            env["nccl_version"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception as exc:
        warn_once("comm-env", f"cannot read the communication backend ({exc})")
    env["nccl_env"] = {k: redact_value(k, v) for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}
    return env


def build_manifest(
    *,
    run_id: str | None,
    segment: Mapping[str, Any] | None,
    steps_done: int,
    checkpoint: str | None,
    world_size: int,
    num_nodes: int,
    ranks_per_node: int,
    hosts: list[str] | None,
    trainer: Mapping[str, Any],
    dataloader: Mapping[str, Any],
    model: Mapping[str, Any],
    price: PriceChoice | None,
    electricity_usd_per_kwh: float | None,
    profiling: ProfilingPolicy,
    count_flops: bool,
    recording: RecordingPolicy,
    timing: str | None,
    tune_trial: Mapping[str, Any] | None,
) -> dict[str, Any]:
    from tuneup.collect.environment import capture_environment
    from tuneup.collect.nvml import gpu_inventory

    return {
        "run_id": run_id,
        "created_unix": round(time.time(), 3),
        "elastic_run_id": elastic_identity()[0],
        "segment": {
            **(segment or {"index": 0, "reason": "start"}),
            "global_step_at_start": steps_done,
            "checkpoint": checkpoint,
        },
        "world_size": world_size,
        "num_nodes": num_nodes,
        # Each rank's host, gathered at setup: the report names the hosts of ranks that left no record.
        **({"hosts_by_rank": hosts} if hosts else {}),
        "trainer": dict(trainer),
        "dataloader": dict(dataloader),
        "model": dict(model),
        "environment": capture_environment(),
        "gpus": gpu_inventory(),
        "communication": communication_environment(world_size, ranks_per_node, num_nodes),
        "pricing": {
            **(price.as_dict() if price is not None else {}),
            "electricity_usd_per_kwh": electricity_usd_per_kwh,
        },
        "flops": {"flops_per_sample": profiling.flops_per_sample, "count_flops": count_flops},
        **({"tune_trial": dict(tune_trial)} if tune_trial is not None else {}),
        "recording": {
            **recording.as_dict(),
            "telemetry_interval_s": profiling.telemetry_interval_s,
            "grad_norm": profiling.grad_norm,
            "noise_scale": profiling.noise_scale,
            "noise_scale_every": profiling.noise_scale_every,
            "timing": timing,
        },
    }
