"""The run: what ran, where, with which batch, and for how long."""

from __future__ import annotations

from collections.abc import Sequence

from tuneup.analyze.model import FsdpSettings, Hardware, RunAnalysis, RunInfo
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, KeyValues, by_value
from tuneup.report.format import (
    MISSING,
    count,
    duration,
    is_number,
    parameters,
    plural,
    ranks_text,
    recorded_steps,
    size_bytes,
    text,
    unix_time,
)

ID = "run"
TITLE = "The run"
PLOTS = ()

_TIMING = {"host": "host clock", "cuda_event": "CUDA events"}
_DATA_TIMING = {"fetch": "timed around each batch fetch", "gap": "inferred from the gap between batches"}


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    run = analysis.run
    global_batch = run.global_batch_size
    steps = recorded_steps(run.steps_recorded, run.steps_seen, run.detail_steps, run.sample_every)
    if run.last_step is not None:
        steps += f" (last step {text(run.last_step)})"
    timing = [_TIMING.get(str(t), text(t)) for t in run.timing]
    data_timing = [_DATA_TIMING.get(str(t), text(t)) for t in run.data_timing]
    pairs = (
        ("Run id", text(run.run_id)),
        ("Run directory", text(run.path)),
        ("Model", text(run.model_class)),
        ("Parameters", _parameters(run)),
        ("World size", _world(run)),
        ("Hosts", by_value(run.hosts)),
        ("Strategy", text(run.strategy) + _start_method(run.start_method)),
        *((("FSDP2", _fsdp(run.fsdp)),) if run.fsdp is not None else ()),
        ("Precision", text(run.precision)),
        ("Accelerator", text(run.accelerator)),
        ("Trainer package", text(run.namespace)),
        ("Batch size per rank", text(run.batch_size_per_rank)),
        ("Gradient accumulation", accumulation(run.accumulate_grad_batches)),
        (
            "Global batch",
            f"{count(global_batch)} samples per training step" if is_number(global_batch) else MISSING,
        ),
        ("CPU", _cpu(run.hardware)),
        ("GPUs", _gpus(run.hardware)),
        ("Started", unix_time(run.start_unix)),
        ("Duration", duration(run.duration_s)),
        ("Steps recorded", steps),
        ("Status", by_value(run.status)),
        ("Step timing", text(timing) if timing else MISSING),
        ("Data wait timing", text(data_timing) if data_timing else MISSING),
    )
    return [KeyValues("", pairs)]


def _fsdp(f: FsdpSettings) -> str:
    """ "5 units; reshard after forward; bf16 parameters, fp32 reduction; no offload"."""
    reshard = {True: "reshard after forward", False: "parameters kept from forward to backward"}.get(
        f.reshard_after_forward,  # type: ignore[arg-type]
        f"reshard after forward: {text(f.reshard_after_forward)}",
    )
    precision = (
        f"{f.param_dtype} parameters, {f.reduce_dtype or 'their own dtype for the'} reduction"
        if f.param_dtype
        else "no mixed-precision policy"
    )
    offload = {"cpu": "parameters offloaded to CPU", "none": "no offload"}.get(
        f.offload or "", "offload unknown"
    )
    return f"{f.units} units (fully_shard); {reshard}; {precision}; {offload}"


def _parameters(run: RunInfo) -> str:
    params, trainable = run.parameters, run.trainable_parameters
    out = parameters(params)
    if is_number(trainable) and trainable != params:
        out += f" ({parameters(trainable)} trainable)"
    return out


def _world(run: RunInfo) -> str:
    line = plural(int(run.world_size), "rank") if is_number(run.world_size) else MISSING
    if is_number(run.num_nodes):
        line += f" on {plural(int(run.num_nodes), 'node')}"
    if run.missing_ranks:
        line += f"; no record from {ranks_text(run.missing_ranks)}"
    return line


def _cpu(hw: Hardware) -> str:
    cpu = text(hw.cpu_model)
    if is_number(hw.cpu_count):
        cpu += f", {plural(int(hw.cpu_count), 'logical CPU')}"
    if is_number(hw.ram_total_bytes):
        cpu += f", {size_bytes(hw.ram_total_bytes)} RAM"
    return cpu


def _gpus(hw: Hardware) -> str:
    gpus = text(hw.gpu_names) if hw.gpu_names else "none visible to NVML"
    if is_number(hw.gpus_per_node) and hw.gpus_per_node:
        gpus += f" ({text(hw.gpus_per_node)} per node"
        gpus += f", driver {text(hw.driver_version)})" if hw.driver_version else ")"
    return gpus


def accumulation(value: object) -> str:
    """Gradient accumulation in words: how many micro-batches make one training step."""
    if value == 1:
        return "none (1 micro-batch per training step)"
    return f"{text(value)} micro-batches per training step" if is_number(value) else text(value)


# How DDP's ranks were started, as Lightning's strategy names say it.
START_METHODS = {
    "popen": "ranks started as new processes (ddp)",
    "spawn": "ranks spawned by the launching process (ddp_spawn)",
    "fork": "ranks forked from the launching process (ddp_fork, ddp_notebook)",
}


def _start_method(method: str | None) -> str:
    return f"; {START_METHODS.get(method, text(method))}" if method else ""
