"""Reading a run directory back: `load_run(path) -> Run`.

The reader is forgiving about what a killed or interrupted run leaves behind (a partial last line, a
rank that never wrote, a rank that never closed) and strict about what it cannot interpret (no manifest,
a manifest it cannot parse, a schema newer than this tuneup). Forgiveness is never silent: every
tolerated defect becomes a line in `Run.warnings`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tuneup.record.schema import (
    COLLECTIVES_FILE,
    EVENTS_FILE,
    INFO_FILE,
    MANIFEST_FILE,
    RANK_DIR_PREFIX,
    SCHEMA_VERSION,
    STEPS_FILE,
    TELEMETRY_FILE,
    WINDOWS_FILE,
    CollectiveRecord,
    Manifest,
    RankInfo,
    RankRecord,
    Run,
    StepRecord,
    WindowAggregate,
    rank_dir_name,
)

T = TypeVar("T")


class RunRecordError(Exception):
    """A run directory that cannot be read. The message names the file and what to do."""


def _load_json_object(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RunRecordError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunRecordError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "the file is damaged — restore it or record the run again"
        ) from None
    if not isinstance(obj, dict):
        raise RunRecordError(f"{path} must hold a JSON object, found {type(obj).__name__}")
    return obj


def _int_field(obj: dict[str, Any], key: str, path: Path, default: int | None = None) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RunRecordError(f"{path}: field {key!r} must be an integer, found {value!r}")
    return value


def _parse_manifest(path: Path) -> Manifest:
    raw = _load_json_object(path)
    version = raw.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise RunRecordError(f"{path}: 'schema_version' must be an integer, found {version!r}")
    if version > SCHEMA_VERSION:
        raise RunRecordError(
            f"{path} has schema version {version}, newer than the {SCHEMA_VERSION} this tuneup reads; "
            "upgrade tuneup (pip install -U tuneup) to read this run"
        )
    if version < 1:
        raise RunRecordError(f"{path}: unknown schema version {version}")
    world_size = _int_field(raw, "world_size", path)
    if world_size < 1:
        raise RunRecordError(f"{path}: 'world_size' must be at least 1, found {world_size}")

    def section(key: str) -> dict[str, Any]:
        value = raw.get(key)
        return value if isinstance(value, dict) else {}

    created = raw.get("created_unix")
    return Manifest(
        schema_version=version,
        run_id=str(raw.get("run_id") or path.parent.name),
        created_unix=float(created) if isinstance(created, (int, float)) else 0.0,
        world_size=world_size,
        num_nodes=_int_field(raw, "num_nodes", path, default=1),
        trainer=section("trainer"),
        dataloader=section("dataloader"),
        model=section("model"),
        environment=section("environment"),
        gpus=raw.get("gpus") if isinstance(raw.get("gpus"), dict) else None,
        recording=section("recording"),
        raw=raw,
    )


def _jsonl(path: Path, warnings: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for every readable line; note damaged lines in `warnings`."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    except OSError as exc:
        warnings.append(f"cannot read {path}: {exc.strerror or exc}")
        return
    lines = data.split(b"\n")
    # A file that does not end in a newline was cut mid-write (a kill during a flush): its last piece is
    # either a partial line or empty; both are dropped, and a partial one is reported.
    last = lines.pop()
    if last.strip():
        warnings.append(
            f"{path}: last line is incomplete (the process stopped while writing); it was skipped"
        )
    bad: list[int] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            bad.append(number)
            continue
        if not isinstance(obj, dict):
            bad.append(number)
            continue
        yield number, obj
    if bad:
        shown = ", ".join(str(n) for n in bad[:5]) + (" ..." if len(bad) > 5 else "")
        warnings.append(f"{path}: {len(bad)} damaged line(s) skipped (line {shown})")


def _typed(path: Path, warnings: list[str], build: Callable[[dict[str, Any]], T], what: str) -> list[T]:
    out: list[T] = []
    bad: list[int] = []
    for number, obj in _jsonl(path, warnings):
        try:
            out.append(build(obj))
        except (KeyError, TypeError, ValueError):
            bad.append(number)
    if bad:
        shown = ", ".join(str(n) for n in bad[:5]) + (" ..." if len(bad) > 5 else "")
        warnings.append(
            f"{path}: {len(bad)} {what} line(s) with missing or mistyped fields skipped (line {shown})"
        )
    return out


def _num(obj: dict[str, Any], key: str) -> float:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(key)
    return float(value)


def _opt_num(obj: dict[str, Any], key: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(key)
    return float(value)


def _opt_int(obj: dict[str, Any], key: str) -> int | None:
    value = _opt_num(obj, key)
    return None if value is None else int(value)


def _step(obj: dict[str, Any]) -> StepRecord:
    step = obj["step"]
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError("step")
    return StepRecord(
        step=step,
        epoch=int(_num(obj, "epoch")) if obj.get("epoch") is not None else 0,
        t_end=_num(obj, "t_end"),
        wall_ms=_num(obj, "wall_ms"),
        data_ms=_num(obj, "data_ms"),
        forward_ms=_num(obj, "forward_ms"),
        backward_ms=_num(obj, "backward_ms"),
        optimizer_ms=_num(obj, "optimizer_ms"),
        other_ms=_num(obj, "other_ms"),
        micro_batches=int(_num(obj, "micro_batches")),
        samples=_opt_int(obj, "samples"),
        tokens=_opt_int(obj, "tokens"),
        loss=_opt_num(obj, "loss"),
        grad_norm=_opt_num(obj, "grad_norm"),
        peak_mem_bytes=_opt_int(obj, "peak_mem_bytes"),
        checkpoint=bool(obj.get("checkpoint", False)),
        comm_ms=_opt_num(obj, "comm_ms"),
        comm_exposed_ms=_opt_num(obj, "comm_exposed_ms"),
        comm_bytes=_opt_int(obj, "comm_bytes"),
        comm_count=_opt_int(obj, "comm_count"),
    )


def _opt_str(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(key)
    return value


def _collective(obj: dict[str, Any]) -> CollectiveRecord:
    kind = obj["kind"]
    if not isinstance(kind, str):
        raise TypeError("kind")
    return CollectiveRecord(
        step=int(_num(obj, "step")),
        kind=kind,
        bytes=int(_num(obj, "bytes")),
        duration_ms=_num(obj, "duration_ms"),
        dtype=_opt_str(obj, "dtype"),
        bucket=_opt_int(obj, "bucket"),
        world_size=_opt_int(obj, "world_size"),
        start_ms=_opt_num(obj, "start_ms"),
        source=_opt_str(obj, "source"),
    )


def _window(obj: dict[str, Any]) -> WindowAggregate:
    stats = obj["stats"]
    if not isinstance(stats, dict):
        raise TypeError("stats")
    return WindowAggregate(
        first_step=int(_num(obj, "first_step")),
        last_step=int(_num(obj, "last_step")),
        count=int(_num(obj, "count")),
        t_start=_num(obj, "t_start"),
        t_end=_num(obj, "t_end"),
        samples=_opt_int(obj, "samples"),
        tokens=_opt_int(obj, "tokens"),
        micro_batches=int(_num(obj, "micro_batches")),
        stats={k: v for k, v in stats.items() if isinstance(v, dict)},
    )


def _rank_info(rank: int, path: Path, warnings: list[str]) -> RankInfo:
    try:
        raw = _load_json_object(path)
    except RunRecordError as exc:
        warnings.append(f"rank {rank}: {exc}")
        return RankInfo(rank=rank)

    def opt(key: str, kind: type) -> Any:
        value = raw.get(key)
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

    dropped = raw.get("dropped")
    return RankInfo(
        rank=rank,
        host=opt("host", str),
        pid=opt("pid", int),
        local_rank=opt("local_rank", int),
        node_rank=opt("node_rank", int),
        device=opt("device", str),
        device_bus_id=opt("device_bus_id", str),
        timing=opt("timing", str),
        start_unix=opt("start_unix", (int, float)),
        end_unix=opt("end_unix", (int, float)),
        closed=raw.get("closed") is True,
        last_step=opt("last_step", int),
        steps_seen=opt("steps_seen", int),
        dropped=dropped if isinstance(dropped, dict) else {},
        raw=raw,
    )


def _load_rank(run_dir: Path, rank: int, warnings: list[str]) -> RankRecord:
    rank_dir = run_dir / rank_dir_name(rank)
    info = _rank_info(rank, rank_dir / INFO_FILE, warnings)
    steps = _typed(rank_dir / STEPS_FILE, warnings, _step, "step")
    windows = _typed(rank_dir / WINDOWS_FILE, warnings, _window, "window")
    telemetry = [obj for _, obj in _jsonl(rank_dir / TELEMETRY_FILE, warnings)]
    events = [obj for _, obj in _jsonl(rank_dir / EVENTS_FILE, warnings)]
    collectives = _typed(rank_dir / COLLECTIVES_FILE, warnings, _collective, "collective")
    if not info.closed:
        last = steps[-1].step if steps else None
        where = f"at step {last}" if last is not None else "before its first recorded step"
        warnings.append(f"rank {rank} stopped {where} without closing (killed or still running)")
    for what, count in sorted(info.dropped.items()):
        warnings.append(f"rank {rank}: {count} {what} record(s) could not be written and are missing")
    return RankRecord(
        info=info, steps=steps, windows=windows, telemetry=telemetry, events=events, collectives=collectives
    )


def _not_a_run(path: Path) -> RunRecordError:
    runs = sorted(p.name for p in path.iterdir() if (p / MANIFEST_FILE).is_file()) if path.is_dir() else []
    if runs:
        shown = ", ".join(runs[:5]) + (" ..." if len(runs) > 5 else "")
        return RunRecordError(f"{path} is not a run but holds {len(runs)} run(s): {shown}; pass one of them")
    if path.is_dir() and not any(path.iterdir()):
        return RunRecordError(f"{path} is empty; pass the run directory TuneupCallback wrote (its .run_dir)")
    return RunRecordError(
        f"{path} is not a tuneup run (no {MANIFEST_FILE}); "
        "pass the run directory TuneupCallback wrote (its .run_dir)"
    )


def load_run(path: str | os.PathLike[str]) -> Run:
    """Load the run directory at `path`.

    Raises `RunRecordError` (with a one-line message naming the file and the fix) when `path` is not a
    readable run of a schema this tuneup understands. Missing ranks, unclosed ranks and damaged lines do
    not raise: they are listed in `Run.missing_ranks` and `Run.warnings`.
    """
    run_dir = Path(path)
    if not run_dir.exists():
        raise RunRecordError(
            f"{run_dir} does not exist; pass the run directory TuneupCallback wrote (its .run_dir)"
        )
    if not run_dir.is_dir():
        raise RunRecordError(f"{run_dir} is a file, not a run directory")
    manifest_path = run_dir / MANIFEST_FILE
    if not manifest_path.is_file():
        raise _not_a_run(run_dir)
    manifest = _parse_manifest(manifest_path)

    warnings: list[str] = []
    ranks: dict[int, RankRecord] = {}
    missing: list[int] = []
    for rank in range(manifest.world_size):
        if not (run_dir / rank_dir_name(rank)).is_dir():
            missing.append(rank)
            continue
        ranks[rank] = _load_rank(run_dir, rank, warnings)
    if missing:
        shown = ", ".join(str(r) for r in missing[:10]) + (" ..." if len(missing) > 10 else "")
        warnings.insert(
            0,
            f"{len(missing)} of {manifest.world_size} rank(s) left no record (rank {shown}); "
            "figures cover the ranks present only",
        )
    extra = sorted(
        int(p.name[len(RANK_DIR_PREFIX) :])
        for p in run_dir.glob(f"{RANK_DIR_PREFIX}*")
        if p.name[len(RANK_DIR_PREFIX) :].isdigit()
        and int(p.name[len(RANK_DIR_PREFIX) :]) >= manifest.world_size
    )
    if extra:
        warnings.append(f"rank directories beyond world size {manifest.world_size} ignored: {extra}")
    return Run(path=run_dir, manifest=manifest, ranks=ranks, missing_ranks=missing, warnings=warnings)
