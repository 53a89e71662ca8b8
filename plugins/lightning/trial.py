"""A `tuneup tune` trial inside the training process: apply the trial's settings the Lightning way, stop once
the step time is measured well enough, and tell the tuner how the trial goes (tuneup.tune.protocol).

Each setting is applied by its knob's apply function (tuneup.tune.knobs, where each says how), in the
callback's `setup` (after the datamodule's setup, before the strategy wraps the model and before any
dataloader is built); what needs the wrapped model or the built DataLoader is finished at on_train_start.
Whatever is not applied is written to applied.json with the reason, and the tuner drops that knob.

The run is recorded where the trial says (`TrialSpec.run_dir`, see `trial_run_dir`), over a `dirpath` the
script gives the callback.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tuneup._log import info_once, warn_once
from tuneup.tune import knobs as registry
from tuneup.tune.protocol import (
    APPLIED_FILE,
    HEARTBEAT_S,
    TrialSpec,
    TrialSpecError,
    failure_file,
    heartbeat_file,
    measured_enough,
    spec_from_environment,
)


def trial_run_dir(dirpath: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The run directory a `tuneup tune` trial records to, or None outside a trial. It wins over the
    script's `dirpath` (said once when they differ): the tuner reads every trial's run from the trial's own
    directory, and a fixed dirpath would put them all in one place the tuner never looks."""
    try:
        spec = spec_from_environment(environ)
    except TrialSpecError:
        return None  # the callback says what is wrong with it when the trial starts
    if spec is None or not spec.run_dir:
        return None
    if dirpath is not None and os.path.abspath(dirpath) != os.path.abspath(spec.run_dir):
        info_once(
            "trial-run-dir",
            f"tuneup tune trial {spec.trial}: recording in {spec.run_dir}, not in dirpath={dirpath} "
            "(each trial is recorded in its own directory, where the tuner reads it)",
        )
    return spec.run_dir


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OutOfMemoryError (CUDA, MPS, XPU), or a host allocation failure."""
    if isinstance(exc, MemoryError):
        return True
    with contextlib.suppress(Exception):
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    return "out of memory" in str(exc).lower()[:300]


class TrialControl:
    """One fit's trial: its settings, its stop rule and its answers to the tuner."""

    def __init__(self, spec: TrialSpec, rank: int) -> None:
        self.spec = spec
        self.rank = rank
        self.status_dir = Path(spec.status_dir) if spec.status_dir else None
        self.applied: dict[str, Any] = {}
        self.not_applied: dict[str, str] = {}
        self._at_train_start: list[tuple[str, Callable[[], None]]] = []  # (knob, step)
        self._steps = 0
        self._seen_global_step = -1
        self._last_step_end: float | None = None
        self._steady_ms: list[float] = []
        self._last_beat = 0.0

    # -- settings --------------------------------------------------------------------------------------

    def apply_at_setup(self, trainer: Any, pl_module: Any, on_cuda: bool) -> None:
        """Each setting by its knob's apply function; one that raises is not applied, with the reason."""
        context = _Applying(self, trainer, pl_module, on_cuda)
        for name, value in self.spec.settings.items():
            knob = registry.knob(name)
            if knob is None:
                self.not_applied[name] = "not a knob this version of tuneup applies"
                continue
            try:
                knob.apply(context, value)
            except Exception as exc:
                context.refused(name, f"applying it failed: {type(exc).__name__}: {exc}")
        if self.spec.skip_validation:
            # A trial measures training steps; validation and the sanity check only lengthen it.
            trainer.limit_val_batches = 0
            trainer.num_sanity_val_steps = 0

    def apply_at_train_start(self, trainer: Any) -> None:
        """The knobs' steps that need the wrapped model or the built DataLoader."""
        self._seen_global_step = int(trainer.global_step)
        steps, self._at_train_start = self._at_train_start, []
        for name, step in steps:
            try:
                step()
            except Exception as exc:
                self.applied.pop(name, None)
                self.not_applied[name] = f"applying it at train start failed: {type(exc).__name__}: {exc}"
        if self.rank == 0:
            self._write_applied()

    @property
    def hook_pending(self) -> bool:
        """Whether some knob still waits for on_train_start (the comm hook off CUDA, workers on the loader)."""
        return bool(self._at_train_start)

    def _write_applied(self) -> None:
        if self.status_dir is None:
            return
        document = {"applied": self.applied, "not_applied": self.not_applied}
        with contextlib.suppress(OSError):
            path = self.status_dir / APPLIED_FILE
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(document, indent=1))
            os.replace(tmp, path)

    # -- stopping --------------------------------------------------------------------------------------

    def batch_ended(self, trainer: Any) -> None:
        """After every batch; an optimizer step ended where the global step moved. Count it, beat the heart,
        and stop the fit once the trial has measured enough. Every rank reaches the same step count, so all
        take part in the one collective of a check."""
        global_step = int(trainer.global_step)
        if global_step == self._seen_global_step:
            return  # still accumulating
        self._seen_global_step = global_step
        now = time.perf_counter()
        self._steps += 1
        rule = self.spec.stop
        if self._last_step_end is not None and self._steps > rule.warmup_steps:
            self._steady_ms.append((now - self._last_step_end) * 1000.0)
        self._last_step_end = now
        if now - self._last_beat >= HEARTBEAT_S:
            self._last_beat = now
            self.beat()
        if self._steps >= rule.max_steps:
            trainer.should_stop = True  # the same step on every rank: no collective needed
        elif self._steps % rule.check_every == 0 and self._steps > rule.warmup_steps:
            enough = measured_enough(rule, self._steady_ms)
            if trainer.strategy.reduce_boolean_decision(enough, all=True):
                trainer.should_stop = True

    def manifest(self) -> dict[str, Any]:
        """For the run's manifest: which trial this run is, and what it applied."""
        return {
            "trial": self.spec.trial,
            "settings": dict(self.spec.settings),
            "applied": dict(self.applied),
            "not_applied": dict(self.not_applied),
            "stop": asdict(self.spec.stop),
        }

    def beat(self) -> None:
        if self.status_dir is None:
            return
        try:
            heartbeat_file(self.status_dir, self.rank).write_text(str(self._steps))
        except OSError as exc:
            warn_once("trial-heartbeat", f"cannot write the trial's heartbeat ({exc})")

    def failed(self, exc: BaseException) -> None:
        if self.status_dir is None:
            return
        document = {
            "rank": self.rank,
            "type": type(exc).__name__,
            "message": str(exc)[:500],
            "out_of_memory": is_out_of_memory(exc),
            "steps": self._steps,
        }
        with contextlib.suppress(OSError):
            failure_file(self.status_dir, self.rank).write_text(json.dumps(document))


class _Applying:
    """What a knob's apply function is given (tuneup.tune.knobs.TrialContext): the fit, and where it says
    what it applied, what it could not, and what it finishes at on_train_start."""

    def __init__(self, control: TrialControl, trainer: Any, pl_module: Any, on_cuda: bool) -> None:
        self._control = control
        self.trainer = trainer
        self.pl_module = pl_module
        self.on_cuda = on_cuda

    def applied(self, knob: str, value: Any) -> None:
        self._control.not_applied.pop(knob, None)
        self._control.applied[knob] = value

    def refused(self, knob: str, reason: str) -> None:
        self._control.applied.pop(knob, None)  # a knob is applied, or not: never both
        self._control.not_applied[knob] = reason

    def at_train_start(self, knob: str, step: Callable[[], None]) -> None:
        self._control._at_train_start.append((knob, step))
