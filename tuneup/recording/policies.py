"""What a recording session measures and how it prices the run: the options, grouped in typed policies.

Three policies, each a frozen dataclass checked when it is made:
- `RecordingPolicy` (tuneup.record.writer): how much of the record is kept and how often it is flushed;
- `ProfilingPolicy`: what is measured, and how (timing, telemetry, communication, FLOPs, the operator
  profiler, the gradient noise scale);
- `PricingPolicy`: what the job costs per hour (an instance of the catalog or a price of one's own) and
  per kWh.

`policies_from_keywords` maps the flat keyword names of `TuneupCallback` (one name per option, as users
and LightningCLI configs spell them) onto the three, so that every adapter accepts the same names and says
what is wrong with one in its own name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from tuneup.cost.pricing import PriceChoice, check_choice, choice_from_env
from tuneup.record.writer import RecordingPolicy

TIMINGS = ("auto", "host", "cuda_event")


def _positive(owner: str, name: str, value: Any, kind: type | tuple[type, ...] = (int, float)) -> None:
    if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
        raise ValueError(f"{owner}({name}=...) must be a positive number, got {value!r}")


@dataclass(frozen=True)
class ProfilingPolicy:
    """What is measured in each step, and how.

    Args:
        telemetry_interval_s: seconds between telemetry samples (NVML, psutil).
        timing: ``"auto"`` (CUDA events on a GPU, the host clock otherwise), ``"host"`` or ``"cuda_event"``.
        grad_norm: also record the total gradient norm per step (one extra pass over the gradients, no
            device synchronization).
        max_lag_steps: how many steps, beyond the ``flush_every_steps`` that wait to be written anyway,
            CUDA timings may still be unreadable before tuneup waits for the device.
        profile_communication: time every gradient collective (DDP comm hooks, FSDP gathers and scatters)
            when more than one rank trains.
        count_flops: count the FLOPs of the first micro-batch once (torch's FlopCounterMode; that one
            micro-batch runs several times slower) for achieved FLOP/s and MFU.
        flops_per_sample: your own FLOPs per sample (forward and backward), instead of counting.
        profile_steps: capture this many training steps with ``torch.profiler`` on each rank (off: 0). The
            Chrome trace is written beside the record (``rank-<r>/trace.json``: open it in Perfetto) and the
            report shows the top operators of each phase. Profiled steps run slower.
        profile_start_step: how many steps into the fit profiling starts (default 10: past warm-up).
        noise_scale: measure the gradient noise scale B_simple (McCandlish et al. 2018), the batch size
            beyond which a bigger batch stops saving steps, from two gradient norms per measured step, with
            no extra communication and no copy of the gradients. Under DDP (more than one rank, with
            ``profile_communication``): each bucket's squared norm before and after its all-reduce. With one
            process and gradient accumulation of 2 or more (where the trainer says how it scales each
            micro-batch's loss): the gradient's norm after the first micro-batch and before the optimizer
            step. Not measured for FSDP (sharded gradients) or manual optimization. The mixed-precision
            loss scale is divided out. ``False``: nothing is computed.
        noise_scale_every: which optimizer steps take the two norms: those whose step number is a multiple
            of it. ``None`` (automatic): on the CPU, tuneup times the norms and the steps on the host and
            takes the norms on one step in k, k the smallest power of two with (norm time) / (k x step
            time) <= 0.5% (at most 256), re-chosen after each measured step; on CUDA every step (the norms
            are asynchronous kernels the host cannot time). An integer forces one step in that many. Past
            ``detail_steps`` only steps the record keeps take the norms. The record's
            ``noise_scale_sampling`` event gives the final k and the times it was chosen from.
    """

    telemetry_interval_s: float = 1.0
    timing: str = "auto"
    grad_norm: bool = False
    max_lag_steps: int = 4
    profile_communication: bool = True
    count_flops: bool = True
    flops_per_sample: float | None = None
    profile_steps: int = 0
    profile_start_step: int = 10
    noise_scale: bool = True
    noise_scale_every: int | None = None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _positive(owner, "telemetry_interval_s", self.telemetry_interval_s)
        _positive(owner, "max_lag_steps", self.max_lag_steps, int)
        if self.timing not in TIMINGS:
            raise ValueError(f"{owner}(timing={self.timing!r}) must be one of {', '.join(TIMINGS)}")
        if self.flops_per_sample is not None:
            _positive(owner, "flops_per_sample", self.flops_per_sample)
        if self.profile_steps:
            _positive(owner, "profile_steps", self.profile_steps, int)
        start = self.profile_start_step
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"{owner}(profile_start_step=...) must be a non-negative integer, got {start!r}")
        if not isinstance(self.noise_scale, bool):
            raise ValueError(f"{owner}(noise_scale=...) must be True or False, got {self.noise_scale!r}")
        every = self.noise_scale_every
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ValueError(
                f"{owner}(noise_scale_every=...) must be a positive integer (1: every step, k: one "
                f"step in k) or None (chosen automatically), got {every!r}"
            )

    @property
    def counts_flops(self) -> bool:
        """FLOPs are counted unless the user gave their own per sample."""
        return bool(self.count_flops) and self.flops_per_sample is None


@dataclass(frozen=True)
class PricingPolicy:
    """What the job costs: a catalog instance (``"aws:p4d.24xlarge"``; ``spot`` for its spot price;
    ``catalog``: a CSV that extends or overrides the packaged one) or a ``price_per_hour`` of one's own
    (USD, per ``"node"`` or per ``"gpu"``), and ``electricity_usd_per_kwh`` to turn measured energy into
    money. Without an instance or a price, the environment may price the run (``TUNEUP_INSTANCE``, with
    ``TUNEUP_SPOT=1`` and ``TUNEUP_CATALOG``, or ``TUNEUP_PRICE_PER_HOUR`` with ``TUNEUP_PRICE_PER``);
    ``tuneup report --instance ...`` can price or re-price the run afterwards."""

    instance: str | None = None
    spot: bool = False
    price_per_hour: float | None = None
    price_per: str = "node"
    catalog: str | os.PathLike[str] | None = None
    electricity_usd_per_kwh: float | None = None

    def __post_init__(self) -> None:
        if self.electricity_usd_per_kwh is not None:
            _positive(type(self).__name__, "electricity_usd_per_kwh", self.electricity_usd_per_kwh)

    def choice(self, where: str) -> PriceChoice | None:
        """The price choice, else the environment's; checked now (an unknown instance raises, naming the
        closest ones), before any training starts. `where` names the caller in the errors."""
        if self.instance is None and self.price_per_hour is None:
            if self.spot or self.catalog is not None:
                raise ValueError(f"{where}(spot=/catalog=) need instance=: e.g. instance='aws:p4d.24xlarge'")
            return choice_from_env()
        choice = PriceChoice(
            instance=self.instance,
            spot=bool(self.spot),
            price_per_hour=self.price_per_hour,
            price_per=self.price_per,
            catalog=os.fspath(self.catalog) if self.catalog is not None else None,
            source="callback",
        )
        return check_choice(choice, where=where)


_POLICIES: tuple[type, ...] = (RecordingPolicy, ProfilingPolicy, PricingPolicy)
# Each keyword the adapters accept, and the policy it belongs to.
KEYWORD_POLICY: dict[str, type] = {f.name: cls for cls in _POLICIES for f in fields(cls)}
# Each keyword's default: a policy made without it holds this.
KEYWORD_DEFAULTS: dict[str, Any] = {f.name: f.default for cls in _POLICIES for f in fields(cls)}
# The keyword that takes each policy whole (``recording=RecordingPolicy(...)``), as SessionOptions names it.
POLICY_ARGUMENTS: dict[type, str] = {
    RecordingPolicy: "recording",
    ProfilingPolicy: "profiling",
    PricingPolicy: "pricing",
}


@dataclass(frozen=True)
class SessionOptions:
    """The three policies of one session."""

    recording: RecordingPolicy
    profiling: ProfilingPolicy
    pricing: PricingPolicy


def keywords_beside(keywords: Mapping[str, Any], *policies: object | None) -> dict[str, Any]:
    """The flat keywords to pass on beside `policies` (those given whole, None for one not given): a keyword
    of a given policy only where it is set to other than its default, which then is given twice (the
    session refuses it). For an adapter whose signature spells every keyword with its default, as
    TuneupCallback's does for LightningCLI (which passes them all): it cannot tell one left alone."""
    return {
        k: v
        for k, v in keywords.items()
        if k not in KEYWORD_POLICY
        or v != KEYWORD_DEFAULTS[k]
        or not any(isinstance(p, KEYWORD_POLICY[k]) for p in policies)
    }


def policies_from_keywords(owner: str, **keywords: Any) -> SessionOptions:
    """The policies from flat keywords (``flush_every_steps=``, ``timing=``, ``instance=``...: every field
    of the three policies by its own name). A bad value raises a ValueError that names `owner`'s keyword
    (``TuneupCallback(timing='gpu') must be one of ...``)."""
    unknown = sorted(set(keywords) - set(KEYWORD_POLICY))
    if unknown:
        raise TypeError(f"{owner}() got unexpected keyword arguments: {', '.join(unknown)}")
    made: dict[type, Any] = {}
    for cls in _POLICIES:
        given = {k: v for k, v in keywords.items() if KEYWORD_POLICY[k] is cls}
        try:
            made[cls] = cls(**given)
        except ValueError as exc:
            name = cls.__name__
            # RecordingPolicy says "RecordingPolicy.name must ..."; the others "Policy(name=...) ...".
            raise ValueError(
                str(exc).replace(f"{name}.", f"{owner}(").replace(f"{name}(", f"{owner}(")
            ) from None
    return SessionOptions(made[RecordingPolicy], made[ProfilingPolicy], made[PricingPolicy])
