"""The Hugging Face Trainer adapter (`TuneupTrainerCallback`) records real `transformers.Trainer` runs of a
tiny GPT-2 built from its config: a delay injected into each phase comes back in that phase over a
no-delay control of the same run, a step is an optimizer step of `gradient_accumulation_steps`
micro-batches, logging between steps is sync and never data, and `tuneup report`, `advise` and `compare`
read the record."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from tuneup import load_run

from adapter_support import assert_commands_read, baseline_steps, record_alternating, record_two_ranks
from conftest import free_port, hf_environ
from workloads.hf_trainer import BATCH_SIZE, SEQUENCE
from workloads.loops import Delays
from workloads.phase_check import assert_alternate_steps_come_back

STEPS = 48
ACCUMULATE = 2
DELAYS = Delays()
HF_TRAINER = Path(__file__).resolve().parent / "workloads" / "hf_trainer.py"


@contextmanager
def one_torch_thread() -> Iterator[None]:
    # One intra-op thread: on a small shared machine torch's thread pool made each of this model's tiny
    # matrix products take ~10 ms (a 60 ms step took 600).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run whose odd steps are control steps (their delays are pauses outside them), with the even
    steps' injected delays."""
    from workloads.hf_trainer import train

    with one_torch_thread():
        return record_alternating(train, tmp_path_factory.mktemp("hf") / "run", STEPS, ACCUMULATE, DELAYS)


def test_each_phase_delay_comes_back_in_its_phase(hf_run: dict[str, Any]) -> None:
    # The control steps are interleaved with the delayed ones: on a shared 2-core machine the model's own
    # forward took 8.7 ms in one run and 13.5 ms in the next (more than the tolerance), and a control run
    # before the delayed one could not tell that drift from an error.
    # Per optimizer step every micro-batch is collated, runs forward and backward; the optimizer steps once.
    steps = load_run(hf_run["run"]).steps(0)[2:]
    errors = assert_alternate_steps_come_back(steps, ACCUMULATE, DELAYS, hf_run["injected"])
    print("transformers phase errors (ms: error, tolerance, injected):", errors)


def test_a_step_is_an_optimizer_step_of_its_micro_batches(hf_run: dict[str, Any]) -> None:
    run = load_run(hf_run["run"])
    steps = run.steps(0)
    assert [s.step for s in steps] == list(range(STEPS))
    assert all(s.micro_batches == ACCUMULATE for s in steps)
    assert all(
        s.samples == BATCH_SIZE * ACCUMULATE and s.tokens == BATCH_SIZE * ACCUMULATE * SEQUENCE for s in steps
    )
    assert all(s.loss is not None for s in steps)
    assert run.manifest.trainer["namespace"] == "transformers"
    assert run.manifest.trainer["accumulate_grad_batches"] == ACCUMULATE
    assert run.manifest.model["class"] == "GPT2LMHeadModel"
    # The Trainer fetches with no event around it: the record says the data phase is the gap.
    assert run.ranks[0].info.raw["data_timing"] == "gap"
    # Logging every 5 steps gathers the loss between steps: sync, never data.
    logged = [s for s in steps if s.step in (5, 10, 15, 20, 25, 30)]
    assert all(s.sync_ms > 0 for s in logged), [s.sync_ms for s in logged]


def test_report_advise_and_compare_read_the_record(hf_run: dict[str, Any], tmp_path: Path) -> None:
    run = hf_run["run"]
    assert_commands_read(run, tmp_path / "report")
    # Against a short run of the same workload without its delays: faster, or no verdict with one a side.
    # That run evaluates (two batches of 30 ms) and saves a checkpoint every 4 steps: neither is any step's
    # time (the next step's data phase, where the Trainer's gap between steps is, holds neither), and both
    # are in the job's timeline.
    from workloads.hf_trainer import train

    with one_torch_thread():
        steps = baseline_steps(
            run, 8, lambda **options: train(tmp_path / "baseline", 8, ACCUMULATE, **options)
        )
    assert steps[4].data_ms + steps[4].other_ms < 30.0, steps[4]


@pytest.mark.slow
def test_two_ddp_ranks_under_torchrun_each_record_with_the_all_reduce_timed(tmp_path: Path) -> None:
    """torchrun starts two gloo ranks; the Trainer wraps the model in DDP (accelerate) and hands callbacks
    the model inside: its all-reduce is timed all the same, and the noise scale taken in its hook."""
    out = tmp_path / "run"
    launcher = ["-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}"]
    # 12 steps: the advice needs 5 steady ones after a warm-up that a loaded machine draws out.
    argv = [*launcher, str(HF_TRAINER), "--out", str(out), "--steps", "12"]
    run = record_two_ranks(argv, out, tmp_path, env=hf_environ())
    assert run.manifest.trainer["strategy"] == "distributed"
    for rank in (0, 1):
        steps = run.steps(rank)
        assert [s.step for s in steps] == list(range(12))
        assert all(s.micro_batches == ACCUMULATE for s in steps)
        assert all(s.comm_count and s.comm_ms is not None for s in steps), [s.comm_count for s in steps]
        # Taken in the DDP hook, on the steps the automatic sampling picks.
        (method,) = [e["method"] for e in run.ranks[rank].events if e.get("kind") == "noise_scale"]
        assert method == "ddp" and any(s.gns_small_sq is not None for s in steps)
    assert_commands_read(out, tmp_path / "report")
