"""The gradient noise scale under FSDP2: the seam on FSDP's foreach_reduce (the local gradient's norm), the
shards' part of the averaged gradient's norm, the method's choice, and the analysis that sums the ranks'
parts. In-process and cheap; the real 2-rank FSDP2 fits against the ground truth are in
tests/test_noise_scale.py (the gns_runs fixture)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from tuneup import load_run
from tuneup.analyze.noise_scale import noise_scale_section, noise_verdict
from tuneup.collect import fsdp_noise
from tuneup.collect.comm import CommProbe
from tuneup.record import RankWriter, write_manifest
from tuneup.recording.noise import choose_method

from synthetic import step_record


class _Group:
    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size


@pytest.fixture
def reduce_calls(monkeypatch: pytest.MonkeyPatch) -> list[list[torch.Tensor]]:
    """FSDP2's foreach_reduce replaced by one that records the gradients it was handed (what FSDP's own
    would reduce-scatter), so that the seam is tested without a process group."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as module

    seen: list[list[torch.Tensor]] = []

    def foreach_reduce(
        fsdp_params: Any,
        unsharded_grads: list[torch.Tensor],
        reduce_scatter_group: Any,
        reduce_scatter_stream: Any,
        reduce_scatter_comm: Any,
        orig_dtype: Any,
        reduce_dtype: Any,
        device: Any,
        gradient_divide_factor: Any,
        all_reduce_group: Any,
        *rest: Any,
    ) -> str:
        seen.append(list(unsharded_grads))
        unsharded_grads.clear()  # as FSDP does once its copy-in is done
        return "reduced"

    monkeypatch.setattr(module, "foreach_reduce", foreach_reduce)
    return seen


def _reduce(
    unit: object, grads: list[torch.Tensor], ranks: int = 2, divide: Any = None, hsdp: int = 0
) -> Any:
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as module

    return module.foreach_reduce(
        [unit], grads, _Group(ranks), None, None, None, None, None, divide, _Group(hsdp) if hsdp else None
    )


def test_the_seam_takes_the_local_gradient_on_taken_steps_only(reduce_calls: list) -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as module

    fake = module.foreach_reduce
    norms = fsdp_noise.LocalGradNorms()
    assert norms.install() and module.foreach_reduce is not fake
    a, b = object(), object()  # two FSDP units
    _reduce(a, [torch.full((3,), 2.0)])  # not a taken step: no norm, FSDP's call unchanged
    assert norms.take(2) is None and len(reduce_calls) == 1
    norms.taking = True
    assert _reduce(a, [torch.full((3,), 2.0), torch.ones(2, 2)]) == "reduced"  # 12 + 4
    _reduce(b, [torch.full((1,), 3.0)])  # 9
    assert reduce_calls[-2][0].tolist() == [2.0, 2.0, 2.0]  # FSDP got the gradients untouched
    assert norms.take_own_s() > 0
    local = norms.take(2)
    assert local is not None and float(local.squared) == 25.0 and local.reductions == 1
    # Once per micro-batch (Lightning's Trainer under accumulation, no set_requires_gradient_sync): 2 each.
    for _ in range(2):
        _reduce(a, [torch.ones(4)])
        _reduce(b, [torch.ones(1)])
    local = norms.take(2)
    assert local is not None and float(local.squared) == 10.0 and local.reductions == 2
    norms.uninstall()
    assert module.foreach_reduce is fake


def test_steps_the_norms_cannot_describe_are_left_out(reduce_calls: list) -> None:
    norms = fsdp_noise.LocalGradNorms()
    assert norms.install()
    norms.taking = True
    a, b = object(), object()
    _reduce(a, [torch.ones(2)])
    _reduce(a, [torch.ones(2)])
    _reduce(b, [torch.ones(2)])  # a partial backward: units reduced unequal numbers of times
    assert norms.take(2) is None
    _reduce(a, [torch.ones(2)], ranks=2)  # a data-parallel group of 2 in a world of 4: tensor parallel
    assert norms.take(4) is None
    _reduce(a, [torch.ones(2)], ranks=2, hsdp=2)  # HSDP: 2 shards x 2 replicas is the whole world
    assert norms.take(4) is not None
    _reduce(a, [torch.ones(2)], divide=8.0)  # the user's divide factor: not the mean over 2 ranks
    assert norms.take(2) is None
    _reduce(a, [torch.ones(2)], divide=2.0)  # the mean's own factor, said explicitly
    assert norms.take(2) is not None
    norms.uninstall()


class _Placement:
    def __init__(self, replicate: bool) -> None:
        self.replicate = replicate

    def is_replicate(self) -> bool:
        return self.replicate


class _Mesh:
    def __init__(self, *sizes: int) -> None:
        self.sizes = sizes

    def size(self, dim: int) -> int:
        return self.sizes[dim]


class _ShardGrad:
    """What a DTensor gradient offers the shard norm: its local shard, mesh and placements."""

    def __init__(self, local: torch.Tensor, mesh: _Mesh, *replicate: bool) -> None:
        self.local, self.device_mesh = local, mesh
        self.placements = tuple(_Placement(r) for r in replicate)

    def to_local(self) -> torch.Tensor:
        return self.local


class _Param:
    def __init__(self, grad: Any) -> None:
        self.grad = grad


def test_the_shards_part_counts_each_hsdp_replica_once() -> None:
    fsdp_mesh, hsdp_mesh = _Mesh(2), _Mesh(3, 2)  # HSDP: 3 replicas of 2 shards
    params = [
        _Param(_ShardGrad(torch.full((4,), 1.0), fsdp_mesh, False)),  # 4
        _Param(_ShardGrad(torch.zeros(0), fsdp_mesh, False)),  # a shard of padding only
        _Param(_ShardGrad(torch.full((3,), 3.0), hsdp_mesh, True, False)),  # 27, held by 3 replicas
        _Param(torch.ones(5)),  # no fully_shard: FSDP reduces nothing of it, in neither norm
        _Param(None),
    ]
    assert float(fsdp_noise.shard_squared_norm(params)) == pytest.approx(4.0 + 27.0 / 3)
    assert fsdp_noise.shard_squared_norm([_Param(torch.ones(2))]) is None  # not FSDP2
    only_padding = fsdp_noise.shard_squared_norm([_Param(_ShardGrad(torch.zeros(0), fsdp_mesh, False))])
    assert float(only_padding) == 0.0  # this rank's part is zero; the other ranks hold the gradient


def test_fsdp2_is_measured_and_fsdp1_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = CommProbe(on_cuda=False, world_size=2)
    probe.record_all = True  # a sharded strategy
    dtensor_params = [_ShardGrad(torch.ones(1), _Mesh(2), False)]  # duck-typed: to_local and device_mesh

    def choose(params: list[Any]) -> tuple[str | None, str | None]:
        return choose_method(
            automatic_optimization=True, world_size=2, comm=probe, accumulation=1, parameters=lambda: params
        )

    assert choose(dtensor_params) == ("fsdp2", None)
    without_probe = choose_method(  # profile_communication=False: FSDP2's norms need no comm probe
        automatic_optimization=True,
        world_size=2,
        comm=None,
        accumulation=1,
        parameters=lambda: dtensor_params,
    )
    assert without_probe == ("fsdp2", None)
    method, why = choose([torch.nn.Parameter(torch.ones(2))])
    assert method is None and why is not None and why.startswith("FSDP1")
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as module

    monkeypatch.delattr(module, "foreach_reduce")  # a torch whose FSDP2 has no such seam
    method, why = choose(dtensor_params)
    assert method is None and why is not None and "foreach_reduce" in why
    assert not fsdp_noise.LocalGradNorms().install()


def _fsdp2_record(path: Path, ranks: int = 2, steps: int = 60, skip: tuple[int, int] | None = None) -> Any:
    """Two ranks' FSDP2 norms: the small ones straddle their expectation, the big one is split unevenly
    between the ranks' shards (rank 1's shard could be padding only)."""
    write_manifest(path, {"run_id": "r", "created_unix": 1.0, "world_size": ranks, "num_nodes": 1})
    grad_sq, trace = 2.0, 40.0  # B_simple 20
    big = grad_sq + trace / 16
    for rank in range(ranks):
        w = RankWriter(path, rank)
        w.open({"host": "h"})
        w.add_event("noise_scale", method="fsdp2", comm_hook=None)
        for s in range(steps):
            rec = step_record(s)
            if (rank, s) != skip:
                rec.update(
                    gns_small_sq=grad_sq + trace / 8 + (1.5 if rank == 0 else -1.5),
                    gns_big_sq=big * (0.75 if rank == 0 else 0.25),
                    gns_small_batch=8,
                    gns_big_batch=16,
                )
            w.add_step(rec)
        w.close(status="completed")
    return load_run(path)


def test_the_ranks_shard_norms_are_summed_per_step(tmp_path: Path) -> None:
    run = _fsdp2_record(tmp_path / "run", skip=(1, 30))
    ns = noise_scale_section(run, {r: rec.steps[5:] for r, rec in run.ranks.items()})
    # Averaged as DDP's identical norms are, the big norm would be half of it: B_simple far from 20.
    assert ns is not None and ns.b_simple == pytest.approx(20.0)
    assert ns.grad_sq == pytest.approx(2.0) and ns.trace_sigma == pytest.approx(40.0)
    assert ns.steps == 54  # step 30 lacks rank 1's part: left out, not half a norm
    assert 30 not in ns.series_step and ns.method.startswith("FSDP2")
    assert ns.series_b_simple[-1] == pytest.approx(20.0)


def test_a_sharded_run_without_the_norms_says_why(tmp_path: Path) -> None:
    from tuneup.analyze.analysis import analyze_run

    info = analyze_run(_fsdp2_record(tmp_path / "run")).run
    fsdp2 = noise_verdict(None, dataclasses.replace(info, strategy="ModelParallelStrategy"))
    assert "do not record it" not in fsdp2.text  # FSDP2 does
    fsdp1 = noise_verdict(None, dataclasses.replace(info, strategy="FSDPStrategy"))
    assert "FSDP1" in fsdp1.text and "FSDP2 (ModelParallelStrategy with fully_shard) does" in fsdp1.text


class _Clock:
    """What NoiseScaleSteps reads of the step clock before the optimizer step."""

    def __init__(self, samples: int, micro_batches: int) -> None:
        self.samples, self.micro_batches, self.noise = samples, micro_batches, None


@pytest.mark.parametrize(
    ("reductions", "accumulate", "expected"),
    [
        (1, 1, (8, 32, 16.0)),  # no accumulation: the step's local gradient
        (1, 2, (16, 64, 16.0)),  # set_requires_gradient_sync: one reduction of both micro-batches
        (2, 2, (8, 64, 4 * 16.0)),  # Lightning's Trainer: each reduction half its micro-batch's mean
        (2, None, None),  # losses scaled in a way tuneup is not told: left out
        (3, 2, None),  # neither once per step nor once per micro-batch
    ],
)
def test_the_step_takes_its_batch_sizes_from_how_often_fsdp_reduced(
    reduce_calls: list, reductions: int, accumulate: int | None, expected: tuple[int, int, float] | None
) -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as module

    from tuneup.collect.grad_noise import noise_record
    from tuneup.record.writer import RecordingPolicy
    from tuneup.recording.noise import NoiseScaleSteps

    fake = module.foreach_reduce
    shard = [_Param(_ShardGrad(torch.full((4,), 0.5), _Mesh(4), False))]  # this rank's part: 1
    steps = NoiseScaleSteps(
        "fsdp2",
        1,
        on_cuda=False,
        comm=None,
        recording=RecordingPolicy(),
        world_size=4,
        parameters=lambda: shard,
        accumulation=None if accumulate is None else (lambda: accumulate),
    )
    assert module.foreach_reduce is not fake  # installed for the fit
    steps.step_starts(0)
    unit = object()
    for _ in range(reductions):
        _reduce(unit, [torch.full((4,), 2.0)], ranks=4)  # 16 each
    assert steps.backward_own_s() > 0
    micro_batches = accumulate or 2
    clock = _Clock(samples=8 * micro_batches, micro_batches=micro_batches)
    steps.before_optimizer(clock, None)  # type: ignore[arg-type]
    if expected is None:
        assert clock.noise is None
    else:
        record = noise_record(clock.noise, None)  # type: ignore[arg-type]
        small_batch, big_batch, small_sq = expected
        assert (record["gns_small_batch"], record["gns_big_batch"]) == (small_batch, big_batch)
        assert record["gns_small_sq"] == pytest.approx(small_sq) and record["gns_big_sq"] == 1.0
    steps.close()
    assert module.foreach_reduce is fake  # the seam leaves with the fit
