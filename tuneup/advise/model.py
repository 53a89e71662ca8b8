"""The advice's typed result: recommendations, what was looked at and left alone, the step-time model's
terms and the what-if over instances, one frozen dataclass each.

These sit above the run's analysis (tuneup.analyze.model) and are written with its JSON rules
(`to_json`, `decimals`, `significant`): report.json carries them under "recommendations", and
`tuneup advise --format json` prints the same document. A relative change is a fraction of 1: +0.25 is
25% more (samples/s) or 25% longer (step time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tuneup.analyze.model import CollectiveFit, decimals, significant

# A recommendation is made only when its predicted gain is at least this (AdaptDL's hysteresis is 5% too):
# below it, a change is within what a rerun of the same settings can show.
MIN_GAIN = 0.05


# Tests set this to make a Range whose ends are out of order, or leave out its point, raise instead of being
# repaired: the repair keeps a defect from ever being printed, the raise finds the defect's cause.
STRICT_INTERVALS = False


class IntervalError(ValueError):
    """A Range built with its ends out of order or without its point (raised only under STRICT_INTERVALS)."""


@dataclass(frozen=True, slots=True)
class Range:
    """A predicted figure and its interval (roughly 90%: the fit's uncertainty and the model's own error).

    Always ordered, low ≤ value ≤ high: every Range passes through this constructor, and one whose ends
    came out swapped or beside its point (a defect upstream) is widened to hold them all, so that no
    impossible interval is ever printed."""

    value: float = significant(5)
    low: float = significant(5)
    high: float = significant(5)

    def __post_init__(self) -> None:
        v, lo, hi = self.value, self.low, self.high
        if any(math.isnan(x) for x in (v, lo, hi)) or lo <= v <= hi:
            return
        if STRICT_INTERVALS:
            raise IntervalError(f"interval out of order: value {v!r}, low {lo!r}, high {hi!r}")
        object.__setattr__(self, "low", min(v, lo, hi))
        object.__setattr__(self, "high", max(v, lo, hi))

    def scaled(self, factor: float) -> Range:
        lo, hi = sorted((self.low * factor, self.high * factor))
        return Range(self.value * factor, lo, hi)

    def change_from(self, base: float) -> Range:
        """The relative change from `base` (+0.2: 20% more), for the value and both ends."""
        return Range(self.value / base - 1, self.low / base - 1, self.high / base - 1)


@dataclass(frozen=True, slots=True)
class Setting:
    """The knobs that the step-time model predicts for. Batch size is per rank and micro-batch."""

    batch_size: int
    accumulate_grad_batches: int
    world_size: int
    precision: str | None = None
    num_workers: int | None = None
    comm_bytes_factor: float = 1.0  # what a compressing hook sends per byte of gradient (fp16: 0.5)
    # Local SGD's H: no gradient leaves a rank, and every H-th step all-reduces the parameters after the
    # optimizer, exposed (TuneupDDPStrategy(local_sgd_period=H)). None: DDP's all-reduce every step.
    local_sgd_period: int | None = None

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.accumulate_grad_batches * self.world_size


@dataclass(frozen=True, slots=True)
class Predicted:
    """What a setting delivers, as the model predicts it."""

    step_ms: Range  # the typical (median) training step
    samples_per_s: Range  # all ranks, at the mean step
    usd_per_million_samples: Range | None = None
    usd_per_million_tokens: Range | None = None
    # Throughput times the statistical efficiency at this global batch (Pollux), where the gradient noise
    # scale was measured: samples/s worth as much progress as the current batch's samples.
    goodput_samples_per_s: Range | None = None
    statistical_efficiency: float | None = decimals(4, None)
    breakdown_ms: dict[str, float] | None = decimals(3, None)  # the model's terms for this setting
    # The run(s) that measured this setting, where one did: the figures are then theirs, not the model's.
    measured_run: str | None = None
    # The mean training step, which samples/s is made of (samples per step / mean step): shown beside
    # samples/s, so that no line divides one step's samples by the other step's time.
    mean_step_ms: Range | None = None


@dataclass(frozen=True, slots=True)
class Change:
    knob: str  # e.g. "batch_size", "accumulate_grad_batches", "num_workers", "precision", "compression"
    current: str
    proposed: str


@dataclass(frozen=True, slots=True)
class Recommendation:
    id: str
    title: str
    changes: list[Change]
    objective: str  # what `gain` is of: "samples/s", "goodput", "time lost to interruptions", ...
    gain: Range  # the objective's predicted relative change (+0.2: 20% better)
    confidence: str  # "high", "medium", "low": how much of the prediction was measured rather than assumed
    evidence: list[str]  # the figures of the run(s) it rests on
    code: str  # the exact Lightning code (Trainer / DataLoader / strategy arguments)
    yaml: str | None  # the same as a LightningCLI YAML fragment, where it has one
    caveats: list[str] = field(default_factory=list)
    current: Predicted | None = None  # the model at the run's own setting (None for advice without one)
    predicted: Predicted | None = None
    cost_change: Range | None = None  # relative change in $ per 1M samples (negative: cheaper)


@dataclass(frozen=True, slots=True)
class Considered:
    """A knob that was looked at and left alone, and why (below the threshold, no evidence, not possible)."""

    knob: str
    reason: str


@dataclass(frozen=True, slots=True)
class ModelTerms:
    """The fitted step-time model (tuneup/advise/step_model.py), per training step unless named otherwise."""

    runs: int
    batch_sizes: list[int]
    world_sizes: list[int]
    compute_intercept_ms: float = decimals(3)  # per micro-batch: forward and backward at batch size 0
    compute_ms_per_sample: float = decimals(5)  # per micro-batch, per sample
    compute_prior: str | None  # how an unidentifiable term was fixed (one batch size seen), else None
    backward_share: float = decimals(4)  # of a micro-batch's compute: what communication can overlap
    data_ms_per_sample: float = decimals(5)
    optimizer_ms: float = decimals(3)
    other_ms: float = decimals(3)  # sync and the loop's own time, per micro-batch
    sync_ms: float | None = decimals(3)  # the collectives' time per step from the link fit (None: one rank)
    exposed_comm_ms: float | None = decimals(3)
    interference_ms: float | None = decimals(3)  # compute slowed by concurrent collectives, where measured
    overlap_gamma: float | None = decimals(3)
    fit_error: float | None = decimals(4)  # the largest relative error on the runs it was fitted to
    median_over_mean: float = decimals(4)
    notes: list[str] = field(default_factory=list)
    interference_measured: bool = False  # against a one-rank run; else assumed (the notes say how)
    # "FSDP2" or "FSDP" where the run sharded its model: its collectives are its gathers and scatters, held
    # at their measured time per micro-batch (no link fit); None: DDP or one rank.
    sharding: str | None = None


@dataclass(frozen=True, slots=True)
class WhatIfRow:
    """One instance (or interconnect) for the same workload, as the model predicts it."""

    instance: str
    provider: str
    gpu: str
    gpus: int
    nodes: int
    usd_per_hour: float = significant(6)
    fits_in_memory: bool | None
    step_ms: Range | None
    samples_per_s: Range | None
    goodput_samples_per_s: Range | None
    usd_per_million_samples: Range | None
    usd_to_target: Range | None
    spot: bool = False
    # Expected share of paid time lost to spot interruptions (checkpoint saves and redone work, at the
    # Young/Daly interval); the row's $ figures include it, its step and samples/s do not.
    rework_share: float | None = decimals(4, None)
    note: str | None = None
    usd_per_million_tokens: Range | None = None
    global_batch: int | None = None  # may differ from WhatIf.global_batch where it does not divide (note)
    batch_size: int | None = None  # per rank and micro-batch
    accumulate_grad_batches: int | None = None
    link: str | None = None  # the link the gradients' all-reduce is predicted over (None: one GPU)
    compute_scale: float | None = decimals(4, None)  # compute time here / on the run's GPU
    peak_memory_gib: float | None = decimals(2, None)  # predicted per GPU
    statistical_efficiency: float | None = decimals(4, None)  # E(B) at this global batch (noise scale known)


@dataclass(frozen=True, slots=True)
class WhatIf:
    global_batch: int
    nodes: int
    target: str | None  # e.g. "1e9 tokens": what usd_to_target is for
    assumptions: list[str]
    rows: list[WhatIfRow]  # best first
    excluded: list[Considered]  # instances left out, and why
    ranked_by: str
    catalog: str | None = None  # the catalog version (and the user's file) the prices come from


@dataclass(frozen=True, slots=True)
class Advice:
    runs: list[str]  # run ids the advice rests on
    objective: str
    min_gain: float = decimals(3)
    model: ModelTerms | None
    current: Predicted | None
    recommendations: list[Recommendation]
    considered: list[Considered]
    whatif: WhatIf | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class AdviceOptions:
    """What the caller of `advise` may set (`tuneup advise`'s options); the defaults are the report's."""

    min_gain: float = MIN_GAIN
    link_fits: tuple[CollectiveFit, ...] | None = None  # a link measured elsewhere (a probe run's fits)
    whatif: bool = True
    user_catalog: str | None = None  # a CSV of instances to add to the packaged catalog
    instances: tuple[str, ...] = ()  # limit the what-if to these instance keys (empty: all)
    target_samples: float | None = None  # for $ to a target in the what-if
    interruptions_per_hour: float | None = None  # spot interruption rate (the what-if's default if None)
    global_batch: int | None = None  # the what-if's global batch (default: the run's)
    nodes: int | None = None  # the what-if's node count (default: 1)
