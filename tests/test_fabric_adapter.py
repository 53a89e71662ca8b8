"""The Lightning Fabric adapter (`tuneup.plugins.fabric.instrument`) records real Fabric loops: a delay
injected into each phase comes back in that phase over a no-delay control of the same loop, a step counts
optimizer steps under gradient accumulation, and `tuneup report`, `advise` and `compare` read the record;
one process, and two DDP ranks over gloo."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tuneup import load_run
from tuneup.analyze.analysis import analyze_run

from adapter_support import assert_commands_read, baseline_steps, record_alternating, record_two_ranks
from workloads.loops import Delays
from workloads.phase_check import assert_alternate_steps_come_back

STEPS = 32
ACCUMULATE = 2
DELAYS = Delays()
FABRIC_LOOP = Path(__file__).resolve().parent / "workloads" / "fabric_loop.py"


@pytest.fixture(scope="module")
def fabric_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run whose odd steps are control steps (their delays are pauses outside them), with the even
    steps' injected delays."""
    from lightning.fabric import Fabric

    from workloads.fabric_loop import train

    fabric = Fabric(accelerator="cpu", devices=1)
    return record_alternating(
        train, fabric, tmp_path_factory.mktemp("fabric") / "run", STEPS, ACCUMULATE, DELAYS
    )


def test_each_phase_delay_comes_back_in_its_phase(fabric_run: dict[str, Any]) -> None:
    # Per optimizer step every micro-batch is fetched, runs forward and backward; the optimizer steps once.
    steps = load_run(fabric_run["run"]).steps(0)[2:]
    errors = assert_alternate_steps_come_back(steps, ACCUMULATE, DELAYS, fabric_run["injected"])
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

    run = fabric_run["run"]
    assert_commands_read(run, tmp_path / "report")
    # Against a short run of the same loop without its delays: faster, or no verdict with one run a side.
    # That run validates (a second loader Fabric set up) and saves a checkpoint every 4 steps: neither is
    # any step's time, and both are in the job's timeline.
    fabric = Fabric(accelerator="cpu", devices=1)
    steps = baseline_steps(
        run, 8, lambda **options: train(fabric, tmp_path / "baseline", 8, ACCUMULATE, **options)
    )
    assert max(s.wall_ms for s in steps) < 30.0, [round(s.wall_ms, 1) for s in steps]


@pytest.mark.slow
def test_two_ddp_ranks_each_record_with_the_all_reduce_timed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # Fabric's DDP launcher starts this script again for rank 1, as Lightning's Trainer does.
    # 12 steps: the advice needs 5 steady ones after a warm-up that a loaded machine draws out.
    argv = [str(FABRIC_LOOP), "--out", str(out), "--devices", "2", "--steps", "12", "--accumulate", "2"]
    run = record_two_ranks(argv, out, tmp_path)
    assert run.manifest.trainer["strategy"] == "DDPStrategy"
    for rank in (0, 1):
        steps = run.steps(rank)
        assert [s.step for s in steps] == list(range(12))
        assert all(s.micro_batches == 2 for s in steps)
        # The last micro-batch of each step all-reduces the gradients (no_backward_sync skips the first):
        # DDP's hook timed it.
        assert all(s.comm_count and s.comm_ms is not None for s in steps), [s.comm_count for s in steps]
    assert_commands_read(out, tmp_path / "report")
