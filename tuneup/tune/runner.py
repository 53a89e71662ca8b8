"""Run one trial of the user's command, supervised: every process it starts is ended with it.

The command runs under tuneup.launch, in a session of its own, so that the launcher, every rank it starts
(Lightning's subprocess launcher, torchrun, ddp_spawn workers) and their DataLoader workers end together,
whether the trial exits by itself or is stopped. The supervisor polls the trial's status directory
(tuneup.tune.protocol):
- a `failed-rank<r>.json`: some rank raised. The other ranks would wait for it in their next collective
  until the process group's timeout (30 minutes by default), so the whole tree is ended at once;
- no heartbeat from any rank for `stall_s` after the first, or none at all within `startup_s`: a hang;
- past `trial_s` in all: a timeout.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneup.launch import run_tree
from tuneup.tune.protocol import APPLIED_FILE

OUTPUT_FILE = "output.log"


@dataclass(frozen=True, slots=True)
class Limits:
    startup_s: float = 300.0  # launch to the first step: imports, process group, data, compile
    stall_s: float = 60.0  # no step on any rank for this long, once steps have begun
    trial_s: float = 1800.0  # the whole trial
    grace_s: float = 5.0  # between SIGTERM and SIGKILL
    poll_s: float = 0.2


@dataclass(slots=True)
class Finished:
    """How a trial's processes ended."""

    ended: str  # "exited", "failed on a rank", "hang", "timeout", "not applied", "failed to start"
    returncode: int | None
    wall_s: float
    reason: str | None = None
    out_of_memory: bool = False
    failures: list[dict[str, Any]] = field(default_factory=list)
    applied: dict[str, Any] = field(default_factory=dict)
    not_applied: dict[str, str] = field(default_factory=dict)
    output_tail: str = ""


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _failures(status_dir: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(status_dir.glob("failed-rank*.json")):
        data = _read_json(path)
        if data is not None:
            found.append(data)
    return found


def _failure_reason(failures: list[dict[str, Any]]) -> str:
    first = failures[0]
    return f"rank {first.get('rank')} raised {first.get('type')}: {first.get('message')}"


def _refused(status_dir: Path, settings: Collection[str]) -> str | None:
    if not settings:
        return None
    applied = _read_json(status_dir / APPLIED_FILE) or {}
    refused = {k: v for k, v in (applied.get("not_applied") or {}).items() if k in settings}
    return "; ".join(f"{k}: {v}" for k, v in refused.items()) or None


def _last_beat(status_dir: Path) -> float | None:
    times = []
    for path in status_dir.glob("heartbeat-rank*"):
        with contextlib.suppress(OSError):
            times.append(path.stat().st_mtime)
    return max(times) if times else None


@dataclass(slots=True)
class _Watch:
    """Reads the status directory at every poll of the launcher; names what ends the trial early."""

    status_dir: Path
    limits: Limits
    settings: Collection[str]
    started_s: float = field(default_factory=time.monotonic)
    ended: str = "exited"

    def __call__(self) -> str | None:
        failures = _failures(self.status_dir)
        if failures:
            self.ended = "failed on a rank"
            return _failure_reason(failures)
        refused = _refused(self.status_dir, self.settings)
        if refused:
            self.ended = "not applied"
            return refused
        beat = _last_beat(self.status_dir)
        if beat is None and time.monotonic() - self.started_s > self.limits.startup_s:
            self.ended = "hang"
            return f"no training step within {self.limits.startup_s:.0f} s of the launch"
        if beat is not None and time.time() - beat > self.limits.stall_s:
            self.ended = "hang"
            return f"no rank finished a training step for {self.limits.stall_s:.0f} s"
        return None


def run_supervised(
    argv: list[str],
    env: dict[str, str],
    status_dir: Path,
    limits: Limits,
    cwd: str | None = None,
    settings: Collection[str] = (),
) -> Finished:
    """Run `argv` to its end (or end it), its output in status_dir/output.log. A knob of `settings` that the
    callback reports it could not apply ends the trial at once: what would be measured is not the trial."""
    status_dir.mkdir(parents=True, exist_ok=True)
    watch = _Watch(status_dir, limits, settings)
    started_s = watch.started_s
    try:
        run = run_tree(
            argv,
            env=env,
            cwd=cwd,
            output=status_dir / OUTPUT_FILE,
            timeout_s=limits.trial_s,
            watch=watch,
            grace_s=limits.grace_s,
            poll_s=limits.poll_s,
        )
    except OSError as exc:
        return Finished("failed to start", None, 0.0, f"cannot run {argv[0]!r}: {exc.strerror or exc}")
    wall_s = time.monotonic() - started_s  # the sweep included: the budget pays for it too
    ended, reason = watch.ended, run.stopped
    if run.timed_out:
        ended, reason = "timeout", f"the trial ran past its limit of {limits.trial_s:.0f} s"
    failures = _failures(status_dir)
    applied = _read_json(status_dir / APPLIED_FILE) or {}
    finished = Finished(
        ended,
        run.returncode,
        wall_s,
        reason,
        out_of_memory=any(bool(f.get("out_of_memory")) for f in failures),
        failures=failures,
        applied=dict(applied.get("applied") or {}),
        not_applied=dict(applied.get("not_applied") or {}),
        output_tail=run.tail(4)[-600:],
    )
    if ended == "exited" and run.returncode != 0:
        finished.ended = "failed on a rank" if failures else "exited with an error"
        if failures:
            finished.reason = _failure_reason(failures)
        else:
            finished.reason = f"exited with status {run.returncode}: {finished.output_tail}"
    return finished
