"""The CI history: one record per CI result (a commit, when, its headline metrics), kept in a file or a bucket.

`tuneup compare/bench --history LOCATION` appends a record after each CI result; `tuneup regressions
LOCATION` reads them all back, in time order, and looks for change points.

Two layouts, one per kind of location:

- a local path is a JSON Lines file, one record a line, appended with one `write` on a file opened for
  appending (O_APPEND): concurrent CI jobs on one machine add whole lines, never interleaved ones, since a
  line is far below the size the kernel writes in one piece for an appended regular file;
- an fsspec URL (`s3://bucket/ci/history`, `gs://...`, `memory://...`) is a prefix under which every record
  is one small JSON object, named `<timestamp_ns>-<commit>-<random>.json`. Object stores cannot append, and a
  read-modify-write of one shared object would lose a record whenever two CI jobs finish together (the last
  put wins); one object per record has no such race and needs no lock. Reading lists the prefix (one LIST
  and one GET per record: a 2,000-record history is 2,000 small GETs, issued together by fsspec's `cat`).

A damaged line or object (a truncated write, a hand edit) is skipped with a warning naming it and why: one
bad record must not hide the rest of the history. The order is the records' timestamps (a stable sort, so
records with one timestamp keep the order they were written in).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneup.record.remote import filesystem, is_url, join_url

SCHEMA_VERSION = 1
OBJECT_SUFFIX = ".json"
_COMMIT_IN_NAME = 12  # characters of the commit in an object's name: enough to read, the record has it all


class HistoryError(ValueError):
    """A history that cannot be read at all (missing, unreadable, a directory where a file belongs)."""


class HistoryWarning(UserWarning):
    """A record that was skipped: the warning names the line or object and what is wrong with it."""


@dataclass(frozen=True)
class HistoryRecord:
    """One CI result. metrics: name -> value, e.g. "samples_per_s", "step_time_ms", "peak_memory_bytes",
    "usd_per_million_samples", "exposed_comm_ms" (the unit is in the name). verdict: the gate's word for it
    ("regression", "no_change", ...), where one was given."""

    commit: str
    timestamp_unix: float
    metrics: dict[str, float] = field(default_factory=dict)
    branch: str | None = None
    run_url: str | None = None
    verdict: str | None = None

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "commit": self.commit,
            "timestamp_unix": self.timestamp_unix,
            "metrics": dict(self.metrics),
        }
        for name in ("branch", "run_url", "verdict"):
            if getattr(self, name) is not None:
                document[name] = getattr(self, name)
        return document


def record_from_json(document: Any) -> HistoryRecord:
    """The record in a parsed JSON document; ValueError saying what is wrong with it."""
    if not isinstance(document, dict):
        raise ValueError(f"a record is a JSON object, got {type(document).__name__}")
    schema = document.get("schema", SCHEMA_VERSION)
    if schema != SCHEMA_VERSION:
        raise ValueError(f"schema {schema!r}, this tuneup reads schema {SCHEMA_VERSION} (upgrade tuneup)")
    commit = document.get("commit")
    if not isinstance(commit, str) or not commit:
        raise ValueError("no commit (a non-empty string)")
    timestamp = document.get("timestamp_unix")
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)) or not math.isfinite(timestamp):
        raise ValueError("no timestamp_unix (seconds since 1970, a number)")
    raw_metrics = document.get("metrics")
    if not isinstance(raw_metrics, dict):
        raise ValueError("no metrics (an object of name: number)")
    metrics: dict[str, float] = {}
    for name, value in raw_metrics.items():
        # A metric a job could not measure is null; it is left out of that metric's series, not a zero.
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        metrics[str(name)] = float(value)
    optional = {}
    for name in ("branch", "run_url", "verdict"):
        value = document.get(name)
        optional[name] = value if isinstance(value, str) else None
    return HistoryRecord(commit, float(timestamp), metrics, **optional)


def _checked(record: HistoryRecord) -> str:
    """The record as one JSON line; ValueError for one that `read` would skip."""
    text = json.dumps(record.to_json(), separators=(",", ":"), allow_nan=False)
    record_from_json(json.loads(text))
    return text


def append(location: str | os.PathLike[str], record: HistoryRecord) -> None:
    """Add `record` to the history at `location` (a JSON Lines file, or one object under a URL prefix)."""
    try:
        text = _checked(record)
    except ValueError as exc:
        raise HistoryError(
            f"cannot add a record for commit {record.commit!r} to the history: {exc}"
        ) from None
    if is_url(location):
        fs, root = filesystem(os.fspath(location))
        commit = "".join(c for c in record.commit[:_COMMIT_IN_NAME] if c.isalnum()) or "commit"
        # The time first: a listing sorts as the records were written. The random tail keeps two jobs that
        # finish in the same nanosecond on the same commit (a rerun) from replacing each other's record.
        name = f"{round(record.timestamp_unix * 1e9):020d}-{commit}-{secrets.token_hex(4)}{OBJECT_SUFFIX}"
        fs.pipe_file(join_url(root, name), (text + "\n").encode("utf-8"))
        return
    path = Path(location)
    if path.is_dir():
        raise HistoryError(f"{path} is a directory; a local history is a file, e.g. {path / 'history.jsonl'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    # One write of a whole line on an O_APPEND descriptor: concurrent appenders cannot interleave within it.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (text + "\n").encode("utf-8"))
    finally:
        os.close(fd)


def _parse(text: str, where: str) -> HistoryRecord | None:
    try:
        return record_from_json(json.loads(text))
    except ValueError as exc:  # json's errors are ValueErrors too
        warnings.warn(f"{where}: skipped a damaged history record: {exc}", HistoryWarning, stacklevel=3)
        return None


def read(location: str | os.PathLike[str]) -> list[HistoryRecord]:
    """Every readable record at `location`, oldest first. HistoryError when there is no history there."""
    records: list[HistoryRecord] = []
    if is_url(location):
        url = os.fspath(location)
        fs, root = filesystem(url)
        try:
            names = sorted(p for p in fs.find(root) if p.endswith(OBJECT_SUFFIX))
        except OSError as exc:
            raise HistoryError(f"cannot list the history at {url}: {exc}") from None
        if not names:
            raise HistoryError(f"no history at {url}: no {OBJECT_SUFFIX} records under it")
        contents = fs.cat(names, on_error="return")
        for name in names:
            data = contents.get(name)
            where = f"{url.rstrip('/')}/{name[len(root.rstrip('/')) + 1 :]}"
            if isinstance(data, BaseException):
                warnings.warn(
                    f"{where}: skipped an unreadable history record: {data}", HistoryWarning, stacklevel=2
                )
                continue
            record = _parse(data.decode("utf-8", errors="replace"), where)
            if record is not None:
                records.append(record)
    else:
        path = Path(location)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            raise HistoryError(f"no history at {path}: the file does not exist") from None
        except OSError as exc:
            raise HistoryError(f"cannot read the history {path}: {exc}") from None
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                record = _parse(line, f"{path}:{number}")
                if record is not None:
                    records.append(record)
    records.sort(key=lambda r: r.timestamp_unix)
    return records
