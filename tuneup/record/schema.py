"""Names, layout and typed records of a run directory (schema version 1).

Layout of a run directory::

    manifest.json              written once by rank 0 (atomically): what ran, where, how
    rank-<r>/info.json         written by rank r at start and rewritten at close (atomically)
    rank-<r>/steps.jsonl       one line per recorded optimizer step (full detail, then a sample)
    rank-<r>/windows.jsonl     one line per window of steps: count, mean, p50, p95, max of every metric
    rank-<r>/telemetry.jsonl   one line per telemetry tick (process, system, GPUs)
    rank-<r>/events.jsonl      things that happen between steps (validation, checkpoints, warnings)
    rank-<r>/collectives.jsonl one line per timed collective (gradient buckets, FSDP gathers, probes)
    rank-<r>/metrics.jsonl     one line per value of a metric the training logged (val_loss, val_acc, the
                               training loss at the logging interval), as the trainer reduced it
    rank-<r>/operators.json    only when profiling was asked for: each phase's top operators over the
                               profiled steps (tuneup.collect.profiler writes it, once)
    rank-<r>/trace.json        the same steps' Chrome trace from torch.profiler (Perfetto, chrome://tracing)

Every time is either a unix timestamp in seconds (`t_*`, `*_unix`) or a duration whose name ends in
its unit (`_ms`, `_s`). Byte counts end in `_bytes`.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

MANIFEST_FILE = "manifest.json"
RANK_DIR_PREFIX = "rank-"
INFO_FILE = "info.json"
STEPS_FILE = "steps.jsonl"
WINDOWS_FILE = "windows.jsonl"
TELEMETRY_FILE = "telemetry.jsonl"
EVENTS_FILE = "events.jsonl"
COLLECTIVES_FILE = "collectives.jsonl"
METRICS_FILE = "metrics.jsonl"
OPERATORS_FILE = "operators.json"
TRACE_FILE = "trace.json"

# The environment variable that names the run directory to write, where the callback is given none
# (`tuneup bench` sets it for each run).
ENV_RUN_DIR = "TUNEUP_DIR"
# Left by rank 0 in the run directory at setup; the other ranks look for it (a node that cannot see it
# records to its own disk).
RUN_MARKER_FILE = ".tuneup-run"
# info.json's `stop_reason` for a fit the user stopped (Ctrl-C): an end the user chose, not an interruption.
STOP_USER_INTERRUPT = "user_interrupt"

# Collective kinds, named as torch.distributed names the operations.
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")

# Phases of a training step (tuneup.collect.step_clock defines each), in the order a step runs them and
# every table and figure shows them. The one list: the step clock, the profiler, the analysis, the report
# and report.json's schema all take it from here. They tile the step with tuneup's own time:
# wall = data + forward + backward + optimizer + sync + other + tuneup_ms. Records written before `sync` was
# timed have it 0, inside other; records without `tuneup_ms` (written before it was timed, or timed on a
# device) hold tuneup's own time inside the phases.
PHASE_NAMES = ("data", "forward", "backward", "optimizer", "sync", "other")
# Their fields in a step record.
PHASES = tuple(f"{name}_ms" for name in PHASE_NAMES)
# tuneup's own time in a step (StepRecord.tuneup_ms) as the report names its line: not a phase of the
# user's step but beside them, so that the lines of the step-time table and figure add up to the step.
TUNEUP_PHASE = "tuneup"
# The lines of the report's step time, in order (report.json's `step_time.phases` keys are among them).
STEP_TIME_LINES = (*PHASE_NAMES, TUNEUP_PHASE)

# Every per-step metric that windows aggregate.
STEP_METRICS = (
    "wall_ms",
    *PHASES,
    "samples",
    "tokens",
    "loss",
    "grad_norm",
    "peak_mem_bytes",
    "comm_ms",
    "comm_exposed_ms",
    "comm_bytes",
)

# FSDP's exposed communication by what the training thread waited for (StepRecord's fields, in order): the
# forward's all-gathers, the backward's re-gathers, the gradients' reduce-scatters (and HSDP all-reduces).
FSDP_WAIT_FIELDS = (
    "comm_exposed_forward_gather_ms",
    "comm_exposed_backward_gather_ms",
    "comm_exposed_reduce_ms",
)

# Window statistics, in the order they are written.
WINDOW_STATS = ("n", "mean", "p50", "p95", "max")


def new_run_id(prefix: str = "") -> str:
    """A run id that sorts by start time and does not collide: `[prefix-]YYYYmmdd-HHMMSS-xxxxxx`."""
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    return f"{prefix}-{stamp}" if prefix else stamp


def rank_dir_name(rank: int) -> str:
    return f"{RANK_DIR_PREFIX}{rank}"


@dataclass(slots=True)
class StepRecord:
    """One training step on one rank: a batch that stepped the optimizers, with the micro-batches of its
    gradient-accumulation cycle. Manual optimization may step several optimizers in it (a GAN: two)."""

    step: int  # training steps completed before this one (Lightning's batches that stepped), 0-based
    epoch: int
    t_end: float  # unix seconds at the end of the step
    wall_ms: float
    data_ms: float
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    other_ms: float
    micro_batches: int
    samples: int | None = None
    tokens: int | None = None
    loss: float | None = None
    grad_norm: float | None = None
    peak_mem_bytes: int | None = None
    # Set when a checkpoint was saved in the gap before this step: its data wait holds that save too.
    checkpoint: bool = False
    # Communication of the step's timed collectives (absent when none were timed): total time, the part
    # the step waited for after its backward compute ended, bytes on the wire, and how many.
    comm_ms: float | None = None
    comm_exposed_ms: float | None = None
    comm_bytes: int | None = None
    comm_count: int | None = None
    # The trainer's own collectives between batches (Lightning's SIGTERM flag broadcast, barriers).
    sync_ms: float = 0.0
    # The gradient noise scale's inputs (tuneup.collect.grad_noise; absent where it was not measured):
    # the squared norms of a small-batch and a big-batch gradient of this step, in the loss's units (the
    # mixed-precision loss scale divided out), and the samples each was averaged over. DDP: this rank's
    # gradient before the all-reduce and the averaged one after it; one process with accumulation: the
    # first micro-batch's gradient and the accumulated one.
    gns_small_sq: float | None = None
    gns_big_sq: float | None = None
    gns_small_batch: int | None = None
    gns_big_batch: int | None = None
    # Of comm_bytes, those sent among the ranks of one node only (a hierarchical strategy's intra-node
    # collectives, tuneup.sync); absent when no collective said which ranks it spanned.
    comm_node_bytes: int | None = None
    # tuneup's own time in the step, out of its phases (its hooks' bookkeeping, the gradient noise scale's
    # norms; tuneup.collect.step_clock). None: not timed apart (an older record, or a device timer).
    tuneup_ms: float | None = None
    # FSDP on the host (tuneup.collect.comm): comm_exposed_ms's parts, what the training thread waited for
    # the forward's all-gathers, the backward's re-gathers (after a reshard) and the gradients'
    # reduce-scatters (with HSDP's all-reduces). Absent for DDP and where not measured (a GPU, older runs).
    comm_exposed_forward_gather_ms: float | None = None
    comm_exposed_backward_gather_ms: float | None = None
    comm_exposed_reduce_ms: float | None = None

    # Read access by field name, as on the dict the step clock handed out before it built StepRecords: a
    # consumer written for the dict (`record["wall_ms"]`, `record.get("samples")`) keeps working. New code
    # reads the attributes. `get` gives `default` for a field that holds None, as the dict did for a figure
    # it left out (comm_ms where nothing was timed).
    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(self, name)
        except (AttributeError, TypeError):
            raise KeyError(name) from None

    def get(self, name: str, default: Any = None) -> Any:
        value = getattr(self, name, None) if isinstance(name, str) else None
        return default if value is None else value


@dataclass(slots=True)
class RecordedStep(StepRecord):
    """A step as the recording side hands it to the writer (tuneup.collect.step_clock builds it): the step's
    record, with the step's timed collectives, which the writer puts in collectives.jsonl (with the step's
    number) when it keeps the step; steps.jsonl holds the StepRecord fields only, and the reader gives
    StepRecords back."""

    collectives: list[CollectiveRecord] | None = None


@dataclass(slots=True)
class CollectiveRecord:
    """One timed collective operation on one rank."""

    step: int  # the optimizer step it belongs to (for a network probe: the iteration)
    kind: str  # one of COLLECTIVE_KINDS
    # The collective's size as nccl-tests counts it, so bus bandwidth follows its formulas: the whole
    # buffer (all_reduce, broadcast), the gathered output (all_gather), the input before scattering
    # (reduce_scatter). Each rank's own shard of a gather or scatter is bytes / world_size.
    bytes: int
    duration_ms: float  # launch to completion, as seen by this rank
    dtype: str | None = None
    bucket: int | None = None  # DDP gradient bucket index, where there is one
    world_size: int | None = None  # ranks taking part
    start_ms: float | None = None  # launch, ms after the step's start (for overlap), where known
    source: str | None = None  # "ddp_hook", "fsdp", "probe", "param_avg" (local SGD's averaging), ...
    scope: str | None = None  # "node" or "cross_node" where a strategy's subgroup was used; None: all ranks


# Where a logged metric's value was read (MetricRecord.source): at the end of a validation run, at the
# trainer's logging interval during training, or handed over by an adapter's own call (a plain loop, Fabric).
METRIC_SOURCES = ("validation", "train", "log")


@dataclass(slots=True)
class MetricRecord:
    """One value of a metric the training logged (tuneup reads it; it computes none), on one rank.

    `value` is a float in memory and may be NaN or infinite (a diverged loss): on disk such a value is
    written as null with `nonfinite` set to "nan", "inf" or "-inf", and the reader gives the float back.
    """

    name: str
    value: float
    step: int  # optimizer steps completed when it was read (Lightning's global_step)
    t: float  # unix seconds when it was read
    source: str  # one of METRIC_SOURCES
    epoch: int | None = None
    # This rank's samples trained on up to `step` (its steps' `samples` summed), where samples were counted.
    samples: int | None = None


@dataclass(slots=True)
class WindowAggregate:
    """Statistics of every step metric over a window of consecutive steps of one rank."""

    first_step: int
    last_step: int
    count: int
    t_start: float
    t_end: float
    samples: int | None
    tokens: int | None
    micro_batches: int
    # metric name -> {"n", "mean", "p50", "p95", "max"}; metrics with no values are absent.
    stats: dict[str, dict[str, float]]


@dataclass(slots=True)
class RankInfo:
    rank: int
    host: str | None = None
    pid: int | None = None
    local_rank: int | None = None
    node_rank: int | None = None
    device: str | None = None
    device_bus_id: str | None = None
    timing: str | None = None  # "host" (perf_counter) or "cuda_event"
    start_unix: float | None = None
    end_unix: float | None = None
    closed: bool = False
    last_step: int | None = None
    steps_seen: int | None = None
    dropped: dict[str, int] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RankRecord:
    info: RankInfo
    steps: list[StepRecord] = field(default_factory=list)
    windows: list[WindowAggregate] = field(default_factory=list)
    telemetry: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    collectives: list[CollectiveRecord] = field(default_factory=list)
    metrics: list[MetricRecord] = field(default_factory=list)
    # operators.json as written (tuneup.collect.profiler), where this rank profiled steps; else None.
    operators: dict[str, Any] | None = None

    @property
    def rank(self) -> int:
        return self.info.rank


@dataclass(slots=True)
class Manifest:
    schema_version: int
    run_id: str
    created_unix: float
    world_size: int
    num_nodes: int
    trainer: dict[str, Any] = field(default_factory=dict)
    dataloader: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    gpus: dict[str, Any] | None = None
    recording: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def versions(self) -> dict[str, Any]:
        return dict(self.environment.get("versions") or {})


@dataclass(slots=True)
class Run:
    """A loaded run: the manifest and every rank's records, with what was missing or damaged."""

    path: Path
    manifest: Manifest
    ranks: dict[int, RankRecord]
    missing_ranks: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Where it was read from when that is a URL (object storage); `path` is then its local copy.
    url: str | None = None

    @property
    def run_id(self) -> str:
        return self.manifest.run_id

    @property
    def location(self) -> str:
        """Where the run is, as the user named it: its URL, or its directory."""
        return self.url or str(self.path)

    @property
    def world_size(self) -> int:
        return self.manifest.world_size

    @property
    def rank_hosts(self) -> dict[int, str | None]:
        return {r: rec.info.host for r, rec in sorted(self.ranks.items())}

    def steps(self, rank: int = 0) -> list[StepRecord]:
        rec = self.ranks.get(rank)
        return rec.steps if rec is not None else []
