"""`tuneup index`: the Parquet index of many runs (tuneup/fleet/index.py), on synthetic runs made from the
committed demo run (benchmarks/fleet_synthetic.py), local and on object storage."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

import pyarrow.parquet as pq
from test_multinode import s3  # noqa: F401  (the moto S3 server fixture)

from tuneup import cli
from tuneup.analyze.analysis import analyze_run
from tuneup.analyze.model import BADPUT_CATEGORIES
from tuneup.fleet import index as fleet_index
from tuneup.fleet.index import (
    RUNS_FILE,
    RUNS_SCHEMA,
    STEPS_FILE,
    STEPS_SCHEMA,
    query,
    read_index,
    update_index,
)
from tuneup.fleet.row import MAX_STEP_WINDOWS, step_rows
from tuneup.record import RecordingPolicy
from tuneup.record.segments import load_segments

from synthetic import make_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from fleet_synthetic import make_fleet

# The synthetic runs start within the 60 days before this (2026-12-01 00:00 UTC): fixed, so that "last
# month" selects the same runs whenever the test runs.
UNTIL_UNIX = 1_796_083_200.0
FLEET_RUNS = 8


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fleet") / "runs"
    make_fleet(out, FLEET_RUNS, seed=3, until_unix=UNTIL_UNIX)
    return out


def _copy(fleet: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "runs"
    shutil.copytree(fleet, copy)
    return copy


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`tuneup index ARGV` through the command line's own dispatch (bad input: one line, exit 2)."""
    code = cli.main(["index", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runs the index loads (the seam: load_segments, which index_run calls for every run it reads)."""
    import tuneup.record.segments as segments

    seen: list[str] = []
    real = segments.load_segments

    def counting(path: Any) -> Any:
        seen.append(str(path))
        return real(path)

    monkeypatch.setattr(segments, "load_segments", counting)
    return seen


def _run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("manifest.json"))


def test_an_unchanged_run_is_not_read_again_a_changed_one_is_and_a_removed_one_drops_its_rows(
    fleet: Path, tmp_path: Path, loads: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    runs_dir = _copy(fleet, tmp_path)
    index_dir = tmp_path / "index"
    dirs = _run_dirs(runs_dir)
    assert len(dirs) == FLEET_RUNS

    code, out, _ = _cli([str(runs_dir), "--index", str(index_dir), "--workers", "1"], capsys)
    assert code == 0
    assert f"{FLEET_RUNS} runs indexed ({FLEET_RUNS} new or changed, 0 unchanged, 0 unreadable)" in out
    assert sorted(loads) == [str(d) for d in dirs]
    runs, steps = read_index(index_dir)
    assert sorted(runs.column("run_key").to_pylist()) == [str(d) for d in dirs]
    first_indexed = dict(
        zip(runs.column("run_key").to_pylist(), runs.column("indexed_unix").to_pylist(), strict=True)
    )

    loads.clear()
    code, out, _ = _cli([str(runs_dir), "--index", str(index_dir), "--workers", "1"], capsys)
    assert code == 0 and loads == []
    assert f"(0 new or changed, {FLEET_RUNS} unchanged, 0 unreadable)" in out

    # One run gets another line in a rank's stream (a run still being written): read again, alone.
    changed, removed = dirs[1], dirs[2]
    with open(changed / "rank-0" / "telemetry.jsonl", "a", encoding="utf-8") as f:
        f.write('{"t": 1.0}\n')
    shutil.rmtree(removed)
    code, out, _ = _cli([str(runs_dir), "--index", str(index_dir), "--workers", "1"], capsys)
    assert code == 0 and loads == [str(changed)]
    assert "1 gone and dropped" in out
    runs, steps = read_index(index_dir)
    keys = runs.column("run_key").to_pylist()
    assert str(removed) not in keys and len(keys) == FLEET_RUNS - 1
    assert str(removed) not in set(steps.column("run_key").to_pylist())
    indexed = dict(zip(keys, runs.column("indexed_unix").to_pylist(), strict=True))
    assert indexed[str(changed)] > first_indexed[str(changed)]
    assert all(indexed[k] == first_indexed[k] for k in keys if k != str(changed))


def test_runs_under_another_location_are_kept_and_the_price_options_are_part_of_the_fingerprint(
    fleet: Path, tmp_path: Path, loads: list[str]
) -> None:
    from tuneup.cost.options import CostOptions
    from tuneup.cost.pricing import PriceChoice

    runs_dir = _copy(fleet, tmp_path)
    a, b = _run_dirs(runs_dir)[:2]
    index_dir = tmp_path / "index"
    update_index([str(a)], index_dir, workers=1)
    result = update_index([str(b)], index_dir, workers=1)
    assert result.runs == 2 and result.found == 1 and result.dropped == 0
    loads.clear()
    # Another price for runs that recorded none: every run is read again (its dollars may change).
    cost = CostOptions(price=PriceChoice(price_per_hour=10.0, source="command line"))
    again = update_index([str(a), str(b)], index_dir, cost, workers=1)
    assert again.read == 2 and sorted(loads) == sorted([str(a), str(b)])


def _expected_row(run_dir: Path) -> dict[str, Any]:
    """The figures the index must hold for a run: straight from its analysis."""
    runs = load_segments(run_dir)
    analysis = analyze_run(runs[-1], None, runs)
    badput = analysis.badput
    assert badput is not None and analysis.cost is not None
    categories = {c.name: c for c in badput.categories}
    price = analysis.cost.price
    return {
        "run_id": analysis.run.run_id,
        "start": analysis.run.start_unix,
        "instance": price.instance.key if price is not None and price.instance is not None else None,
        "usd": badput.usd,
        "samples_per_s": analysis.throughput.samples_per_s,
        "step_median_ms": analysis.step_time.median_ms,
        "world_size": analysis.run.world_size,
        "tags": analysis.run.tags,
        **{f"{c}_s": categories[c].seconds for c in BADPUT_CATEGORIES},
        **{f"{c}_usd": categories[c].usd for c in BADPUT_CATEGORIES},
    }


def test_the_index_is_read_alike_by_pyarrow_and_duckdb_and_holds_the_analyses_figures(
    fleet: Path, tmp_path: Path
) -> None:
    index_dir = tmp_path / "index"
    update_index([str(fleet)], index_dir, workers=1)
    expected = {str(d): _expected_row(d) for d in _run_dirs(fleet)}

    # pyarrow, straight from the file (the schema is the index's own).
    table = pq.read_table(index_dir / RUNS_FILE)
    assert table.schema.equals(RUNS_SCHEMA, check_metadata=False)
    assert pq.read_table(index_dir / STEPS_FILE).schema.equals(STEPS_SCHEMA, check_metadata=False)
    rows = {r["run_key"]: r for r in table.to_pylist()}
    assert rows.keys() == expected.keys()
    for key, want in expected.items():
        row = rows[key]
        assert row["error"] is None
        assert row["run_id"] == want["run_id"] and row["world_size"] == want["world_size"]
        assert row["instance"] == want["instance"]
        assert dict(row["tags"]) == want["tags"] and set(want["tags"]) == {"project", "user", "experiment"}
        assert row["start"].timestamp() == pytest.approx(want["start"], abs=1e-3)
        for name in ("usd", "samples_per_s", "step_median_ms", *[f"{c}_s" for c in BADPUT_CATEGORIES]):
            assert row[name] == (None if want[name] is None else pytest.approx(want[name], rel=1e-9)), name
    priced = [k for k, w in expected.items() if w["instance"] is not None]
    assert priced and all(rows[k]["exposed_communication_usd"] is not None for k in priced)

    # DuckDB: dollars of exposed communication by instance type, last month.
    since = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    got = dict(
        query(
            index_dir,
            "SELECT instance, sum(exposed_communication_usd) FROM runs "
            "WHERE start >= TIMESTAMPTZ '2026-11-01 00:00:00+00' AND instance IS NOT NULL GROUP BY instance",
        ).fetchall()
    )
    want: dict[str, float] = {}
    for w in expected.values():
        if w["instance"] is not None and w["start"] >= since.timestamp():
            want[w["instance"]] = want.get(w["instance"], 0.0) + w["exposed_communication_usd"]
    assert want and got.keys() == want.keys()
    for instance, usd in want.items():
        assert got[instance] == pytest.approx(usd, rel=1e-9)
    # steps.parquet: each run's windows, joined to runs by its key.
    (joined,) = query(
        index_dir, "SELECT count(DISTINCT s.run_key) FROM steps s JOIN runs r USING (run_key)"
    ).fetchall()
    assert joined == (len(expected),)


def test_step_summary_merges_a_long_runs_windows_into_at_most_32(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "long", world_size=2, steps=400, policy=RecordingPolicy(window_steps=10))
    runs = load_segments(run_dir)
    assert len(runs[0].ranks[0].windows) == 40
    rows = step_rows("k", runs)
    assert len(rows) == MAX_STEP_WINDOWS
    assert rows[0]["first_step"] == 0 and rows[-1]["last_step"] == 399
    assert [r["window"] for r in rows] == list(range(MAX_STEP_WINDOWS))
    # Consecutive spans, none lost or repeated.
    assert all(b["first_step"] == a["last_step"] + 1 for a, b in itertools.pairwise(rows))
    # make_run: rank 0's steps take 10 ms, rank 1's 11 ms; the median over ranks of the window medians.
    assert rows[5]["step_median_ms"] == pytest.approx(10.5)
    # 8 samples a step on each rank, over the steps' own time (10 and 11 ms: 10.5 ms a span-step on the
    # mean), not over the windows' wall-clock span, which a validation or a save between steps would stretch.
    assert rows[5]["samples_per_s"] == pytest.approx(2 * 8 / 0.0105, rel=1e-6)


def test_an_unreadable_run_keeps_an_error_row_and_is_retried_only_when_it_changes(
    fleet: Path, tmp_path: Path, loads: list[str]
) -> None:
    runs_dir = _copy(fleet, tmp_path)
    bad = runs_dir / "broken" / "run"
    bad.mkdir(parents=True)
    (bad / "manifest.json").write_text("{not json", encoding="utf-8")
    index_dir = tmp_path / "index"
    result = update_index([str(runs_dir)], index_dir, workers=1)
    assert result.unreadable == 1 and result.found == FLEET_RUNS + 1
    runs, _ = read_index(index_dir)
    row = next(r for r in runs.to_pylist() if r["run_key"] == str(bad))
    assert row["error"] and "manifest.json" in row["error"] and "\n" not in row["error"]
    assert row["usd"] is None and row["samples_per_s"] is None
    loads.clear()
    assert update_index([str(runs_dir)], index_dir, workers=1).unreadable == 1 and loads == []
    (bad / "manifest.json").write_text("{still not json", encoding="utf-8")
    update_index([str(runs_dir)], index_dir, workers=1)
    assert loads == [str(bad)]


def test_a_pool_of_workers_indexes_the_same_rows_as_one_process(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fleet_index, "POOL_FROM_RUNS", 2)
    monkeypatch.setattr(fleet_index, "ROWS_PER_TASK", 3)
    update_index([str(fleet)], tmp_path / "one", workers=1)
    update_index([str(fleet)], tmp_path / "two", workers=2)
    drop = ["indexed_unix"]
    one, two = read_index(tmp_path / "one"), read_index(tmp_path / "two")
    assert one[0].drop(drop).equals(two[0].drop(drop))
    assert one[1].sort_by("run_key").equals(two[1].sort_by("run_key"))


# -- object storage ------------------------------------------------------------------------------------


def _put_tree(fs: Any, local: Path, remote: str) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            fs.pipe_file(f"{remote}/{path.relative_to(local).as_posix()}", path.read_bytes())


def _same_rows_as_local(url_index: Path, local_index: Path, url: str, local: Path) -> None:
    drop = ["run_key", "fingerprint", "indexed_unix"]
    url_runs, url_steps = read_index(url_index)
    local_runs, local_steps = read_index(local_index)
    assert [k.removeprefix(url) for k in url_runs.column("run_key").to_pylist()] == [
        k.removeprefix(str(local)) for k in local_runs.column("run_key").to_pylist()
    ]
    assert url_runs.drop(drop).equals(local_runs.drop(drop))
    assert url_steps.drop(["run_key"]).equals(local_steps.drop(["run_key"]))


@pytest.fixture
def memory_url() -> Iterator[str]:
    import fsspec

    fs = fsspec.filesystem("memory")
    root = "/tuneup-fleet-test"
    try:
        yield f"memory://{root}"
    finally:
        if fs.exists(root):
            fs.rm(root, recursive=True)


def test_runs_on_memory_fs_are_indexed_like_local_ones(
    fleet: Path, tmp_path: Path, memory_url: str, loads: list[str]
) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    _put_tree(fs, fleet, memory_url.removeprefix("memory://"))
    update_index([str(fleet)], tmp_path / "local", workers=1)
    result = update_index([memory_url], tmp_path / "url", workers=1)
    assert result.found == FLEET_RUNS and result.unreadable == 0
    _same_rows_as_local(tmp_path / "url", tmp_path / "local", memory_url, fleet)
    # Unchanged objects are not read again; a rewritten one is (its listing's time changes).
    loads.clear()
    assert update_index([memory_url], tmp_path / "url", workers=1).read == 0 and loads == []
    runs, _ = read_index(tmp_path / "url")
    key = runs.column("run_key").to_pylist()[0]
    info = f"{key.removeprefix('memory://')}/rank-0/info.json"
    fs.pipe_file(info, fs.cat_file(info))  # the same bytes, put again: a new object
    assert update_index([memory_url], tmp_path / "url", workers=1).read == 1


def test_runs_on_s3_are_indexed_like_local_ones(fleet: Path, tmp_path: Path, s3: str) -> None:  # noqa: F811
    import fsspec

    fs = fsspec.filesystem("s3")
    two = tmp_path / "two"
    for d in _run_dirs(fleet)[:2]:
        shutil.copytree(d, two / d.relative_to(fleet))
    url = f"{s3}/team"
    _put_tree(fs, two, url.removeprefix("s3://"))
    update_index([str(two)], tmp_path / "local", workers=1)
    result = update_index([url], tmp_path / "url", workers=1)
    assert result.found == 2 and result.unreadable == 0
    _same_rows_as_local(tmp_path / "url", tmp_path / "local", url, two)
    assert update_index([url], tmp_path / "url", workers=1).read == 0


# -- bad input -----------------------------------------------------------------------------------------


def test_a_location_without_runs_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    for location, said in (
        (tmp_path / "empty", "holds no run record"),
        (tmp_path / "missing", "does not exist"),
    ):
        code, out, err = _cli([str(location), "--index", str(tmp_path / "index")], capsys)
        assert code == 2 and out == ""
        assert said in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "index").exists()


def test_an_index_that_cannot_be_read_or_written_is_one_line_and_exit_2(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(_run_dirs(fleet)[0])
    a_file = tmp_path / "a-file"
    a_file.write_text("x", encoding="utf-8")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / RUNS_FILE).write_bytes(b"not parquet")
    for index_dir, said in (
        (a_file, "is a file"),
        (damaged, "cannot read"),
        ("s3://bucket/index", "local directory"),
    ):
        code, out, err = _cli([run, "--index", str(index_dir)], capsys)
        assert code == 2 and out == "", err
        assert said in err and len(err.strip().splitlines()) == 1
    assert (damaged / RUNS_FILE).read_bytes() == b"not parquet"


def test_without_pyarrow_the_command_says_how_to_install_it(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "tuneup.fleet.index")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    code, out, err = _cli([str(fleet), "--index", str(tmp_path / "index")], capsys)
    assert code == 2 and out == ""
    assert "pip install 'tuneup[fleet]'" in err and len(err.strip().splitlines()) == 1


def test_query_without_an_index_or_without_duckdb_says_what_to_do(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(fleet_index.FleetIndexError, match="tuneup index"):
        query(tmp_path, "SELECT 1")
    update_index([str(_run_dirs(fleet)[0])], tmp_path / "index", workers=1)
    monkeypatch.setitem(sys.modules, "duckdb", None)
    with pytest.raises(fleet_index.FleetIndexError, match=r"pip install 'tuneup\[fleet\]'"):
        query(tmp_path / "index", "SELECT 1")


def test_the_manifest_tags_reach_the_index_as_a_map(fleet: Path, tmp_path: Path) -> None:
    run = _run_dirs(fleet)[0]
    manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    update_index([str(run)], tmp_path / "index", workers=1)
    (tags,) = query(tmp_path / "index", "SELECT tags['project'] FROM runs").fetchall()
    assert tags == (manifest["tags"]["project"],)
