"""TuneupDDPStrategy (tuneup/sync, plugins/lightning/strategy.py): compression, local SGD, the safeguard.

The unit tests check the arithmetic (PowerSGD, the safeguard's decisions, the topology); the slow ones
train the demo transformer (and Lightning's BoringModel through LightningCLI) under 2 and 4 gloo ranks
and read what the run record says against what the hook really sent."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tuneup import load_run
from tuneup.sync.averaging import Topology
from tuneup.sync.config import SyncConfig
from tuneup.sync.powersgd import PowerSGD, bucket_layout
from tuneup.sync.safeguard import Safeguard

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "tests" / "workloads" / "sync_demo.py"
CLI = ROOT / "tests" / "workloads" / "sync_cli.py"


# -- arithmetic ---------------------------------------------------------------------------------------


class _Bucket:
    """What PowerSGD reads of a DDP GradBucket: its parameters' shapes and its flat buffer."""

    def __init__(self, shapes: list[tuple[int, ...]]) -> None:
        self.params = [torch.empty(s) for s in shapes]
        self.flat = torch.randn(sum(p.numel() for p in self.params))

    def parameters(self) -> list[torch.Tensor]:
        return self.params

    def buffer(self) -> torch.Tensor:
        return self.flat


def _one_rank(tensor: torch.Tensor) -> None:
    """The all-reduce of a world of one: the sum is the tensor itself."""


def test_powersgd_projects_each_matrix_and_sends_what_its_layout_says() -> None:
    shapes = [(64, 32), (32,), (8, 2), (16, 8, 4)]
    layout = bucket_layout(shapes, rank=4)
    # (8, 2) gains nothing from rank-2 factors (not 2x smaller) and goes whole, with the bias.
    assert [(n, m) for _, n, m in layout.matrices] == [(64, 32), (16, 32)]
    assert layout.exact_numel == 32 + 16
    bucket = _Bucket(shapes)
    compressor = PowerSGD(rank=4, error_feedback=True)
    assert compressor.sent_numel(0, bucket) == 48 + (64 + 32) * 4 + (16 + 32) * 4
    original = bucket.flat.clone()
    compressor.reduce(0, bucket, bucket.flat, _one_rank)
    # The uncompressed parts come back exact; each matrix is its projection on P's columns: never longer
    # than the matrix (a contraction), and its residual is kept for the next step.
    assert torch.equal(bucket.flat[64 * 32 : 64 * 32 + 32], original[64 * 32 : 64 * 32 + 32])
    approx = bucket.flat[: 64 * 32].view(64, 32)
    exact = original[: 64 * 32].view(64, 32)
    assert torch.linalg.matrix_rank(approx) == 4
    assert torch.linalg.vector_norm(approx) <= torch.linalg.vector_norm(exact) * (1 + 1e-5)
    residual = compressor._residual[0]
    torch.testing.assert_close(residual + bucket.flat, original, rtol=0, atol=1e-5)


def test_powersgd_with_error_feedback_converges_on_a_fixed_gradient() -> None:
    # Sending the same gradient over and over, error feedback makes the sum of what was sent approach the
    # sum of the gradients; without it, a rank-1 approximation misses the rest forever.
    torch.manual_seed(0)
    gradient = torch.randn(32 * 16)
    sums = {}
    for feedback in (True, False):
        bucket = _Bucket([(32, 16)])
        compressor = PowerSGD(rank=1, error_feedback=feedback)
        total = torch.zeros_like(gradient)
        for _ in range(200):
            bucket.flat.copy_(gradient)
            compressor.reduce(0, bucket, bucket.flat, _one_rank)
            total += bucket.flat
        sums[feedback] = float(
            torch.linalg.vector_norm(total / 200 - gradient) / torch.linalg.vector_norm(gradient)
        )
    assert sums[True] < 0.1 and sums[False] > 0.5, sums


def test_the_safeguard_falls_back_after_k_breaches_in_a_row_and_not_on_one() -> None:
    guard = Safeguard.for_config(SyncConfig(compression="powersgd", breaches_to_fall_back=3))
    guard.observe_loss_only(2.0)
    decisions = [guard.observe(step, error, 1.9).fall_back for step, error in enumerate([1.5, 0.2, 1.5, 1.5])]
    assert decisions == [False, False, False, False]  # the clean check in between starts the count again
    assert guard.observe(5, 1.5, 1.9).fall_back  # the third breach in a row
    assert not guard.observe(6, 1.5, 1.9).fall_back  # and the count starts again after a fallback
    assert "compression error 1.5 above its bound 0.95" in guard.checks[-1].reasons[0]


def test_the_safeguard_reads_the_loss_against_its_lowest_earlier_check() -> None:
    guard = Safeguard.for_config(SyncConfig(local_sgd_period=4, max_loss_rise=0.2, breaches_to_fall_back=2))
    guard.observe_loss_only(3.0)
    assert not guard.observe(10, 0.5, 2.0).breached  # falling: the floor is now 2.0
    assert not guard.observe(20, 0.5, 2.3).breached  # +15%, inside +20%
    check = guard.observe(30, 0.5, 2.5)  # +25%
    assert check.breached and "+25%" in check.reasons[0] and not check.fall_back
    assert guard.observe(40, None, math.nan).fall_back  # a loss that is not a number breaches too
    assert guard.error_name == "parameter divergence"


def test_settings_that_cannot_work_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="choose one"):
        SyncConfig(compression="fp16", local_sgd_period=4)
    with pytest.raises(ValueError, match="compression must be one of"):
        SyncConfig(compression="int8")
    with pytest.raises(ValueError, match="does not divide"):
        Topology(world_size=6, rank=0, ranks_per_node=4)
    assert SyncConfig(compression="powersgd", warmup_steps=0).start_step == 2  # never before the rebuild
    topology = Topology(world_size=4, rank=3, ranks_per_node=2)
    assert (topology.nodes, topology.node, topology.node_ranks(1), topology.cross_ranks(1)) == (
        2,
        1,
        [2, 3],
        [1, 3],
    )


def test_the_strategy_refuses_bf16_on_gloo_and_a_second_hook() -> None:
    from tuneup.plugins.lightning.strategy import TuneupDDPStrategy
    from tuneup.sync.controller import SyncController

    with pytest.raises(ValueError, match="drop ddp_comm_hook"):
        TuneupDDPStrategy(compression="fp16", ddp_comm_hook=lambda state, bucket: None)
    with pytest.raises(ValueError, match=r"'bf16' needs the NCCL backend.*compression='fp16'"):
        SyncController(SyncConfig(compression="bf16"), object(), Topology(2, 0, 2), "gloo")


# -- real training ------------------------------------------------------------------------------------


def _train(out: Path, *args: str, timeout: float = 300) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(DEMO), str(out), *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"training failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return json.loads((out / "result.json").read_text())


def _events(run, kind: str) -> list[dict]:  # type: ignore[no-untyped-def]
    return [e for e in run.ranks[0].events if e["kind"] == kind]


@pytest.mark.slow
def test_compression_cuts_the_recorded_bytes_and_the_record_matches_the_hook(tmp_path: Path) -> None:
    steps, warmup = 16, 4
    for compression, at_most in (("fp16", 0.5), ("powersgd", 0.1)):
        out = tmp_path / compression
        config = {"compression": compression, "warmup_steps": warmup, "check_every_n_steps": 0}
        result = _train(out, "--strategy", json.dumps(config), "--steps", str(steps))
        run = load_run(out / "run")
        summary = result["strategy"]
        assert result["hooks_wrapped"] == 1  # one hook: the strategy's, timed by the callback's probe
        for rank in (0, 1):
            recorded = [s.comm_bytes for s in run.steps(rank)]
            exact = recorded[0]
            assert recorded[:warmup] == [exact] * warmup  # the warm-up all-reduces exactly
            assert all(0 < b <= exact * at_most for b in recorded[warmup:]), (compression, recorded)
            # What the record says was sent is what the hook counted it sent, step for step in sum.
            assert sum(recorded) == summary["sent_bytes"]
            assert all(s.comm_ms is not None and s.comm_ms > 0 for s in run.steps(rank))
        assert summary["exact_bytes"] == exact * steps
        if compression == "fp16":
            assert recorded[warmup:] == [exact // 2] * (steps - warmup)


@pytest.mark.slow
def test_a_faulty_compressor_trips_the_safeguard_which_falls_back_and_says_so(tmp_path: Path) -> None:
    # pytorch_lightning's strategy, PowerSGD whose every result is negated (a faulty compressor).
    config = {"compression": "powersgd", "warmup_steps": 10}
    result = _train(
        tmp_path / "run",
        "--namespace",
        "pytorch_lightning",
        "--strategy",
        json.dumps(config),
        "--steps",
        "60",
        "--fault",
        "-1",
    )
    run = load_run(tmp_path / "run" / "run")
    (started,) = _events(run, "sync_started")
    (fallback,) = _events(run, "sync_fallback")
    assert 0 < fallback["step"] - started["step"] <= 50
    assert fallback["from"] == "PowerSGD rank 4" and fallback["to"] == "exact all-reduce"
    assert any("compression error" in r for r in fallback["reasons"])
    assert result["strategy"]["mode_at_end"] == "exact all-reduce"
    # After the fallback every step all-reduces exactly again.
    recorded = [s.comm_bytes for s in run.steps(0)]
    assert recorded[fallback["step"] :] == [recorded[0]] * (60 - fallback["step"])
    # Every rank fell back at the same step, for the same reasons (or the ranks would have hung).
    on_rank1 = [e for e in run.ranks[1].events if e["kind"] == "sync_fallback"]
    assert [{k: v for k, v in e.items() if k != "t"} for e in on_rank1] == [
        {k: v for k, v in fallback.items() if k != "t"}
    ]


@pytest.mark.slow
def test_local_sgd_averages_parameters_every_h_steps_instead_of_gradients(tmp_path: Path) -> None:
    warmup, period, steps = 4, 4, 20
    config = {"local_sgd_period": period, "warmup_steps": warmup}
    result = _train(tmp_path / "run", "--strategy", json.dumps(config), "--steps", str(steps))
    run = load_run(tmp_path / "run" / "run")
    exact = run.steps(0)[0].comm_bytes
    recorded = [s.comm_bytes or 0 for s in run.steps(0)]
    assert recorded[:warmup] == [exact] * warmup
    # Local steps send nothing; every H-th step averages the parameters (as many bytes as the gradient).
    expected = [exact if (k - warmup + 1) % period == 0 else 0 for k in range(warmup, steps)]
    assert recorded[warmup:] == expected
    averaging = [c for c in run.ranks[0].collectives if c.source == "param_avg"]
    assert len(averaging) == (steps - warmup) // period
    assert all(
        s.comm_exposed_ms >= c.duration_ms
        for s, c in zip([run.steps(0)[c.step] for c in averaging], averaging, strict=True)
    )
    assert result["strategy"]["param_avg_bytes"] >= exact * len(averaging)


@pytest.mark.slow
def test_hierarchical_local_sgd_on_two_simulated_nodes_cuts_the_inter_node_bytes_by_h(tmp_path: Path) -> None:
    warmup, period, steps = 4, 4, 16
    config = {"local_sgd_period": period, "warmup_steps": warmup, "ranks_per_node": 2, "hierarchical": True}
    result = _train(
        tmp_path / "run",
        "--devices",
        "4",
        "--strategy",
        json.dumps(config),
        "--steps",
        str(steps),
        timeout=420,
    )
    assert result["strategy"]["nodes"] == 2 and result["strategy"]["hierarchical"]
    run = load_run(tmp_path / "run" / "run")
    for rank in range(4):
        s = run.steps(rank)
        exact = s[0].comm_bytes
        cross = [x.comm_bytes - (x.comm_node_bytes or 0) for x in s]
        # Warm-up: the gradient crosses the nodes every step. After: within the node every step, across
        # nodes one parameter average every H steps.
        assert cross[:warmup] == [exact] * warmup
        assert sum(cross[warmup:]) * period == exact * (steps - warmup)
        assert all(x.comm_node_bytes == exact for x in s[warmup:])
        scopes = {(c.source, c.scope, c.world_size) for c in run.ranks[rank].collectives if c.step >= warmup}
        assert scopes == {("ddp_hook", "node", 2), ("param_avg", "cross_node", 2)}


@pytest.mark.slow
@pytest.mark.parametrize(
    "namespace, cls",
    [("lightning.pytorch", "TuneupDDPStrategy"), ("pytorch_lightning", "PLTuneupDDPStrategy")],
)
def test_lightning_cli_yaml_selects_the_strategy(tmp_path: Path, namespace: str, cls: str) -> None:
    config = tmp_path / "strategy.yaml"  # not config.yaml: the CLI saves its own config there
    config.write_text(
        f"""
trainer:
  accelerator: cpu
  devices: 2
  max_steps: 6
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  strategy:
    class_path: tuneup.plugins.lightning.strategy.{cls}
    init_args:
      compression: fp16
      warmup_steps: 2
  callbacks:
    - class_path: tuneup.TuneupCallback
      init_args:
        dirpath: {tmp_path / "run"}
"""
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(CLI), namespace, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = load_run(tmp_path / "run")
    recorded = [s.comm_bytes for s in run.steps(0)]
    assert recorded == [recorded[0]] * 2 + [recorded[0] // 2] * 4
    (strategy,) = _events(run, "sync_strategy")
    assert strategy["label"] == "fp16 compression"


def test_the_check_averages_the_slices_of_a_bucket_in_turn() -> None:
    from tuneup.sync.hook import CHECK_MIN_ELEMENTS, HookState

    state = HookState("powersgd", group=None, world_size=2)
    numel = 20 * CHECK_MIN_ELEMENTS + 5  # 16 slices of 1/16th, the last one short
    windows = []
    for _ in range(17):
        windows.append(state.check_window(numel))
        state.checks_made += 1
    length = -(-numel // 16)
    assert windows[0] == slice(0, length) and windows[15] == slice(15 * length, numel)
    assert windows[16] == windows[0]  # round again
    # A small bucket is checked whole, or in slices of at least CHECK_MIN_ELEMENTS.
    assert HookState("fp16", None, 2).check_window(1000) == slice(0, 1000)


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_the_strategy_is_known_by_name_in_each_namespace(namespace: str) -> None:
    import importlib

    import tuneup.plugins.lightning  # noqa: F401  (registers the names)

    trainer = importlib.import_module(namespace).Trainer(
        strategy="tuneup_ddp_spawn", accelerator="cpu", devices=2, logger=False
    )
    expected = "TuneupDDPStrategy" if namespace == "lightning.pytorch" else "PLTuneupDDPStrategy"
    assert type(trainer.strategy).__name__ == expected
    assert trainer.strategy._start_method == "spawn" and not trainer.strategy.sync_config.active
