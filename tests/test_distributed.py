"""Multi-process runs: DDP over gloo in 2 processes, and a process killed with SIGKILL mid-run."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tuneup import load_run

from conftest import STRAGGLER_SLEEP_MS, STRAGGLER_STEPS, run_workload

pytestmark = pytest.mark.slow


def test_ddp_two_ranks_each_record_and_a_straggler_shows(ddp_straggler_run: Path) -> None:
    out = ddp_straggler_run
    run = load_run(out)
    assert run.world_size == 2 and run.missing_ranks == [] and run.warnings == []
    assert run.manifest.trainer["strategy"] == "DDPStrategy"
    assert set(run.rank_hosts) == {0, 1} and all(run.rank_hosts.values())
    for rank in (0, 1):
        steps = run.steps(rank)
        assert [s.step for s in steps] == list(range(STRAGGLER_STEPS))
        assert all(s.micro_batches == 2 and s.samples == 16 for s in steps)
    fwd = {r: statistics.median(s.forward_ms for s in run.steps(r)[2:]) for r in (0, 1)}
    bwd = {r: statistics.median(s.backward_ms for s in run.steps(r)[2:]) for r in (0, 1)}
    # Rank 1 sleeps in training_step every micro-batch; rank 0 waits for it in the gradient all-reduce.
    assert fwd[1] - fwd[0] >= 2 * STRAGGLER_SLEEP_MS * 0.8, fwd
    assert bwd[0] - bwd[1] >= STRAGGLER_SLEEP_MS * 0.8, bwd
    # Rank 0 also waits in Lightning's per-batch SIGTERM broadcast; that wait is not the dataloader's.
    assert run.ranks[0].info.raw["data_timing"] == "fetch"
    assert statistics.median(s.data_ms for s in run.steps(0)[2:]) < 10
    # ... and that wait is named: sync, not other. Rank 0 waits there for rank 1's second micro-batch, and
    # "other" is left at a few per cent of the step on both ranks.
    assert statistics.median(s.sync_ms for s in run.steps(0)[2:]) >= STRAGGLER_SLEEP_MS * 0.5
    for rank in (0, 1):
        steady = run.steps(rank)[2:]
        other_share = sum(s.other_ms for s in steady) / sum(s.wall_ms for s in steady)
        assert other_share < 0.05, (rank, other_share)


def test_ddp_with_pytorch_lightning_namespace(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_workload(
        out, "--namespace", "pytorch_lightning", "--devices", "2", "--strategy", "ddp", "--max-steps", "8"
    )
    run = load_run(out)
    assert run.manifest.trainer["namespace"] == "pytorch_lightning"
    assert [len(run.steps(r)) for r in (0, 1)] == [8, 8]


def test_sigkill_mid_run_keeps_every_flushed_step(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_workload(
        out, "--max-steps", "100", "--die-at-step", "23", "--flush-every-steps", "5", check=False
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    run = load_run(out)
    # Steps 0..22 completed. A writer thread flushes every 5 steps: whatever it had written is there, as
    # a contiguous prefix, and at most the last interval (plus the one being written) is lost.
    kept = [s.step for s in run.steps(0)]
    assert kept == list(range(len(kept))) and 15 <= len(kept) <= 23, kept
    assert not run.ranks[0].info.closed
    assert any(f"rank 0 stopped at step {kept[-1]} without closing" in w for w in run.warnings)
