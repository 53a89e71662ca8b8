"""A `tuneup tune` trial inside a real (one-process) fit: TuneupCallback applies the trial's settings the
Lightning way, stops once the step time is measured, and answers the tuner through its status directory."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tuneup import TuneupCallback
from tuneup.tune.protocol import ENV_TRIAL, StopRule, TrialSpec

from workloads.cli_models import LData, LModel
from workloads.tune_models import make_classes, make_gan

NAMESPACES = ["lightning.pytorch", "pytorch_lightning"]


def _fit(
    L: Any,
    model: Any,
    data: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: dict[str, Any],
    stop: StopRule,
) -> tuple[Any, Path]:
    status = tmp_path / "status"
    status.mkdir()
    spec = TrialSpec(trial="01-test", settings=settings, stop=stop, status_dir=str(status))
    monkeypatch.setenv(ENV_TRIAL, spec.to_env())
    callback = TuneupCallback(tmp_path / "run", count_flops=False, telemetry_interval_s=5.0)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=400,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(model, datamodule=data)
    return trainer, status


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_trial_settings_are_applied_and_the_budget_stops_the_fit(
    namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    L = importlib.import_module(namespace)
    model_cls, data_cls = make_classes(L)
    data = data_cls(batch_size=16)
    trainer, status = _fit(
        L,
        model_cls(hidden=32),
        data,
        tmp_path,
        monkeypatch,
        {"batch_size": 8, "accumulate_grad_batches": 2, "num_workers": 0},
        StopRule(max_steps=12, warmup_steps=2, min_steps=5, precision=1e-9),
    )
    assert trainer.global_step == 12  # the trial's budget, not the Trainer's max_steps of 400
    assert data.batch_size == 8 and trainer.accumulate_grad_batches == 2
    assert trainer.train_dataloader.batch_size == 8
    applied = json.loads((status / "applied.json").read_text())
    assert applied == {
        "applied": {"batch_size": 8, "accumulate_grad_batches": 2, "num_workers": 0},
        "not_applied": {},
    }
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["tune_trial"]["applied"]["batch_size"] == 8
    assert manifest["dataloader"]["batch_size"] == 8  # the record says what ran
    assert (status / "heartbeat-rank0").is_file()


def test_a_precise_enough_step_time_stops_the_trial_early(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning.pytorch as L

    model_cls, data_cls = make_classes(L)
    rule = StopRule(max_steps=300, warmup_steps=3, min_steps=15, precision=0.5, check_every=5)
    trainer, _ = _fit(L, model_cls(hidden=32), data_cls(batch_size=8), tmp_path, monkeypatch, {}, rule)
    # Known to 50% soon after warm-up and min_steps (however noisy the machine): stopped on a check step,
    # before the budget (the budget alone stops at 300, as the test above shows with an unreachable precision).
    assert trainer.global_step < rule.max_steps
    assert trainer.global_step % rule.check_every == 0


def test_what_cannot_be_applied_is_said_and_workers_go_on_the_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning.pytorch as L

    # LModel/LData have no batch_size or num_workers attribute: the DataLoader's batch is fixed at 4.
    trainer, status = _fit(
        L,
        LModel(),
        LData(),
        tmp_path,
        monkeypatch,
        {"batch_size": 8, "num_workers": 1, "precision": "bf16-mixed", "bucket_cap_mb": 50},
        StopRule(max_steps=6, warmup_steps=1, min_steps=2),
    )
    applied = json.loads((status / "applied.json").read_text())
    assert (
        "batch_size" in applied["not_applied"]
        and "`batch_size` attribute" in applied["not_applied"]["batch_size"]
    )
    assert "precision" in applied["not_applied"]
    assert "DistributedDataParallel" in applied["not_applied"]["bucket_cap_mb"]  # one process: no DDP
    assert applied["applied"] == {"num_workers": 1}
    assert trainer.train_dataloader.num_workers == 1 and trainer.train_dataloader.prefetch_factor == 2


def test_an_exception_is_reported_with_out_of_memory_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning.pytorch as L

    monkeypatch.setenv("TUNE_OOM_BATCH", "8")
    model_cls, data_cls = make_classes(L)
    with pytest.raises(torch.OutOfMemoryError):
        _fit(
            L,
            model_cls(hidden=32),
            data_cls(batch_size=8),
            tmp_path,
            monkeypatch,
            {},
            StopRule(max_steps=6, min_steps=2),
        )
    failure = json.loads((tmp_path / "status" / "failed-rank0.json").read_text())
    assert failure["out_of_memory"] is True and failure["type"] == "OutOfMemoryError"


def test_accumulation_is_not_applied_to_manual_optimization(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning.pytorch as L

    model_cls, data_cls = make_classes(L)

    class Manual(model_cls):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__(hidden=16)
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            opt = self.optimizers()
            loss = super().training_step(batch, batch_idx)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            return loss

    trainer, status = _fit(
        L, Manual(), data_cls(batch_size=8), tmp_path, monkeypatch, {"accumulate_grad_batches": 2},
        StopRule(max_steps=6, warmup_steps=1, min_steps=2),
    )  # fmt: skip
    applied = json.loads((status / "applied.json").read_text())
    assert "manual" in applied["not_applied"]["accumulate_grad_batches"]
    assert trainer.accumulate_grad_batches == 1


def test_target_steps_count_as_lightning_counts_max_steps_in_a_two_optimizer_loop(tmp_path: Path) -> None:
    """Lightning's max_steps counts every optimizer's steps (trainer.global_step): a GAN's batch is two. The
    time to --target-steps N is then N/2 training steps, not N (the figure was 2x off)."""
    import lightning.pytorch as L

    from tuneup.tune.objective import Objective
    from tuneup.tune.search import rates_of
    from tuneup.tune.session import config_of_run, measure
    from tuneup.tune.space import Config
    from tuneup.tune.state import OK, Trial

    _, data_cls = make_classes(L)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=40, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[TuneupCallback(tmp_path / "run", count_flops=False)],
    )  # fmt: skip
    trainer.fit(make_gan(L), datamodule=data_cls(batch_size=8, features=16))
    batches = trainer.fit_loop.epoch_loop.total_batch_idx + 1
    assert (trainer.global_step, batches) == (40, 20)  # Lightning's count, on the installed version

    trial = Trial(index=0, name="gan", config=Config(), role="baseline")
    measure(trial, tmp_path / "run")
    assert trial.status == OK and trial.samples_per_s, trial.reason
    assert trial.optimizer_steps_per_step == 2
    trial.config = config_of_run(trial)
    objective = Objective("time", target_steps=trainer.max_steps)
    [(_, rate)] = rates_of(objective, [trial], 1, trial.config)
    step_s = 8 / trial.samples_per_s  # one training step (a batch of 8) at the trial's throughput
    assert objective.figure(rate) * 3600 == pytest.approx(batches * step_s, rel=1e-6)
    assert "optimizer steps" in objective.describe()


def test_reshard_after_forward_false_reaches_every_fsdp2_unit_and_drops_the_backward_gathers(
    tmp_path: Path,
) -> None:
    """Two gloo ranks, FSDP2 through ModelParallelStrategy: each Linear is a unit, gathered in forward and
    (resharded after it, by default) again in backward: 2 all-gathers per unit per step (tests/test_comm.py).
    Kept after forward, each unit is gathered once."""
    from collections import Counter

    from tuneup import load_run

    from conftest import run_workload

    status = tmp_path / "status"
    status.mkdir()
    spec = TrialSpec(
        trial="01-test",
        settings={"reshard_after_forward": "false"},
        stop=StopRule(max_steps=4, warmup_steps=1, min_steps=2, precision=1e-9),
        status_dir=str(status),
    )
    out = tmp_path / "run"
    run_workload(
        out, "--devices", "2", "--strategy", "fsdp2", "--max-steps", "4", env={ENV_TRIAL: spec.to_env()}
    )
    applied = json.loads((status / "applied.json").read_text())
    assert applied == {"applied": {"reshard_after_forward": "false"}, "not_applied": {}}
    run = load_run(out)
    # The manifest says what the units did (the tuner checks a trial's run against what it asked).
    assert run.manifest.raw["model"]["fsdp"]["reshard_after_forward"] is False
    for rank in (0, 1):
        gathers = Counter(c.step for c in run.ranks[rank].collectives if c.kind == "all_gather")
        assert set(gathers.values()) == {2}, gathers  # two units, each gathered once a step


def test_reshard_after_forward_is_refused_without_fsdp2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning.pytorch as L

    model_cls, data_cls = make_classes(L)
    _, status = _fit(
        L,
        model_cls(hidden=32),
        data_cls(batch_size=8),
        tmp_path,
        monkeypatch,
        {"reshard_after_forward": "false"},
        StopRule(max_steps=4, warmup_steps=1, min_steps=2),
    )
    applied = json.loads((status / "applied.json").read_text())
    assert "fully_shard" in applied["not_applied"]["reshard_after_forward"]
