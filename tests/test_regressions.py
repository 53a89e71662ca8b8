"""`tuneup regressions`: the CI history store, change points and drift over it, and the command.

Synthetic histories only (no training): seeded noise of a known CV, 5% steps at known records, a drift of
a known rate over a known stretch.
"""

from __future__ import annotations

import json
import random
import uuid
import warnings
from pathlib import Path

import pytest

from tuneup import cli
from tuneup.compare import history
from tuneup.compare.changepoints import find_changes
from tuneup.compare.history import HistoryRecord

STEPS_AT = (60, 120)  # the first record of each 5% slowdown
STEP_RATIO = 0.95
DRIFT_FROM = 150  # 0.1% slower per record from here to the end
DRIFT_PER_RECORD = 0.001
RECORDS = 200
NOISE_CV = 0.015
SAMPLES_PER_STEP = 64


def synthetic_history(
    seed: int,
    records: int = RECORDS,
    *,
    steps_at: tuple[int, ...] = STEPS_AT,
    drift_from: int | None = DRIFT_FROM,
    noise_cv: float = NOISE_CV,
    slow_share: float = 0.0,
) -> list[HistoryRecord]:
    """A CI history: samples_per_s around 1,000 with `noise_cv` noise, a 5% slowdown at each of `steps_at`,
    and 0.1% slower per record from `drift_from` on (None: no drift); step_time_ms is its reciprocal.
    `slow_share` of the records are 15-40% slow besides: a CI job on a busy runner."""
    rng = random.Random(seed)
    busy = random.Random(seed + 99)  # its own generator: the noise is the same with or without slow jobs
    out = []
    for i in range(records):
        level = 1000.0 * STEP_RATIO ** sum(i >= s for s in steps_at)
        if drift_from is not None and i >= drift_from:
            level *= (1.0 - DRIFT_PER_RECORD) ** (i - drift_from + 1)
        samples_per_s = level * (1.0 + rng.gauss(0.0, noise_cv))
        if busy.random() < slow_share:
            samples_per_s *= busy.uniform(0.6, 0.85)
        metrics = {"samples_per_s": samples_per_s, "step_time_ms": 1000.0 * SAMPLES_PER_STEP / samples_per_s}
        out.append(HistoryRecord(f"{i:04d}{seed:04x}abc", 1_700_000_000.0 + 600.0 * i, metrics, "main"))
    return out


def _series(records: list[HistoryRecord], metric: str = "samples_per_s") -> tuple[list[float], list[str]]:
    return [r.metrics[metric] for r in records], [r.commit for r in records]


def _write(path: Path, records: list[HistoryRecord]) -> Path:
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records), encoding="utf-8")
    return path


def run_command(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`tuneup regressions ARGV` through the command line's own dispatch (bad input: one line, exit 2)."""
    code = cli.main(["regressions", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- change points ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_steps_found_at_their_commits_and_the_drift_reported(seed: int) -> None:
    records = synthetic_history(seed)
    values, commits = _series(records)
    changes = find_changes(values, commits)
    steps = [c for c in changes.change_points if c.ratio < 1.0]
    for at in STEPS_AT:
        near = [c for c in steps if abs(c.index - at) <= 2]
        assert len(near) == 1, (at, changes.change_points)
        step = near[0]
        assert step.commit == commits[step.index]
        assert step.ratio_low <= step.ratio <= step.ratio_high
        assert 0.92 < step.ratio < 0.98 and step.ratio_high < 1.0, step
        assert step.p_value < 0.01
    assert not [c for c in changes.change_points if c.ratio > 1.0], "no improvement was injected"
    drifts = [d for d in changes.drifts if d.end_index == RECORDS - 1]
    assert len(drifts) == 1, changes.drifts
    drift = drifts[0]
    assert drift.start_index <= DRIFT_FROM + 10  # where a gentle kink starts is known roughly
    assert drift.percent_low <= drift.percent_per_record <= drift.percent_high < 0.0
    # The segment may take in some flat records before the drift starts: its slope is then less than 0.1%.
    assert -0.13 < drift.percent_per_record < -0.04, drift


def test_aa_histories_raise_at_most_one_false_alarm_in_20() -> None:
    alarms = []
    for seed in range(20):
        values, commits = _series(synthetic_history(1000 + seed, steps_at=(), drift_from=None, noise_cv=0.02))
        changes = find_changes(values, commits)
        if changes.change_points or changes.drifts:
            alarms.append((seed, changes))
    assert len(alarms) <= 1, alarms


def test_slow_jobs_on_a_busy_runner_are_outliers_not_steps() -> None:
    alarms, missed = [], []
    for seed in range(20):
        records = synthetic_history(2000 + seed, steps_at=(), drift_from=None, slow_share=0.03)
        changes = find_changes(*_series(records))
        if changes.change_points or changes.drifts:
            alarms.append((seed, changes))
        records = synthetic_history(seed, slow_share=0.03)
        changes = find_changes(*_series(records))
        calm = synthetic_history(seed)  # the same noise without the slow jobs
        slow = [i for i, (a, b) in enumerate(zip(records, calm, strict=True)) if a.metrics != b.metrics]
        if not all(any(abs(c.index - at) <= 2 for c in changes.change_points) for at in STEPS_AT):
            missed.append((seed, changes))
        assert slow and set(slow) <= set(changes.outliers), (slow, changes.outliers)
    assert len(alarms) <= 1, alarms
    assert len(missed) <= 1, missed


def test_a_constant_or_short_series_has_no_change() -> None:
    assert find_changes([5.0] * 50, [str(i) for i in range(50)]).change_points == ()
    short = find_changes([1.0, 2.0, 1.0], ["a", "b", "c"])
    assert short.change_points == () and short.drifts == () and short.records == 3
    with pytest.raises(ValueError, match="positive"):
        find_changes([1.0, 0.0] * 10, [str(i) for i in range(20)])


# -- the history store -----------------------------------------------------------------------------------


def test_local_history_appends_and_reads_back_in_time_order(tmp_path: Path) -> None:
    path = tmp_path / "ci" / "history.jsonl"
    records = synthetic_history(3, records=6)
    for record in reversed(records):
        history.append(path, record)
    assert history.read(path) == records
    assert len(path.read_text().splitlines()) == 6


def test_memory_url_history_round_trips_one_object_a_record() -> None:
    url = f"memory://tuneup-test/{uuid.uuid4().hex}/history"
    records = [
        *synthetic_history(4, records=5),
        HistoryRecord("f00d", 1_800_000_000.5, {"samples_per_s": 1.5}, run_url="https://ci/1", verdict="ok"),
    ]
    for record in records:
        history.append(url, record)
    assert history.read(url) == records
    from tuneup.record.remote import filesystem

    fs, root = filesystem(url)
    assert len(fs.find(root)) == len(records)


def test_a_damaged_record_is_skipped_with_a_warning_naming_it(tmp_path: Path) -> None:
    path = _write(tmp_path / "h.jsonl", synthetic_history(5, records=4))
    with path.open("a") as f:
        f.write('{"commit": "x", "timestamp_unix": 1}\n{"commit": "trunc')
    with pytest.warns(history.HistoryWarning) as caught:
        records = history.read(path)
    assert len(records) == 4
    messages = [str(w.message) for w in caught]
    assert any(f"{path}:5" in m and "metrics" in m for m in messages), messages
    assert any(f"{path}:6" in m for m in messages), messages

    url = f"memory://tuneup-test/{uuid.uuid4().hex}/h"
    history.append(url, synthetic_history(5, records=1)[0])
    from tuneup.record.remote import filesystem

    fs, root = filesystem(url)
    fs.pipe_file(f"{root}/bad.json", b"not json")
    with pytest.warns(history.HistoryWarning, match="bad.json"):
        assert len(history.read(url)) == 1


def test_append_refuses_a_record_read_would_skip(tmp_path: Path) -> None:
    with pytest.raises(history.HistoryError, match="commit"):
        history.append(tmp_path / "h.jsonl", HistoryRecord("", 1.0, {}))
    assert not (tmp_path / "h.jsonl").exists()


# -- the command -----------------------------------------------------------------------------------------


def test_command_names_the_regressions_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "h.jsonl", synthetic_history(0))
    code, out, _ = run_command([str(path)], capsys)
    assert code == 1
    for metric in ("samples_per_s", "step_time_ms"):
        assert "REGRESSION in" in out and metric in out.splitlines()[0]
    for at in STEPS_AT:
        assert any(f"(record {i})" in out for i in range(at - 2, at + 3)), out
    assert "drift (REGRESSION)" in out and "% per record" in out

    code, out, _ = run_command([str(path), "--metric", "step_time_ms", "--format", "json"], capsys)
    document = json.loads(out)
    assert code == 1 and document["failing"] == ["step_time_ms"]
    (metric,) = document["metrics"]
    assert metric["higher_is_better"] is False
    assert [c["regression"] for c in metric["change_points"]] == [True, True]
    assert all(c["ratio"] > 1.0 for c in metric["change_points"])  # a slowdown: step time up

    code, out, _ = run_command([str(path), "--format", "md"], capsys)
    assert code == 1 and out.startswith("### tuneup regressions: REGRESSION")


def test_an_improvement_is_no_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = synthetic_history(7, steps_at=(100,), drift_from=None)
    faster = [
        HistoryRecord(r.commit, r.timestamp_unix, {"samples_per_s": 1e6 / r.metrics["samples_per_s"]})
        for r in records
    ]  # the slowdown mirrored: samples/s up by 1/0.95
    code, out, _ = run_command([str(_write(tmp_path / "h.jsonl", faster))], capsys)
    assert code == 0, out
    assert "improvement from commit" in out and "no regression" in out


def test_a_drift_alone_fails_even_when_the_last_job_was_an_outlier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = synthetic_history(5, steps_at=())
    last = records[-1]
    slow = {**last.metrics, "samples_per_s": 0.7 * last.metrics["samples_per_s"]}
    records[-1] = HistoryRecord(last.commit, last.timestamp_unix, {**slow, "exposed_comm_ms": 0.0})
    path = _write(tmp_path / "h.jsonl", records)
    code, out, _ = run_command(
        [str(path), "--metric", "samples_per_s", "--metric", "exposed_comm_ms"], capsys
    )
    assert code == 1, out
    # A small step may be reported inside the drift (see changepoints.STEP_P); the drift is reported anyway.
    assert "drift (REGRESSION)" in out and "improvement" not in out
    assert (
        f"1 outlying records left out (far from their neighbours: one slow job, say): records {RECORDS - 1}"
        in out
    )
    assert "exposed_comm_ms: not analysed: always 0 in these 1 records" in out


def test_an_aa_history_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "h.jsonl", synthetic_history(11, steps_at=(), drift_from=None))
    code, out, _ = run_command([str(path)], capsys)
    assert code == 0 and "no change point, no drift" in out, out


def test_command_reads_a_url_history_and_warns_of_a_damaged_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"memory://tuneup-test/{uuid.uuid4().hex}/history"
    for record in synthetic_history(0):
        history.append(url, record)
    code, out, _ = run_command([url, "--metric", "samples_per_s"], capsys)
    assert code == 1 and out.count("REGRESSION from commit") == 2, out

    path = _write(tmp_path / "h.jsonl", synthetic_history(11, steps_at=(), drift_from=None))
    with path.open("a") as f:
        f.write("{truncated\n")
    code, out, err = run_command([str(path)], capsys)
    assert code == 0 and "no regression" in out
    assert f"warning: {path}:{RECORDS + 1}: skipped a damaged history record" in err, err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["{tmp}/missing.jsonl"], "does not exist"),
        (["{tmp}/empty.jsonl"], "no readable record"),
        (["{tmp}/h.jsonl", "--metric", "tokens_per_s"], "no metric 'tokens_per_s'"),
        (["{tmp}/h.jsonl", "--min-effect", "-1"], "--min-effect"),
        (["{tmp}"], "directory"),
    ],
)
def test_bad_input_is_exit_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    _write(tmp_path / "h.jsonl", synthetic_history(0, records=20))
    (tmp_path / "empty.jsonl").write_text("")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, out, err = run_command([a.format(tmp=tmp_path) for a in argv], capsys)
    assert code == 2 and out == ""
    assert said in err and len(err.strip().splitlines()) == 1, err
