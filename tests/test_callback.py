"""TuneupCallback in real (tiny) Lightning training, in this process: one rank, both namespaces."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import tuneup
from tuneup import TuneupCallback, load_run
from tuneup.plugins.lightning import TuneupCallback as PluginCallback

from workloads.tiny import lightning_namespace, make_loader, make_module, make_trainer

NAMESPACES = ["lightning", "pytorch_lightning"]


def fit(
    namespace: str,
    out: Path,
    *,
    max_steps: int = 12,
    accumulate: int = 1,
    slow_data_ms: float = 0,
    slow_step_ms: float = 0,
    loader: Any = None,
    model: Any = None,
    callback: Any = None,
    **trainer_kwargs: Any,
) -> TuneupCallback:
    cb = callback or TuneupCallback(dirpath=out, telemetry_interval_s=0.2)
    model = model or make_module(namespace, slow_step_ms=slow_step_ms)
    trainer = make_trainer(
        namespace, [cb], max_steps=max_steps, accumulate=accumulate, root=str(out.parent), **trainer_kwargs
    )
    trainer.fit(model, loader or make_loader(slow_data_ms=slow_data_ms))
    return cb


def test_one_class_everywhere() -> None:
    import lightning.pytorch as L
    import pytorch_lightning as PL

    assert tuneup.TuneupCallback is PluginCallback
    cb = TuneupCallback()
    assert isinstance(cb, L.Callback) and isinstance(cb, PL.Callback)


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_records_every_optimizer_step(namespace: str, tmp_path: Path) -> None:
    cb = fit(namespace, tmp_path / "run", max_steps=12)
    assert cb.run_dir == tmp_path / "run"
    run = load_run(cb.run_dir)
    assert run.warnings == []
    steps = run.steps(0)
    assert [s.step for s in steps] == list(range(12))
    for s in steps:
        # The user's phases and tuneup's own time (its hooks, kept out of the phases) tile the step.
        phases = s.data_ms + s.forward_ms + s.backward_ms + s.optimizer_ms + s.other_ms + (s.tuneup_ms or 0.0)
        assert phases == pytest.approx(s.wall_ms, abs=0.01)
        assert s.forward_ms > 0 and s.backward_ms > 0 and s.optimizer_ms > 0
        assert s.samples == 8 and s.micro_batches == 1 and s.loss is not None
    assert run.manifest.trainer["namespace"] == {"lightning": "lightning.pytorch"}.get(namespace, namespace)
    assert run.manifest.trainer["max_steps"] == 12
    assert run.manifest.dataloader["batch_size"] == 8
    assert run.manifest.model["parameters"] == 16 * 32 + 32 + 32 + 1
    assert run.manifest.versions["torch"] == torch.__version__
    assert run.ranks[0].info.timing == "host" and run.ranks[0].info.closed
    assert run.ranks[0].telemetry, "the sampler wrote nothing"
    assert "process" in run.ranks[0].telemetry[0]


def test_default_run_dir_is_under_default_root_dir(tmp_path: Path) -> None:
    cb = TuneupCallback(telemetry_interval_s=0.5)
    trainer = make_trainer("lightning", [cb], max_steps=2, root=str(tmp_path))
    trainer.fit(make_module("lightning"), make_loader())
    assert cb.run_dir is not None and cb.run_dir.parent == tmp_path / "tuneup"
    assert load_run(cb.run_dir).run_id == cb.run_dir.name


def test_reused_dirpath_never_mixes_two_runs(tmp_path: Path) -> None:
    first = fit("lightning", tmp_path / "run", max_steps=2)
    second = fit("lightning", tmp_path / "run", max_steps=3)
    assert first.run_dir == tmp_path / "run" and second.run_dir == tmp_path / "run-1"
    assert len(load_run(first.run_dir).steps(0)) == 2 and len(load_run(second.run_dir).steps(0)) == 3


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_accumulation_counts_optimizer_steps_not_micro_batches(namespace: str, tmp_path: Path) -> None:
    model = make_module(namespace)
    seen: list[float] = []
    original = model.training_step

    def training_step(batch: Any, batch_idx: int) -> Any:
        loss = original(batch, batch_idx)
        seen.append(float(loss))
        return loss

    model.training_step = training_step
    cb = fit(namespace, tmp_path / "run", max_steps=5, accumulate=4, model=model)
    steps = load_run(cb.run_dir).steps(0)
    assert [s.step for s in steps] == list(range(5))
    assert all(s.micro_batches == 4 and s.samples == 32 for s in steps)
    # Lightning divides each micro-batch loss by 4: the step's loss is the mean of its micro-batches.
    for i, s in enumerate(steps):
        assert s.loss == pytest.approx(statistics.mean(seen[4 * i : 4 * i + 4]), rel=1e-5)


def test_slow_dataloader_is_attributed_to_data_wait(tmp_path: Path) -> None:
    steps = load_run(fit("lightning", tmp_path / "run", max_steps=12, slow_data_ms=40).run_dir).steps(0)[2:]
    data = statistics.median(s.data_ms for s in steps)
    forward = statistics.median(s.forward_ms for s in steps)
    assert 40 <= data <= 40 + 25, data
    assert forward < 20, forward


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_data_is_the_fetch_alone_and_the_users_profiler_still_sees_it(namespace: str, tmp_path: Path) -> None:
    pl = lightning_namespace(namespace)

    class SlowBetweenBatches(pl.Callback):  # after tuneup's batch end: the gap, but no data loading
        def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
            import time

            time.sleep(0.03)

    profiler = pl.profilers.SimpleProfiler()
    cb = TuneupCallback(dirpath=tmp_path / "run", telemetry_interval_s=0.5)
    trainer = make_trainer(
        namespace, [cb, SlowBetweenBatches()], max_steps=8, root=str(tmp_path), profiler=profiler
    )
    trainer.fit(make_module(namespace), make_loader(slow_data_ms=40))
    run = load_run(cb.run_dir)
    assert run.ranks[0].info.raw["data_timing"] == "fetch"
    steps = run.steps(0)[2:]
    assert 40 <= statistics.median(s.data_ms for s in steps) <= 40 + 25
    assert statistics.median(s.other_ms for s in steps) >= 30
    # The fetch is still the user's profiler's to time, and nothing of tuneup's is left on the trainer.
    assert len(profiler.recorded_durations["[_TrainingEpochLoop].train_dataloader_next"]) >= 8
    for obj in (trainer.profiler, trainer.fit_loop.epoch_loop, trainer.strategy):
        left = {"start", "stop", "_on_before_fetch", "_on_after_fetch", "batch_to_device"} & set(vars(obj))
        assert not left, (obj, left)


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_work_in_the_users_batch_transfer_hook_is_data(namespace: str, tmp_path: Path) -> None:
    class Augmenting(make_module(namespace).__class__):
        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            import time

            time.sleep(0.03)  # augmentation on the batch, once it is on the device
            return batch

    wrapped: list[bool] = []

    class SeesTheStrategy(lightning_namespace(namespace).Callback):
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            wrapped.append("batch_to_device" in vars(trainer.strategy))

    cb = TuneupCallback(dirpath=tmp_path / "run", telemetry_interval_s=0.5)
    trainer = make_trainer(namespace, [cb, SeesTheStrategy()], max_steps=8, root=str(tmp_path))
    trainer.fit(Augmenting(), make_loader())
    steps = load_run(cb.run_dir).steps(0)[2:]
    assert all(wrapped)
    assert 30 <= statistics.median(s.data_ms for s in steps) <= 30 + 25
    assert statistics.median(s.other_ms for s in steps) < 10

    # Without such a hook, on the CPU, batch_to_device does nothing worth a mark: it is left alone.
    wrapped.clear()
    cb = TuneupCallback(dirpath=tmp_path / "run2", telemetry_interval_s=0.5)
    trainer = make_trainer(namespace, [cb, SeesTheStrategy()], max_steps=4, root=str(tmp_path))
    trainer.fit(make_module(namespace), make_loader())
    assert wrapped and not any(wrapped)


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_each_step_carries_its_epoch(namespace: str, tmp_path: Path) -> None:
    # 6 batches an epoch, 14 steps: epochs 0 and 1 whole, two steps of epoch 2.
    cb = fit(namespace, tmp_path / "run", max_steps=14, loader=make_loader(n=48))
    steps = load_run(cb.run_dir).steps(0)
    assert [s.epoch for s in steps] == [0] * 6 + [1] * 6 + [2] * 2


def test_slow_training_step_is_attributed_to_forward(tmp_path: Path) -> None:
    steps = load_run(fit("lightning", tmp_path / "run", max_steps=12, slow_step_ms=40).run_dir).steps(0)[2:]
    data = statistics.median(s.data_ms for s in steps)
    forward = statistics.median(s.forward_ms for s in steps)
    assert 40 <= forward <= 40 + 25, forward
    assert data < 20, data


def test_validation_time_is_not_data_wait(tmp_path: Path) -> None:
    import lightning.pytorch as L

    class WithSlowValidation(make_module("lightning").__class__):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            import time

            time.sleep(0.05)

    loader = make_loader()
    cb = TuneupCallback(dirpath=tmp_path / "run", telemetry_interval_s=0.5)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=12,
        val_check_interval=4,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        callbacks=[cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(WithSlowValidation(), loader, make_loader(n=16))
    run = load_run(cb.run_dir)
    validations = [e for e in run.ranks[0].events if e["kind"] == "validation"]
    assert len(validations) == 3 and all(e["duration_ms"] >= 100 for e in validations)
    assert max(s.data_ms for s in run.steps(0)) < 50


def test_logger_receives_headline_metrics(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(str(tmp_path), name="csv")
    cb = TuneupCallback(dirpath=tmp_path / "run", telemetry_interval_s=0.5)
    trainer = make_trainer("lightning", [cb], max_steps=10, log_every_n_steps=5)
    trainer.loggers = [logger]
    trainer.fit(make_module("lightning"), make_loader())
    logger.finalize("success")
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    logged = [r for r in rows if r.get("tuneup/step_time_ms")]
    assert [int(r["step"]) for r in logged] == [4, 9]
    assert all(float(r["tuneup/samples_per_s"]) > 0 for r in logged)


def test_manual_optimization_is_recorded(tmp_path: Path) -> None:
    model = make_module("lightning")
    model.automatic_optimization = False

    def training_step(batch: Any, batch_idx: int) -> Any:
        opt = model.optimizers()
        x, y = batch
        loss = torch.nn.functional.mse_loss(model.net(x), y)
        opt.zero_grad()
        model.manual_backward(loss)
        opt.step()
        return loss

    model.training_step = training_step
    steps = load_run(fit("lightning", tmp_path / "run", max_steps=6, model=model).run_dir).steps(0)
    assert [s.step for s in steps] == list(range(6))
    assert all(s.backward_ms > 0 and s.loss is not None for s in steps)


def test_gradient_norm_when_asked(tmp_path: Path) -> None:
    cb = TuneupCallback(dirpath=tmp_path / "run", grad_norm=True, telemetry_interval_s=0.5)
    steps = load_run(fit("lightning", tmp_path / "run", max_steps=3, callback=cb).run_dir).steps(0)
    assert all(s.grad_norm is not None and s.grad_norm > 0 for s in steps)


class Opaque:
    """A batch type tuneup cannot size."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y


def opaque_workload() -> tuple[Any, DataLoader]:
    """A model trained on Opaque batches, and their loader."""
    model = make_module("lightning")
    model.training_step = lambda batch, batch_idx: torch.nn.functional.mse_loss(model.net(batch.x), batch.y)

    def collate(items: list[Any]) -> Opaque:
        return Opaque(torch.stack([a for a, _ in items]), torch.stack([b for _, b in items]))

    return model, DataLoader(make_loader().dataset, batch_size=8, collate_fn=collate)


def test_unknown_batch_type_warns_once_and_training_goes_on(tmp_path: Path, caplog) -> None:
    model, loader = opaque_workload()
    steps = load_run(
        fit("lightning", tmp_path / "run", max_steps=5, model=model, loader=loader).run_dir
    ).steps(0)
    assert len(steps) == 5 and all(s.samples is None for s in steps)
    assert sum("cannot tell the batch size of a Opaque batch" in r.getMessage() for r in caplog.records) == 1


def test_batch_size_fn_counts_what_inference_cannot(tmp_path: Path) -> None:
    model, loader = opaque_workload()
    cb = TuneupCallback(
        dirpath=tmp_path / "run", batch_size_fn=lambda b: b.x.shape[0], telemetry_interval_s=0.5
    )
    steps = load_run(
        fit("lightning", tmp_path / "run", max_steps=3, model=model, loader=loader, callback=cb).run_dir
    ).steps(0)
    assert [s.samples for s in steps] == [8, 8, 8]


def test_unwritable_directory_warns_once_and_training_completes(tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    model = make_module("lightning")
    before = [p.detach().clone() for p in model.parameters()]
    fit("lightning", blocker / "run", max_steps=5, model=model)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # it trained
    assert sum("cannot write the run record" in r.getMessage() for r in caplog.records) == 1


def test_internal_failure_disables_tuneup_not_training(tmp_path: Path, caplog, monkeypatch) -> None:
    from tuneup.collect.step_clock import StepClock

    def broken(self: Any, *a: Any, **k: Any) -> None:
        raise RuntimeError("sensor exploded")

    monkeypatch.setattr(StepClock, "before_backward", broken)
    model = make_module("lightning")
    trainer = make_trainer("lightning", [TuneupCallback(dirpath=tmp_path / "run")], max_steps=6)
    trainer.fit(model, make_loader())
    assert trainer.global_step == 6
    msgs = [r.getMessage() for r in caplog.records if "tuneup stops recording" in r.getMessage()]
    assert len(msgs) == 1 and "sensor exploded" in msgs[0]
    assert load_run(tmp_path / "run").ranks[0].info.raw["status"] == "tuneup_error"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timing": "gpu"}, "timing='gpu'"),
        ({"telemetry_interval_s": 0}, "telemetry_interval_s"),
        ({"flush_every_steps": 0}, "flush_every_steps"),
        ({"window_steps": 1.5}, "window_steps"),
        ({"batch_size_fn": 3}, "batch_size_fn"),
        ({"dirpath": 5}, "dirpath"),
        ({"max_lag_steps": -1}, "max_lag_steps"),
        ({"flops_per_sample": 0}, "flops_per_sample"),
        ({"electricity_usd_per_kwh": -0.1}, "electricity_usd_per_kwh"),
        ({"price_per_hour": 2.0, "price_per": "rack"}, "'node' or 'gpu'"),
        ({"spot": True}, "need instance="),
    ],
)
def test_invalid_options_fail_at_construction(kwargs: dict, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(")):
        TuneupCallback(**kwargs)


@pytest.mark.parametrize(
    ("namespace", "model", "data"),
    [("lightning", "LModel", "LData"), ("pytorch_lightning", "PLModel", "PLData")],
)
def test_lightning_cli_config(namespace: str, model: str, data: str, tmp_path: Path, monkeypatch) -> None:
    import importlib
    import sys

    monkeypatch.setattr(sys, "argv", ["train.py"])  # pytest's own argv would otherwise reach the CLI

    cli_module = importlib.import_module(
        "lightning.pytorch.cli" if namespace == "lightning" else "pytorch_lightning.cli"
    )
    import workloads.cli_models as models

    config = tmp_path / "config.yaml"
    config.write_text(f"""
trainer:
  accelerator: cpu
  max_steps: 4
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
  callbacks:
    - class_path: tuneup.TuneupCallback
      init_args:
        dirpath: {tmp_path / "cli-run"}
        telemetry_interval_s: 0.5
""")
    cli_module.LightningCLI(
        getattr(models, model),
        getattr(models, data),
        args=["fit", "--config", str(config)],
        save_config_callback=None,
    )
    run = load_run(tmp_path / "cli-run")
    assert [s.step for s in run.steps(0)] == [0, 1, 2, 3] and run.steps(0)[0].samples == 4


def test_whole_policies_take_effect_and_a_keyword_beside_its_policy_is_refused(tmp_path: Path) -> None:
    from tuneup.recording import PricingPolicy, ProfilingPolicy, RecordingPolicy

    # Which of the two was meant cannot be told: both are named. Every adapter's session refuses it alike.
    both = r"flush_every_steps= given both as a keyword and in recording=RecordingPolicy\(\.\.\.\)"
    with pytest.raises(ValueError, match=both):
        TuneupCallback(recording=RecordingPolicy(flush_every_steps=5), flush_every_steps=7)
    with pytest.raises(ValueError, match=r"instance= given both as a keyword and in pricing=PricingPolicy"):
        tuneup.track(tmp_path / "loop", pricing=PricingPolicy(), instance="aws:p4d.24xlarge")
    cb = TuneupCallback(
        dirpath=tmp_path / "run",
        recording=RecordingPolicy(flush_every_steps=3),
        profiling=ProfilingPolicy(telemetry_interval_s=0.5, count_flops=False),
        timing="auto",  # its policy's default, as LightningCLI passes every keyword: the policy's stands
        instance="aws:p4d.24xlarge",  # a keyword of the one policy not given whole
    )
    assert cb.policy.flush_every_steps == 3 and cb.price is not None
    fit("lightning", tmp_path / "run", max_steps=4, callback=cb)
    run = load_run(cb.run_dir)
    recording = run.manifest.raw["recording"]
    assert (recording["flush_every_steps"], recording["telemetry_interval_s"]) == (3, 0.5)
    assert run.manifest.raw["flops"]["count_flops"] is False
    assert not [e for e in run.ranks[0].events if e["kind"] == "flops"]
    assert run.manifest.raw["pricing"]["instance"] == "aws:p4d.24xlarge"


def test_second_fit_with_the_same_callback_is_a_new_run(tmp_path: Path) -> None:
    cb = TuneupCallback(dirpath=tmp_path / "run", telemetry_interval_s=0.5)
    model = make_module("lightning")
    make_trainer("lightning", [cb], max_steps=3).fit(model, make_loader())
    first = cb.run_dir
    make_trainer("lightning", [cb], max_steps=5).fit(model, make_loader())
    assert first == tmp_path / "run" and cb.run_dir == tmp_path / "run-1"
    assert len(load_run(first).steps(0)) == 3 and len(load_run(cb.run_dir).steps(0)) == 5
    assert load_run(cb.run_dir).ranks[0].info.closed


def test_a_run_directory_that_cannot_be_chosen_disables_tuneup_not_training(tmp_path, caplog, monkeypatch):
    import tuneup.recording.run_dir as run_dir_module

    def refuse(base: Path) -> Path:
        raise PermissionError(13, "Permission denied", str(base))

    monkeypatch.setattr(run_dir_module, "free_run_dir", refuse)
    trainer = make_trainer("lightning", [TuneupCallback(dirpath=tmp_path / "run")], max_steps=4)
    trainer.fit(make_module("lightning"), make_loader())
    assert trainer.global_step == 4
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert (
        "cannot choose a run directory (PermissionError" in messages and "tuneup stops recording" in messages
    )


def test_flops_are_counted_once_and_the_price_choice_is_recorded(tmp_path: Path) -> None:
    cb = TuneupCallback(dirpath=tmp_path / "run", instance="aws:p4d.24xlarge", electricity_usd_per_kwh=0.15)
    fit("lightning", tmp_path / "run", max_steps=6, callback=cb)
    run = load_run(cb.run_dir)
    flops = [e for e in run.ranks[0].events if e["kind"] == "flops"]
    # Hand count for the tiny model (see tests/test_comm.py): 2240 FLOPs per sample, batch 8.
    assert [(e["flops"], e["samples"], e["step"]) for e in flops] == [(2240 * 8, 8, 0)]
    pricing = run.manifest.raw["pricing"]
    assert pricing["instance"] == "aws:p4d.24xlarge" and pricing["source"] == "callback"
    assert pricing["electricity_usd_per_kwh"] == 0.15
    # The counted micro-batch ran inside FlopCounterMode; nothing of it is left on later steps.
    assert not cb._session._flops.counting


def test_flops_per_sample_replaces_counting(tmp_path: Path) -> None:
    cb = TuneupCallback(dirpath=tmp_path / "run", flops_per_sample=1e6)
    fit("pytorch_lightning", tmp_path / "run", max_steps=4, callback=cb)
    run = load_run(cb.run_dir)
    assert not [e for e in run.ranks[0].events if e["kind"] == "flops"]
    assert run.manifest.raw["flops"] == {"flops_per_sample": 1e6, "count_flops": False}


def test_a_compiled_model_is_recognized_so_its_flops_are_not_counted() -> None:
    from tuneup.recording.device import is_compiled as _is_compiled

    model = make_module("lightning")
    assert not _is_compiled(model)
    model.net.compile()  # nn.Module.compile compiles nothing until the first call: cheap to test
    assert _is_compiled(model)
    assert _is_compiled(torch.compile(make_module("lightning").net))
