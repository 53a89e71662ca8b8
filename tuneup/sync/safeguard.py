"""When a synchronisation strategy is hurting training: the safeguard's decision at each check (no torch).

At each check the strategy hands in what it measured since the last one: the error its compression or its
local steps introduced (`error`; see `SyncConfig` for each measure) and the mean loss of the steps since
the last check, both already agreed across ranks. A check is breached when the error exceeds its bound, or
the loss rose above the lowest earlier check's by more than `max_loss_rise` of it, or the loss is not a
number. After `breaches_to_fall_back` breached checks in a row the strategy falls back, once per breach
run, and the count starts again: one noisy check never changes the training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tuneup.sync.config import SyncConfig


@dataclass(frozen=True, slots=True)
class Check:
    step: int
    error: float | None  # the measured error (None: not measured at this check)
    error_bound: float
    loss: float | None  # mean loss of the steps since the last check, over all ranks
    loss_floor: float | None  # the lowest mean loss of the earlier checks
    reasons: tuple[str, ...]  # why the check is breached; empty when it is not
    fall_back: bool  # this check completes a run of breaches: fall back now

    @property
    def breached(self) -> bool:
        return bool(self.reasons)

    def to_dict(self) -> dict[str, object]:
        return {
            "step": self.step,
            "error": self.error,
            "error_bound": self.error_bound,
            "loss": self.loss,
            "loss_floor": self.loss_floor,
            "breached": self.breached,
            "reasons": list(self.reasons),
            "fall_back": self.fall_back,
        }


@dataclass(slots=True)
class Safeguard:
    config: SyncConfig
    error_name: str  # what `error` measures, as the reasons say it
    error_bound: float
    _loss_floor: float | None = None
    _breaches_in_row: int = 0
    checks: list[Check] = field(default_factory=list)

    @classmethod
    def for_config(cls, config: SyncConfig) -> Safeguard:
        if config.local_sgd_period is not None:
            return cls(config, "parameter divergence", config.max_divergence)
        return cls(config, "compression error", config.max_compression_error)

    def observe(self, step: int, error: float | None, loss: float | None) -> Check:
        reasons = []
        if error is not None and not (error <= self.error_bound):  # NaN breaches too
            reasons.append(f"{self.error_name} {error:.3g} above its bound {self.error_bound:.3g}")
        floor = self._loss_floor
        if loss is not None:
            if not math.isfinite(loss):
                reasons.append(f"the loss is {loss}")
            elif floor is not None and loss - floor > self.config.max_loss_rise * max(abs(floor), 1e-12):
                reasons.append(
                    f"mean loss {loss:.4g} is {loss / floor - 1:+.0%} against the lowest earlier check's "
                    f"{floor:.4g} (bound +{self.config.max_loss_rise:.0%})"
                    if floor > 0
                    else f"mean loss {loss:.4g} rose above the lowest earlier check's {floor:.4g}"
                )
            if math.isfinite(loss):
                self._loss_floor = loss if floor is None else min(floor, loss)
        self._breaches_in_row = self._breaches_in_row + 1 if reasons else 0
        fall_back = self._breaches_in_row >= self.config.breaches_to_fall_back
        if fall_back:
            self._breaches_in_row = 0
        check = Check(step, error, self.error_bound, loss, floor, tuple(reasons), fall_back)
        self.checks.append(check)
        return check

    def observe_loss_only(self, loss: float | None) -> None:
        """A loss seen while no check runs (the exact warm-up): it sets the floor later checks compare to."""
        if loss is not None and math.isfinite(loss):
            self._loss_floor = loss if self._loss_floor is None else min(self._loss_floor, loss)
