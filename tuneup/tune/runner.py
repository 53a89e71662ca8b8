"""Run one trial of the user's command, supervised: every process it starts is ended with it.

The command starts in a new session (its own process group), so that the launcher, every rank it starts
(Lightning's subprocess launcher, torchrun, ddp_spawn workers) and their DataLoader workers can be ended
together. The supervisor polls the trial's status directory (tuneup.tune.protocol):
- a `failed-rank<r>.json`: some rank raised. The other ranks would wait for it in their next collective
  until the process group's timeout (30 minutes by default), so the whole tree is ended at once;
- no heartbeat from any rank for `stall_s` after the first, or none at all within `startup_s`: a hang;
- past `trial_s` in all: a timeout.
Ending the tree: SIGTERM to the group and to every descendant found (a process that left the group too),
then SIGKILL to whatever is left after `grace_s`. After a trial that exited by itself the same sweep runs,
so that no worker outlives its trial.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

    ended: str  # "exited", "failed on a rank", "hang", "timeout", "interrupted"
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


def _descendants(pid: int) -> list[Any]:
    try:
        import psutil

        return psutil.Process(pid).children(recursive=True)
    except Exception:
        return []


def end_process_tree(proc: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """SIGTERM the trial's process group and every descendant, then SIGKILL what is left after `grace_s`."""
    family = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    for child in family:
        with contextlib.suppress(Exception):
            child.terminate()
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc.poll() is not None and not any(_alive(c) for c in family):
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in family:
        with contextlib.suppress(Exception):
            child.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    for child in family:
        with contextlib.suppress(Exception):
            child.wait(timeout=1.0)


def _alive(process: Any) -> bool:
    try:
        return bool(process.is_running()) and process.status() != "zombie"
    except Exception:
        return False


def _tail(path: Path, lines: int = 4) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    kept = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[-600:]


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
    log_path = status_dir / OUTPUT_FILE
    started = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd
            )
        except OSError as exc:
            return Finished("failed to start", None, 0.0, f"cannot run {argv[0]!r}: {exc.strerror or exc}")
        ended, reason = "exited", None
        try:
            while proc.poll() is None:
                time.sleep(limits.poll_s)
                now = time.monotonic()
                failures = _failures(status_dir)
                if failures:
                    ended, reason = "failed on a rank", _failure_reason(failures)
                    break
                refused = _refused(status_dir, settings)
                if refused:
                    ended, reason = "not applied", refused
                    break
                beat = _last_beat(status_dir)
                if beat is None and now - started > limits.startup_s:
                    ended, reason = "hang", f"no training step within {limits.startup_s:.0f} s of the launch"
                    break
                if beat is not None and time.time() - beat > limits.stall_s:
                    ended = "hang"
                    reason = f"no rank finished a training step for {limits.stall_s:.0f} s"
                    break
                if now - started > limits.trial_s:
                    ended, reason = "timeout", f"the trial ran past its limit of {limits.trial_s:.0f} s"
                    break
        except KeyboardInterrupt:
            end_process_tree(proc, limits.grace_s)
            raise
        finally:
            if proc.poll() is None or _descendants(proc.pid):
                end_process_tree(proc, limits.grace_s)
            else:
                # The launcher is gone; a worker it left in the group is not.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
    wall = time.monotonic() - started
    failures = _failures(status_dir)
    applied = _read_json(status_dir / APPLIED_FILE) or {}
    finished = Finished(
        ended,
        proc.returncode,
        wall,
        reason,
        out_of_memory=any(bool(f.get("out_of_memory")) for f in failures),
        failures=failures,
        applied=dict(applied.get("applied") or {}),
        not_applied=dict(applied.get("not_applied") or {}),
        output_tail=_tail(log_path),
    )
    if ended == "exited" and proc.returncode != 0:
        finished.ended = "failed on a rank" if failures else "exited with an error"
        if failures:
            finished.reason = _failure_reason(failures)
        else:
            finished.reason = f"exited with status {proc.returncode}: {finished.output_tail}"
    return finished
