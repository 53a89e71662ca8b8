"""Regression tests for defects users found running tuneup on Lightning's own examples: each names the
defect it guards against."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import pytest

from tuneup import TuneupCallback
from tuneup.report import analyze

from workloads.tiny import make_loader, make_module, make_trainer

ROOT = Path(__file__).resolve().parents[1]


def _fit(root: Path, callbacks: list[Any], ckpt_path: str | None = None, **kw: Any) -> Any:
    trainer = make_trainer("lightning", callbacks, root=str(root), **kw)  # enable_checkpointing: see tiny
    trainer.fit(make_module("lightning"), make_loader(n=64), ckpt_path=ckpt_path)
    return trainer


def test_resuming_a_completed_run_is_not_an_interruption(tmp_path: Path) -> None:
    # Defect: training on from a finished fit's last checkpoint was counted as an interruption, with the
    # days between the two fits as time lost.
    run_dir, ckpts = tmp_path / "run", tmp_path / "ckpt"
    saver = L.callbacks.ModelCheckpoint(dirpath=ckpts, every_n_train_steps=4, save_top_k=-1)
    _fit(tmp_path, [TuneupCallback(dirpath=run_dir), saver], max_steps=8, enable_checkpointing=True)
    (last,) = sorted(ckpts.glob("*step=8*.ckpt"))
    more = TuneupCallback(dirpath=run_dir)
    _fit(
        tmp_path,
        [more, L.callbacks.ModelCheckpoint(dirpath=ckpts)],
        str(last),
        max_steps=12,
        enable_checkpointing=True,
    )
    assert more.run_dir == run_dir / "segment-1"
    it = analyze(run_dir).interruptions
    assert it is not None and len(it.segments) == 2
    assert it.interruptions == 0 and it.lost_s == 0.0
    assert it.segments[1].downtime_before_s is None and it.segments[1].redone_steps is None


def test_checkpoints_saved_outside_a_step_are_seen_and_timed(tmp_path: Path) -> None:
    # Defect: ModelCheckpoint's end-of-epoch saves happen outside any step, and the report said "no
    # checkpoint save was seen".
    run_dir = tmp_path / "run"
    saver = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)  # saves at each epoch end
    _fit(
        tmp_path,
        [TuneupCallback(dirpath=run_dir), saver],
        max_steps=-1,
        max_epochs=2,
        enable_checkpointing=True,
    )
    analysis = analyze(run_dir)
    assert analysis.interruptions is not None
    assert analysis.interruptions.checkpoint_saves_seen == 2
    assert (
        analysis.interruptions.checkpoint_save_s is not None and analysis.interruptions.checkpoint_save_s > 0
    )
    assert analysis.timeline is not None
    saves = next(p for p in analysis.timeline.parts if p.name == "checkpoint_saves")
    assert saves.count == 2 and saves.seconds > 0


def test_the_fit_ends_with_one_line_naming_the_run_and_the_command(tmp_path: Path, capsys: Any) -> None:
    # Printed on stderr, not logged at INFO, which Python hides unless logging is configured.
    cb = TuneupCallback(dirpath=tmp_path / "run")
    _fit(tmp_path, [cb], max_steps=3)
    lines = [line for line in capsys.readouterr().err.splitlines() if "report it with" in line]
    assert lines == [
        f"tuneup: run record written to {cb.run_dir}; report it with: tuneup report {cb.run_dir}"
    ]


SPAWN_SCRIPT = """
import lightning.pytorch as L
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import DataLoader, TensorDataset
from tuneup import TuneupCallback


class Regression(L.LightningModule):  # at module level: ddp_spawn pickles it into the workers
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(16, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    cb = TuneupCallback(dirpath={out!r}, telemetry_interval_s=0.5)
    strategy = L.strategies.DDPStrategy(start_method="spawn", ddp_comm_hook=default_hooks.fp16_compress_hook)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_steps=6, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir={root!r}, callbacks=[cb],
    )
    data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    trainer.fit(Regression(), DataLoader(data, batch_size=8))
    print("RUN_DIR=" + str(cb.run_dir))
"""


@pytest.mark.slow
def test_ddp_spawn_tells_the_launching_process_where_the_run_went(tmp_path: Path) -> None:
    # Defects: under ddp_spawn, callback.run_dir was None in the launching process; a ddp_comm_hook that
    # Lightning dropped (on CPU) was said only in the training log; ddp and ddp_spawn runs looked alike.
    out = tmp_path / "run"
    script = tmp_path / "spawn_fit.py"
    script.write_text(SPAWN_SCRIPT.format(out=str(out), root=str(tmp_path)))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"RUN_DIR={out}" in proc.stdout
    assert proc.stderr.count(f"report it with: tuneup report {out}") == 1
    analysis = analyze(out)
    assert analysis.environment.trainer["start_method"] == "spawn"
    assert "spawn" in textwrap.shorten(str(analysis.run.strategy) + str(analysis.run.start_method), 200)
    (dropped,) = [f for f in analysis.findings if f.id == "comm_hook_dropped"]
    assert "fp16_compress_hook" in dropped.title


@pytest.mark.parametrize("kind", ["fast_dev_run", "three_steps"])
def test_a_run_too_short_for_a_steady_state_says_so_instead_of_quoting_figures(
    tmp_path: Path, kind: str
) -> None:
    # Defect: fast_dev_run gave a "steady state" from its one FLOP-counted step, and "Loss went from 2.32
    # at step 0 to 2.32 at step 0".
    from tuneup.report import write_report
    from tuneup.report.terminal import render_terminal

    run_dir = tmp_path / "run"
    options = {"fast_dev_run": True, "max_steps": -1} if kind == "fast_dev_run" else {"max_steps": 3}
    _fit(tmp_path, [TuneupCallback(dirpath=run_dir)], **options)
    analysis = analyze(run_dir)
    assert analysis.warmup.no_steady_state is not None
    assert analysis.throughput.samples_per_s is None and analysis.step_time.mean_ms is None
    assert "no steady state" in render_terminal(analysis)
    write_report(run_dir, tmp_path / "out", formats="md")
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "No steady state" in markdown
    if kind == "fast_dev_run":
        assert "Loss went from" not in markdown and "(one step recorded)" in markdown


def test_waiting_in_the_trainers_collectives_is_a_sync_finding_not_other(tmp_path: Path) -> None:
    # Defect: in 2-rank DDP, "other" was 28-40% of the step and blamed on callbacks and logging; it was a
    # fast rank waiting in Lightning's per-batch SIGTERM flag broadcast. Now that wait is "sync", said so.
    from tuneup.record import RankWriter, write_manifest

    from synthetic import step_record

    write_manifest(tmp_path, {"run_id": "r", "created_unix": 1.0, "world_size": 2, "num_nodes": 1})
    for rank in range(2):
        w = RankWriter(tmp_path, rank)
        w.open({"host": "node"})
        for step in range(40):
            record = step_record(step, wall_ms=12.0)
            # Rank 0 waits 2.5 ms per step for rank 1, which spends it in forward.
            record.update(other_ms=0.0, sync_ms=2.5 if rank == 0 else 0.0)
            record["forward_ms"] += 0.0 if rank == 0 else 2.5
            w.add_step(record)
        w.close(status="completed")
    analysis = analyze(tmp_path)
    ids = {f.id for f in analysis.findings}
    assert "sync_wait" in ids and "other_time" not in ids
    assert analysis.step_time.phases["sync"].ms == pytest.approx(1.25)


def test_a_failing_mark_inside_the_trainers_methods_stops_recording_not_training(
    tmp_path: Path, monkeypatch: Any, caplog: Any
) -> None:
    # The optimizer post-hook and the collective wrappers run inside torch's and Lightning's code: a bug of
    # tuneup's there must never reach the training.
    from tuneup.collect.step_clock import StepClock

    def broken(self: Any) -> None:
        raise RuntimeError("clock broke")

    monkeypatch.setattr(StepClock, "after_optimizer", broken)
    trainer = _fit(tmp_path, [TuneupCallback(dirpath=tmp_path / "run")], max_steps=6)
    assert trainer.global_step == 6  # training went on to the end
    assert "a trainer mark failed with RuntimeError: clock broke" in caplog.text
    assert trainer.strategy.__dict__.get("barrier") is None  # the wrappers were taken off at the end


def test_a_record_without_the_fits_times_says_they_are_unknown_not_absent(tmp_path: Path) -> None:
    from tuneup.report import write_report

    from synthetic import make_run

    run = make_run(tmp_path / "run", steps=30)  # written as before the fit's times were recorded
    write_report(run, tmp_path / "out", formats="md")
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "recorded before tuneup kept the fit's own times" in markdown
    assert "Not in this fit" not in markdown
