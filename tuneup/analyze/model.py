"""The typed analysis of a run: `RunAnalysis`, one frozen dataclass per section.

This is the contract above the run record. The report's sections, `tuneup show`, `tuneup compare`, the
trainer's loggers and the advice read these fields and never compute a headline figure again; the key
names of report.json are the field names here (and in report.schema.json), nowhere else.

Units are in the names (`_ms`, `_s`, `_bytes`, `_per_s`, `usd_`). A share is a fraction of 1. A figure
that the run did not record is None, never 0. `to_json` turns an analysis into report.json's document and
`from_json` reads one back (a report written by this version, or a test's hand-made one).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

REPORT_SCHEMA_VERSION = 1


# How report.json writes a figure: the analysis keeps full precision, and `to_json` rounds at the edge, by
# the rule its field declares (for a list or a mapping of figures, each of them).
def decimals(places: int, default: Any = dataclasses.MISSING) -> Any:
    """A float field written with `places` decimals (milliseconds to the microsecond: 3)."""
    return field(default=default, metadata={"round": ("decimals", places)})


def significant(digits: int, default: Any = dataclasses.MISSING) -> Any:
    """A float field written with `digits` significant digits (money and FLOPs span many magnitudes)."""
    return field(default=default, metadata={"round": ("significant", digits)})


# Which statistic the throughput is, said once for the report's sections and the terminal alike.
THROUGHPUT_STATISTIC = (
    "a steady-state mean: each rank's samples, tokens or training steps after warm-up over those steps' "
    "total time, so a slow step counts in full"
)


# -- run ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hardware:
    cpu_model: str | None
    cpu_count: int | None
    ram_total_bytes: int | None
    gpu_names: list[str]
    gpus_per_node: int
    driver_version: str | None


@dataclass(frozen=True, slots=True)
class FsdpSettings:
    """FSDP2's settings as its units held them (tuneup/recording/describe.py); "mixed" where units differ."""

    units: int  # modules fully_shard wrapped
    reshard_after_forward: bool | str | None  # the units' but the root's; "mixed"
    param_dtype: str | None  # the mixed-precision policy's; None: the parameters' own
    reduce_dtype: str | None
    offload: str | None  # "cpu" (CPUOffloadPolicy) or "none"


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What ran, where, and for how long."""

    run_id: str
    path: str
    world_size: int
    num_nodes: int
    ranks_present: list[int]
    missing_ranks: list[int]
    hosts: dict[str, str | None]  # rank -> host (None: the rank's record does not name it)
    namespace: str | None
    strategy: str | None
    accelerator: str | None
    precision: str | int | None  # as the trainer was given it: "bf16-mixed", 32
    accumulate_grad_batches: int
    batch_size_per_rank: int | None
    global_batch_size: int | None
    max_steps: int | None
    max_epochs: int | None
    model_class: str | None
    parameters: int | None
    trainable_parameters: int | None
    hardware: Hardware
    start_unix: float | None = decimals(3)
    end_unix: float | None = decimals(3)
    duration_s: float | None = decimals(3)
    steps_recorded: int
    last_step: int | None
    status: dict[str, str]  # rank -> how its record ended
    data_timing: list[str]
    timing: list[str]
    # How the ranks were started: "popen" (ddp), "spawn" (ddp_spawn), "fork" (ddp_fork); None for one process.
    start_method: str | None = None
    # How the record sampled the steps: every step up to `detail_steps` steps, then one in `sample_every`
    # (tuneup.record.writer.RecordingPolicy); `steps_seen` is how many steps ran (the most of any rank).
    # None in reports written before these were kept, or where the record does not say.
    steps_seen: int | None = None
    detail_steps: int | None = None
    sample_every: int | None = None
    # Which adapter recorded the run (each rank's info: "lightning", "lightning.fabric", "transformers",
    # "loop"), for the advice's code; None where the record does not say (the Lightning callback's before
    # adapters named themselves).
    adapter: str | None = None
    # How FSDP2 wrapped the model, read once it was wrapped (the manifest's model.fsdp); None: no FSDP2 unit.
    fsdp: FsdpSettings | None = None
    # The run's tags (`TuneupCallback(tags=...)`, `TUNEUP_TAGS`): project, user, experiment, anything.
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Warmup:
    steps: int
    per_rank: dict[str, int]
    share: float = decimals(4)  # of the recorded steps
    first_steady_step: int | None
    rule: str
    # Why the run has no steady state (fast_dev_run, too few steps): then no headline figure is quoted.
    no_steady_state: str | None = None


# -- throughput and step time ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankThroughput:
    rank: int
    samples_per_s: float | None = decimals(3)
    tokens_per_s: float | None = decimals(3)
    steps_per_s: float | None = decimals(3)


@dataclass(frozen=True, slots=True)
class Throughput:
    """Steady-state rates: the samples (tokens, steps) of the steps after warm-up over their time. This is
    what the job delivers per second it is paid for, so it is mean-based; see THROUGHPUT_STATISTIC."""

    samples_per_s: float | None = decimals(3)  # summed over ranks
    tokens_per_s: float | None = decimals(3)  # summed over ranks
    steps_per_s: float | None = decimals(3)  # the slowest rank's: ranks step together
    per_rank: list[RankThroughput]


@dataclass(frozen=True, slots=True)
class PhaseTime:
    ms: float = decimals(3)  # mean per step
    share: float = decimals(4)  # of the mean step
    # The typical step beside the mean: where slow steps pull the mean well above the median, `noisy` says so
    # (the rule is tuneup/analyze/throughput.py's is_noisy), and the report shows these next to it.
    median_ms: float | None = decimals(3, default=None)
    p95_ms: float | None = decimals(3, default=None)
    noisy: bool = False


@dataclass(frozen=True, slots=True)
class Quantiles:
    min: float = decimals(3)
    p5: float = decimals(3)
    p25: float = decimals(3)
    p50: float = decimals(3)
    p75: float = decimals(3)
    p95: float = decimals(3)
    max: float = decimals(3)


@dataclass(frozen=True, slots=True)
class RankStepTime:
    rank: int
    steps: int
    median_ms: float = decimals(3)
    p95_ms: float = decimals(3)
    phase_median_ms: dict[str, float] = decimals(3)
    phase_mean_ms: dict[str, float] = decimals(3)
    distribution_ms: Quantiles


@dataclass(frozen=True, slots=True)
class SlowPeriod:
    """A stretch of steady steps that ran well above the steady step time (tuneup/analyze/slow_periods.py).
    Its steps stay in the throughput and step-time figures: they are part of what the job delivered."""

    first_step: int
    last_step: int
    steps: int  # recorded steps in it (past the record's detail_steps, one step in sample_every is kept)
    median_ms: float = decimals(3)  # its median step
    baseline_ms: float = decimals(3)  # the steady step time it is measured against (slow_periods.py)
    slowdown: float = decimals(2)  # median_ms over baseline_ms: 2.0 = twice as long
    duration_s: float = decimals(3)  # wall-clock, its first step's start to its last step's end
    share_of_time: float = decimals(4)  # of the recorded steady steps' time


@dataclass(frozen=True, slots=True)
class StepTime:
    median_ms: float | None = decimals(3)
    mean_ms: float | None = decimals(3)  # the step the throughput is made of
    p95_ms: float | None = decimals(3)
    phases: dict[str, PhaseTime]  # data, forward, backward, optimizer, other: means over all ranks
    per_rank: list[RankStepTime]
    noisy: bool = False  # slow steps pull the mean step well above the median (throughput.py's is_noisy)
    slow_periods: list[SlowPeriod] = field(default_factory=list)
    # Phases the trainer's adapter could not time on some rank (a plain loop that never marks data, say):
    # their time is in "other", and their figures are not measurements (throughput.py's phases_not_timed).
    phases_not_timed: list[str] = field(default_factory=list)


# -- time series -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankSeries:
    step: list[int]
    t_s: list[float] = decimals(3)
    step_time_ms: list[float] = decimals(3)


@dataclass(frozen=True, slots=True)
class ThroughputSeries:
    step: list[int]
    samples_per_s: list[float] = decimals(3)
    tokens_per_s: list[float | None] = decimals(3)


@dataclass(frozen=True, slots=True)
class LossSeries:
    rank: int | None
    step: list[int]
    values: list[float] = decimals(6)


@dataclass(frozen=True, slots=True)
class TimeSeries:
    source: str  # "steps" (every step kept) or "windows" (window means)
    per_rank: dict[str, RankSeries]
    throughput: ThroughputSeries
    loss: LossSeries


# -- ranks -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StragglerInfo:
    rank: int
    phase: str
    excess_ms: float | None = decimals(3)
    phase_ms: float | None = decimals(3)
    others_phase_ms: float | None = decimals(3)
    others_wait_ms: float | None = decimals(3)
    step_ms: float | None = decimals(3)
    share_of_step: float | None = decimals(4)
    summary: str


@dataclass(frozen=True, slots=True)
class RankStep:
    """One rank's median steady step, for the slowest and fastest lists."""

    rank: int
    host: str | None
    median_ms: float = decimals(3)


@dataclass(frozen=True, slots=True)
class HostRanks:
    """The ranks of one host: how their median steps spread."""

    host: str
    ranks: int
    median_ms: float = decimals(3)  # the median of its ranks' median steps
    slowest_rank: int
    slowest_median_ms: float = decimals(3)
    fastest_median_ms: float = decimals(3)


@dataclass(frozen=True, slots=True)
class Ranks:
    straggler: StragglerInfo | None
    # The spread of the ranks' median steady steps, the k slowest and fastest, and one row per host: what a
    # reader of 1,024 ranks needs instead of 1,024 rows.
    median_step_ms: Quantiles | None = None
    slowest: list[RankStep] = field(default_factory=list)
    fastest: list[RankStep] = field(default_factory=list)
    per_host: list[HostRanks] = field(default_factory=list)


# -- data loading ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stall:
    rank: int
    step: int
    data_ms: float = decimals(3)
    wall_ms: float = decimals(3)


@dataclass(frozen=True, slots=True)
class DataLoading:
    median_data_ms: float | None = decimals(3)
    stall_threshold_ms: float | None = decimals(3)
    stall_count: int
    stall_total_ms: float | None = decimals(3)
    worst_stalls: list[Stall]
    num_workers: int | None
    pin_memory: bool | None
    persistent_workers: bool | None
    batch_size: int | None


# -- telemetry ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Series:
    t_s: list[float] = decimals(3)  # seconds since the run's start
    values: list[float] = decimals(3)


@dataclass(frozen=True, slots=True)
class GpuSeries:
    util_percent: Series
    power_w: Series
    mem_used_bytes: Series


@dataclass(frozen=True, slots=True)
class GpuTelemetry:
    host: str | None
    index: int
    bus_id: str | None
    lost: bool
    util_percent_mean: float | None = decimals(1)
    util_percent_max: float | None = decimals(1)
    mem_used_bytes_max: int | None
    mem_total_bytes: int | None
    power_w_mean: float | None = decimals(1)
    power_w_max: float | None = decimals(1)
    energy_j: float | None = decimals(1)
    energy_span_s: float | None = decimals(3)
    energy_source: str | None
    temp_c_max: float | None
    sm_clock_mhz_mean: float | None = decimals(0)
    throttle_reasons: list[str]
    series: GpuSeries


@dataclass(frozen=True, slots=True)
class ProcessSeries:
    cpu_percent: Series
    rss_bytes: Series


# How the report and the terminal name each measure: the kernel's high-water mark is a peak RSS too (the
# label says which).
PROCESS_MEMORY_NAMES = {"hwm": "RSS", "pss": "PSS", "uss": "USS", "rss": "RSS"}

# What a rank's process-tree memory peak measures, by `ProcessTelemetry.memory_measure`: said once for the
# report, the terminal and `tuneup compare`.
PROCESS_MEMORY_LABELS = {
    "hwm": "peak RSS (the kernel's high-water mark of the rank's one process: exact, not sampled)",
    "pss": "peak memory (PSS, workers' shared pages counted once)",
    "uss": "peak memory (USS, pages shared with workers left out: a lower bound)",
    "rss": "peak RSS (sum over processes, shared pages counted per process: an upper bound)",
}


@dataclass(frozen=True, slots=True)
class ProcessTelemetry:
    rank: int
    cpu_percent_mean: float | None = decimals(1)  # 100 = one core
    rss_bytes_max: int | None  # summed over the tree: pages shared with forked workers count once per process
    series: ProcessSeries
    # The tree's memory peak, the headline figure, in the measure `memory_measure` names (a key of
    # PROCESS_MEMORY_LABELS): the kernel's high-water mark for a rank alone in its tree, else PSS where
    # the run recorded it, else RSS (tuneup.analyze.telemetry.ProcessTelemetry.memory). A report.json
    # written before PSS was recorded lacks both and reads as its RSS.
    memory_bytes_max: int | None = None
    memory_measure: str = "rss"

    def __post_init__(self) -> None:
        if self.memory_measure == "rss" and self.memory_bytes_max is None:
            object.__setattr__(self, "memory_bytes_max", self.rss_bytes_max)


@dataclass(frozen=True, slots=True)
class NetRate:
    sent_bytes_per_s: float | None
    recv_bytes_per_s: float | None


@dataclass(frozen=True, slots=True)
class HostSeries:
    cpu_percent: Series
    mem_used_bytes: Series
    net_recv_bytes_per_s: Series
    net_sent_bytes_per_s: Series


@dataclass(frozen=True, slots=True)
class HostTelemetry:
    host: str | None
    cpu_percent_mean: float | None = decimals(1)
    mem_used_bytes_max: int | None
    mem_total_bytes: int | None
    disk_read_bytes_per_s: float | None = decimals(1)
    disk_write_bytes_per_s: float | None = decimals(1)
    net_bytes_per_s: dict[str, NetRate]  # interface -> rates
    series: HostSeries


@dataclass(frozen=True, slots=True)
class CpuContention:
    """How much of one host's CPU went to processes other than the training's (tuneup/analyze/contention.py).
    Percentages are of all the host's cores (100 = every core busy), means over the samples where the
    host's and every local rank's CPU were read together."""

    host: str | None
    cores: int
    ranks: list[int]  # the training's ranks on this host, whose process trees are the training's CPU
    samples: int
    host_busy_percent_mean: float | None = decimals(1)
    training_percent_mean: float | None = decimals(1)
    others_percent_mean: float | None = decimals(1)  # host busy less the training's, never below 0
    contended_share: float = decimals(4)  # of the samples: host saturated and others above the threshold
    contended: bool = False


@dataclass(frozen=True, slots=True)
class Telemetry:
    samples: int
    gpus: list[GpuTelemetry]
    processes: list[ProcessTelemetry]
    hosts: list[HostTelemetry]
    # The CUDA caching allocator's peak over the steady steps, the largest of any rank (step records, GPU
    # only): what a bigger batch must fit beside.
    gpu_allocated_peak_bytes: int | None = None
    cpu_contention: list[CpuContention] = field(default_factory=list)  # one per host with host telemetry


# -- environment -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Environment:
    """The manifest's own records, as captured (versions, host, git, seeds, allow-listed variables)."""

    versions: dict[str, Any]
    host: dict[str, Any] | None
    git: dict[str, Any] | None
    seeds: dict[str, Any] | None
    env: dict[str, Any]
    gpus: dict[str, Any] | None
    trainer: dict[str, Any]
    dataloader: dict[str, Any]


# -- communication -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankComm:
    rank: int
    steps_with_comm: int
    comm_ms: float | None = decimals(3)
    exposed_ms: float | None = decimals(3)
    bytes_per_step: float | None = decimals(0)
    collectives_per_step: float | None = decimals(1)


@dataclass(frozen=True, slots=True)
class BucketTime:
    bucket: int
    kind: str
    bytes: int
    dtype: str | None
    median_ms: float | None = decimals(3)
    count: int


@dataclass(frozen=True, slots=True)
class SizeTime:
    kind: str
    bytes: int
    count: int
    median_us: float | None = decimals(1)
    algbw_gbytes_per_s: float | None = decimals(4)
    busbw_gbytes_per_s: float | None = decimals(4)


@dataclass(frozen=True, slots=True)
class CollectiveFit:
    kind: str
    alpha_us: float | None = decimals(3)
    beta_ns_per_byte: float | None = decimals(6)
    busbw_gbytes_per_s: float | None = decimals(3)
    r_squared: float | None = decimals(4)
    points: int
    sizes: int
    notes: list[str]


@dataclass(frozen=True, slots=True)
class LinkCheck:
    """The link the collectives should have run over, and how the measured bandwidth compares."""

    name: str
    reason: str
    source: str | None
    measured_busbw_gbytes_per_s: float | None = decimals(3, default=None)
    reference: str | None = None
    reference_gbytes_per_s: float | None = decimals(3, default=None)
    ratio: float | None = decimals(4, default=None)
    far_below: bool | None = None
    summary: str | None = None


@dataclass(frozen=True, slots=True)
class LateRank:
    rank: int
    comm_ms: float | None = decimals(3)
    others_comm_ms: float | None = decimals(3)
    summary: str


@dataclass(frozen=True, slots=True)
class PhaseWait:
    """FSDP on the host: what one phase of the step waited for its collectives (the training thread blocked
    in them), mean per step over the ranks' steady steps, and the phase's compute without those waits."""

    phase: str  # "forward" or "backward" (the step clock's phases)
    phase_ms: float | None = decimals(3)
    waited_ms: float | None = decimals(3)  # gathers_ms + reduces_ms
    gathers_ms: float | None = decimals(3)  # all-gathers: the forward's, the backward's re-gathers
    reduces_ms: float | None = decimals(3)  # gradient reduce-scatters (and HSDP all-reduces); None in forward
    compute_ms: float | None = decimals(3)  # phase_ms less waited_ms
    waited_share: float | None = decimals(4)  # waited_ms / phase_ms


@dataclass(frozen=True, slots=True)
class Communication:
    backend: str | None
    world_size: int
    ranks_per_node: int | None
    nccl_version: str | None
    comm_ms_per_step: float | None = decimals(3)
    share_of_step: float | None = decimals(4)
    exposed_ms_per_step: float | None = decimals(3)
    overlapped_ms_per_step: float | None = decimals(3)
    exposed_share_of_step: float | None = decimals(4)
    per_rank: list[RankComm]
    per_bucket: list[BucketTime]
    by_size: list[SizeTime]
    fits: list[CollectiveFit]
    link: LinkCheck | None
    late_rank: LateRank | None
    ddp_logging: dict[str, float] | None = decimals(3)
    # FSDP on the host: the exposed time by phase (forward, backward); empty for DDP, on a GPU, in older
    # reports.
    exposed_by_phase: list[PhaseWait] = field(default_factory=list)


# -- gradient noise scale ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NoiseScale:
    """The gradient noise scale B_simple = tr(Σ)/|G|² (McCandlish et al. 2018, appendix A.1), from a small-
    and a big-batch gradient norm per step (tuneup/analyze/noise_scale.py). It is the batch size at which
    the gradient's noise equals its signal: well below it a bigger batch cuts the steps to a target almost
    in proportion; well above it, hardly at all. Squared norms are in the loss's units (per parameter
    gradient, summed over parameters), the mixed-precision loss scale divided out."""

    method: str  # how the two norms were taken, in words
    small_batch: int  # samples behind the small-batch gradient (per rank, per step)
    big_batch: int  # samples behind the big-batch gradient
    steps: int  # steady steps the headline uses
    # mean tr(Σ) estimate / mean |G|² estimate over the steady steps, with a 95% interval; None when the
    # mean |G|² is not positive: the signal is below the noise at these batch sizes (B_simple is larger
    # than can be measured with them). ci_high None: unbounded above.
    b_simple: float | None = significant(4)
    ci_low: float | None = significant(4)
    ci_high: float | None = significant(4)
    grad_sq: float | None = significant(6)  # |G|², the mean of its per-step estimates
    trace_sigma: float | None = significant(6)  # tr(Σ) of one sample's gradient, the same way
    # The plot's series: bias-corrected EMAs of both estimates, divided (None where the |G|² EMA is not
    # positive), at each recorded step with both norms.
    series_step: list[int]
    series_b_simple: list[float | None] = significant(4)
    ema_steps: float = decimals(1)  # the EMAs' time constant, in steps
    comm_hook: str | None  # the DDP comm hook the norms were taken around
    notes: list[str]


# -- memory by kind -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankMemory:
    """One rank's memory by kind, in bytes, read once before its second optimizer step
    (tuneup/recording/memory_kinds.py)."""

    rank: int
    step: int | None  # the step it was read in
    parameters_bytes: int  # the parameters this rank holds: its shards, under FSDP
    parameters_unsharded_bytes: int  # the same parameters whole: what gathering them all materializes
    sharded_parameters: int  # how many parameters are sharded (FSDP2 DTensors)
    gradients_bytes: int | None  # held gradients, sharded like their parameters; None: none existed
    optimizer_state_bytes: int  # every tensor of the optimizers' state
    peak_allocated_bytes: int | None  # GPU: the caching allocator's peak so far; None on CPU
    other_at_peak_bytes: int | None  # GPU: the peak less the kinds above (activations, gathered
    # parameters, communication buffers, temporaries: a peak does not tell them apart)


@dataclass(frozen=True, slots=True)
class MemoryByKind:
    """The ranks' memory by kind; the headline figures are the fullest rank's (the one that limits the batch)."""

    sharded: bool  # some parameters were sharded (FSDP2)
    ranks: list[RankMemory]
    rank: int  # the fullest rank: the most bytes held (its peak on a GPU)
    parameters_bytes: int
    parameters_unsharded_bytes: int
    gradients_bytes: int | None
    optimizer_state_bytes: int
    held_bytes: int  # parameters + gradients + optimizer state, as held on that rank
    peak_allocated_bytes: int | None
    other_at_peak_bytes: int | None
    notes: list[str]


# -- gradient synchronisation strategy ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SyncCheck:
    """One check of the strategy's safeguard. `step` counts the optimizer steps taken, as the strategy's
    events do: the check at step 30 came after the 30th step (the record's step 29)."""

    step: int
    error: float | None = significant(4)  # None: not measured at this check
    error_bound: float | None = significant(4)
    loss: float | None = significant(6)  # mean loss of the steps since the previous check, over the ranks
    breached: bool


@dataclass(frozen=True, slots=True)
class SyncFallback:
    """The safeguard giving up a mode: from the step after `step` (optimizer steps taken), `to_mode` runs."""

    step: int
    from_mode: str
    to_mode: str
    reasons: list[str]


@dataclass(frozen=True, slots=True)
class SyncStrategy:
    """What a gradient synchronisation strategy (TuneupDDPStrategy: fp16/bf16/PowerSGD compression or local
    SGD) did in the run (tuneup/analyze/sync_strategy.py). Steps count optimizer steps taken, as the
    strategy's events do; the strategy's phase is from `started_at` to the first fallback (`end_step`), or
    to the end of the run.

    Bytes are per rank and per optimizer step: exact is what DDP's all-reduce of every bucket sends, sent
    is what the step records' collectives sent in the strategy's phase (local SGD's parameter averaging
    included, the safeguard's checks not: they are `check_bytes`). Times compare the steady exact steps
    before the start with the strategy's steps of the same run."""

    label: str
    start_step: int  # as configured: exact all-reduce for this many optimizer steps first
    started_at: int | None  # optimizer steps taken when it started; None: the run ended before it did
    end_step: int | None  # the first fallback's step; None: the strategy ran to the end
    mode_at_end: str | None  # None where the run recorded no summary (it did not end cleanly)
    steps: int | None  # optimizer steps the run took, by the strategy's count (None: no summary)
    hierarchical: bool
    nodes: int
    ranks_per_node: int | None
    error_name: str  # what the safeguard's error is: "compression error" or "parameter divergence"
    error_meaning: str  # how it is measured, in words
    exact_bytes_per_step: float | None = decimals(1)
    exact_basis: str | None  # where the exact figure comes from, in words
    strategy_steps: int  # training steps in the strategy's phase whose bytes were recorded
    sent_bytes_per_step: float | None = decimals(1)
    bytes_ratio: float | None = decimals(3)  # exact / sent: 2.0 is half the bytes
    # Hierarchical runs over more than one node: the bytes of collectives that span nodes (an exact
    # all-reduce always does); None otherwise.
    cross_node_exact_bytes_per_step: float | None = decimals(1)
    cross_node_sent_bytes_per_step: float | None = decimals(1)
    cross_node_ratio: float | None = decimals(3)
    # The strategy's own count of its bytes over the same steps (its run summary), a cross-check of the
    # step records; None where the summary cannot give it (no summary, or a fallback to another local SGD
    # period).
    counted_bytes_per_step: float | None = decimals(1)
    counted_bytes_ratio: float | None = decimals(3)  # exact / counted
    check_bytes: int | None  # the safeguard's exact all-reduces, over the run
    check_overhead_share: float | None = decimals(4)  # check_bytes / what the strategy's phase sent
    # Time, means over the ranks: the steady exact steps before the start (the first, slow steps left out)
    # against the strategy's; the counts are of training steps.
    exact_steps_timed: int
    strategy_steps_timed: int
    exact_exposed_comm_ms: float | None = decimals(3)
    strategy_exposed_comm_ms: float | None = decimals(3)
    exact_step_ms: float | None = decimals(3)
    strategy_step_ms: float | None = decimals(3)
    time_saved_ms_per_step: float | None = decimals(3)  # exact_step_ms − strategy_step_ms; < 0: it cost
    checks: list[SyncCheck]
    fallbacks: list[SyncFallback]
    notes: list[str]
    # The collectives' time per steady exact step (the gradient all-reduce the strategy replaces), and
    # local SGD's parameter average: what one cost the step, the steady averaging steps' mean step over the
    # other local steps' (None: not local SGD, or no step of either kind).
    exact_comm_ms: float | None = decimals(3, None)
    averaging_ms: float | None = decimals(3, None)


# -- cost --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PricedInstance:
    """The catalog row a run was priced with (tuneup.catalog's Instance, as the report shows it)."""

    key: str
    provider: str
    instance: str
    region: str | None
    gpu: str
    gpu_count: int
    gpu_mem_gib: float | None
    vcpus: int | None
    mem_gib: float | None
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float | None
    intra_node_link: str
    inter_node_gbps: str | None
    source: str
    as_of: str
    as_of_date: str | None
    doubt: str | None
    host_included: bool = True
    origin: str = "packaged"


@dataclass(frozen=True, slots=True)
class Price:
    usd_per_hour: float
    spot_usd_per_hour: float | None
    basis: str  # one sentence: where the figure comes from
    source: str  # callback, environment, command line
    devices: int
    nodes: int
    instance: PricedInstance | None
    spot: bool
    doubts: list[str]
    catalog_version: str | None


@dataclass(frozen=True, slots=True)
class Money:
    usd_per_hour: float | None = significant(9)
    samples_per_usd: float | None = significant(9)
    tokens_per_usd: float | None = significant(9)
    usd_per_million_tokens: float | None = significant(9)
    usd_per_epoch: float | None = significant(9)
    usd_so_far: float | None = significant(9)


@dataclass(frozen=True, slots=True)
class Projection:
    target: str  # the steps are training steps (batches that stepped the optimizers)
    total_steps: float | None = significant(9)
    steps_remaining: float | None = significant(9)
    time_s: float | None = significant(9)
    usd: float | None = significant(9)
    usd_spot: float | None = significant(9)


@dataclass(frozen=True, slots=True)
class Compute:
    """Achieved FLOP/s and MFU; `note` says why a figure is missing."""

    source: str | None
    flops_per_step: float | None = significant(9)
    achieved_tflops_per_s: float | None = significant(9)
    flops_per_sample: float | None = significant(9, default=None)
    achieved_tflops_per_s_per_device: float | None = significant(9, default=None)
    mfu: float | None = significant(4, default=None)
    note: str | None = None
    gpu: str | None = None
    peak_precision: str | None = None
    peak_tflops_per_device: float | None = None
    gpu_doubt: str | None = None


@dataclass(frozen=True, slots=True)
class Energy:
    source: str | None
    note: str
    gpus: int | None = None
    span_s: float | None = significant(9, default=None)
    energy_kwh: float | None = significant(9, default=None)
    mean_power_w: float | None = significant(9, default=None)
    j_per_step: float | None = significant(9, default=None)
    kwh_per_million_tokens: float | None = significant(9, default=None)
    electricity_usd_per_kwh: float | None = None
    electricity_usd: float | None = significant(9, default=None)
    electricity_usd_per_million_tokens: float | None = significant(9, default=None)


@dataclass(frozen=True, slots=True)
class Cost:
    priced: bool
    price: Price | None
    not_priced_reason: str | None
    steps_per_epoch: float | None = significant(9)
    steps_per_epoch_basis: str
    epoch_s: float | None = significant(9)
    figures: Money
    figures_spot: Money | None  # the same job at the spot price, where the catalog has one
    projections: list[Projection]
    flops: Compute
    energy: Energy
    # Validation, checkpoint saves and fit-loop time per second of training steps, at this run's rate: an
    # epoch's time and every projection include it. None where the run did not record its timeline.
    loop_overhead_share: float | None = decimals(4, None)
    # The fit ended (completed or stopped by a limit): projections are of the user's targets from step 0.
    run_ended: bool = False
    stop_reason: str | None = None


# -- interruptions -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Segment:
    index: int
    reason: str
    restart_count: int | None
    checkpoint: str | None
    path: str
    world_size: int
    first_step: int | None
    last_step: int | None
    start_unix: float | None = decimals(6)
    end_unix: float | None = decimals(6)
    status: list[str]
    step_ms: float | None = decimals(6)
    downtime_before_s: float | None = decimals(6, default=None)
    redone_steps: int | None = None
    redone_s: float | None = decimals(6, default=None)
    # A segment that ended interrupted with no segment resumed after it: its training since its last save
    # (or since its start, without one), lost, or to be redone when it resumes.
    unsaved_s: float | None = decimals(6, default=None)


@dataclass(frozen=True, slots=True)
class Interruptions:
    segments: list[Segment]
    interruptions: int
    downtime_s: float | None = decimals(6)
    redone_s: float | None = decimals(6)
    lost_s: float | None = decimals(6)
    run_s: float | None = decimals(6)
    checkpoint_save_s: float | None = decimals(6)
    checkpoint_saves_seen: int
    mtbf_s: float | None = decimals(6)
    recommended_checkpoint_interval_s: float | None = decimals(6)
    example_interval_s: float | None = decimals(6)
    example_mtbf_s: float
    rule: str
    usd_all_segments: float | None = decimals(6, default=None)
    usd_lost: float | None = decimals(6, default=None)
    # Segments the user stopped (Ctrl-C): an end the user chose, not an interruption to plan checkpoints for.
    user_stops: int = 0
    unsaved_s: float | None = decimals(6, default=None)  # the segments' unsaved_s, in lost_s


# -- operators (profiled steps) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OperatorTime:
    """One operator within one phase of the profiled steps (tuneup/analyze/operators.py): per profiled
    step, the mean over the ranks whose top list holds it."""

    name: str
    ranks: int  # profiled ranks whose top list for the phase holds it
    calls_per_step: float = decimals(2)
    self_cpu_ms_per_step: float = decimals(4)  # its own host time, less the operators it called
    total_cpu_ms_per_step: float = decimals(4)  # with the operators it called
    share_of_phase: float | None = decimals(4)  # self CPU time over the phase's host time
    device_ms_per_step: float | None = decimals(4)  # the kernels it launched itself; None without a device
    device_share_of_phase: float | None = decimals(4)  # of the phase's device time
    # The spread of its self CPU time per step over the ranks that list it (None unless two or more do),
    # and the rank with the most (None with one rank profiled).
    self_cpu_ms_per_step_min: float | None = decimals(4)
    self_cpu_ms_per_step_max: float | None = decimals(4)
    slowest_rank: int | None


@dataclass(frozen=True, slots=True)
class PhaseOperators:
    """One phase of the profiled steps: its time, and the operators it spent it in. Means over the
    profiled ranks, per profiled step."""

    phase: str  # the step clock's: data, forward, backward, optimizer, sync, other
    wall_ms_per_step: float = decimals(3)  # host time in the phase, profiler on
    share_of_step: float | None = decimals(4)  # of the profiled step
    steady_ms_per_step: float | None = decimals(3)  # the same phase's steady mean, profiler off (step time)
    self_cpu_ms_per_step: float = decimals(3)  # all its operators' self time (every thread)
    outside_operators_ms_per_step: float | None = decimals(3)  # host time in no operator: Python, the trainer
    device_ms_per_step: float | None = decimals(3)  # kernels it launched; None without a device
    calls_per_step: float = decimals(1)
    operators: list[OperatorTime]  # the top ones, by device time where there is a device, else self CPU
    other_operators: int  # distinct operators in the phase not listed
    other_self_cpu_ms_per_step: float = decimals(4)  # their self CPU time
    other_device_ms_per_step: float | None = decimals(4)


@dataclass(frozen=True, slots=True)
class OperatorProfile:
    """The steps torch.profiler recorded on request (`TuneupCallback(profile_steps=N)`), phase by phase:
    the drill-down from the step-time section to operators. Profiled steps run slower than the others
    (`note` says why): read shares, not milliseconds."""

    ranks: list[int]  # the ranks that profiled
    steps: list[int]  # the profiled steps (the lowest profiled rank's)
    device: str | None  # "cuda" when kernels were recorded, else None (host only)
    step_ms: float | None = decimals(3)  # the mean profiled step, profiler on
    steady_step_ms: float | None = decimals(3)  # the steady mean step, profiler off (step time)
    phases: list[PhaseOperators]  # in the step clock's order, phases without time left out
    traces: list[str]  # Chrome traces, relative to the run directory
    note: str
    write_s: float | None = decimals(3)  # the longest a rank spent stopping the profiler and writing


# -- findings and the whole ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finding:
    """What was measured, in plain words, with the evidence (findings.py says when each fires)."""

    id: str
    severity: str  # "warning" (costs time now) or "info"
    title: str
    evidence: str


# -- job timeline ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimelinePart:
    """One kind of time in the fit: how long in all, its share of the fit's wall time, how many times."""

    name: str  # one of TIMELINE_PARTS
    seconds: float = decimals(3)
    share: float = decimals(4)
    count: int | None = None  # steps, validations, saves; None where counting means nothing


# The parts of a fit, in the order they happen; they sum to the fit's wall time.
TIMELINE_PARTS = (
    "setup",
    "sanity_check",
    "training_steps",
    "validation",
    "checkpoint_saves",
    "other_fit_loop",
    "teardown",
)


@dataclass(frozen=True, slots=True)
class TimelineInterval:
    """One stretch of a rank's fit, in seconds since its start: where the timeline plot draws it."""

    name: str  # one of TIMELINE_PARTS
    start_s: float = decimals(3)
    duration_s: float = decimals(3)


@dataclass(frozen=True, slots=True)
class RankTimeline:
    rank: int
    fit_start_unix: float | None = decimals(3)
    fit_end_unix: float | None = decimals(3)
    wall_s: float | None = decimals(3)
    parts: list[TimelinePart]
    end: str  # what the end time is: "fit end", "training end", "record closed", "last step"
    # False for records written before the fit's times were: setup, sanity check and teardown are unknown
    # and the wall time is from the first step's start to the record's end.
    times_recorded: bool
    # Setup, sanity check, training loop, validations, saves and teardown where they happened (the training
    # loop as one stretch, the others drawn over it); empty for records without the fit's times.
    intervals: list[TimelineInterval]


@dataclass(frozen=True, slots=True)
class Timeline:
    """Where the fit's wall time went, from each rank's real start and end times.

    `parts` are the reporting rank's (rank 0's, else the lowest present); `overhead_per_step_s` is what
    each second of training steps brought along (validation, saves, fit-loop time between steps), so that
    an epoch's time and a projection include them. `ended` is True when the fit ended (completed or
    stopped by a limit), so there is nothing to go.
    """

    rank: int
    fit_wall_s: float | None = decimals(3)
    before_fit_s: float | None = decimals(3)  # process start to the fit's setup: imports, data, launch
    parts: list[TimelinePart]
    loop_overhead_share: float | None = decimals(4)  # (validation + saves + other loop) / training steps
    ended: bool
    stop_reason: str | None
    max_time_s: float | None = decimals(3)
    per_rank: list[RankTimeline]
    tuneup_start_s: float | None = decimals(3, None)  # tuneup's own start-up, inside setup
    # The modules torch.compile wraps, seen at setup ("" the LightningModule itself; empty: none; None: not
    # recorded). Compilation runs inside the first call of each graph: the sanity check's first validation
    # step, the first training step.
    compiled: list[str] | None = None
    # The first training step's time above the steady step time (its compilation, when compiled, and the
    # rest of its warm-up); None where the record has no steady step time to measure it against.
    first_step_extra_s: float | None = decimals(3, None)


# -- convergence (the metrics the training logged) ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """One recorded value of a metric, placed on every x-axis the report offers."""

    value: float = significant(7)
    step: int  # optimizer steps done when it was read
    hours: float | None = decimals(6)  # since the run's start
    samples: int | None  # trained on up to `step`, all ranks (Convergence.samples_basis says how counted)
    usd: float | None = significant(6)  # hours at the run's price; None where the run has no price


@dataclass(frozen=True, slots=True)
class MetricCurve:
    """One metric the training logged, as the reporting rank read it (tuneup/analyze/convergence.py)."""

    name: str
    rank: int  # whose values these are: rank 0's, or the lowest rank that logged it
    ranks: int  # ranks that logged it
    source: str  # where it was read: "validation", "train", "log", or "mixed"
    direction: str  # "lower" (a loss), "higher" (an accuracy) or "unknown"
    direction_basis: str  # how the direction was decided, in words
    step: list[int]
    hours: list[float | None] = decimals(6)
    samples: list[int | None]
    usd: list[float | None] = significant(6)
    values: list[float | None] = significant(7)  # None: not finite (NaN or inf) at that point
    best: CurvePoint | None  # the best finite value so far and when; None where the direction is unknown
    last: CurvePoint | None  # the last finite value
    evaluations_since_best: int | None  # values recorded after the best one
    steps_since_best: int | None
    hours_since_best: float | None = decimals(6)  # to the last value
    usd_since_best: float | None = significant(6)
    plateau: bool  # no improvement over the last Convergence.plateau_evaluations values (validation metrics)
    nonfinite_steps: list[int]  # where a value was NaN or infinite
    spike_steps: list[int]  # where a value jumped the wrong way (Convergence.spike_rule)
    rank_spread_max: float | None = significant(6)  # the largest max - min across ranks at one step


@dataclass(frozen=True, slots=True)
class LossSpread:
    """The ranks' training losses (StepRecord.loss) over windows of steps: how far their window means lie
    apart (max - min), against what the steps' own scatter alone would give ("variance across workers")."""

    ranks: int
    window_steps: int
    step: list[int]  # each window's last step
    spread: list[float] = significant(6)  # max - min of the ranks' mean losses over the window
    noise: list[float] = significant(6)  # the spread the within-window scatter alone would give
    drifting: bool  # the spread grew beyond noise (convergence.py's DRIFT_* rule)
    rule: str


@dataclass(frozen=True, slots=True)
class GradNorm:
    """The gradient's norm per recorded step, where it came free (the clipping norm, or the noise scale's)."""

    source: str  # "grad_norm" (StepRecord.grad_norm) or "sqrt(gns_big_sq)" (the averaged gradient's norm)
    rank: int
    step: list[int]
    values: list[float] = significant(6)
    median: float | None = significant(6)
    spike_steps: list[int]


@dataclass(frozen=True, slots=True)
class TargetOutcome:
    """When, and at what cost, the run reached a quality target (`--target val_acc>=0.9`), or a projection
    of it. `status`: "reached", "projected", "not_projected" (reason says why) or "not_recorded" (the run
    logged no such metric; reason lists those it did)."""

    target: str  # as tuneup.target spells it: "val_acc>=0.9"
    metric: str
    value: float
    lower_is_better: bool
    given_by: str  # "command line" or "callback"
    status: str
    reason: str
    reached: CurvePoint | None  # the first recorded value meeting it
    # The projection (tuneup/analyze/projection.py) from the metric's history: its status, curve and the
    # interval (high None: open above), converted to hours and $ at `Convergence.s_per_step`.
    projection_status: str | None = None
    form: str | None = None
    points_used: int | None = None
    step: float | None = significant(6, default=None)
    step_low: float | None = significant(6, default=None)
    step_high: float | None = significant(6, default=None)
    hours: float | None = decimals(6, default=None)
    hours_low: float | None = decimals(6, default=None)
    hours_high: float | None = decimals(6, default=None)
    usd: float | None = significant(6, default=None)
    usd_low: float | None = significant(6, default=None)
    usd_high: float | None = significant(6, default=None)
    samples: float | None = significant(6, default=None)
    asymptote: float | None = significant(7, default=None)


@dataclass(frozen=True, slots=True)
class Convergence:
    """The metrics the training logged, against steps, hours, samples and dollars; the training loss across
    ranks; the gradient norm; and a quality target's time and cost (tuneup/analyze/convergence.py)."""

    metrics: list[MetricCurve]
    usd_per_hour: float | None = significant(9)  # the run's price (the cost section's); None: not priced
    not_priced_reason: str | None
    samples_basis: str  # how the samples axis was counted
    # Seconds of the fit per training step: the steady step time plus the validation, saves and fit-loop time
    # each step brings along (the cost section's loop overhead); what turns a projected step into hours.
    s_per_step: float | None = significant(6)
    s_per_step_basis: str
    plateau_evaluations: int
    spike_rule: str
    loss_spread: LossSpread | None
    grad_norm: GradNorm | None
    target: TargetOutcome | None
    notes: list[str] = field(default_factory=list)
    # The first step whose training loss (StepRecord.loss) was NaN or infinite on any rank, and that rank.
    train_loss_nonfinite_step: int | None = None
    train_loss_nonfinite_rank: int | None = None
    # Local SGD (TuneupDDPStrategy(local_sgd_period=H)): H, and the steps of the validations that ran between
    # two parameter averages, where each rank evaluated its own drifted model (empty: none did, or no local SGD).
    local_sgd_period: int | None = None
    validations_between_averages: list[int] = field(default_factory=list)


# No slots: the report holds its advice on an analysis by a weak reference (tuneup/report/advice.py), which a
# slotted class refuses before Python 3.11 (weakref_slot). One object per report: slots saved nothing here.
@dataclass(frozen=True)
class RunAnalysis:
    report_schema_version: int
    generated_unix: float
    tuneup_version: str
    run: RunInfo
    warmup: Warmup
    throughput: Throughput
    step_time: StepTime
    timeseries: TimeSeries
    ranks: Ranks
    data_loader: DataLoading
    telemetry: Telemetry
    environment: Environment
    communication: Communication | None
    cost: Cost | None  # None only in version-1 reports written before cost figures existed
    findings: list[Finding]
    warnings: list[str]
    interruptions: Interruptions | None = None
    operators: OperatorProfile | None = None  # only where steps were profiled
    timeline: Timeline | None = None  # None in reports written before the job timeline existed
    noise_scale: NoiseScale | None = None  # None where it was not measured (and in older reports)
    sync_strategy: SyncStrategy | None = None  # None where the run used no TuneupDDPStrategy
    memory: MemoryByKind | None = None  # None where no rank recorded it (and in older reports)
    # The metrics the training logged and a quality target; None where the run logged none (and in older
    # reports).
    convergence: Convergence | None = None
    # Where the run's time and dollars went; None where no rank recorded a step (and in older reports).
    badput: Badput | None = None


# -- badput ledger (where the run's time and money went) ----------------------------------------------


# The ledger's categories, in the order a report lists them. `productive_compute` is the training steps'
# own work; every other one is badput unless the ledger's settings count it as useful (validation).
BADPUT_CATEGORIES = (
    "productive_compute",
    "startup",  # the fit's setup and sanity check, and the first step's extra time (compilation, warm-up)
    "data_wait",  # the training steps' wait for their batch
    "exposed_communication",  # collectives the step waited for, less the waits for a late rank
    "sync_wait",  # waits for other ranks: for a late rank at the collectives, the trainer's own barriers
    "validation",
    "checkpoint_saves",
    "restarts",  # downtime between segments, and the steps a resumed segment did again
    "idle_devices",  # a rank's device paid but outside its fit while the others ran (late start, early end)
    "other",  # the fit loop's own time between steps, teardown, what no record names
)


@dataclass(frozen=True, slots=True)
class BadputCategory:
    """One category of the run's wall time: seconds (the mean over ranks, summed over segments), share of
    the ledger's wall time, and dollars at the run's price."""

    name: str  # one of BADPUT_CATEGORIES
    seconds: float = decimals(3)
    share: float = decimals(4)
    usd: float | None = significant(6)  # None where the run has no price
    useful: bool  # counted as useful work: productive compute, and validation where the setting says so
    basis: str  # how it was measured, in a phrase
    judgement: str | None = None  # why counting it as badput is a judgement call, where it is one


@dataclass(frozen=True, slots=True)
class Badput:
    """Where the run's wall time and dollars went: productive compute and named badput, adding up to the
    whole (tuneup/analyze/badput.py). Dollars are device-time at the run's price, as the cost section's."""

    wall_s: float = decimals(3)  # what the categories add up to: the fit's wall time, restarts included
    usd: float | None = significant(9)  # the same time's dollars; None where the run has no price
    device_hours: float = decimals(6)  # wall time x ranks, summed over segments
    categories: list[BadputCategory]
    useful_s: float = decimals(3)
    useful_share: float = decimals(4)  # goodput, in time: useful seconds over the wall time
    badput_usd: float | None = significant(9)
    validation_useful: bool  # the setting: validation counted as useful work (`--validation-useful`)
    segments: int  # the run's segments (restarts and resumes) the ledger covers
    # Left out of the ledger, as the cost section leaves them out: the first process's time before its fit
    # (imports, launch, data preparation; None where not recorded), and the gaps between segments that
    # followed a completed or user-stopped one (no job ran then).
    before_fit_s: float | None = decimals(3, None)
    before_fit_usd: float | None = significant(6, None)
    gaps_between_segments_s: float = decimals(3, 0.0)


# -- JSON --------------------------------------------------------------------------------------------


def to_json(value: Any, rule: tuple[str, int] | None = None) -> Any:
    """A dataclass tree as plain JSON values: dataclasses become objects in field order, each float is
    rounded by its field's rule, and a non-finite float becomes null (report.json is strict JSON)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_json(getattr(value, f.name), f.metadata.get("round"))
            for f in dataclasses.fields(value)
        }
    if isinstance(value, dict):
        return {str(k): to_json(v, rule) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if rule is not None and all(type(v) is float for v in value):
            # A series: thousands of floats, written without a call each (a 1,024-rank report has millions).
            kind, n = rule
            if kind == "decimals":
                return [round(v, n) if math.isfinite(v) else None for v in value]
        return [to_json(v, rule) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if rule is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        kind, n = rule
        return round(float(value), n) if kind == "decimals" else float(f"{value:.{n}g}")
    return value


class AnalysisFormatError(ValueError):
    """A report document that does not fit RunAnalysis: names the field path."""


T = TypeVar("T")
_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    return _HINTS[cls]


def _read(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise AnalysisFormatError(f"{where}: null where a value is required")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _read(arg, value, where)
            except AnalysisFormatError as exc:
                errors.append(str(exc))
        raise AnalysisFormatError(errors[0])
    if tp is Any:
        return value
    if origin is list:
        if not isinstance(value, list):
            raise AnalysisFormatError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)
        return [_read(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(args) != 2 or args[1] is not Ellipsis:
            raise AnalysisFormatError(f"{where}: expected a list, got {type(value).__name__}")
        return tuple(_read(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise AnalysisFormatError(f"{where}: expected an object, got {type(value).__name__}")
        _, item = typing.get_args(tp)
        return {str(k): _read(item, v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _read_dataclass(tp, value, where)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value) if isinstance(value, float) else value
        raise AnalysisFormatError(f"{where}: expected a number, got {value!r:.40}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise AnalysisFormatError(f"{where}: expected an integer, got {value!r:.40}")
    if tp in (str, bool):
        if type(value) is tp:
            return value
        raise AnalysisFormatError(f"{where}: expected {tp.__name__}, got {value!r:.40}")
    raise AnalysisFormatError(f"{where}: cannot read type {tp!r}")


def _read_dataclass(cls: type[T], value: Any, where: str) -> T:
    if not isinstance(value, dict):
        raise AnalysisFormatError(f"{where}: expected an object, got {type(value).__name__}")
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in value:
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                continue
            if type(None) in typing.get_args(hints[f.name]):
                kwargs[f.name] = None
                continue
            raise AnalysisFormatError(f"{where}.{f.name}: missing")
        kwargs[f.name] = _read(hints[f.name], value[f.name], f"{where}.{f.name}")
    return cls(**kwargs)


def read_dataclass(cls: type[T], document: Any, where: str) -> T:
    """A JSON document as the dataclass `cls`, typed as `from_json` reads report.json (AnalysisFormatError
    names the first field that does not fit; unknown keys are ignored)."""
    return _read_dataclass(cls, document, where)


def from_json(document: Any) -> RunAnalysis:
    """report.json's document as a RunAnalysis. Raises AnalysisFormatError naming the first field that
    does not fit. Keys this version does not know are ignored (a newer minor writer's additions)."""
    return _read_dataclass(RunAnalysis, document, "report")
