"""The run record: writing, reading back, and what a damaged or partial record reads as."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tuneup.record import RankWriter, RecordingPolicy, RunRecordError, load_run, write_manifest
from tuneup.record.schema import SCHEMA_VERSION

from synthetic import make_run, step_record


def test_round_trip_all_fields(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path / "run", world_size=2, steps=30))
    assert run.world_size == 2 and run.missing_ranks == [] and run.warnings == []
    assert run.rank_hosts == {0: "node0", 1: "node1"}
    steps = run.steps(1)
    assert [s.step for s in steps] == list(range(30))
    assert steps[3].wall_ms == 11.0 and steps[3].tokens == 256 and steps[3].loss == pytest.approx(1.997)
    assert run.ranks[0].info.closed and run.ranks[0].info.last_step == 29
    assert run.ranks[0].telemetry == [{"t": 1.0, "process": {"cpu_percent": 50.0}}]


def test_windows_hold_count_mean_p50_p95_max(tmp_path: Path) -> None:
    path = tmp_path / "run"
    write_manifest(path, {"run_id": "r", "created_unix": 0, "world_size": 1, "num_nodes": 1})
    w = RankWriter(path, 0, RecordingPolicy(window_steps=10))
    w.open({})
    for s in range(25):
        w.add_step(step_record(s, wall_ms=float(s % 10 + 1)))  # 1..10 ms in every full window
    w.close()
    windows = load_run(path).ranks[0].windows
    assert [(x.first_step, x.last_step, x.count) for x in windows] == [(0, 9, 10), (10, 19, 10), (20, 24, 5)]
    wall = windows[0].stats["wall_ms"]
    assert wall["n"] == 10 and wall["mean"] == pytest.approx(5.5) and wall["max"] == 10.0
    assert wall["p50"] == pytest.approx(5.5) and wall["p95"] == pytest.approx(9.55)
    assert windows[0].samples == 80 and windows[0].tokens == 2560
    assert "grad_norm" not in windows[0].stats  # a metric never recorded is absent, not zero


def test_bounded_size_keeps_detail_then_a_sample(tmp_path: Path) -> None:
    policy = RecordingPolicy(detail_steps=100, sample_every=50, window_steps=100, flush_every_steps=1000)
    run = load_run(make_run(tmp_path / "run", steps=5000, policy=policy))
    kept = [s.step for s in run.steps(0)]
    assert kept[:100] == list(range(100))
    # Past the detail, the multiples of 53: the first prime from 50, so that no round period is favoured.
    assert policy.sample_stride == 53
    assert kept[100:] == list(range(106, 5000, 53))
    assert len(run.ranks[0].windows) == 50
    assert sum(w.count for w in run.ranks[0].windows) == 5000  # every step is in an aggregate


def test_flush_every_n_steps_reaches_disk_before_close(tmp_path: Path) -> None:
    path = tmp_path / "run"
    w = RankWriter(path, 0, RecordingPolicy(flush_every_steps=10, flush_every_s=3600))
    w.open({})
    for s in range(25):
        w.add_step(step_record(s))
    lines = (path / "rank-0" / "steps.jsonl").read_text().splitlines()
    assert len(lines) == 20  # two flushes of 10; the last 5 are still buffered
    w.close()
    assert len((path / "rank-0" / "steps.jsonl").read_text().splitlines()) == 25


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = make_run(tmp_path / "run", steps=10)
    steps_file = path / "rank-0" / "steps.jsonl"
    data = steps_file.read_bytes()
    steps_file.write_bytes(data[: len(data) - 40])  # cut the last line mid-way, as a kill during write does
    run = load_run(path)
    assert [s.step for s in run.steps(0)] == list(range(9))
    assert any("incomplete" in w for w in run.warnings)


def test_damaged_and_mistyped_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    path = make_run(tmp_path / "run", steps=5)
    steps_file = path / "rank-0" / "steps.jsonl"
    lines = steps_file.read_text().splitlines()
    lines[1] = "{not json"
    bad = json.loads(lines[2])
    bad["wall_ms"] = "fast"
    lines[2] = json.dumps(bad)
    steps_file.write_text("\n".join(lines) + "\n")
    run = load_run(path)
    assert [s.step for s in run.steps(0)] == [0, 3, 4]
    assert any("damaged line" in w and "line 2" in w for w in run.warnings)
    assert any("mistyped" in w and "line 3" in w for w in run.warnings)


def test_missing_rank_is_reported_not_fatal(tmp_path: Path) -> None:
    path = make_run(tmp_path / "run", world_size=2)
    for f in (path / "rank-1").iterdir():
        f.unlink()
    (path / "rank-1").rmdir()
    run = load_run(path)
    assert run.missing_ranks == [1]
    assert sorted(run.ranks) == [0]
    assert "1 of 2 rank(s) left no record (rank 1)" in run.warnings[0]


def test_unclosed_rank_says_where_it_stopped(tmp_path: Path) -> None:
    path = tmp_path / "run"
    write_manifest(path, {"run_id": "r", "created_unix": 0, "world_size": 1, "num_nodes": 1})
    w = RankWriter(path, 0, RecordingPolicy(flush_every_steps=5))
    w.open({})
    for s in range(12):
        w.add_step(step_record(s))
    # no close(): as after SIGKILL
    run = load_run(path)
    assert [s.step for s in run.steps(0)] == list(range(10))
    assert "rank 0 stopped at step 9 without closing" in " ".join(run.warnings)


def test_newer_schema_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = make_run(tmp_path / "run")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["schema_version"] = SCHEMA_VERSION + 1
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RunRecordError, match=r"newer than .* upgrade tuneup"):
        load_run(path)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.mkdir(), "is empty"),
        (lambda p: (p.mkdir(), (p / "notes.txt").write_text("x")), "not a tuneup run"),
        (lambda p: p.write_text("x"), "is a file"),
        (lambda p: (p.mkdir(), (p / "manifest.json").write_text("{oops")), "not valid JSON"),
        (lambda p: (p.mkdir(), (p / "manifest.json").write_text('{"schema_version": 1}')), "world_size"),
    ],
)
def test_unreadable_paths_raise_one_clear_error(tmp_path: Path, setup, message: str) -> None:
    path = tmp_path / "x"
    setup(path)
    with pytest.raises(RunRecordError, match=message) as info:
        load_run(path)
    assert "\n" not in str(info.value)


def test_directory_of_runs_names_them(tmp_path: Path) -> None:
    make_run(tmp_path / "runs" / "a")
    make_run(tmp_path / "runs" / "b")
    with pytest.raises(RunRecordError, match=r"holds 2 run\(s\): a, b"):
        load_run(tmp_path / "runs")


def test_unwritable_directory_warns_once_and_degrades(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if os.geteuid() == 0:
        # root ignores directory permissions; a path under a regular file cannot be created by anyone.
        blocked = tmp_path / "file"
        blocked.write_text("x")
        target = blocked / "run"
    else:
        target = tmp_path / "ro" / "run"
        (tmp_path / "ro").mkdir(mode=0o500)
    w = RankWriter(target, 0)
    assert w.open({}) is False
    for s in range(200):
        w.add_step(step_record(s))  # must not raise
    w.close()
    warnings = [r for r in caplog.records if "cannot write the run record" in r.getMessage()]
    assert len(warnings) == 1


def test_write_failure_mid_run_stops_that_stream_once(tmp_path: Path, caplog, monkeypatch) -> None:
    path = tmp_path / "run"
    w = RankWriter(path, 0, RecordingPolicy(flush_every_steps=5))
    w.open({})
    for s in range(10):
        w.add_step(step_record(s))

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(w._steps.file, "write", full_disk)
    for s in range(10, 30):
        w.add_step(step_record(s))
    monkeypatch.undo()
    w.close()
    msgs = [r.getMessage() for r in caplog.records if "No space left" in r.getMessage()]
    assert len(msgs) == 1 and "training goes on" in msgs[0]
    info = json.loads((path / "rank-0" / "info.json").read_text())
    assert info["dropped"]["steps"] == 20


def test_non_finite_values_are_written_as_null(tmp_path: Path) -> None:
    path = tmp_path / "run"
    write_manifest(path, {"run_id": "r", "created_unix": 0, "world_size": 1, "num_nodes": 1})
    w = RankWriter(path, 0)
    w.open({})
    rec = step_record(0)
    rec["loss"] = float("nan")
    w.add_step(rec)
    w.close()
    assert load_run(path).steps(0)[0].loss is None


@pytest.mark.parametrize("bad", [{"flush_every_steps": 0}, {"window_steps": -1}, {"flush_every_s": 0}])
def test_policy_rejects_bad_values(bad: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        RecordingPolicy(**bad)
