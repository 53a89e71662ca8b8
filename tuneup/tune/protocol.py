"""How `tuneup tune` tells a training process what its trial is, and how the process answers.

The tuner launches the user's command with `TUNEUP_TRIAL` in its environment: one JSON object with the
settings `TuneupCallback` is to apply, the step budget and stop rule, and a status directory. Every rank
inherits the environment from the launcher (Lightning's subprocess launcher, torchrun, ddp_spawn), and
rank 0's reading is broadcast at setup all the same, so one decision holds on every rank.

The trial's run is recorded in the spec's `run_dir`, whatever `dirpath` the script gives the callback.

Answers, written by the callback into the status directory (files, so that they survive a process that
is then killed):
    heartbeat-rank<r>   touched at most every HEARTBEAT_S while steps run: the tuner's hang detector
    failed-rank<r>.json the exception that ended the fit on that rank (type, message, out_of_memory)
    applied.json        what rank 0 applied, and what it could not (with the reason)
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ENV_TRIAL = "TUNEUP_TRIAL"
# Set on every process a tuning session launches (with the session's id): lets a test, or a user, find a
# trial's processes, and tells them apart from the user's other jobs.
ENV_SESSION = "TUNEUP_TUNE_SESSION"
HEARTBEAT_S = 1.0
APPLIED_FILE = "applied.json"


def heartbeat_file(status_dir: Path, rank: int) -> Path:
    return status_dir / f"heartbeat-rank{rank}"


def failure_file(status_dir: Path, rank: int) -> Path:
    return status_dir / f"failed-rank{rank}.json"


class TrialSpecError(ValueError):
    """A TUNEUP_TRIAL the callback cannot use: names what is wrong."""


# What a trial's step limit counts, said in the same words by every command that runs trials (tune and
# advise --measure): the trial callback counts the batches where trainer.global_step moved
# (plugins/lightning/trial.py), not Lightning's max_steps, which counts each optimizer's step.
TRIAL_STEPS_HELP = (
    "most training steps a trial runs, each a batch (or an accumulation's batches) that stepped the "
    "optimizers; a batch stepping two optimizers is one, where Lightning's max_steps counts two"
)


@dataclass(frozen=True, slots=True)
class StopRule:
    """When a trial has measured enough: after `warmup_steps`, once the mean steady step time is known to
    `precision` (the 95% interval's half-width over the mean, from batch means) with at least `min_steps`
    steady steps; at `max_steps` at the latest. The decision is taken every `check_every` steps."""

    max_steps: int = 200
    warmup_steps: int = 10
    min_steps: int = 30
    precision: float = 0.02
    check_every: int = 5

    def __post_init__(self) -> None:
        for name in ("max_steps", "warmup_steps", "min_steps", "check_every"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < (0 if name == "warmup_steps" else 1)
            ):
                raise TrialSpecError(f"stop rule: {name} must be a positive whole number, got {value!r}")
        if not (
            isinstance(self.precision, (int, float))
            and 0 < self.precision < 1
            and math.isfinite(self.precision)
        ):
            raise TrialSpecError(f"stop rule: precision must be a fraction in (0, 1), got {self.precision!r}")


@dataclass(frozen=True, slots=True)
class TrialSpec:
    trial: str  # the trial's name in the tuning directory
    settings: dict[str, Any] = field(default_factory=dict)  # knobs the callback applies (Config's names)
    stop: StopRule = field(default_factory=StopRule)
    status_dir: str | None = None
    skip_validation: bool = True  # a trial measures training steps: validation only lengthens it
    # Where the trial's run is recorded. It wins over a dirpath the script gives TuneupCallback (the README's
    # own style): the tuner reads each trial's run from its own directory.
    run_dir: str | None = None

    def to_env(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrialSpec:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TrialSpecError(f"{ENV_TRIAL} is not JSON ({exc})") from None
        if not isinstance(data, Mapping):
            raise TrialSpecError(f"{ENV_TRIAL} must be a JSON object")
        try:
            stop = StopRule(**dict(data.get("stop") or {}))
            return cls(
                trial=str(data.get("trial", "")),
                settings=dict(data.get("settings") or {}),
                stop=stop,
                status_dir=data.get("status_dir"),
                skip_validation=bool(data.get("skip_validation", True)),
                run_dir=str(data["run_dir"]) if data.get("run_dir") else None,
            )
        except TypeError as exc:
            raise TrialSpecError(f"{ENV_TRIAL} has an unknown field ({exc})") from None


def spec_from_environment(environ: Mapping[str, str] = os.environ) -> TrialSpec | None:
    text = environ.get(ENV_TRIAL)
    return TrialSpec.from_json(text) if text else None


# Two-sided 97.5% quantiles of Student's t by degrees of freedom: the batch-means interval has few blocks.
_T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
MAX_BLOCKS = 10


def relative_half_width(intervals_ms: list[float]) -> float | None:
    """The 95% interval's half-width of the mean step time over the mean, by batch means: consecutive steps
    are autocorrelated (a slow step drags the next), so the steps are cut into up to 10 blocks and the
    blocks' means are the samples. None with fewer than 3 steps per block for 5 blocks."""
    n = len(intervals_ms)
    blocks = min(MAX_BLOCKS, n // 3)
    if blocks < 5:
        return None
    size = n // blocks
    tail = intervals_ms[n - blocks * size :]  # the oldest leftover steps go: they are nearest the warm-up
    means = [sum(tail[i * size : (i + 1) * size]) / size for i in range(blocks)]
    mean = sum(means) / blocks
    if mean <= 0:
        return None
    variance = sum((m - mean) ** 2 for m in means) / (blocks - 1)
    return _T975.get(blocks - 1, 2.26) * math.sqrt(variance / blocks) / mean


def measured_enough(rule: StopRule, steady_intervals_ms: list[float]) -> bool:
    """Whether the steady steps are enough and their mean is known to the rule's precision (this rank's
    view: the ranks then agree on one decision)."""
    if len(steady_intervals_ms) < rule.min_steps:
        return False
    width = relative_half_width(steady_intervals_ms)
    return width is not None and width <= rule.precision
