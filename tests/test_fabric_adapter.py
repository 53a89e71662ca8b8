"""The Lightning Fabric adapter (`tuneup.plugins.fabric.instrument`) records real Fabric loops: a delay
injected into each phase comes back in that phase over a no-delay control of the same loop, a step counts
optimizer steps under gradient accumulation, and `tuneup report`, `advise` and `compare` read the record;
one process, and two DDP ranks over gloo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuneup import load_run
from tuneup.analyze.analysis import analyze_run
from tuneup.cli import main

from workloads.loops import Delays, clear_injected
from workloads.phase_check import assert_delays_come_back, injected_snapshot, phase_own_ms

STEPS = 32
ACCUMULATE = 2
DELAYS = Delays()
PHASES = ("data", "forward", "backward", "optimizer")
# Per optimizer step: every micro-batch is fetched, runs forward and backward; the optimizer steps once.
CALLS = {"data": ACCUMULATE, "forward": ACCUMULATE, "backward": ACCUMULATE, "optimizer": 1}
FABRIC_LOOP = Path(__file__).resolve().parent / "workloads" / "fabric_loop.py"


@pytest.fixture(scope="module")
def fabric_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run whose odd steps are control steps (their delays are pauses outside them), with the even
    steps' injected delays."""
    from lightning.fabric import Fabric

    from workloads.fabric_loop import train

    clear_injected()
    recorder = train(
        Fabric(accelerator="cpu", devices=1),
        tmp_path_factory.mktemp("fabric") / "run",
        STEPS,
        ACCUMULATE,
        DELAYS,
        alternate_control=True,
        telemetry_interval_s=0.5,
        count_flops=False,
    )
    return {"run": Path(recorder.run_dir), "injected": injected_snapshot()}


def test_each_phase_delay_comes_back_in_its_phase(fabric_run: dict[str, Any]) -> None:
    steps = load_run(fabric_run["run"]).steps(0)[2:]
    own = phase_own_ms([s for s in steps if s.step % 2], PHASES)
    delayed = [s for s in steps if s.step % 2 == 0]
    errors = assert_delays_come_back(delayed, own, CALLS, DELAYS, fabric_run["injected"])
    print("fabric phase errors (ms: error, tolerance, injected):", errors)
    for s in steps:
        named = s.data_ms + s.forward_ms + s.backward_ms + s.optimizer_ms + s.sync_ms + s.other_ms
        assert named + (s.tuneup_ms or 0.0) == pytest.approx(s.wall_ms, abs=0.01)


def test_a_step_is_an_optimizer_step_of_its_micro_batches(fabric_run: dict[str, Any]) -> None:
    run = load_run(fabric_run["run"])
    steps = run.steps(0)
    assert [s.step for s in steps] == list(range(STEPS))
    assert all(s.micro_batches == ACCUMULATE and s.samples == 8 * ACCUMULATE for s in steps)
    assert all(s.loss is not None for s in steps)
    assert run.manifest.trainer["namespace"] == "lightning.fabric"
    assert run.manifest.model["class"] == "Net"
    assert run.manifest.dataloader["batch_size"] == 8
    # Fabric's loaders are timed around each fetch: the data phase is the fetches, not the gap.
    assert run.ranks[0].info.raw["data_timing"] == "fetch"
    # Fabric does not say the loop's accumulation: the analysis reads it from the steps' micro-batches.
    info = analyze_run(run).run
    assert (info.accumulate_grad_batches, info.global_batch_size) == (ACCUMULATE, 8 * ACCUMULATE)


def test_report_advise_and_compare_read_the_record(fabric_run: dict[str, Any], tmp_path: Path) -> None:
    from lightning.fabric import Fabric

    from workloads.fabric_loop import train

    run = str(fabric_run["run"])
    assert main(["report", run, "-o", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "report.html").is_file()
    assert main(["advise", run, "--no-whatif"]) == 0
    # Against a short run of the same loop without its delays: faster, or no verdict with one run a side.
    # That run validates (a second loader Fabric set up) and saves a checkpoint every 4 steps: neither is
    # any step's time, and both are in the job's timeline.
    baseline = train(
        Fabric(accelerator="cpu", devices=1),
        tmp_path / "baseline",
        8,
        ACCUMULATE,
        Delays(0, 0, 0, 0),
        validate_every=4,
        validation_ms=30.0,
        count_flops=False,
    )
    assert main(["compare", str(baseline.run_dir), run]) in (0, 1)
    record = load_run(baseline.run_dir)
    steps = record.steps(0)
    assert [s.step for s in steps] == list(range(8))
    assert max(s.wall_ms for s in steps) < 30.0, [round(s.wall_ms, 1) for s in steps]
    kinds = [e.get("kind") for e in record.ranks[0].events]
    assert kinds.count("validation") == 2 and kinds.count("checkpoint") == 2, kinds


@pytest.mark.slow
def test_two_ddp_ranks_each_record_with_the_all_reduce_timed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    # Fabric's DDP launcher starts this script again for rank 1, as Lightning's Trainer does.
    proc = subprocess.run(
        [
            sys.executable,
            str(FABRIC_LOOP),
            "--out",
            str(out),
            "--devices",
            "2",
            "--steps",
            "6",
            "--accumulate",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    run = load_run(out)
    assert run.world_size == 2 and run.missing_ranks == [] and run.warnings == []
    assert run.manifest.trainer["strategy"] == "DDPStrategy"
    for rank in (0, 1):
        steps = run.steps(rank)
        assert [s.step for s in steps] == list(range(6))
        assert all(s.micro_batches == 2 for s in steps)
        # The last micro-batch of each step all-reduces the gradients (no_backward_sync skips the first):
        # DDP's hook timed it.
        assert all(s.comm_count and s.comm_ms is not None for s in steps), [s.comm_count for s in steps]
    assert main(["report", str(out), "-o", str(tmp_path / "report")]) == 0
    assert main(["advise", str(out), "--no-whatif"]) == 0
