"""The settings of a gradient synchronisation strategy, checked when it is made (no torch).

Compression and local SGD are exclusive: local SGD sends no gradient at all between averages, so there
is nothing to compress (and the safeguard could not tell which of the two hurt).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
# DDP rebuilds its buckets during the second iteration (index 1): state kept per bucket (PowerSGD's
# error feedback and warm start) is only valid from iteration 2.
FIRST_STABLE_ITERATION = 2


@dataclass(frozen=True, kw_only=True)
class SyncConfig:
    compression: str = "none"
    # PowerSGD: the rank of the approximation (1-4 is the published range) and error feedback (the part
    # compression left out is added to the next step's gradient; memory: one gradient's size).
    powersgd_rank: int = 4
    error_feedback: bool = True
    # Exact all-reduce for this many optimizer steps first: compression and local steps start from a
    # model past its first, steepest steps (and never before DDP's bucket rebuild).
    warmup_steps: int = 50
    # Post-local SGD: after the warm-up, average the parameters every this many steps instead of the
    # gradients every step. None: off.
    local_sgd_period: int | None = None
    # Average within a node every step and across nodes every `local_sgd_period` steps. None: when the
    # job has more than one node.
    hierarchical: bool | None = None
    # Ranks per node; None: the strategy's own (devices per node). Set it to simulate nodes on one host.
    ranks_per_node: int | None = None
    # The safeguard: a check every this many optimizer steps; fall back after this many breached checks
    # in a row. 0 turns it off.
    check_every_n_steps: int = 10
    breaches_to_fall_back: int = 3
    # Bounds. Compression: the relative error of the compressed average against an exact all-reduce of
    # the same gradient at a checked step. Local SGD: the ranks' parameters' spread around their average
    # at a sync, relative to how far the average moved since the last sync. Both: the mean loss of the
    # steps since the last check against the lowest of the earlier checks, as a ratio less one.
    max_compression_error: float = 0.95
    max_divergence: float = 2.0
    max_loss_rise: float = 0.5

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ValueError(
                f"compression must be one of {', '.join(map(repr, COMPRESSIONS))}, got {self.compression!r}"
            )
        if not 1 <= self.powersgd_rank <= 64:
            raise ValueError(
                f"powersgd_rank must be between 1 and 64 (1-4 is usual), got {self.powersgd_rank}"
            )
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be 0 or more, got {self.warmup_steps}")
        if self.local_sgd_period is not None:
            if self.local_sgd_period < 1:
                raise ValueError(f"local_sgd_period must be at least 1, got {self.local_sgd_period}")
            if self.compression != "none":
                raise ValueError(
                    f"compression={self.compression!r} with local_sgd_period={self.local_sgd_period}: choose one "
                    "(local SGD sends no gradients between averages, so there is nothing to compress)"
                )
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be at least 1, got {self.ranks_per_node}")
        if self.check_every_n_steps < 0:
            raise ValueError(f"check_every_n_steps must be 0 (off) or more, got {self.check_every_n_steps}")
        if self.breaches_to_fall_back < 1:
            raise ValueError(f"breaches_to_fall_back must be at least 1, got {self.breaches_to_fall_back}")
        for name in ("max_compression_error", "max_divergence", "max_loss_rise"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def active(self) -> bool:
        """Whether the strategy changes DDP's synchronisation at all."""
        return self.compression != "none" or self.local_sgd_period is not None

    @property
    def start_step(self) -> int:
        """The first optimizer step (0-based) that is compressed or local."""
        if self.compression == "powersgd" or self.local_sgd_period is not None:
            return max(self.warmup_steps, FIRST_STABLE_ITERATION)
        return self.warmup_steps

    @property
    def label(self) -> str:
        if self.local_sgd_period is not None:
            return f"local SGD, H={self.local_sgd_period}" + (", hierarchical" if self.hierarchical else "")
        if self.compression == "powersgd":
            return f"PowerSGD rank {self.powersgd_rank}" + (
                "" if self.error_feedback else ", no error feedback"
            )
        return "exact all-reduce" if self.compression == "none" else f"{self.compression} compression"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
