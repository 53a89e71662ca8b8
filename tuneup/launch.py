"""Start a command that may grow a tree of training processes, and end the whole tree with it.

`bench`, `probe-network` and `tune` all start training that starts more processes: a torchrun with its
ranks, Lightning's subprocess launcher, ddp_spawn workers, DataLoader workers. Ending only the direct child
(what `subprocess.run(timeout=)` does) leaves the ranks running, holding the devices and a port. So:
- the command starts in a session of its own, hence its own process group, which its descendants inherit;
- while it runs, its descendants are gathered every `scan_s` (psutil), so that one that left the group
  (a `setsid`, a daemon) is still known once its parent is gone;
- it is ended on a timeout, when the caller's `watch` asks for it, or on KeyboardInterrupt (or any other
  exception): SIGTERM to the group and to every descendant known, SIGKILL to what is left after `grace_s`;
- after it exits by itself the same sweep runs, so that no worker outlives its command;
- under `terminate_as_exit()` a SIGTERM to this process (a CI job cancelled, a scheduler's stop) is an
  exception too, so the tree is ended and the caller's cleanup (`finally`, `with`) runs, which Python's
  default for SIGTERM (dying at once) skips.
The command's exit is noticed without reaping it (`waitid` with WNOWAIT): while its zombie holds the pid,
no other process can take that number as a process group id, so the group's last SIGKILL reaches only the
command's own group.

The output goes where the caller needs it: this process's own stdout and stderr (`INHERIT`, for a command
the user watches), captured (`CAPTURE`: stdout and stderr apart, in temporary files rather than memory, so
that a chatty run neither fills memory nor blocks on a full pipe), or one file (a `Path`, stderr merged
into it). The result carries the end of each, for an error message.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Literal, Union

import psutil

__all__ = ["CAPTURE", "INHERIT", "Ended", "Output", "run_tree", "terminate_as_exit"]

INHERIT: Final = "inherit"
CAPTURE: Final = "capture"
Output = Union[Literal["inherit", "capture"], Path]  # noqa: UP007 - a runtime alias on Python 3.10

# Enough for the last lines of a traceback; an error message shows only a few of them.
TAIL_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class Ended:
    """How a command and its tree of processes ended."""

    returncode: int | None  # the command's exit status, -N when signal N ended it; None if never reaped
    duration_s: float  # from the start to its exit, or to the decision to end it (the sweep not counted)
    timed_out: bool = False
    stopped: str | None = None  # the reason `watch` gave for ending it early
    stdout_tail: str = ""  # the end of its output (of both streams when they went to one file)
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.stopped is None

    def tail(self, lines: int = 3) -> str:
        """The last `lines` non-blank lines of stderr (of stdout when stderr holds none), joined by ' | '."""
        for text in (self.stderr_tail, self.stdout_tail):
            kept = [line.strip() for line in text.splitlines() if line.strip()]
            if kept:
                return " | ".join(kept[-lines:])
        return ""


def run_tree(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    output: Output = CAPTURE,
    timeout_s: float | None = None,
    watch: Callable[[], str | None] | None = None,
    grace_s: float = 5.0,
    poll_s: float = 0.2,
    scan_s: float = 1.0,
) -> Ended:
    """Run `argv` in a session of its own until it exits, `timeout_s` passes, or `watch` (called every
    `poll_s`) returns a reason to stop it; then end every process it started. Raises OSError when the
    command cannot be started, as subprocess does; re-raises KeyboardInterrupt after ending the tree."""
    with contextlib.ExitStack() as files:
        out_file: IO[bytes] | None = None
        err_file: IO[bytes] | None = None
        if isinstance(output, Path):
            out_file = files.enter_context(open(output, "w+b"))
        elif output == CAPTURE:
            out_file = files.enter_context(tempfile.TemporaryFile())
            err_file = files.enter_context(tempfile.TemporaryFile())
        elif output != INHERIT:
            raise ValueError(f"output must be {INHERIT!r}, {CAPTURE!r} or a Path, not {output!r}")
        started = time.monotonic()
        proc = subprocess.Popen(
            list(argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdout=out_file,
            stderr=subprocess.STDOUT if isinstance(output, Path) else err_file,
            start_new_session=True,
        )
        family: dict[int, psutil.Process] = {}
        timed_out, stopped = False, None
        try:
            next_scan_s = started + min(scan_s, poll_s)
            while not _exits_within(proc.pid, poll_s):
                now = time.monotonic()
                if now >= next_scan_s:
                    _gather(proc.pid, family)
                    next_scan_s = now + scan_s
                if watch is not None and (stopped := watch()) is not None:
                    break
                if timeout_s is not None and now - started > timeout_s:
                    timed_out = True
                    break
            duration_s = time.monotonic() - started
        except BaseException:
            _end_tree(proc, family.values(), grace_s)
            raise
        if not _exits_within(proc.pid, 0.0) or any(_alive(p) for p in family.values()):
            _end_tree(proc, family.values(), grace_s)
        else:
            # The command is gone and nothing it was seen to start lives on; a worker it started since
            # the last scan may still be in its group.
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        ended = Ended(
            returncode=proc.returncode,
            duration_s=duration_s,
            timed_out=timed_out,
            stopped=stopped,
            stdout_tail=_read_tail(out_file) if out_file is not None else "",
            stderr_tail=_read_tail(err_file) if err_file is not None else "",
        )
    return ended


def _exits_within(pid: int, timeout_s: float) -> bool:
    """Whether the child `pid` has exited, waiting up to `timeout_s`, without reaping it."""
    deadline_s = time.monotonic() + timeout_s
    delay_s = 0.001
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True  # already reaped
        remaining_s = deadline_s - time.monotonic()
        if remaining_s <= 0:
            return False
        # Quick to notice a short command's exit, then no busier than 20 checks a second.
        time.sleep(min(delay_s, remaining_s))
        delay_s = min(delay_s * 2, 0.05)


def _gather(pid: int, family: dict[int, psutil.Process]) -> None:
    """Add the living descendants of `pid` to `family`. psutil's Process remembers each one's start time,
    so a signal never reaches an unrelated process that later took the same pid."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children(recursive=True):
            family.setdefault(child.pid, child)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _end_tree(proc: subprocess.Popen[Any], known: Iterable[psutil.Process], grace_s: float) -> None:
    """SIGTERM the group and every known descendant; SIGKILL whatever is left after `grace_s`; reap."""
    family = {p.pid: p for p in known}
    if not _exits_within(proc.pid, 0.0):
        _gather(proc.pid, family)  # the latest tree, while the command can still name its children
    members = list(family.values())
    _signal_group(proc.pid, signal.SIGTERM)
    for member in members:
        with contextlib.suppress(psutil.Error):
            member.terminate()
    deadline_s = time.monotonic() + grace_s
    while time.monotonic() < deadline_s:
        if _exits_within(proc.pid, 0.0) and not any(_alive(m) for m in members):
            break
        time.sleep(0.05)
    _signal_group(proc.pid, signal.SIGKILL)
    for member in members:
        with contextlib.suppress(psutil.Error):
            member.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    # Return once they are gone: the devices, ports and files they held are free for the next command.
    deadline_s = time.monotonic() + 1.0
    while any(_alive(m) for m in members) and time.monotonic() < deadline_s:
        time.sleep(0.02)


def _read_tail(file: IO[bytes]) -> str:
    try:
        file.flush()
        size = file.seek(0, os.SEEK_END)
        file.seek(max(0, size - TAIL_BYTES))
        data = file.read()
    except (OSError, ValueError):
        return ""
    text = data.decode(errors="replace")
    if size > TAIL_BYTES:
        text = text.partition("\n")[2]  # the first line is cut: drop it
    return text


@contextlib.contextmanager
def terminate_as_exit() -> Iterator[None]:
    """While inside, SIGTERM raises SystemExit(143) (128 + SIGTERM, the shell's code for it) in the main
    thread; the handler before is restored afterwards. Elsewhere than the main thread it does nothing
    (Python lets only the main thread set handlers)."""
    try:
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)
