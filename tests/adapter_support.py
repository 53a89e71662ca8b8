"""What the tests of the trainer adapters other than Lightning's (tests/test_fabric_adapter.py,
tests/test_hf_adapter.py) share: one recorded run with alternate control steps, the commands that read a
record, the short no-delay baseline run, and two DDP ranks started as a script."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuneup import load_run
from tuneup.cli import main
from tuneup.record.schema import Run, StepRecord

from workloads.loops import Delays, clear_injected
from workloads.phase_check import injected_snapshot


def record_alternating(train: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """`train(*args)` (a workload's, returning what recorded it) with every odd step a control step (its
    delays are pauses outside it), no FLOP counting, and telemetry every 0.5 s: the run's directory ("run")
    and the delays it injected ("injected")."""
    clear_injected()
    recorder = train(*args, alternate_control=True, telemetry_interval_s=0.5, count_flops=False)
    return {"run": Path(recorder.run_dir), "injected": injected_snapshot()}


def assert_commands_read(run: Path | str, report_dir: Path) -> None:
    assert main(["report", str(run), "-o", str(report_dir)]) == 0
    assert (report_dir / "report.html").is_file()
    assert main(["advise", str(run), "--no-whatif"]) == 0


def baseline_steps(run: Path | str, steps: int, train: Callable[..., Any]) -> list[StepRecord]:
    """The steps of a short baseline run of `steps` steps, `train(**options)` with no delays, that validates
    (two batches of 30 ms) and saves a checkpoint every 4 steps, after `tuneup compare` weighed `run`
    against it (faster, or no verdict with one run a side). The validations and checkpoints are events for
    the job's timeline."""
    recorder = train(delays=Delays(0, 0, 0, 0), validate_every=4, validation_ms=30.0, count_flops=False)
    assert main(["compare", str(recorder.run_dir), str(run)]) in (0, 1)
    record = load_run(recorder.run_dir)
    kinds = [e.get("kind") for e in record.ranks[0].events]
    assert kinds.count("validation") == 2 and kinds.count("checkpoint") == 2, kinds
    out = record.steps(0)
    assert [s.step for s in out] == list(range(steps))
    return out


def record_two_ranks(argv: list[str], out: Path, cwd: Path, env: dict[str, str] | None = None) -> Run:
    """Runs `python *argv` (a launcher that starts two DDP ranks over gloo, recording to `out`) in `cwd`: the
    run, with both ranks and no warning. `env`: the environment (default: this process's)."""
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=240, env=env, cwd=str(cwd)
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    run = load_run(out)
    assert run.world_size == 2 and run.missing_ranks == [] and run.warnings == []
    return run
