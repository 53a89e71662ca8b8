"""Reading a run directory back: `load_run(path) -> Run`.

The reader is forgiving about what a killed or interrupted run leaves behind (a partial last line, a
rank that never wrote, a rank that never closed) and strict about what it cannot interpret (no manifest,
a manifest it cannot parse, a schema newer than this tuneup). Forgiveness is never silent: every
tolerated defect becomes a line in `Run.warnings`.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from tuneup._gc import cyclic_gc_paused
from tuneup.record.remote import is_url
from tuneup.record.schema import (
    COLLECTIVE_KINDS,
    COLLECTIVES_FILE,
    EVENTS_FILE,
    FSDP_WAIT_FIELDS,
    INFO_FILE,
    MANIFEST_FILE,
    METRIC_SOURCES,
    METRICS_FILE,
    OPERATORS_FILE,
    PHASES,
    RANK_DIR_PREFIX,
    SCHEMA_VERSION,
    STEPS_FILE,
    TELEMETRY_FILE,
    WINDOWS_FILE,
    CollectiveRecord,
    Manifest,
    MetricRecord,
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


# No measurement is beyond the range of a 64-bit integer (every counter fits in one); a number that is
# cannot be a reading, and sums of a few such would overflow a float into inf in the report's figures.
NUMBER_LIMIT = 2**63
# More ranks than any job has run: a larger world size is a damaged manifest, not a run to list ranks of.
MAX_WORLD_SIZE = 2**20
NOT_A_NUMBER = "NaN, Infinity or a number out of 64-bit range"
# Text that may hold a number out of that range: a run of 19 digits (2**63 has 19) or a positive exponent.
# Only lines that hold one, or NaN or Infinity, pay for the slower parse that checks every number.
_MAYBE_OUT_OF_RANGE = re.compile(r"[0-9](?:[0-9]{18}|[eE]\+?[0-9])")
# The same test, and the one for NaN and Infinity, over a whole file at once, at the speed of a substring
# search: with every digit made "0", "E" made "e", "I" made "N" and every "+" left out, a file holds none
# of that text unless it holds one of these. Leaving "+" out can only join runs of digits (a match where
# there was none: the file then takes the slower way), never split one; a line break stays a line break.
_SHAPE = bytes.maketrans(b"123456789EI", b"000000000eN")
_SHAPES_SPECIAL = (b"N", b"0" * 19, b"0e0")
# json.loads' own scanner, called without the three layers of Python around it: on a line that starts
# with the value and ends with it, json.loads returns exactly what it returns.
_SCAN_JSON = json.JSONDecoder().scan_once
# orjson, where installed (`pip install tuneup[fast]`), parses a line 2.5-3x faster than json and gives
# the same object for every line the fast path lets through: a file that holds NaN, Infinity or a number
# beyond 64 bits takes the checked path whole, and a line orjson refuses takes it alone.
try:
    from orjson import loads as _FAST_LOADS
except ImportError:  # the standard library's scanner does the same, slower
    _FAST_LOADS = None


def _may_hold_special_numbers(data: bytes) -> bool:
    """Whether any line of `data` may hold text that `_decode` reads with its slower, checking parse."""
    shape = data.translate(_SHAPE, b"+")
    return any(s in shape for s in _SHAPES_SPECIAL)


# Past this many objects kept by one load, one full collection at its end is cheaper than what the
# collector would do with them later; below it, the collector is left to its rhythm.
_COLLECT_AFTER_OBJECTS = 200_000


class _NumberCheck:
    """Hooks for `json.loads` that read NaN, Infinity and out-of-range numbers as null, and count them."""

    def __init__(self) -> None:
        self.replaced = 0

    def missing(self, _text: str) -> None:
        self.replaced += 1
        return None

    def parse_float(self, text: str) -> float | None:
        value = float(text)
        return value if math.isfinite(value) and abs(value) <= NUMBER_LIMIT else self.missing(text)

    def parse_int(self, text: str) -> int | None:
        value = int(text)  # ValueError beyond 4,300 digits: the caller's damaged line
        # Up to 2**64: unsigned 64-bit values are real readings (torch's random initial seed is one).
        return value if abs(value) <= 2 * NUMBER_LIMIT else self.missing(text)


def _decode(data: bytes) -> tuple[Any, int]:
    """A JSON value, with NaN, Infinity and out-of-range numbers as None, and how many there were.

    Raises ValueError (UnicodeDecodeError and json.JSONDecodeError among them) or RecursionError (nested
    too deeply) for text that is not JSON."""
    text = data.decode("utf-8")
    if "NaN" not in text and "Infinity" not in text and not _MAYBE_OUT_OF_RANGE.search(text):
        return json.loads(text), 0
    check = _NumberCheck()
    value = json.loads(
        text, parse_constant=check.missing, parse_float=check.parse_float, parse_int=check.parse_int
    )
    return value, check.replaced


def _load_json_object(path: Path, warnings: list[str]) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RunRecordError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        obj, replaced = _decode(data)
    except json.JSONDecodeError as exc:
        raise RunRecordError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "the file is damaged — restore it or record the run again"
        ) from None
    except UnicodeDecodeError as exc:
        raise RunRecordError(
            f"{path} is not UTF-8 text (byte {exc.start}); the file is damaged — restore it or record the "
            "run again"
        ) from None
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits, nesting too deep
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise RunRecordError(
            f"{path} is not valid JSON ({reason}); the file is damaged — restore it or record the run again"
        ) from None
    if not isinstance(obj, dict):
        found = "null" if obj is None else "an array" if isinstance(obj, list) else type(obj).__name__
        raise RunRecordError(f"{path} must hold a JSON object, found {found}")
    if replaced:
        warnings.append(f"{path}: {replaced} value(s) that were {NOT_A_NUMBER} read as missing")
    return obj


# The manifest's sections and fields that tuneup reads, with their JSON types: a dict is an object's
# fields, "*" any of its keys, a one-item list the type of every item. What the writer writes always has
# them; a value of another type (a manifest edited by hand, or damaged) is read as missing, with a warning,
# so that no reader of the manifest has to check again. A null is "not recorded", never wrong, but under
# "*" where the types do not include None.
_MANIFEST_TYPES: dict[str, Any] = {
    "trainer": {
        "namespace": str,
        "strategy": str,
        "accelerator": str,
        "precision": (str, int),
        "accumulate_grad_batches": int,
        "max_steps": int,
        "max_epochs": int,
        "limit_train_batches": (int, float),
    },
    "dataloader": {
        "batch_size": int,
        "num_workers": int,
        "pin_memory": bool,
        "persistent_workers": bool,
        "drop_last": bool,
        "sampler": str,
        "dataset_len": int,
    },
    "model": {"class": str, "parameters": int, "trainable_parameters": int},
    "environment": {
        "versions": {"*": (str, int, float, bool, type(None))},
        "host": {"cpu_model": str, "cpu_count_logical": int, "ram_total_bytes": int},
        "env": {"*": str},
        "git": dict,
        "seeds": dict,
    },
    "gpus": {
        "driver_version": str,
        "gpus": [
            {
                "index": int,
                "name": str,
                "pci_bus_id": str,
                "pci_device_id": (str, int),
                "memory_total_bytes": int,
                "nvml_nvlink_version": int,
                "nvlink_links_active": int,
                "pcie_max_gen": int,
                "pcie_max_width": int,
            }
        ],
    },
    "communication": {"backend": str, "ranks_per_node": int, "nccl_version": str},
    "pricing": {
        "instance": str,
        "spot": bool,
        "price_per_hour": (int, float),
        "price_per": str,
        "catalog": str,
        "source": str,
        "electricity_usd_per_kwh": (int, float),
    },
    "flops": {"flops_per_sample": (int, float), "count_flops": bool},
    "recording": dict,
    "segment": {
        "index": int,
        "reason": str,
        "restart_count": int,
        "checkpoint": str,
        "global_step_at_start": int,
    },
}
# The fields of a rank's info.json that are read from its raw form (the others are typed in RankInfo).
_INFO_TYPES: dict[str, Any] = {"status": str, "data_timing": str, "dropped": {"*": int}}

_WRONG = object()  # a value of the wrong type, to be read as missing


def _typed_value(value: Any, spec: Any, where: str, wrong: list[str], nullable: bool = True) -> Any:
    """`value` without the parts whose type is not the one `spec` gives (read as missing, their names
    added to `wrong`); _WRONG when `value` itself is not."""
    if value is None and nullable:
        return None
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            wrong.append(where)
            return _WRONG
        out = dict(value)
        for key, sub in spec.items():
            for k in list(out) if key == "*" else [key] if key in out else []:
                typed = _typed_value(out[k], sub, f"{where}.{k}" if where else k, wrong, nullable=key != "*")
                if typed is _WRONG:
                    del out[k]
                else:
                    out[k] = typed
        return out
    if isinstance(spec, list):
        if not isinstance(value, list):
            wrong.append(where)
            return _WRONG
        items = [_typed_value(v, spec[0], f"{where}[{i}]", wrong) for i, v in enumerate(value)]
        return [v for v in items if v is not _WRONG and v is not None]
    types = spec if isinstance(spec, tuple) else (spec,)
    if isinstance(value, types) and (bool in types or not isinstance(value, bool)):
        return value
    wrong.append(where)
    return _WRONG


def _typed_fields(
    raw: dict[str, Any], types: dict[str, Any], path: Path, warnings: list[str]
) -> dict[str, Any]:
    wrong: list[str] = []
    typed = _typed_value(raw, types, "", wrong)
    if wrong:
        shown = ", ".join(wrong[:5]) + (" ..." if len(wrong) > 5 else "")
        warnings.append(f"{path}: {len(wrong)} field(s) of the wrong type read as missing ({shown})")
    return typed


def _int_field(obj: dict[str, Any], key: str, path: Path, default: int | None = None) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RunRecordError(f"{path}: field {key!r} must be an integer, found {value!r}")
    return value


def _parse_manifest(path: Path, warnings: list[str]) -> Manifest:
    raw = _load_json_object(path, warnings)
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
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise RunRecordError(f"{path}: 'world_size' must be from 1 to {MAX_WORLD_SIZE:,}, found {world_size}")
    num_nodes = _int_field(raw, "num_nodes", path, default=1)
    if num_nodes < 1:
        raise RunRecordError(f"{path}: 'num_nodes' must be at least 1, found {num_nodes}")

    raw = _typed_fields(raw, _MANIFEST_TYPES, path, warnings)

    def section(key: str) -> dict[str, Any]:
        value = raw.get(key)
        return value if isinstance(value, dict) else {}

    created = raw.get("created_unix")
    return Manifest(
        schema_version=version,
        run_id=str(raw.get("run_id") or path.parent.name),
        created_unix=float(created) if isinstance(created, (int, float)) else 0.0,
        world_size=world_size,
        num_nodes=num_nodes,
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
    # A file that does not end in a newline was cut mid-write (a kill during a flush): its last piece is
    # either a partial line or empty; both are dropped, and a partial one is reported.
    cut = data.rfind(b"\n") + 1
    body, last = data[:cut], data[cut:]
    if last.strip():
        warnings.append(
            f"{path}: last line is incomplete (the process stopped while writing); it was skipped"
        )
    bad: list[int] = []
    replaced: list[int] = []
    # The usual file, whole lines of UTF-8 without a number to check, is read on a fast path (orjson's
    # parser where it is installed, else json's own scanner); any line it does not read as an object
    # (blank, damaged, or merely unusual) takes the checked path below, unchanged.
    fast = not _may_hold_special_numbers(body)
    lines: list[str] | list[bytes]
    if fast and _FAST_LOADS is not None:
        lines = body.split(b"\n")
    else:
        try:
            lines = body.decode("utf-8").split("\n") if fast else []
        except UnicodeDecodeError:
            fast = False
        if not fast:
            lines = body.split(b"\n")
    lines.pop()  # the empty piece after the last newline
    for number, line in enumerate(lines, start=1):
        if fast:
            if type(line) is bytes:
                try:
                    obj = _FAST_LOADS(line)  # type: ignore[misc]
                except ValueError:  # orjson's JSONDecodeError, for whatever it refuses
                    obj = None
                if type(obj) is dict:
                    yield number, obj
                    continue
            else:
                try:
                    obj, end = _SCAN_JSON(line, 0)
                except (StopIteration, ValueError, RecursionError):
                    end = -1
                if end == len(line) and type(obj) is dict:
                    yield number, obj
                    continue
                line = line.encode("utf-8")  # the very bytes it was decoded from
        if not line.strip():
            continue
        try:
            obj, count = _decode(line)
        except (ValueError, RecursionError):  # not UTF-8, not JSON, an endless integer, nested too deep
            bad.append(number)
            continue
        if not isinstance(obj, dict):
            bad.append(number)
            continue
        if count:
            replaced.append(number)
        yield number, obj
    if bad:
        warnings.append(f"{path}: {len(bad)} damaged line(s) skipped (line {_shown(bad)})")
    if replaced:
        warnings.append(
            f"{path}: {len(replaced)} line(s) with values that were {NOT_A_NUMBER}, read as missing "
            f"(line {_shown(replaced)})"
        )


def _shown(numbers: list[int]) -> str:
    return ", ".join(str(n) for n in numbers[:5]) + (" ..." if len(numbers) > 5 else "")


def _typed(path: Path, warnings: list[str], build: Callable[[dict[str, Any]], T], what: str) -> list[T]:
    out: list[T] = []
    bad: list[int] = []
    for number, obj in _jsonl(path, warnings):
        try:
            out.append(build(obj))
        except (KeyError, TypeError, ValueError):
            bad.append(number)
    if bad:
        warnings.append(
            f"{path}: {len(bad)} {what} line(s) with missing or mistyped fields skipped (line {_shown(bad)})"
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


# Durations and counts, which no reading makes negative (the step clock clamps its phases at zero): a
# negative one is a damaged line, and would make a negative rate of the report's figures.
_NON_NEGATIVE_STEP_FIELDS = (
    "wall_ms",
    *PHASES,
    "micro_batches",
    "samples",
    "tokens",
    "peak_mem_bytes",
    "comm_ms",
    "comm_exposed_ms",
    "comm_bytes",
    "comm_count",
    "gns_small_sq",
    "gns_big_sq",
    "gns_small_batch",
    "gns_big_batch",
    "comm_node_bytes",
    "tuneup_ms",
    *FSDP_WAIT_FIELDS,
)


def _non_negative(record: T, names: tuple[str, ...]) -> T:
    for name in names:
        value = getattr(record, name)
        if value is not None and value < 0:
            raise ValueError(name)
    return record


# The exact types of the numbers json gives (bool is not one of them): a field of one of these types,
# and not negative, is valid as it is, and needs none of the checks below.
_NUMBER = frozenset((int, float))
_NUMBER_OR_NULL = frozenset((int, float, type(None)))
_NO_FSDP_WAITS = [None] * len(FSDP_WAIT_FIELDS)  # a step line without them (every run but FSDP's)


# A step line's fields, in the order of StepRecord's (so that one is built without keywords).
_STEP_FIELDS = (
    "step",
    "epoch",
    "t_end",
    "wall_ms",
    "data_ms",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "other_ms",
    "micro_batches",
    "samples",
    "tokens",
    "loss",
    "grad_norm",
    "peak_mem_bytes",
    "checkpoint",
    "comm_ms",
    "comm_exposed_ms",
    "comm_bytes",
    "comm_count",
    "sync_ms",
    "gns_small_sq",
    "gns_big_sq",
    "gns_small_batch",
    "gns_big_batch",
    "comm_node_bytes",
    "tuneup_ms",
    *FSDP_WAIT_FIELDS,
)
if tuple(f.name for f in fields(StepRecord)) != _STEP_FIELDS:
    raise ImportError("tuneup.record.reader: _STEP_FIELDS must list StepRecord's fields in their order")


def _step(obj: dict[str, Any]) -> StepRecord:
    # Every field fetched and checked once, inline: a large run has millions of step lines, and the
    # checked reading below takes twice as long. Anything this does not accept goes there.
    (
        step,
        epoch,
        t_end,
        wall,
        data,
        forward,
        backward,
        optimizer,
        other,
        micro,
        samples,
        tokens,
        loss,
        grad_norm,
        peak,
        checkpoint,
        comm,
        exposed,
        comm_bytes,
        comm_count,
        sync,
        small_sq,
        big_sq,
        small_batch,
        big_batch,
        node_bytes,
        own,
        *fsdp_waits,
    ) = map(obj.get, _STEP_FIELDS)
    if not (
        type(step) is int
        and _NUMBER.issuperset(map(type, (t_end, wall, data, forward, backward, optimizer, other, micro)))
        and _NUMBER_OR_NULL.issuperset(
            map(
                type,
                (
                    epoch,
                    samples,
                    tokens,
                    loss,
                    grad_norm,
                    peak,
                    comm,
                    exposed,
                    comm_bytes,
                    comm_count,
                    sync,
                    own,
                ),
            )
        )
        and (small_sq is None or _gns_valid(small_sq, big_sq, small_batch, big_batch))
        and (sync is None or sync >= 0)
        and min(wall, data, forward, backward, optimizer, other, micro) >= 0
        and (samples is None or samples >= 0)
        and (tokens is None or tokens >= 0)
        and (peak is None or peak >= 0)
        and (comm is None or comm >= 0)
        and (exposed is None or exposed >= 0)
        and (comm_bytes is None or comm_bytes >= 0)
        and (comm_count is None or comm_count >= 0)
        and (node_bytes is None or (type(node_bytes) is int and node_bytes >= 0))
        and (own is None or own >= 0)
        and (fsdp_waits == _NO_FSDP_WAITS or all(type(w) in _NUMBER and w >= 0 for w in fsdp_waits))
    ):
        return _checked_step(obj)
    return StepRecord(
        step,
        0 if epoch is None else int(float(epoch)),
        float(t_end),
        float(wall),
        float(data),
        float(forward),
        float(backward),
        float(optimizer),
        float(other),
        int(float(micro)),
        None if samples is None else int(float(samples)),
        None if tokens is None else int(float(tokens)),
        None if loss is None else float(loss),
        None if grad_norm is None else float(grad_norm),
        None if peak is None else int(float(peak)),
        bool(checkpoint),
        None if comm is None else float(comm),
        None if exposed is None else float(exposed),
        None if comm_bytes is None else int(float(comm_bytes)),
        None if comm_count is None else int(float(comm_count)),
        0.0 if sync is None else float(sync),
        None if small_sq is None else float(small_sq),
        None if small_sq is None else float(big_sq),
        None if small_sq is None else int(small_batch),
        None if small_sq is None else int(big_batch),
        node_bytes,
        None if own is None else float(own),
        *(None if w is None else float(w) for w in fsdp_waits),
    )


def _gns_valid(small_sq: Any, big_sq: Any, small_batch: Any, big_batch: Any) -> bool:
    """The noise scale's four fields, as the callback writes them: all there, numbers, not negative."""
    return (
        type(small_sq) in _NUMBER
        and type(big_sq) in _NUMBER
        and type(small_batch) is int
        and type(big_batch) is int
        and min(small_sq, big_sq) >= 0
        and 0 < small_batch < big_batch
    )


def _checked_step(obj: dict[str, Any]) -> StepRecord:
    """A step line read field by field: a field missing, of the wrong type or negative raises."""
    step = obj["step"]
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError("step")
    record = StepRecord(
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
        sync_ms=_opt_num(obj, "sync_ms") or 0.0,
        gns_small_sq=_opt_num(obj, "gns_small_sq"),
        gns_big_sq=_opt_num(obj, "gns_big_sq"),
        gns_small_batch=_opt_int(obj, "gns_small_batch"),
        gns_big_batch=_opt_int(obj, "gns_big_batch"),
        comm_node_bytes=_opt_int(obj, "comm_node_bytes"),
        tuneup_ms=_opt_num(obj, "tuneup_ms"),
        **{name: _opt_num(obj, name) for name in FSDP_WAIT_FIELDS},
    )
    return _non_negative(record, _NON_NEGATIVE_STEP_FIELDS)


def _opt_str(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(key)
    return value


_STR_OR_NULL = frozenset((str, type(None)))


def _collective(obj: dict[str, Any]) -> CollectiveRecord:
    # As for steps: the usual line inline, anything else through the checked reading.
    get = obj.get
    step, kind, size, duration = get("step"), get("kind"), get("bytes"), get("duration_ms")
    dtype, bucket, world_size, start, source = (
        get("dtype"),
        get("bucket"),
        get("world_size"),
        get("start_ms"),
        get("source"),
    )
    num, opt = _NUMBER, _NUMBER_OR_NULL
    if not (
        type(kind) is str
        and kind in COLLECTIVE_KINDS
        and type(step) in num
        and type(size) in num
        and type(duration) in num
        and type(dtype) in _STR_OR_NULL
        and type(bucket) in opt
        and type(world_size) in opt
        and type(start) in opt
        and type(source) in _STR_OR_NULL
        and type(get("scope")) in _STR_OR_NULL
        and size >= 0
        and duration >= 0
        and (world_size is None or world_size >= 1)
    ):
        return _checked_collective(obj)
    return CollectiveRecord(
        step=int(float(step)),
        kind=kind,
        bytes=int(float(size)),
        duration_ms=float(duration),
        dtype=dtype,
        bucket=None if bucket is None else int(float(bucket)),
        world_size=None if world_size is None else int(float(world_size)),
        start_ms=None if start is None else float(start),
        source=source,
        scope=get("scope"),
    )


def _checked_collective(obj: dict[str, Any]) -> CollectiveRecord:
    kind = obj["kind"]
    if kind not in COLLECTIVE_KINDS:
        raise ValueError("kind")
    world_size = _opt_int(obj, "world_size")
    if world_size is not None and world_size < 1:
        raise ValueError("world_size")
    record = CollectiveRecord(
        step=int(_num(obj, "step")),
        kind=kind,
        bytes=int(_num(obj, "bytes")),
        duration_ms=_num(obj, "duration_ms"),
        dtype=_opt_str(obj, "dtype"),
        bucket=_opt_int(obj, "bucket"),
        world_size=world_size,
        start_ms=_opt_num(obj, "start_ms"),
        source=_opt_str(obj, "source"),
        scope=_opt_str(obj, "scope"),
    )
    return _non_negative(record, ("bytes", "duration_ms"))


_NONFINITE_VALUES = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _metric(obj: dict[str, Any]) -> MetricRecord:
    """A metrics.jsonl line; a null value is the non-finite one its `nonfinite` names (the writer's form),
    and a line with neither a number nor a known `nonfinite` is damaged."""
    name, source = obj["name"], obj["source"]
    if type(name) is not str or not name or source not in METRIC_SOURCES:
        raise ValueError("name" if type(name) is not str or not name else "source")
    value = obj.get("value")
    if value is None:
        value = _NONFINITE_VALUES[obj.get("nonfinite")]  # KeyError: neither a value nor a known kind
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("value")
    epoch, samples = _opt_int(obj, "epoch"), _opt_int(obj, "samples")
    if samples is not None and samples < 0:
        raise ValueError("samples")
    return MetricRecord(
        name=name,
        value=float(value),
        step=int(_num(obj, "step")),
        t=_num(obj, "t"),
        source=source,
        epoch=epoch,
        samples=samples,
    )


def _window_stats(stats: dict[str, Any]) -> dict[str, float]:
    # A statistic that is not a number is left out, as a metric with no values is.
    if _NUMBER.issuperset(map(type, stats.values())):
        return dict(stats)
    return {k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _window(obj: dict[str, Any]) -> WindowAggregate:
    stats = obj["stats"]
    if not isinstance(stats, dict):
        raise TypeError("stats")
    record = WindowAggregate(
        first_step=int(_num(obj, "first_step")),
        last_step=int(_num(obj, "last_step")),
        count=int(_num(obj, "count")),
        t_start=_num(obj, "t_start"),
        t_end=_num(obj, "t_end"),
        samples=_opt_int(obj, "samples"),
        tokens=_opt_int(obj, "tokens"),
        micro_batches=int(_num(obj, "micro_batches")),
        stats={k: _window_stats(v) for k, v in stats.items() if isinstance(v, dict)},
    )
    return _non_negative(record, ("count", "samples", "tokens", "micro_batches"))


def _rank_info(rank: int, path: Path, warnings: list[str]) -> RankInfo:
    try:
        raw = _typed_fields(_load_json_object(path, warnings), _INFO_TYPES, path, warnings)
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


def _operators(rank: int, path: Path, warnings: list[str]) -> dict[str, Any] | None:
    """operators.json, where the rank profiled steps: an object whose `phases` is an object, else None
    with a warning (the run's other figures stand without it)."""
    if not path.is_file():
        return None
    try:
        obj = _load_json_object(path, warnings)
    except RunRecordError as exc:
        warnings.append(f"rank {rank}: {exc}; its operator profile is left out")
        return None
    if not isinstance(obj.get("phases"), dict):
        warnings.append(f"rank {rank}: {path} has no phases object; its operator profile is left out")
        return None
    return obj


def _load_rank(run_dir: Path, rank: int, warnings: list[str]) -> RankRecord:
    rank_dir = run_dir / rank_dir_name(rank)
    info = _rank_info(rank, rank_dir / INFO_FILE, warnings)
    steps = _typed(rank_dir / STEPS_FILE, warnings, _step, "step")
    windows = _typed(rank_dir / WINDOWS_FILE, warnings, _window, "window")
    telemetry = [obj for _, obj in _jsonl(rank_dir / TELEMETRY_FILE, warnings)]
    events = [obj for _, obj in _jsonl(rank_dir / EVENTS_FILE, warnings)]
    collectives = _typed(rank_dir / COLLECTIVES_FILE, warnings, _collective, "collective")
    metrics = _typed(rank_dir / METRICS_FILE, warnings, _metric, "logged metric")
    operators = _operators(rank, rank_dir / OPERATORS_FILE, warnings)
    if not info.closed:
        last = steps[-1].step if steps else None
        where = f"at step {last}" if last is not None else "before its first recorded step"
        warnings.append(f"rank {rank} stopped {where} without closing (killed or still running)")
    for what, count in sorted(info.dropped.items()):
        warnings.append(f"rank {rank}: {count} {what} record(s) could not be written and are missing")
    return RankRecord(
        info=info,
        steps=steps,
        windows=windows,
        telemetry=telemetry,
        events=events,
        collectives=collectives,
        metrics=metrics,
        operators=operators,
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


def _load_url(url: str) -> Run:
    """A run on object storage (tuneup.record.remote), read through a local copy of it."""
    import atexit
    import shutil

    from tuneup.record.remote import materialize

    try:
        local = materialize(url)
    except FileNotFoundError:
        raise RunRecordError(
            f"{url} holds nothing; pass the run's URL as TuneupCallback printed it"
        ) from None
    except Exception as exc:  # a missing backend, no credentials, no network: one line, named
        raise RunRecordError(f"cannot read {url}: {exc}") from None
    # Kept while this process runs: a resumed run's segments are read from it later.
    atexit.register(shutil.rmtree, local, True)
    run = load_run(local)
    run.url = url
    return run


def load_run(path: str | os.PathLike[str]) -> Run:
    """Load the run directory at `path`.

    Raises `RunRecordError` (with a one-line message naming the file and the fix) when `path` is not a
    readable run of a schema this tuneup understands. Missing ranks, unclosed ranks and damaged lines do
    not raise: they are listed in `Run.missing_ranks` and `Run.warnings`.
    """
    if is_url(path):
        return _load_url(str(path))
    run_dir = Path(path)
    if not run_dir.exists():
        raise RunRecordError(
            f"{run_dir} does not exist; pass the run directory TuneupCallback wrote (its .run_dir)"
        )
    if not run_dir.is_dir():
        raise RunRecordError(f"{run_dir} is a file, not a run directory")
    manifest_path = run_dir / MANIFEST_FILE
    if not manifest_path.exists():
        raise _not_a_run(run_dir)
    warnings: list[str] = []
    manifest = _parse_manifest(manifest_path, warnings)
    try:
        # Listed once: a stat per rank would take long for a large world size.
        rank_dirs = {p.name for p in run_dir.iterdir() if p.is_dir()}
    except OSError as exc:
        raise RunRecordError(f"cannot read {run_dir}: {exc.strerror or exc}") from None

    ranks: dict[int, RankRecord] = {}
    missing: list[int] = []
    with cyclic_gc_paused(_COLLECT_AFTER_OBJECTS):
        for rank in range(manifest.world_size):
            if rank_dir_name(rank) not in rank_dirs:
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
