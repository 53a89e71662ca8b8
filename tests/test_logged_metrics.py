"""The metrics the training logs (val_loss, val_acc, the training loss) are recorded as the trainer reduced
them, in every adapter: names, values equal to what the trainer logged, steps, source; a target reached;
a NaN kept as one; the record's bound; one rank's values in its own file under DDP.

Also a script: `python tests/test_logged_metrics.py --out RUN_DIR` trains the classifier below on 2 DDP
ranks (gloo) and writes what each rank's logger was handed beside the record (the DDP test runs it)."""

from __future__ import annotations

import importlib
import json
import logging
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuneup import load_run
from tuneup.record.schema import METRICS_FILE, MetricRecord, rank_dir_name
from tuneup.record.writer import (
    METRIC_NAMES_MAX,
    VALIDATION_VALUES_MAX,
    RankWriter,
    RecordingPolicy,
    thinning_stride,
)
from tuneup.recording.logged_metrics import LoggedMetrics

DIM = 8
BATCH = 4
STEPS = 15
VAL_EVERY = 3
LOG_EVERY = 2
NAN_AT = 5  # the global step whose training_step logs a NaN train_loss (the loss it trains on stays finite)
TARGET = "val_acc>=0.9"


# -- a classifier whose validation accuracy climbs from below chance past 0.9 within STEPS --------------


def _data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, DIM, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


class _Body:
    """Both namespaces' model; the label is the sign of the first feature, and the model starts reversed."""

    def __init__(self, nan_at: int = -1, sync: bool = False) -> None:
        super().__init__()
        self.nan_at = nan_at
        self.sync = sync
        self.net = torch.nn.Linear(DIM, 2)
        with torch.no_grad():
            w = torch.zeros(DIM)
            w[0] = 0.5
            self.net.weight.copy_(torch.stack([w, -w]))  # predicts the wrong class at first
            self.net.bias.zero_()

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        logged = loss.detach() * float("nan") if self.global_step == self.nan_at else loss
        self.log("train_loss", logged)  # per rank: no sync_dist
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=self.sync)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), sync_dist=self.sync)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.net.parameters(), lr=1.0)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_data(64, 0), batch_size=BATCH)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(_data(32, 1), batch_size=16)


def _namespace(name: str) -> Any:
    return importlib.import_module("lightning.pytorch" if name == "lightning" else "pytorch_lightning")


def _classes(ns: Any) -> tuple[type, type, type]:
    """The model, a logger that keeps what Lightning hands it, and a callback that keeps the trainer's
    callback metrics at each validation's end: what Lightning logged, to compare the record with."""

    class Model(_Body, ns.LightningModule):
        pass

    class Kept(ns.loggers.Logger):
        def __init__(self) -> None:
            super().__init__()
            self.logged: list[tuple[int, dict[str, float]]] = []

        @property
        def name(self) -> str:
            return "kept"

        @property
        def version(self) -> int:
            return 0

        def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
            return None

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            self.logged.append((int(step or 0), dict(metrics)))

    class AtValidationEnd(ns.Callback):
        def __init__(self) -> None:
            self.seen: list[tuple[int, dict[str, float]]] = []

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if not trainer.sanity_checking:
                values = {k: float(v) for k, v in trainer.callback_metrics.items()}
                self.seen.append((trainer.global_step, values))

    return Model, Kept, AtValidationEnd


def _trainer_args(**extra: Any) -> dict[str, Any]:
    return {
        "accelerator": "cpu",
        "max_steps": STEPS,
        "val_check_interval": VAL_EVERY,
        "limit_val_batches": 2,
        "log_every_n_steps": LOG_EVERY,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        **extra,
    }


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _by_source(metrics: list[MetricRecord], source: str, name: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in metrics if m.source == source and m.name == name]


@pytest.fixture(scope="module", params=["lightning", "pytorch_lightning"])
def lightning_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from tuneup import TuneupCallback

    ns = _namespace(request.param)
    Model, Kept, AtValidationEnd = _classes(ns)
    out = tmp_path_factory.mktemp(f"logged-{request.param}") / "run"
    kept, at_end = Kept(), AtValidationEnd()
    tuneup = TuneupCallback(out, target=TARGET, telemetry_interval_s=0.5)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    tuneup_logger = logging.getLogger("tuneup")
    level = tuneup_logger.level
    tuneup_logger.setLevel(logging.INFO)  # before the tests' own fixture sets it: this one is the module's
    tuneup_logger.addHandler(handler)
    try:
        trainer = ns.Trainer(**_trainer_args(logger=kept, callbacks=[tuneup, at_end]))
        trainer.fit(Model(nan_at=NAN_AT))
    finally:
        tuneup_logger.removeHandler(handler)
        tuneup_logger.setLevel(level)
    return {
        "run": load_run(out),
        "dir": out,
        "logged": kept.logged,
        "validation": at_end.seen,
        "lines": [r.getMessage() for r in records],
    }


def test_validation_metrics_are_what_lightning_had_at_each_validation_end(
    lightning_run: dict[str, Any],
) -> None:
    metrics = lightning_run["run"].ranks[0].metrics
    seen = lightning_run["validation"]
    assert [step for step, _ in seen] == [3, 6, 9, 12, 15]  # no sanity check among them
    recorded = [m for m in metrics if m.source == "validation"]
    # Only what the validation set: the training loss in the same callback metrics is not validation's.
    assert {m.name for m in recorded} == {"val_loss", "val_acc"}
    for name in ("val_loss", "val_acc"):
        assert _by_source(metrics, "validation", name) == [(step, values[name]) for step, values in seen]
    for m in recorded:
        assert m.epoch == 0 and m.samples == BATCH * m.step  # one rank, one micro-batch a step


def test_training_metrics_are_what_lightning_logged_at_its_interval(lightning_run: dict[str, Any]) -> None:
    metrics = lightning_run["run"].ranks[0].metrics
    # Lightning's loggers count steps from 0 (the batches stepped before this one); the record counts the
    # optimizer steps done, as trainer.global_step does: one more.
    logged = [
        (step + 1, values["train_loss"]) for step, values in lightning_run["logged"] if "train_loss" in values
    ]
    recorded = _by_source(metrics, "train", "train_loss")
    assert [s for s, _ in recorded] == [s for s, _ in logged] == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    assert all(_same(a, b) for (_, a), (_, b) in zip(recorded, logged, strict=True))
    assert {m.name for m in metrics if m.source == "train"} == {
        "train_loss"
    }  # the validation's are not train


def test_a_nan_is_recorded_as_nonfinite_and_read_back_as_nan(lightning_run: dict[str, Any]) -> None:
    nan_step = NAN_AT + 1  # logged by the step that trained at global step NAN_AT
    values = dict(_by_source(lightning_run["run"].ranks[0].metrics, "train", "train_loss"))
    assert math.isnan(values[nan_step]) and all(math.isfinite(v) for s, v in values.items() if s != nan_step)
    lines = (lightning_run["dir"] / rank_dir_name(0) / METRICS_FILE).read_text().splitlines()
    raw = [json.loads(line) for line in lines if '"nonfinite"' in line]
    assert [(r["name"], r["step"], r["value"], r["nonfinite"]) for r in raw] == [
        ("train_loss", nan_step, None, "nan")
    ]


def test_the_target_is_reached_at_the_first_validation_that_meets_it(lightning_run: dict[str, Any]) -> None:
    run = lightning_run["run"]
    first = next(step for step, values in lightning_run["validation"] if values["val_acc"] >= 0.9)
    assert first < STEPS  # reached within the run, before its end: the event is not merely the last step
    events = [e for e in run.ranks[0].events if e["kind"] == "target_reached"]
    assert len(events) == 1
    event = events[0]
    assert event["metric"] == "val_acc" and event["step"] == first and event["target"] == TARGET
    assert event["value"] == pytest.approx(dict(lightning_run["validation"])[first]["val_acc"], rel=1e-6)
    assert (
        0
        < event["elapsed_s"]
        < run.ranks[0].info.raw["train_end_unix"] - run.ranks[0].info.raw["fit_start_unix"]
    )
    assert run.manifest.recording["target"] == TARGET
    said = [line for line in lightning_run["lines"] if "target val_acc>=0.9 reached" in line]
    assert len(said) == 1 and f"at step {first}:" in said[0]


def test_lightning_cli_records_the_logged_metrics_and_takes_the_target(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["train.py"])
    from lightning.pytorch.cli import LightningCLI

    Model, _, _ = _classes(_namespace("lightning"))
    config = tmp_path / "config.yaml"
    config.write_text(f"""
trainer:
  accelerator: cpu
  max_steps: 6
  val_check_interval: 3
  limit_val_batches: 2
  log_every_n_steps: 2
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
  callbacks:
    - class_path: tuneup.TuneupCallback
      init_args:
        dirpath: {tmp_path / "cli-run"}
        telemetry_interval_s: 0.5
        target: "val_loss<=0.01"
""")
    LightningCLI(Model, args=["fit", "--config", str(config)], save_config_callback=None)
    run = load_run(tmp_path / "cli-run")
    metrics = run.ranks[0].metrics
    assert [s for s, _ in _by_source(metrics, "validation", "val_acc")] == [3, 6]
    # Without a logger Lightning still reduces the training metrics at its interval, and they are recorded.
    assert [s for s, _ in _by_source(metrics, "train", "train_loss")] == [2, 4, 6]
    assert run.manifest.recording["target"] == "val_loss<=0.01"
    assert not [e for e in run.ranks[0].events if e["kind"] == "target_reached"]  # not reached: no event


def test_a_target_that_cannot_be_read_fails_at_construction() -> None:
    from tuneup import TuneupCallback

    with pytest.raises(
        ValueError, match=r"TuneupCallback\(target=...\): cannot read the target 'val_acc=>0.9'"
    ):
        TuneupCallback(target="val_acc=>0.9")
    assert str(TuneupCallback(target="val_loss<2.1").target) == "val_loss<=2.1"


# -- the bound ----------------------------------------------------------------------------------------


def _offer(writer: RankWriter, name: str, source: str, count: int, value: float = 1.0) -> int:
    return sum(
        writer.add_metric(MetricRecord(name=name, value=value, step=i, t=0.0, source=source))
        for i in range(count)
    )


def test_the_record_of_logged_metrics_is_bounded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = RankWriter(tmp_path, 0, RecordingPolicy())
    writer.open({})
    # Training values: all of the first 2,000, then every 2nd to 4,000, every 4th to 8,000, every 8th...
    offered = 20_001
    kept = _offer(writer, "train_loss", "train", offered)
    assert kept == 2_000 + 1_000 + 1_000 + 1_000 + (offered - 16_000 + 15) // 16
    assert [thinning_stride(i) for i in (0, 1_999, 2_000, 3_999, 4_000, 8_000, 1_000_000)] == [
        1,
        1,
        2,
        2,
        4,
        8,
        512,
    ]
    # A million values of one name stay about 11,000 lines.
    assert sum(1 for i in range(1_000_000) if i % thinning_stride(i) == 0) < 11_500
    # The first NaN is kept whatever the thinning (the 20,002nd value would otherwise be dropped).
    assert writer.add_metric(MetricRecord("train_loss", math.nan, offered + 1, 0.0, "train"))
    assert not writer.add_metric(MetricRecord("train_loss", math.nan, offered + 3, 0.0, "train"))
    # Validation values: every one, up to 10,000 a name.
    assert _offer(writer, "val_loss", "validation", VALIDATION_VALUES_MAX + 50) == VALIDATION_VALUES_MAX
    # Names: 64 a run, the 65th dropped with one warning that names it.
    for i in range(METRIC_NAMES_MAX - 2 + 5):
        _offer(writer, f"extra_{i}", "log", 2)
    dropped = [r.getMessage() for r in caplog.records if "more than 64 metrics" in r.getMessage()]
    assert len(dropped) == 1 and "'extra_62'" in dropped[0]
    writer.close()
    run_metrics = load_run_metrics(tmp_path)
    assert len({m.name for m in run_metrics}) == METRIC_NAMES_MAX
    assert len(run_metrics) == kept + 1 + VALIDATION_VALUES_MAX + 2 * (METRIC_NAMES_MAX - 2)
    info = json.loads((tmp_path / rank_dir_name(0) / "info.json").read_text())
    assert info["metric_names_dropped"] == [f"extra_{i}" for i in range(62, 67)]
    assert info["metric_validation_capped"] == ["val_loss"]


def load_run_metrics(run_dir: Path) -> list[MetricRecord]:
    from tuneup.record.reader import _load_rank

    return _load_rank(run_dir, 0, []).metrics


def test_the_reader_skips_a_damaged_line_and_a_cut_last_line_and_says_so(tmp_path: Path) -> None:
    from tuneup.record.reader import _load_rank

    rank_dir = tmp_path / rank_dir_name(0)
    rank_dir.mkdir()
    (rank_dir / METRICS_FILE).write_text(
        '{"name":"val_loss","step":3,"t":1.5,"value":0.25,"source":"validation","epoch":0,"samples":12}\n'
        '{"name":"val_loss","step":6,"t":2.5,"value":null,"source":"validation"}\n'  # null without its kind
        '{"name":"val_loss","step":7,"t":2.6,"value":1,"source":"somewhere"}\n'  # an unknown source
        "not json\n"
        '{"name":"val_loss","step":9,"t":3.5,"value":null,"nonfinite":"-inf","source":"validation"}\n'
        '{"name":"val_loss","step":12,"t":4.5,"val'
    )
    warnings: list[str] = []
    metrics = _load_rank(tmp_path, 0, warnings).metrics
    assert metrics[0] == MetricRecord("val_loss", 0.25, 3, 1.5, "validation", epoch=0, samples=12)
    assert [(m.step, m.value) for m in metrics] == [(3, 0.25), (9, -math.inf)]
    said = " | ".join(warnings)
    assert "last line is incomplete" in said and "1 damaged line" in said
    assert "2 logged metric line(s) with missing or mistyped fields skipped (line 2, 3)" in said


def test_a_read_takes_scalars_of_every_kind_and_skips_what_is_not_one_number() -> None:
    import numpy as np

    kept: list[MetricRecord] = []
    metrics = LoggedMetrics(lambda r: kept.append(r) is None)
    values = {
        "a": torch.tensor(0.5),
        "b": torch.tensor([2], dtype=torch.int64),  # one element: a scalar
        "c": 3,
        "d": np.float32(0.25),
        "vector": torch.ones(3),
        "text": "x",
        "flag": True,
        "epoch": 1,  # an axis, not a metric
        "tuneup/step_time_ms": 4.0,  # tuneup's own figure
    }
    a = values["a"]
    metrics.take(values, "log", step=7, epoch=0, samples=28)
    a.add_(1.0)  # changed in place after the read: the read holds the value it had
    assert not kept  # nothing is read on the training thread
    metrics.drain()
    assert sorted((r.name, r.value) for r in kept) == [("a", 0.5), ("b", 2.0), ("c", 3.0), ("d", 0.25)]
    assert {(r.step, r.epoch, r.samples, r.source) for r in kept} == {(7, 0, 28, "log")}


class _Copy:
    """Stands in for the CUDA event recorded after a read's copy to the host (no GPU here)."""

    def __init__(self) -> None:
        self.landed = False
        self.waited = False

    def query(self) -> bool:
        return self.landed

    def synchronize(self) -> None:
        self.waited = self.landed = True


def test_a_read_waits_for_its_copy_unless_the_record_closes() -> None:
    kept: list[MetricRecord] = []
    metrics = LoggedMetrics(lambda r: kept.append(r) is None)
    first, second = _Copy(), _Copy()
    metrics.take({"val_loss": torch.tensor(1.0)}, "validation", step=3)
    metrics._reads[-1].events.append(first)
    metrics.take({"val_loss": torch.tensor(0.5)}, "validation", step=6)
    metrics._reads[-1].events.append(second)
    metrics.drain()
    assert kept == [] and not first.waited  # a copy not landed: nothing read, nothing waited for
    second.landed = True
    metrics.drain()
    assert kept == []  # in order: the second read waits behind the first
    first.landed = True
    metrics.drain()
    assert [(r.step, r.value) for r in kept] == [(3, 1.0), (6, 0.5)] and not first.waited
    metrics.take({"val_loss": torch.tensor(0.25)}, "validation", step=9)
    metrics._reads[-1].events.append(third := _Copy())
    metrics.drain(force=True)  # the record closes: wait for the last copy
    assert third.waited and kept[-1].value == 0.25


# -- the other adapters ----------------------------------------------------------------------------------


def test_the_plain_loop_records_what_it_hands_over(tmp_path: Path) -> None:
    from tuneup.plugins.loop import track

    model = torch.nn.Linear(DIM, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with track(
        tmp_path / "run", batch_size=BATCH, model=model, target="val_loss<=100", telemetry_interval_s=0.5
    ) as run:
        for i, (x, y) in enumerate(DataLoader(_data(16, 0), batch_size=BATCH)):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            run.step(loss=loss)
            run.log_metrics({"val_loss": loss.detach() * 2, "lr": 0.1})
            if i == 1:
                run.log_metrics({"val_loss": loss.detach()}, step=100, epoch=3)
    metrics = load_run(tmp_path / "run").ranks[0].metrics
    assert [(m.step, m.source, m.samples) for m in metrics if m.name == "val_loss"] == [
        (1, "log", 4),
        (2, "log", 8),
        (100, "log", 8),
        (3, "log", 12),
        (4, "log", 16),
    ]
    assert [m.epoch for m in metrics if m.name == "val_loss"] == [None, None, 3, None, None]
    assert all(m.value == 0.1 for m in metrics if m.name == "lr")
    events = [e for e in load_run(tmp_path / "run").ranks[0].events if e["kind"] == "target_reached"]
    assert [e["step"] for e in events] == [1]


def test_fabric_records_log_dict_and_the_recorders_own_call(tmp_path: Path) -> None:
    from lightning.fabric import Fabric

    from tuneup.plugins.fabric import instrument

    fabric = Fabric(accelerator="cpu", devices=1)
    recorder = instrument(fabric, dirpath=tmp_path / "run", telemetry_interval_s=0.5)
    model = torch.nn.Linear(DIM, 2)
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loader = fabric.setup_dataloaders(DataLoader(_data(16, 0), batch_size=BATCH))
    losses = []
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        fabric.log("train_loss", loss.detach(), step=1000)  # its loggers' own axis; the record's is steps
        losses.append(float(loss.detach()))
    recorder.log_metrics({"val_loss": 0.75})
    recorder.close()
    metrics = load_run(tmp_path / "run").ranks[0].metrics
    assert [(m.step, m.source, m.epoch) for m in metrics if m.name == "train_loss"] == [
        (i, "log", 0) for i in (1, 2, 3, 4)
    ]
    assert [m.value for m in metrics if m.name == "train_loss"] == losses
    assert [(m.step, m.value) for m in metrics if m.name == "val_loss"] == [(4, 0.75)]


def test_hugging_face_records_its_training_logs_and_evaluation(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import TrainerCallback

    from tuneup.plugins.huggingface import TuneupTrainerCallback

    from workloads.hf_trainer import make_trainer
    from workloads.loops import Delays

    class Kept(TrainerCallback):
        def __init__(self) -> None:
            self.logs: list[tuple[int, dict[str, float]]] = []

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            self.logs.append((state.global_step, dict(logs or {})))

    torch.set_num_threads(1)
    callback = TuneupTrainerCallback(dirpath=tmp_path / "run", telemetry_interval_s=0.5)
    delays = Delays(data_ms=0.0, forward_ms=0.0, backward_ms=0.0, optimizer_ms=0.0)
    trainer = make_trainer(
        tmp_path / "hf", callback, steps=4, accumulate=1, delays=delays, logging_steps=2, validate_every=2
    )
    kept = Kept()
    trainer.add_callback(kept)
    trainer.train()
    metrics = load_run(tmp_path / "run").ranks[0].metrics
    train_logs = [(s, logs["loss"]) for s, logs in kept.logs if "loss" in logs]
    assert [(m.step, m.value) for m in metrics if m.name == "loss"] == train_logs and len(train_logs) == 2
    assert {m.source for m in metrics if m.name == "loss"} == {"train"}
    eval_logs = [(s, logs["eval_loss"]) for s, logs in kept.logs if "eval_loss" in logs]
    recorded = [(m.step, m.value) for m in metrics if m.name == "eval_loss"]
    assert recorded == eval_logs and [s for s, _ in recorded] == [2, 4]
    assert {m.source for m in metrics if m.name.startswith("eval_")} == {"validation"}
    names = {m.name for m in metrics}
    assert not names & {"epoch", "eval_runtime", "train_runtime"}  # axes, timings and the summary


# -- DDP: every rank its own values ------------------------------------------------------------------------


def test_each_ddp_rank_records_its_own_values(tmp_path: Path) -> None:
    import os

    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, __file__, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = load_run(out)
    per_rank = {}
    for rank in (0, 1):
        kept = json.loads((out.parent / f"logged-rank{rank}.json").read_text())
        logged = [(step + 1, values["train_loss"]) for step, values in kept if "train_loss" in values]
        per_rank[rank] = _by_source(run.ranks[rank].metrics, "train", "train_loss")
        assert per_rank[rank] == logged and len(logged) == 2, rank
        val = _by_source(run.ranks[rank].metrics, "validation", "val_loss")
        assert [s for s, _ in val] == [3]
    # Logged without sync_dist, each rank's training loss is its own batch's; with it, the validation
    # loss is the same on both.
    assert [v for _, v in per_rank[0]] != [v for _, v in per_rank[1]]
    assert _by_source(run.ranks[0].metrics, "validation", "val_loss") == _by_source(
        run.ranks[1].metrics, "validation", "val_loss"
    )


def _ddp_main(out: Path) -> None:
    import lightning.pytorch as L

    from tuneup import TuneupCallback

    Model, Kept, _ = _classes(L)
    kept = Kept()
    trainer = L.Trainer(
        **_trainer_args(max_steps=4, devices=2, strategy="ddp", logger=kept, num_sanity_val_steps=0),
        callbacks=[TuneupCallback(out, telemetry_interval_s=0.5)],
    )
    trainer.fit(Model(sync=True))
    (out.parent / f"logged-rank{trainer.global_rank}.json").write_text(json.dumps(kept.logged))


if __name__ == "__main__":
    _ddp_main(Path(sys.argv[sys.argv.index("--out") + 1]))
