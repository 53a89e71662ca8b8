"""Fuzzing the reader and the command line: damaged run records load with warnings or fail in one line.

A small but complete run (two ranks, steps, windows, telemetry with GPUs, events, collectives, a priced
manifest) is written once with the real writer; each example copies it and damages it (cuts a file at a
random byte, replaces a line with junk, puts a wrong type, a huge number, NaN or Infinity where a field
was, duplicates or reorders lines, empties a file, puts a directory where a file was, damages the
manifest). Then `load_run` must return a Run or raise RunRecordError naming the path in one line, and
`tuneup report`, `show` and `compare` must exit 0, 1 (compare: regression) or 2 with one line on stderr,
never a traceback; a report written must be strict JSON valid against its schema.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import fields
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from tuneup import RunRecordError, load_run
from tuneup.cli import main
from tuneup.record import RankWriter, RecordingPolicy, Run, write_manifest
from tuneup.report import report_schema

from synthetic import step_record

WORLD_SIZE = 2
STEPS = 12

MANIFEST: dict[str, Any] = {
    "run_id": "fuzz",
    "created_unix": 1000.0,
    "world_size": WORLD_SIZE,
    "num_nodes": 1,
    "trainer": {
        "namespace": "lightning.pytorch",
        "strategy": "DDPStrategy",
        "accelerator": "CUDAAccelerator",
        "precision": "bf16-mixed",
        "accumulate_grad_batches": 2,
        "max_steps": 100,
        "max_epochs": -1,
        "limit_train_batches": 1.0,
    },
    "dataloader": {
        "batch_size": 8,
        "num_workers": 2,
        "pin_memory": True,
        "persistent_workers": False,
        "drop_last": True,
        "sampler": "DistributedSampler",
        "dataset_len": 960,
    },
    "model": {"class": "TinyLM", "parameters": 1000, "trainable_parameters": 1000},
    "environment": {
        "versions": {"tuneup": "0.1.0", "torch": "2.13.0"},
        "host": {"hostname": "node0", "cpu_model": "EPYC", "cpu_count_logical": 8, "ram_total_bytes": 2**34},
        "env": {"NCCL_DEBUG": "INFO"},
        "git": {"commit": "abc", "dirty": False},
        "seeds": {"pl_global_seed": 0},
    },
    "gpus": {
        "driver_version": "550.0",
        "gpus": [
            {"index": i, "name": "NVIDIA H100 80GB HBM3", "pcie_max_gen": 5, "pcie_max_width": 16}
            for i in range(WORLD_SIZE)
        ],
    },
    "communication": {"backend": "nccl", "ranks_per_node": WORLD_SIZE, "nccl_version": "2.21.5"},
    "pricing": {"price_per_hour": 12.0, "price_per": "node", "electricity_usd_per_kwh": 0.2},
    "flops": {"flops_per_sample": None, "count_flops": True},
    "recording": {"window_steps": 4},
    "segment": {"index": 0, "reason": "start", "global_step_at_start": 0, "checkpoint": None},
}

# Every file of the run, in the order a mutation picks from.
STREAMS = (
    "info.json",
    "steps.jsonl",
    "windows.jsonl",
    "telemetry.jsonl",
    "events.jsonl",
    "collectives.jsonl",
)
FILES = ("manifest.json", *(f"rank-{r}/{name}" for r in range(WORLD_SIZE) for name in STREAMS))

# JSON text put where a value was: wrong types, huge and tiny numbers, non-finite literals (which
# Python's json writes and reads, though JSON has none), and numbers no float can hold.
BAD_VALUES = (
    '"fast"',
    '""',
    "[1]",
    "[]",
    "{}",
    '{"n": 1}',
    "null",
    "true",
    "false",
    "0",
    "-1",
    "-0.0",
    "4.5",
    '"1"',
    "1e308",
    "-1e308",
    "1e-308",
    "5e-324",
    "1e999",
    "1" + "0" * 400,
    "-1" + "0" * 400,
    "9" * 5000,  # longer than Python converts to an int (4,300 digits)
    "NaN",
    "Infinity",
    "-Infinity",
    "2147483648",
    "9223372036854775808",
)

# Any JSON value at all, as Python's json writes it (NaN and Infinity included), for the same purpose.
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
).map(json.dumps)
VALUES = st.one_of(st.sampled_from(BAD_VALUES), ANY_JSON)

# Whole lines put where a line was.
BAD_LINES = (
    b"",
    b"{",
    b"{not json",
    b"[1, 2, 3]",
    b"null",
    b"42",
    b'"a string"',
    b"NaN",
    b"\xff\xfe\xfd",
    b'{"step": 1, "kind": "\xff"}',
    b"\x00" * 8,
    b"[" * 100_000,  # deeper than the parser recurses
    b'{"a":' * 50_000,
    b"1" * 5000,
    b'{"step": ' + b"1" * 5000 + b"}",
    b'{"step": 1e999, "wall_ms": NaN}',
)

# The ways a file is damaged; a field's value most often, as it has the most ways to be wrong.
KINDS = (
    "truncate",
    "corrupt_line",
    "mutate_field",
    "mutate_field",
    "mutate_field",
    "mutate_every_line",
    "duplicate_line",
    "swap_lines",
    "delete_line",
    "empty",
    "directory",
    "remove",
)

_RAW = "__fuzz_raw_value__"


# -- the run every example starts from ------------------------------------------------------------------


def write_base_run(path: Path, run_id: str = "fuzz") -> Path:
    """A small, complete run through the real writer: everything the reader and the report read."""
    write_manifest(path, {**MANIFEST, "run_id": run_id})
    for rank in range(WORLD_SIZE):
        w = RankWriter(path, rank, RecordingPolicy(window_steps=4, flush_every_steps=100))
        w.open(
            {
                "host": "node0",
                "pid": 100 + rank,
                "local_rank": rank,
                "node_rank": 0,
                "device": f"cuda:{rank}",
                "device_bus_id": f"00000000:0{rank}:00.0",
                "timing": "cuda_event",
                "start_unix": 999.9,
                "data_timing": "fetch",
            }
        )
        for s in range(STEPS):
            rec = step_record(s, wall_ms=10.0 + rank)
            rec.update(comm_ms=2.0, comm_exposed_ms=0.5, comm_bytes=6144, comm_count=2, grad_norm=1.5)
            rec["peak_mem_bytes"] = 2**30 + s
            rec["checkpoint"] = s == 6
            rec["_collectives"] = [
                {
                    "kind": "all_reduce",
                    "bytes": 2048 * (b + 1),
                    "duration_ms": 0.8 + b,
                    "dtype": "bfloat16",
                    "bucket": b,
                    "world_size": WORLD_SIZE,
                    "start_ms": 5.0 + b,
                    "source": "ddp_hook",
                }
                for b in range(2)
            ]
            w.add_step(rec)
            w.add_telemetry(
                {
                    "t": 1000.0 + 0.05 * s,
                    "process": {"cpu_percent": 90.0, "rss_bytes": 2**30, "num_threads": 9},
                    "system": {
                        "cpu_percent": 50.0,
                        "mem_used_bytes": 2**32,
                        "mem_total_bytes": 2**34,
                        "disk_read_bytes": 1000 * s,
                        "disk_write_bytes": 2000 * s,
                        "net": {"lo": {"sent_bytes": s, "recv_bytes": s}, "eth0": {"sent_bytes": 10 * s}},
                    },
                    "gpus": [
                        {
                            "index": rank,
                            "bus_id": f"00000000:0{rank}:00.0",
                            "util_percent": 80.0 + s,
                            "mem_used_bytes": 2**33,
                            "mem_total_bytes": 80 * 2**30,
                            "power_w": 300.0 + s,
                            "temp_c": 60,
                            "sm_clock_mhz": 1980,
                            "energy_j": 100.0 * s,
                            "throttle": ["gpu_idle", "sw_power_cap"],
                        }
                    ],
                }
            )
        w.add_event("flops", flops=1.0e9, samples=8, tokens=256, step=0)
        w.add_event("checkpoint", step=6, duration_ms=40.0)
        w.add_event(
            "ddp_logging",
            avg_backward_comm_time=2_000_000,
            avg_backward_compute_comm_overlap_time=1_500_000,
            avg_backward_compute_time=4_000_000,
        )
        w.close(status="completed")
    return path


@cache
def _base_root() -> Path:
    return Path(tempfile.mkdtemp(prefix="tuneup-fuzz-base-"))


def base_run(run_id: str = "fuzz") -> Path:
    return _written_base_run(run_id)


@cache
def _written_base_run(run_id: str) -> Path:
    # Written once per test process (cached on the id alone); every example works on its own copy.
    return write_base_run(_base_root() / run_id, run_id)


@pytest.fixture(scope="module", autouse=True)
def _remove_base_runs():
    yield
    if _base_root.cache_info().currsize:
        shutil.rmtree(_base_root(), ignore_errors=True)
        _base_root.cache_clear()
        _written_base_run.cache_clear()


# -- mutations ------------------------------------------------------------------------------------------

# A mutation draws what it needs through `draw(strategy)`, so hypothesis can shrink it.
Draw = Callable[[st.SearchStrategy[Any]], Any]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into a JSON value, the value itself (the empty path) included."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _with_raw(value: Any, path: tuple[Any, ...], raw: str | None) -> str:
    """`value` as JSON text with the value at `path` replaced by the JSON text `raw` (None: deleted)."""
    if not path:
        return raw if raw is not None else ""
    value = json.loads(json.dumps(value))
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    if raw is None:
        del parent[path[-1]]
        return json.dumps(value)
    parent[path[-1]] = _RAW
    return json.dumps(value).replace(json.dumps(_RAW), raw)


def _mutated_json(draw: Draw, obj: Any) -> tuple[bytes, str]:
    """A JSON value with one field replaced by a bad value, deleted, or added; and what was done."""
    path = draw(st.sampled_from(_paths(obj)))
    action = draw(st.sampled_from(("replace", "replace", "delete", "add")))
    where = ".".join(map(str, path)) or "the whole value"
    if action == "delete" and path:
        return _with_raw(obj, path, None).encode(), f"{where} deleted"
    raw = draw(VALUES)
    if action == "add" and isinstance(obj, dict):
        key = draw(st.sampled_from(("step", "extra", "t", "kind", "gpus", "process")))
        return _with_raw({**obj, key: 0}, (key,), raw).encode(), f"{key} = {raw[:40]}"
    return _with_raw(obj, path, raw).encode(), f"{where} = {raw[:40]}"


def _split_lines(data: bytes) -> tuple[list[bytes], bool]:
    lines = data.split(b"\n")
    ends_with_newline = lines[-1] == b""
    if ends_with_newline:
        lines.pop()
    return lines, ends_with_newline


def mutate(draw: Draw, run: Path) -> str:
    """Damage `run` in one way; return what was done, for the failure message."""
    name = draw(st.sampled_from(FILES))
    path = run / name
    kind = draw(st.sampled_from(KINDS))
    if not path.is_file():  # an earlier mutation removed it or made it a directory
        return f"{name}: already gone"
    data = path.read_bytes()
    lines, ends_with_newline = _split_lines(data)
    if name.endswith(".json"):
        # A whole-file JSON document: damage it as one "line".
        lines, ends_with_newline = [data], False
    if kind == "truncate":
        cut = draw(st.integers(0, max(0, len(data) - 1)))
        path.write_bytes(data[:cut])
        return f"{name}: cut at byte {cut} of {len(data)}"
    if kind == "empty":
        path.write_bytes(b"")
        return f"{name}: emptied"
    if kind == "remove":
        path.unlink()
        return f"{name}: removed"
    if kind == "directory":
        path.unlink()
        path.mkdir()
        (path / "x").write_text("x")
        return f"{name}: a directory"
    if not lines:
        return f"{name}: no line to damage"
    i = draw(st.integers(0, len(lines) - 1))
    if kind == "corrupt_line":
        lines[i] = draw(st.one_of(st.sampled_from(BAD_LINES), st.binary(max_size=40)))
        what = f"line {i + 1} replaced by {lines[i][:60]!r}"
    elif kind == "mutate_every_line":
        # One field wrong on every line (every step's wall_ms tiny, every collective's kind unknown).
        try:
            first = json.loads(lines[0])
        except ValueError:
            return f"{name}: line 1 is not JSON"
        field = draw(st.sampled_from([p for p in _paths(first) if p] or [()]))
        raw = draw(VALUES)
        for n, line in enumerate(lines):
            with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):  # a line without it stays
                lines[n] = _with_raw(json.loads(line), field, raw).encode()
        what = f"every line: {'.'.join(map(str, field)) or 'the whole value'} = {raw[:40]}"
    elif kind == "mutate_field":
        try:
            obj = json.loads(lines[i])
        except ValueError:
            return f"{name}: line {i + 1} is not JSON"
        lines[i], change = _mutated_json(draw, obj)
        what = f"line {i + 1}: {change}"
    elif kind == "duplicate_line":
        lines.insert(i, lines[i])
        what = f"line {i + 1} duplicated"
    elif kind == "swap_lines":
        j = draw(st.integers(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
        what = f"lines {i + 1} and {j + 1} swapped"
    else:
        del lines[i]
        what = f"line {i + 1} deleted"
    path.write_bytes(b"\n".join(lines) + (b"\n" if ends_with_newline and lines else b""))
    return f"{name}: {what}"


def damaged_copy(draw: Draw, root: Path, mutations: int, run_id: str = "fuzz") -> tuple[Path, list[str]]:
    run = root / "run"
    shutil.copytree(base_run(run_id), run)
    done = [mutate(draw, run) for _ in range(mutations)]
    return run, done


# -- what must hold ---------------------------------------------------------------------------------


def _no_non_finite(value: Any, where: str) -> None:
    if isinstance(value, float):
        assert math.isfinite(value), f"{where} is {value}"
    elif isinstance(value, dict):
        for k, v in value.items():
            _no_non_finite(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _no_non_finite(v, f"{where}[{i}]")


def check_load(path: Path) -> Run | None:
    """load_run returns a Run whose numbers are all finite, or raises RunRecordError in one line."""
    try:
        run = load_run(path)
    except RunRecordError as exc:
        message = str(exc)
        assert "\n" not in message and str(path) in message, message
        return None
    assert isinstance(run, Run)
    assert all(isinstance(w, str) and "\n" not in w for w in run.warnings), run.warnings
    for rank, rec in run.ranks.items():
        for kind in ("steps", "windows", "collectives"):
            for i, record in enumerate(getattr(rec, kind)):
                for f in fields(record):
                    _no_non_finite(getattr(record, f.name), f"rank {rank} {kind}[{i}].{f.name}")
        _no_non_finite(rec.telemetry, f"rank {rank} telemetry")
        _no_non_finite(rec.events, f"rank {rank} events")
        _no_non_finite(rec.info.raw, f"rank {rank} info")
    _no_non_finite(run.manifest.raw, "manifest")
    return run


def _strict_json(text: str) -> Any:
    def refuse(literal: str) -> Any:
        raise AssertionError(f"report.json holds {literal}, which is not JSON")

    return json.loads(text, parse_constant=refuse)


@cache
def _report_validator() -> jsonschema.protocols.Validator:
    schema = report_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def run_cli(
    capsys: pytest.CaptureFixture[str], argv: Sequence[str], codes: Sequence[int]
) -> tuple[int, str, str]:
    """`tuneup ARGV` in this process: an allowed exit code, no traceback, one line on stderr for 2."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code in codes, f"tuneup {' '.join(argv)} exited {code}: {err}"
    assert "Traceback" not in err and "internal error" not in err, err
    if code == 2:
        assert err.count("\n") == 1 and err.endswith("\n"), err
    return code, out, err


def check_report(capsys: pytest.CaptureFixture[str], run: Path, out: Path, loaded: bool) -> None:
    code, _, _ = run_cli(capsys, ["report", str(run), "-o", str(out), "--format", "json"], (0, 2))
    report_json = out / "report.json"
    if code != 0:
        assert not loaded, "a run that loads must make a report"
        assert not report_json.exists(), "a failed report left a report.json"
        return
    assert loaded, "a run that does not load made a report"
    document = _strict_json(report_json.read_text(encoding="utf-8"))
    _report_validator().validate(document)


def check_show(capsys: pytest.CaptureFixture[str], run: Path, loaded: bool) -> None:
    code, out, _ = run_cli(capsys, ["show", str(run)], (0, 2))
    assert (code == 0) == loaded
    if code == 0:
        assert out.startswith("tuneup run ")


FUZZ = settings(
    max_examples=300,
    deadline=5000,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# -- properties -------------------------------------------------------------------------------------


@FUZZ
@given(data=st.data(), mutations=st.integers(1, 3))
def test_damaged_run_loads_with_warnings_or_fails_in_one_line(
    data: st.DataObject, mutations: int, capsys: pytest.CaptureFixture[str]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run, done = damaged_copy(data.draw, Path(tmp), mutations)
        note(str(done))
        loaded = check_load(run) is not None
        check_report(capsys, run, Path(tmp) / "out", loaded)
        check_show(capsys, run, loaded)


def _loaded(path: Path) -> tuple[Any, ...]:
    try:
        run = load_run(path)
    except RunRecordError as exc:
        return ("error", str(exc))
    return (
        run.warnings,
        run.missing_ranks,
        {
            r: (rec.info, rec.steps, rec.windows, rec.telemetry, rec.events, rec.collectives)
            for r, rec in run.ranks.items()
        },
    )


@settings(FUZZ, max_examples=150)
@given(data=st.data(), mutations=st.integers(1, 3))
def test_the_fast_parser_reads_what_the_standard_one_reads(
    data: st.DataObject, mutations: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """orjson (tuneup[fast]) and json's scanner read every damaged record alike: the same records, the
    same warnings."""
    from tuneup.record import reader

    if reader._FAST_LOADS is None:
        pytest.skip("orjson is not installed: only the standard parser is in use")
    with tempfile.TemporaryDirectory() as tmp:
        run, done = damaged_copy(data.draw, Path(tmp), mutations)
        note(str(done))
        fast = _loaded(run)
        with monkeypatch.context() as m:
            m.setattr(reader, "_FAST_LOADS", None)
            standard = _loaded(run)
    assert fast == standard


@settings(FUZZ, max_examples=100)
@given(data=st.data())
def test_compare_with_a_damaged_run_exits_0_1_or_2(
    data: st.DataObject, capsys: pytest.CaptureFixture[str]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        # Another run of the same workload (compare refuses a run compared with itself), then damaged.
        run, done = damaged_copy(data.draw, Path(tmp), 1, run_id="fuzz-candidate")
        note(str(done))
        result = Path(tmp) / "compare.json"
        code, _, _ = run_cli(capsys, ["compare", str(base_run()), str(run), "--json", str(result)], (0, 1, 2))
        if code != 2:
            _strict_json(result.read_text(encoding="utf-8"))
        run_cli(capsys, ["compare", str(run), str(base_run())], (0, 1, 2))


def test_the_undamaged_run_reports_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = check_load(base_run())
    assert run is not None and run.warnings == []
    assert all(len(rec.steps) == STEPS and rec.collectives and rec.windows for rec in run.ranks.values())
    check_report(capsys, base_run(), tmp_path / "out", loaded=True)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["communication"] and report["telemetry"]["gpus"] and report["cost"]["priced"]
    _, out, _ = run_cli(capsys, ["compare", str(base_run()), str(base_run("fuzz-candidate"))], (0,))
    assert "throughput" in out


# -- regression tests: the smallest damage that once broke the reader or the report -----------------------


def _copy(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(base_run(), run)
    return run


def _set_field(run: Path, name: str, field: str, raw: str, line: int | None = None) -> None:
    """Put the JSON text `raw` at the dotted `field` of line `line` of `name` (every line if None)."""
    path = run / name
    lines = path.read_bytes().splitlines() if name.endswith(".jsonl") else [path.read_bytes()]
    keys = tuple(int(k) if k.isdigit() else k for k in field.split("."))
    for i in range(len(lines)) if line is None else [line - 1]:
        lines[i] = _with_raw(json.loads(lines[i]), keys, raw).encode()
    path.write_bytes(b"\n".join(lines) + b"\n")


def _replace_line(run: Path, name: str, line: int, data: bytes) -> None:
    path = run / name
    lines = path.read_bytes().splitlines()
    lines[line - 1] = data
    path.write_bytes(b"\n".join(lines) + b"\n")


def _reported(capsys: pytest.CaptureFixture[str], run: Path) -> tuple[Run, dict[str, Any]]:
    """The damaged run loads, and its report is written, strict JSON valid against the schema."""
    loaded = check_load(run)
    assert loaded is not None
    check_report(capsys, run, run.parent / "out", loaded=True)
    check_show(capsys, run, loaded=True)
    return loaded, json.loads((run.parent / "out" / "report.json").read_text())


def _warned(run: Run, *parts: str) -> bool:
    return any(all(p in w for p in parts) for w in run.warnings)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("rank-0/steps.jsonl", b'{"step": ' + b"1" * 5000 + b"}"),  # ValueError: past int's 4,300 digits
        ("rank-0/telemetry.jsonl", b"[" * 100_000),  # RecursionError
        ("rank-0/events.jsonl", b'{"a":' * 50_000),  # RecursionError
        ("rank-1/windows.jsonl", b"1" * 5000),
    ],
)
def test_a_line_the_json_parser_raises_on_is_a_damaged_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, data: bytes
) -> None:
    run = _copy(tmp_path)
    _replace_line(run, name, 3, data)
    loaded, _ = _reported(capsys, run)
    assert _warned(loaded, name, "1 damaged line(s) skipped (line 3)")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"schema_version": 1, "world_size": 2, "run_id": "\xff"}', "not UTF-8 text"),  # UnicodeDecodeError
        (b"[" * 100_000, "nested too deeply"),  # RecursionError
        (b'{"schema_version": 1, "world_size": ' + b"9" * 5000 + b"}", "not valid JSON"),  # ValueError
        (b"null", "must hold a JSON object, found null"),
    ],
)
def test_a_manifest_the_json_parser_raises_on_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, message: str
) -> None:
    run = _copy(tmp_path)
    (run / "manifest.json").write_bytes(data)
    with pytest.raises(RunRecordError, match=message):
        load_run(run)
    assert check_load(run) is None  # one line, naming the file
    check_report(capsys, run, tmp_path / "out", loaded=False)


def test_an_info_json_that_is_not_utf8_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(tmp_path)
    (run / "rank-1" / "info.json").write_bytes(b'{"rank": 1, "host": "\xff"}')  # was: UnicodeDecodeError
    loaded, _ = _reported(capsys, run)
    assert _warned(loaded, "rank 1:", "info.json is not UTF-8 text")


def test_a_manifest_that_is_a_directory_says_it_cannot_be_read(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    (run / "manifest.json").unlink()
    (run / "manifest.json").mkdir()
    with pytest.raises(RunRecordError, match=r"cannot read .*manifest\.json"):
        load_run(run)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_nan_and_infinity_are_read_as_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], literal: str
) -> None:
    # Python's json reads these (and writes the first three); a report that took them in could not be written.
    run = _copy(tmp_path)
    _set_field(run, "rank-0/steps.jsonl", "loss", literal, line=4)  # optional: read as None
    _set_field(run, "rank-0/steps.jsonl", "wall_ms", literal, line=5)  # required: the line is skipped
    _set_field(run, "rank-1/telemetry.jsonl", "gpus.0.power_w", literal)
    _set_field(run, "rank-1/collectives.jsonl", "duration_ms", literal, line=2)
    _set_field(run, "rank-0/info.json", "start_unix", literal)
    _set_field(run, "manifest.json", "created_unix", literal)
    loaded, report = _reported(capsys, run)
    steps = {s.step: s for s in loaded.steps(0)}
    assert steps[3].loss is None and 4 not in steps and len(steps) == STEPS - 1
    assert _warned(loaded, "rank-0/steps.jsonl: 2 line(s) with values that were NaN, Infinity", "(line 4, 5)")
    assert _warned(
        loaded, "rank-0/steps.jsonl: 1 step line(s) with missing or mistyped fields skipped (line 5)"
    )
    assert _warned(loaded, "rank-1/telemetry.jsonl", f"{STEPS} line(s)")
    assert _warned(loaded, "manifest.json: 1 value(s) that were NaN, Infinity")
    assert loaded.ranks[0].info.start_unix is None and loaded.manifest.created_unix == 0.0
    assert report["telemetry"]["gpus"][1]["power_w_mean"] is None


@pytest.mark.parametrize("literal", ["1e308", "-1e308", "1" + "0" * 400, "18446744073709551617", "1e19"])
def test_numbers_beyond_64_bits_are_read_as_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], literal: str
) -> None:
    # Were: OverflowError from float(10**400) in the reader; inf sums and fsum's OverflowError in the report.
    run = _copy(tmp_path)
    _set_field(run, "rank-0/steps.jsonl", "wall_ms", literal)
    _set_field(run, "rank-1/steps.jsonl", "peak_mem_bytes", literal, line=2)
    _set_field(run, "rank-1/collectives.jsonl", "world_size", literal, line=1)
    _set_field(run, "rank-1/telemetry.jsonl", "system.disk_read_bytes", literal)
    loaded, _ = _reported(capsys, run)
    assert loaded.steps(0) == [] and loaded.steps(1)[1].peak_mem_bytes is None
    assert _warned(loaded, "rank-0/steps.jsonl", f"{STEPS} step line(s) with missing or mistyped fields")
    assert _warned(loaded, "rank-1/collectives.jsonl: 1 line(s) with values that were", "(line 1)")


def test_the_largest_number_in_range_still_makes_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(tmp_path)
    _set_field(run, "rank-0/steps.jsonl", "wall_ms", str(2**63))
    _set_field(run, "rank-0/steps.jsonl", "samples", str(2**63))
    loaded, _ = _reported(capsys, run)
    assert [s.wall_ms for s in loaded.steps(0)] == [2.0**63] * STEPS


def test_a_step_too_short_to_divide_by_has_no_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Was: 8 samples / 1e-308 ms = inf samples/s in the report's time series, and no report.
    run = _copy(tmp_path)
    _set_field(run, "rank-1/steps.jsonl", "wall_ms", "1e-308", line=11)
    _set_field(run, "rank-0/collectives.jsonl", "duration_ms", "5e-324")
    _, report = _reported(capsys, run)
    assert 10 not in report["timeseries"]["throughput"]["step"]


def test_telemetry_gpus_that_is_not_a_list_is_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(tmp_path)
    _set_field(run, "rank-1/telemetry.jsonl", "gpus", "1.5", line=1)  # was: TypeError, not iterable
    _reported(capsys, run)


def test_window_statistics_that_are_not_numbers_are_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(tmp_path)
    _set_field(run, "rank-0/info.json", "steps_seen", "1000")  # a sampled run: its time series is windows'
    _set_field(run, "rank-0/windows.jsonl", "stats.wall_ms.mean", '"fast"', line=1)  # was: TypeError
    loaded, report = _reported(capsys, run)
    assert "mean" not in loaded.ranks[0].windows[0].stats["wall_ms"]
    assert report["timeseries"]["source"] == "windows"


@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("environment.host", "-1"),  # was: AttributeError in the analysis
        ("environment.versions", "-1"),  # TypeError in Manifest.versions
        ("environment.env.NCCL_DEBUG", "[1]"),  # a report its schema refuses
        ("gpus.gpus", "4.5"),  # TypeError, not iterable
        ("gpus.gpus.0.name", "1"),  # AttributeError in the GPU catalog's match
        ("flops", '"fast"'),  # AttributeError in the cost section
        ("trainer.accumulate_grad_batches", "[1]"),  # TypeError in the cost section
        ("dataloader.batch_size", "4.5"),  # a report its schema refuses
        ("model.class", "0"),  # a report its schema refuses
        ("segment.index", '"x"'),  # ValueError in the interruptions section
    ],
)
def test_manifest_fields_of_the_wrong_type_are_read_as_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, raw: str
) -> None:
    run = _copy(tmp_path)
    _set_field(run, "manifest.json", field, raw)
    loaded, _ = _reported(capsys, run)
    shown = re.sub(r"\.(\d+)", r"[\1]", field)  # gpus.gpus[0].name
    assert _warned(loaded, "manifest.json: 1 field(s) of the wrong type read as missing", f"({shown})")


def test_a_null_segment_index_is_segment_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy(tmp_path)
    _set_field(run, "manifest.json", "segment.index", "NaN")  # null after reading; was: int(None)
    _reported(capsys, run)


def test_info_status_of_the_wrong_type_is_read_as_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(tmp_path)
    _set_field(run, "rank-0/info.json", "status", "0")  # was: a report its schema refuses
    _set_field(run, "rank-1/info.json", "status", "null")
    loaded, report = _reported(capsys, run)
    assert report["run"]["status"] == {"0": "closed", "1": "closed"}
    assert _warned(loaded, "rank-0/info.json: 1 field(s) of the wrong type read as missing (status)")


@pytest.mark.parametrize(("field", "raw"), [("kind", '"fast"'), ("world_size", "0"), ("world_size", "-1")])
def test_collectives_of_unknown_kind_or_no_ranks_are_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, raw: str
) -> None:
    # Was: ValueError from the collective table's bus factor, and no report.
    run = _copy(tmp_path)
    _set_field(run, "rank-0/collectives.jsonl", field, raw, line=3)
    loaded, _ = _reported(capsys, run)
    assert _warned(loaded, "rank-0/collectives.jsonl: 1 collective line(s)", "(line 3)")


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("rank-1/steps.jsonl", "tokens"),
        ("rank-1/steps.jsonl", "wall_ms"),
        ("rank-0/collectives.jsonl", "bytes"),
        ("rank-0/windows.jsonl", "samples"),
    ],
)
def test_negative_durations_and_counts_are_damaged_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, field: str
) -> None:
    # Was: negative tokens/s, which the report's schema refuses.
    run = _copy(tmp_path)
    _set_field(run, name, field, "-1")
    loaded, _ = _reported(capsys, run)
    assert _warned(loaded, name, "line(s) with missing or mistyped fields skipped")


def test_negative_duplicate_and_unordered_steps_still_make_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(tmp_path)
    _set_field(run, "rank-0/steps.jsonl", "step", "-5", line=2)
    path = run / "rank-0" / "steps.jsonl"
    lines = path.read_bytes().splitlines()
    path.write_bytes(b"\n".join([lines[5], *lines, lines[5]]) + b"\n")
    loaded, _ = _reported(capsys, run)
    assert [s.step for s in loaded.steps(0)][:3] == [5, 0, -5]


@pytest.mark.parametrize("world_size", [2**20 + 1, 2**40, 10**18])
def test_a_world_size_no_job_has_fails_at_once(tmp_path: Path, world_size: int) -> None:
    # Was: a hang, looking for 10**18 rank directories one by one.
    run = _copy(tmp_path)
    _set_field(run, "manifest.json", "world_size", str(world_size))
    with pytest.raises(RunRecordError, match=r"'world_size' must be from 1 to 1,048,576"):
        load_run(run)


def test_a_large_world_size_with_few_ranks_present_loads(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    _set_field(run, "manifest.json", "world_size", "65536")
    _set_field(run, "manifest.json", "num_nodes", "8192")
    loaded = load_run(run)
    assert sorted(loaded.ranks) == [0, 1] and len(loaded.missing_ranks) == 65534


@pytest.mark.parametrize("num_nodes", ["0", "-1"])
def test_num_nodes_out_of_range_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], num_nodes: str
) -> None:
    # Was: a report with num_nodes 0, which its schema refuses.
    run = _copy(tmp_path)
    _set_field(run, "manifest.json", "num_nodes", num_nodes)
    with pytest.raises(RunRecordError, match=r"'num_nodes' must be at least 1"):
        load_run(run)
    check_report(capsys, run, tmp_path / "out", loaded=False)
