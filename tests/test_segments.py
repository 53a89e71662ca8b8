"""Resumed and restarted training continues the same run as a new segment, never mixed into the old one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import lightning.pytorch as L
import pytest

from tuneup import TuneupCallback, load_run
from tuneup.record.segments import elastic_identity, load_segments, next_segment_index

from conftest import WORKLOAD
from workloads.badput import CrashAt
from workloads.tiny import make_loader, make_module


def fit(root: Path, callbacks: list[Any], max_steps: int, ckpt_path: str | None = None) -> None:
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=str(root), callbacks=callbacks,
    )  # fmt: skip
    trainer.fit(make_module("lightning"), make_loader(), ckpt_path=ckpt_path)


def test_a_fit_resumed_from_a_checkpoint_is_the_next_segment_of_the_same_run(tmp_path: Path) -> None:
    run_dir, ckpts = tmp_path / "run", tmp_path / "ckpt"
    saver = L.callbacks.ModelCheckpoint(dirpath=ckpts, every_n_train_steps=5, save_top_k=-1)
    first = TuneupCallback(dirpath=run_dir, telemetry_interval_s=0.2)
    with pytest.raises(RuntimeError, match="node lost"):
        fit(tmp_path, [first, saver, CrashAt(8)], max_steps=20)
    (ckpt,) = sorted(ckpts.glob("*step=5*.ckpt"))
    second = TuneupCallback(dirpath=run_dir, telemetry_interval_s=0.2)
    fit(tmp_path, [second, L.callbacks.ModelCheckpoint(dirpath=ckpts, every_n_train_steps=5)], 20, str(ckpt))

    assert second.run_dir == run_dir / "segment-1" and second.run_id == first.run_id
    assert not (tmp_path / "run-1").exists()  # no stray new run beside it
    segments = load_segments(run_dir)
    assert [s.run_id for s in segments] == [first.run_id] * 2
    one, two = (s.manifest.raw["segment"] for s in segments)
    assert one["index"] == 0 and one["reason"] == "start" and one["global_step_at_start"] == 0
    assert two["index"] == 1 and two["reason"] == "resume" and two["global_step_at_start"] == 5
    assert two["checkpoint"] == str(ckpt)
    # Step numbers continue: the first segment's steps 5..7 were redone by the second.
    assert [s.step for s in segments[0].steps(0)] == list(range(8))
    assert [s.step for s in segments[1].steps(0)] == list(range(5, 20))
    assert segments[0].ranks[0].info.raw["status"] == "exception"
    assert load_run(run_dir).run_id == first.run_id  # a reader that knows no segments still reads the first


def test_a_resumed_run_whose_directory_is_gone_is_recorded_as_a_new_run(tmp_path: Path, caplog) -> None:
    ckpts = tmp_path / "ckpt"
    saver = L.callbacks.ModelCheckpoint(dirpath=ckpts, every_n_train_steps=4, save_top_k=-1)
    fit(tmp_path, [TuneupCallback(dirpath=tmp_path / "gone"), saver], max_steps=4)
    (ckpt,) = ckpts.glob("*.ckpt")
    for f in sorted((tmp_path / "gone").rglob("*"), reverse=True):
        f.unlink() if f.is_file() else f.rmdir()
    (tmp_path / "gone").rmdir()
    again = TuneupCallback(dirpath=tmp_path / "new")
    fit(tmp_path, [again], max_steps=8, ckpt_path=str(ckpt))
    assert again.run_dir == tmp_path / "new"
    assert load_run(again.run_dir).manifest.raw["segment"]["index"] == 0
    assert "not here or not writable" in caplog.text


def test_torchrun_restarts_continue_the_run_under_its_elastic_id(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job42")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    first = TuneupCallback()
    fit(tmp_path, [first], max_steps=4)
    assert first.run_dir == tmp_path / "tuneup" / "elastic-job42"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    second = TuneupCallback()
    fit(tmp_path, [second], max_steps=4)
    assert second.run_dir == first.run_dir / "segment-1" and second.run_id == first.run_id
    seg = load_run(second.run_dir).manifest.raw["segment"]
    assert seg["reason"] == "restart" and seg["restart_count"] == 1
    assert next_segment_index(first.run_dir) == 2
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job43")  # another job: another run, never mixed in
    third = TuneupCallback()
    fit(tmp_path, [third], max_steps=4)
    assert third.run_dir == tmp_path / "tuneup" / "elastic-job43"


def test_elastic_identity_ignores_torchruns_placeholder() -> None:
    assert elastic_identity({"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "2"}) == (None, 2)
    assert elastic_identity({"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "x"}) == ("abc", 0)
    assert elastic_identity({}) == (None, 0)


def torchrun(tmp_path: Path, nproc: int, *args: str) -> None:
    """A real torchrun launch with a fixed rendezvous id (what a scheduler's job id gives every attempt)."""
    port = 29500 + (os.getpid() % 400)
    proc = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--max-restarts=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=elastic-test", "--monitor-interval=0.5",
            str(WORKLOAD), "--devices", str(nproc), "--strategy", "ddp", *args,
        ],
        env={**os.environ, "TUNEUP_DIR": str(tmp_path / "run"), "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_torchrun_restarts_and_a_new_world_size_are_new_segments(tmp_path: Path) -> None:
    """Under torchrun --max-restarts=1 the first attempt is killed at step 4 and torchrun restarts it;
    then the job is launched again with the same id on 2 processes (an elastic job that gained a node).
    Each is a segment of the one run, with its own world size and ranks, never mixed into the others."""
    torchrun(tmp_path, 1, "--max-steps", "8", "--die-at-step", "4", "--flush-every-steps", "2")
    torchrun(tmp_path, 2, "--max-steps", "6")
    segments = load_segments(tmp_path / "run")
    reasons = [
        (s.manifest.raw["segment"]["reason"], s.manifest.raw["segment"].get("restart_count"))
        for s in segments
    ]
    assert reasons == [("start", None), ("restart", 1), ("restart", 0)]
    assert [s.world_size for s in segments] == [1, 1, 2]
    assert [sorted(s.ranks) for s in segments] == [[0], [0], [0, 1]]
    assert len({s.run_id for s in segments}) == 1
    assert not segments[0].ranks[0].info.closed  # the killed attempt never closed its record
    assert [len(s.steps(0)) for s in segments[1:]] == [8, 6]


def test_the_report_counts_the_interruption_and_the_work_it_cost(tmp_path: Path) -> None:
    from tuneup.report import build_report

    run_dir, ckpts = tmp_path / "run", tmp_path / "ckpt"
    saver = L.callbacks.ModelCheckpoint(dirpath=ckpts, every_n_train_steps=5, save_top_k=-1)
    with pytest.raises(RuntimeError):
        fit(tmp_path, [TuneupCallback(dirpath=run_dir), saver, CrashAt(8)], max_steps=20)
    (ckpt,) = sorted(ckpts.glob("*step=5*.ckpt"))
    fit(
        tmp_path, [TuneupCallback(dirpath=run_dir), L.callbacks.ModelCheckpoint(dirpath=ckpts)], 20, str(ckpt)
    )
    report = build_report(run_dir)
    section = report["interruptions"]
    assert section["interruptions"] == 1
    first, second = section["segments"]
    assert first["status"] == ["failed (an exception)"] and second["status"] == ["completed"]
    assert (second["reason"], second["redone_steps"]) == ("resume", 3)  # steps 5, 6 and 7 ran twice
    assert second["redone_s"] == pytest.approx(3 * first["step_ms"] / 1000, rel=1e-3)
    assert second["downtime_before_s"] >= 0
    assert section["lost_s"] == pytest.approx(second["downtime_before_s"] + second["redone_s"], rel=1e-3)
    assert report["run"]["path"] == str(run_dir / "segment-1")  # the figures are the last segment's
    assert any("2 segments" in w for w in report["warnings"])
    from tuneup.report import report_schema

    jsonschema.validate(report, report_schema())

    from tuneup.report import analyze, write_report
    from tuneup.report.terminal import render_terminal

    # `tuneup show` names the run by the directory it was given, not by its last segment's.
    assert render_terminal(analyze(run_dir)).splitlines()[0].endswith(f"  ({run_dir})")

    written = write_report(run_dir, tmp_path / "report", "md,html")
    md = written.path("md").read_text()  # type: ignore[union-attr]
    section = md.split("## Interruptions and checkpoints\n", 1)[1].split("\n## ", 1)[0]
    assert "| 1 | resumed from a checkpoint | 1 | 5 to 19 |" in section and "| 3 |" in section
    assert "exception" in section and "Time to save a checkpoint" in section
    assert "Interruptions and checkpoints" in written.path("html").read_text()  # type: ignore[union-attr]


def test_young_daly_interval() -> None:
    from tuneup.analyze.interruptions import young_daly_interval_s

    # A 30 s save and one interruption a day: sqrt(2 x 30 x 86,400) = 2,276.8 s, about 38 minutes.
    assert young_daly_interval_s(30.0, 86_400.0) == pytest.approx(2276.8, abs=0.1)


class InterruptAt(L.Callback):
    """Ctrl-C in the middle of training."""

    def __init__(self, step: int = 3) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step >= self.step:
            raise KeyboardInterrupt


def test_a_keyboard_interrupt_closes_the_record_as_interrupted(tmp_path: Path) -> None:
    from tuneup.report import analyze, write_report
    from tuneup.report.advice import advice_for
    from tuneup.report.terminal import render_terminal

    callback = TuneupCallback(dirpath=tmp_path / "run")
    # Saves every step: the record has timed saves, as the run the issue reported had.
    saver = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1)
    with pytest.raises((KeyboardInterrupt, SystemExit)):  # Lightning turns it into SystemExit(1)
        fit(tmp_path, [callback, saver, InterruptAt(12)], max_steps=30)
    run = load_run(tmp_path / "run")
    info = run.ranks[0].info
    assert info.closed and info.raw["status"] == "interrupted"
    assert info.raw["stop_reason"] == "user_interrupt"
    assert [s.step for s in run.steps(0)] == list(range(12))
    assert run.warnings == []

    # A user's Ctrl-C is a stop, said as the reason the fit stopped; it is no interruption, and nothing
    # plans checkpoints for it.
    analysis = analyze(tmp_path / "run")
    assert analysis.timeline is not None and analysis.timeline.stop_reason == "user_interrupt"
    section = analysis.interruptions
    assert section is not None and section.interruptions == 0 and section.user_stops == 1
    assert section.checkpoint_save_s  # the saves were timed: only the stop keeps the advice away
    advice = advice_for(analysis)
    assert not isinstance(advice, str)
    assert not [r for r in advice.recommendations if r.id == "checkpoint.interval"]
    (why,) = [c.reason for c in advice.considered if c.knob == "checkpoint interval"]
    assert "stopped by the user" in why
    assert "stopped because the user interrupted it (Ctrl-C)" in render_terminal(analysis)
    written = write_report(tmp_path / "run", tmp_path / "report", "md,html")
    for fmt in ("md", "html"):
        page = written.path(fmt).read_text()  # type: ignore[union-attr]
        assert "the user interrupted it (Ctrl-C)" in page and "Save a checkpoint every" not in page
