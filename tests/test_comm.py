"""Communication profiling through Lightning on CPU: 2 gloo processes, DDP hooks and FSDP2."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from tuneup import load_run

from conftest import run_workload

pytestmark = pytest.mark.slow

# tests/workloads/tiny.py trains Linear(16, 32) -> ReLU -> Linear(32, 1): 577 float32 parameters.
PARAMS = 16 * 32 + 32 + 32 + 1
GRAD_BYTES = PARAMS * 4
# FLOPs of one micro-batch of the tiny model per sample, by hand: forward 2 x (16x32 + 32x1) products;
# backward the weight gradients of both layers (2 x (16x32 + 32x1)) and the hidden activations' gradient
# (2 x 32), but not the input's, which needs none. Biases and ReLU are not matrix products.
FLOPS_PER_SAMPLE = 2 * (16 * 32 + 32) + 2 * (16 * 32 + 32) + 2 * 32


def assert_flops_counted_once_per_rank(run, batch: int = 8) -> None:  # type: ignore[no-untyped-def]
    """Counting FLOPs under DDP or FSDP2 (comm hooks and collectives inside the dispatch mode) works."""
    for rank in (0, 1):
        events = [e for e in run.ranks[rank].events if e["kind"] == "flops"]
        assert [(e["flops"], e["samples"], e["step"]) for e in events] == [
            (FLOPS_PER_SAMPLE * batch, batch, 0)
        ]


def test_ddp_default_hook_under_accumulation_times_each_bucket_once_per_optimizer_step(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    run_workload(out, "--devices", "2", "--strategy", "ddp", "--max-steps", "8", "--accumulate", "2")
    run = load_run(out)
    assert run.warnings == []
    for rank in (0, 1):
        steps = run.steps(rank)
        assert len(steps) == 8 and all(s.micro_batches == 2 for s in steps)
        # One bucket, all-reduced on the synchronizing micro-batch only: no_sync ones send nothing.
        assert all(s.comm_count == 1 and s.comm_bytes == GRAD_BYTES for s in steps)
        assert all(s.comm_ms is not None and s.comm_ms > 0 for s in steps)
        assert all(0 <= s.comm_exposed_ms <= s.comm_ms + 1e-6 for s in steps)
        collectives = run.ranks[rank].collectives
        assert [c.step for c in collectives] == list(range(8))
        assert {(c.kind, c.bytes, c.dtype, c.bucket, c.world_size) for c in collectives} == {
            ("all_reduce", GRAD_BYTES, "float32", 0, 2)
        }
    ddp_logging = [e for e in run.ranks[0].events if e["kind"] == "ddp_logging"]
    assert ddp_logging and ddp_logging[0]["comm_hook"] == "timed_allreduce_hook"
    assert_flops_counted_once_per_rank(run)


def test_fp16_compression_halves_the_bytes(tmp_path: Path) -> None:
    run_workload(
        tmp_path / "run", "--devices", "2", "--strategy", "ddp", "--max-steps", "4", "--comm-hook", "fp16"
    )
    collectives = load_run(tmp_path / "run").ranks[0].collectives
    assert {(c.bytes, c.dtype) for c in collectives} == {(GRAD_BYTES // 2, "float16")}


def test_powersgd_one_bucket_sends_its_low_rank_factors(tmp_path: Path) -> None:
    run_workload(
        tmp_path / "run", "--devices", "2", "--strategy", "ddp", "--max-steps", "6", "--comm-hook", "powersgd"
    )
    steps = load_run(tmp_path / "run").steps(0)
    # PowerSGD all-reduces plainly for start_powerSGD_iter=2 steps, then far fewer bytes.
    assert [s.comm_bytes for s in steps[:2]] == [GRAD_BYTES, GRAD_BYTES]
    assert all(0 < s.comm_bytes < GRAD_BYTES / 2 for s in steps[2:])


def test_a_users_hook_is_timed_without_changing_what_it_computes(tmp_path: Path) -> None:
    args = ("--devices", "2", "--strategy", "ddp", "--max-steps", "8", "--comm-hook", "user")
    run_workload(tmp_path / "with", *args, "--save-params", str(tmp_path / "with.pt"))
    run_workload(tmp_path / "without", *args, "--no-callback", "--save-params", str(tmp_path / "without.pt"))
    with_tuneup, without = torch.load(tmp_path / "with.pt"), torch.load(tmp_path / "without.pt")
    assert with_tuneup.keys() == without.keys()
    for name in without:
        torch.testing.assert_close(with_tuneup[name], without[name], rtol=1e-6, atol=1e-7)
    steps = load_run(tmp_path / "with").steps(0)
    assert all(s.comm_bytes == GRAD_BYTES and s.comm_count == 1 for s in steps)


@pytest.mark.parametrize("namespace", ["lightning", "pytorch_lightning"])
def test_fsdp2_gathers_and_scatters_each_layer_shard(tmp_path: Path, namespace: str) -> None:
    args = ("--devices", "2", "--strategy", "fsdp2", "--max-steps", "4", "--namespace", namespace)
    run_workload(tmp_path / "run", *args)
    run = load_run(tmp_path / "run")
    trainer = run.manifest.raw["trainer"]
    assert trainer["strategy"] == "ModelParallelStrategy"
    # How FSDP2 wrapped the model, read once wrapped: two Linear units and the Sequential root, defaults.
    assert run.manifest.raw["model"]["fsdp"] == {
        "kind": "FSDP2", "units": 3, "reshard_after_forward": True, "param_dtype": None,
        "reduce_dtype": None, "offload": "none",
    }  # fmt: skip
    assert trainer["namespace"] == ("lightning.pytorch" if namespace == "lightning" else namespace)
    world = 2
    # FSDP2 shards dim 0 of every parameter, padded to a multiple of the world size.
    layers = [[(32, 16), (32,)], [(1, 32), (1,)]]
    padded = [sum(math.ceil(s[0] / world) * world * math.prod(s[1:]) * 4 for s in layer) for layer in layers]
    for rank in (0, 1):
        for step in range(4):
            per_step = Counter(
                (c.kind, c.bytes)
                for c in run.ranks[rank].collectives
                if c.step == step and c.source == "fsdp"
            )
            # Each layer gathered for forward and again for backward, its gradient reduce-scattered once.
            assert per_step == Counter(
                {("all_gather", b): 2 for b in padded} | {("reduce_scatter", b): 1 for b in padded}
            )
        steps = run.steps(rank)
        assert all(s.comm_bytes == 3 * sum(padded) and s.comm_count == 6 for s in steps)
    shard_bytes = {c.bytes // c.world_size for c in run.ranks[0].collectives}
    assert shard_bytes == {b // world for b in padded}
    # Memory by kind: each rank holds its shards (padded), the whole model is 577 float32 parameters.
    kinds = [next(e for e in run.ranks[r].events if e["kind"] == "memory_kinds") for r in (0, 1)]
    assert sum(k["parameters_bytes"] for k in kinds) == sum(padded)
    assert all(k["gradients_bytes"] == k["parameters_bytes"] for k in kinds)
    assert {(k["parameters_unsharded_bytes"], k["sharded_parameters"]) for k in kinds} == {(577 * 4, 4)}
    assert_flops_counted_once_per_rank(run)
