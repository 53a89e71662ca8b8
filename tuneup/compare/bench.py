"""`tuneup bench`: run a short training workload N times, alternating with a baseline, each run recorded.

A workload is a command or a Python entry point (`module:function`) that trains with `TuneupCallback()`.
Each run gets its own run directory through the environment (`TUNEUP_DIR`, which the callback uses when
its `dirpath` is not set), so the workload needs no change to be benchmarked. Runs of the two workloads
alternate, A B B A A B ..., so that the machine's drift over the minutes of a bench hits both alike.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tuneup.launch import CAPTURE, run_tree
from tuneup.record.schema import ENV_RUN_DIR, MANIFEST_FILE


class BenchError(Exception):
    """A workload that cannot be benchmarked: one line naming it and the fix (exit code 2)."""


@dataclass(frozen=True)
class Workload:
    label: str  # "candidate" or "baseline": the subdirectory its runs go to
    command: str | None = None
    entry: str | None = None
    # Where it runs and what it adds to the environment: the baseline's worktree (--baseline-ref).
    cwd: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.command is None) == (self.entry is None):
            raise BenchError(f"{self.label}: give a command or an entry point (module:function), one of them")
        if self.entry is not None:
            module, _, function = self.entry.partition(":")
            if (
                not module
                or not function
                or not all(p.isidentifier() for p in (*module.split("."), function))
            ):
                raise BenchError(
                    f"{self.label}: entry point {self.entry!r} must look like package.module:function"
                )
        if self.command is not None and not shlex.split(self.command):
            raise BenchError(f"{self.label}: an empty command")

    @property
    def shown(self) -> str:
        what = self.command if self.command is not None else f"entry point {self.entry}"
        return what if self.cwd is None else f"{what} (in {self.cwd})"

    def argv(self) -> list[str]:
        if self.command is not None:
            return shlex.split(self.command)
        module, _, function = str(self.entry).partition(":")
        code = (
            f"import importlib, sys; sys.exit(getattr(importlib.import_module({module!r}), {function!r})())"
        )
        return [sys.executable, "-c", code]


def interleaved(workloads: Sequence[Workload], runs: int) -> list[tuple[int, Workload]]:
    """(run number, workload) in order: A B, then B A, then A B... so neither always goes first."""
    order: list[tuple[int, Workload]] = []
    for i in range(runs):
        turn = list(workloads) if i % 2 == 0 else list(reversed(workloads))
        order.extend((i + 1, w) for w in turn)
    return order


def run_bench(
    workloads: Sequence[Workload],
    runs: int,
    out_dir: Path,
    *,
    timeout_s: float = 3600.0,
    echo: Callable[[str], None] = print,
) -> dict[str, Path]:
    """Run every workload `runs` times, interleaved; returns each workload's set directory."""
    if runs < 1:
        raise BenchError(f"--runs must be at least 1, got {runs}")
    sets = {w.label: out_dir / w.label for w in workloads}
    for path in sets.values():
        if path.exists() and any(path.iterdir()):
            raise BenchError(
                f"{path} already holds runs; give --out an empty or new directory so sets never mix"
            )
    for n, workload in interleaved(workloads, runs):
        run_dir = sets[workload.label] / f"run-{n:02d}"
        seconds = run_once(workload, run_dir, f"run {n}", timeout_s=timeout_s)
        echo(f"{workload.label} run {n}/{runs}: {seconds:.1f} s -> {run_dir}")
    return sets


def pinned_argv(argv: Sequence[str], cpus: Iterable[int]) -> list[str]:
    """`argv` run on `cpus` only: a Python launcher sets its affinity and execs it, so that every process
    it starts (a launcher's ranks, dataloader workers) inherits the set; no `taskset` needed."""
    code = (
        f"import os, sys; os.sched_setaffinity(0, {sorted(cpus)!r})\n"
        "try:\n os.execvp(sys.argv[1], sys.argv[1:])\n"
        "except OSError as exc:\n sys.exit(f'cannot run {sys.argv[1]}: {exc.strerror or exc}')"
    )
    return [sys.executable, "-c", code, *argv]


def run_once(
    workload: Workload,
    run_dir: Path,
    name: str,
    *,
    timeout_s: float,
    cpus: Iterable[int] | None = None,
    cancel: Callable[[], bool] | None = None,
) -> float:
    """One run of `workload` recorded into `run_dir` (through TUNEUP_DIR), on `cpus` when given; its
    seconds. BenchError, naming the run as `name`, when it cannot start, fails, times out or records
    nothing; `cancel`, asked while it runs, ends it (its tree included) once it says so."""
    env = {**os.environ, **workload.env, ENV_RUN_DIR: str(run_dir.resolve())}
    argv = workload.argv() if cpus is None else pinned_argv(workload.argv(), cpus)
    try:
        # Its own session: a timeout ends a torchrun's or Lightning's ranks too, not only the launcher.
        run = run_tree(
            argv,
            env=env,
            cwd=workload.cwd,
            output=CAPTURE,
            timeout_s=timeout_s,
            watch=None if cancel is None else (lambda: "cancelled" if cancel() else None),
        )
    except FileNotFoundError as exc:
        raise BenchError(f"{workload.label}: cannot run {workload.shown!r} ({exc.strerror or exc})") from None
    if run.stopped is not None:
        raise BenchError(f"{workload.label} {name} was {run.stopped}")
    if run.timed_out:
        raise BenchError(f"{workload.label} {name} took longer than {timeout_s:.0f} s; raise --timeout")
    if run.returncode != 0:
        raise BenchError(
            f"{workload.label} {name} ({workload.shown}) exited with {run.returncode}: {run.tail(3)}"
        )
    if not (run_dir / MANIFEST_FILE).is_file():
        raise BenchError(
            f"{workload.label} {name} recorded no run in {run_dir}: does it train with TuneupCallback() "
            f"with dirpath left unset (so that {ENV_RUN_DIR} applies)?"
        )
    return run.duration_s
