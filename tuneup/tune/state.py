"""A tuning session on disk: `tune.json` in the tuning directory, beside one directory per trial.

    TUNE_DIR/
      tune.json                 the session: command, space, objective, every trial, the result
      trials/00-baseline/       status files (tuneup.tune.protocol), output.log, and run/ (the run record)
      trials/01-b32-a1-w0/ ...

tune.json is rewritten (atomically) after every trial, so that a killed session loses at most the trial
it was running and `tuneup tune --resume TUNE_DIR` continues from there. A trial's figures are kept in
tune.json (with the step-time model's Observation), so that the report and a resumed search need not
read every run again.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuneup._version import __version__
from tuneup.advise.observe import Observation
from tuneup.analyze.model import read_dataclass
from tuneup.tune.space import Config, SearchSpace

TUNE_FILE = "tune.json"
TUNE_FORMAT = 1
TRIALS_DIR = "trials"


class TuneStateError(ValueError):
    """A tuning directory that cannot be read or resumed: names the file and the fix (exit code 2)."""


# Trial statuses. "infeasible": ran out of memory (a result, not an error); "failed": anything else that
# ended it early (an exception on some rank, a hang, a timeout, a setting the script could not apply).
OK, FAILED, INFEASIBLE = "ok", "failed", "infeasible"


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the search predicted for a trial's objective before running it (None for the baseline)."""

    value: float
    low: float
    high: float


@dataclass(slots=True)
class Trial:
    index: int
    name: str
    config: Config  # every knob resolved (the baseline's values where the search left one alone)
    role: str  # "baseline", "search" or "confirm"
    status: str = OK
    reason: str | None = None
    run_dir: str | None = None  # relative to the tuning directory
    started_unix: float = 0.0
    wall_s: float = 0.0
    steps: int | None = None
    step_ms: float | None = None  # mean steady step
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    usd_per_hour: float | None = None
    peak_memory_bytes: float | None = None
    b_noise: float | None = None
    # Lightning's optimizer steps (trainer.global_step, what max_steps counts) per training step: 2 for a
    # batch that steps two optimizers, as a GAN's does. None: not recorded (taken as 1).
    optimizer_steps_per_step: float | None = None
    objective: float | None = None  # the objective's rate (higher is better; Objective.figure shows it)
    predicted: Prediction | None = None
    not_applied: dict[str, str] = field(default_factory=dict)
    observation: Observation | None = None

    @property
    def measured(self) -> bool:
        return self.status == OK and self.objective is not None

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["config"] = self.config.as_dict()
        out["predicted"] = asdict(self.predicted) if self.predicted else None
        out["observation"] = asdict(self.observation) if self.observation else None
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trial:
        """A trial as tune.json keeps it, typed field by field (AnalysisFormatError names a field that does not
        fit; SpaceError an unknown knob or a knob's value of the wrong type)."""
        document = dict(data)
        config = Config.from_dict(document.pop("config", None) or {})
        figures = read_dataclass(_trial_document(), document, "trial")
        return cls(config=config, **{f.name: getattr(figures, f.name) for f in dataclasses.fields(figures)})


@functools.cache
def _trial_document() -> type:
    """Trial's fields but its configuration, as a dataclass the typed reader reads (a configuration has one
    attribute per registered knob, not fields of its own: Config.from_dict reads it)."""
    hints = typing.get_type_hints(Trial)
    specs: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(Trial):
        if f.name == "config":
            continue
        if f.default is not dataclasses.MISSING:
            spec = field(default=f.default)
        elif f.default_factory is not dataclasses.MISSING:
            spec = field(default_factory=f.default_factory)
        else:
            spec = field()
        specs.append((f.name, hints[f.name], spec))
    document = dataclasses.make_dataclass("TrialDocument", specs)
    document.__module__ = __name__  # where the typed reader resolves its annotations
    return document


@dataclass(slots=True)
class TuneState:
    command: list[str]
    script_kind: str  # "cli" (LightningCLI overrides) or "callback" (TuneupCallback applies the settings)
    objective: str
    space: SearchSpace | None = None  # chosen once the baseline has run (its values fill the defaults)
    requested: dict[str, Any] = field(default_factory=dict)  # the knob values asked for on the command line
    options: dict[str, Any] = field(default_factory=dict)  # budget, stop rule, thresholds, price
    trials: list[Trial] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)  # knob -> why it is no longer tuned
    result: dict[str, Any] | None = None  # the winner, its gain and the compare verdict, once decided
    created_unix: float = field(default_factory=time.time)
    stopped_because: str | None = None

    @property
    def baseline(self) -> Trial | None:
        return next((t for t in self.trials if t.role == "baseline"), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": TUNE_FORMAT,
            "tuneup_version": __version__,
            "command": self.command,
            "script_kind": self.script_kind,
            "objective": self.objective,
            "space": self.space.as_dict() if self.space else None,
            "requested": self.requested,
            "options": self.options,
            "trials": [t.as_dict() for t in self.trials],
            "dropped": self.dropped,
            "result": self.result,
            "created_unix": self.created_unix,
            "stopped_because": self.stopped_because,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TuneState:
        return cls(
            command=list(data["command"]),
            script_kind=str(data["script_kind"]),
            objective=str(data["objective"]),
            space=SearchSpace.from_dict(data["space"]) if data.get("space") else None,
            requested=dict(data.get("requested") or {}),
            options=dict(data.get("options") or {}),
            trials=[Trial.from_dict(t) for t in data.get("trials") or ()],
            dropped=dict(data.get("dropped") or {}),
            result=data.get("result"),
            created_unix=float(data.get("created_unix") or 0.0),
            stopped_because=data.get("stopped_because"),
        )


def save_state(tune_dir: Path, state: TuneState) -> Path:
    path = tune_dir / TUNE_FILE
    tmp = path.with_name(f".{TUNE_FILE}.tmp")
    tmp.write_text(json.dumps(finite(state.as_dict()), indent=1, allow_nan=False))
    os.replace(tmp, path)
    return path


def finite(value: Any) -> Any:
    """JSON has no NaN or infinity: a figure that is not finite is written as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def is_tune_dir(path: Path) -> bool:
    return (path / TUNE_FILE).is_file()


def load_state(tune_dir: Path) -> TuneState:
    path = tune_dir / TUNE_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise TuneStateError(
            f"{tune_dir} is not a tuning directory (no {TUNE_FILE}); pass the --out of a `tuneup tune`"
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise TuneStateError(f"cannot read {path} ({exc})") from None
    if not isinstance(data, Mapping) or data.get("format") != TUNE_FORMAT:
        raise TuneStateError(
            f"{path} is not a tuning session this tuneup reads (format {data.get('format') if isinstance(data, Mapping) else '?'}, "
            f"expected {TUNE_FORMAT})"
        )
    try:
        return TuneState.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise TuneStateError(
            f"{path} is damaged ({type(exc).__name__}: {exc}); start a new session"
        ) from None
