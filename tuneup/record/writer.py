"""Writing a run directory: the manifest (rank 0) and one rank's append-only streams.

Each rank writes only its own files, so ranks never contend on a shared filesystem. Lines are buffered
in memory and written in whole lines every `flush_every_steps` steps or `flush_every_s` seconds: a
process killed with SIGKILL loses at most that last interval, and a kill during a write leaves at most
one partial last line, which the reader skips.

A write that fails (full disk, unwritable directory) warns once and turns that stream off; the caller
never sees the exception, because the training being observed must go on.
"""

from __future__ import annotations

import contextlib
import json
import math
import operator
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Any

from tuneup._log import warn_once
from tuneup._stats import quantile
from tuneup.record.schema import (
    COLLECTIVES_FILE,
    EVENTS_FILE,
    INFO_FILE,
    MANIFEST_FILE,
    METRICS_FILE,
    SCHEMA_VERSION,
    STEP_METRICS,
    STEPS_FILE,
    TELEMETRY_FILE,
    WINDOWS_FILE,
    CollectiveRecord,
    MetricRecord,
    StepRecord,
    rank_dir_name,
)


@dataclass(frozen=True)
class RecordingPolicy:
    """How much is written, and how often.

    With the defaults a 1,000,000-step run keeps 1,000 + ~10,000 step lines and 10,000 window lines per
    rank (about 12 MB, measured by benchmarks/record_size.py), however long the run.

    Past `detail_steps` the steps kept are the multiples of `sample_stride`, the first prime at or above
    `sample_every` (101 for 100). A round stride would keep only the steps where periodic work lands:
    Lightning logs every `log_every_n_steps` (50 by default; 10, 20, 25, 100 are common), tuneup's own
    logging follows it, validation and epochs often come in round numbers of steps. Those steps are slower,
    and keeping only them made a sampled stretch look slow (issue 25: 9.4 ms kept against 6.2 ms run).
    A prime stride p shares no factor with any period under p, so over p x L steps its multiples meet every
    step of a period L exactly once: the periodic steps are kept in their own share, neither more nor less.
    It stays a function of the step number, so every rank keeps the same steps.
    """

    flush_every_steps: int = 50
    flush_every_s: float = 10.0
    detail_steps: int = 1000  # every step is kept for this many steps of each process...
    sample_every: int = 100  # ...then about one step in this many (see sample_stride)
    window_steps: int = 100  # aggregates over windows of this many steps, aligned on step numbers

    def __post_init__(self) -> None:
        for name in ("flush_every_steps", "detail_steps", "sample_every", "window_steps"):
            value = getattr(self, name)
            minimum = 0 if name == "detail_steps" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"RecordingPolicy.{name} must be a positive integer, got {value!r}")
        if not (isinstance(self.flush_every_s, (int, float)) and self.flush_every_s > 0):
            raise ValueError(
                f"RecordingPolicy.flush_every_s must be a positive number, got {self.flush_every_s!r}"
            )

    @property
    def sample_stride(self) -> int:
        """The step numbers kept past `detail_steps` are its multiples: `sample_every`, or the first prime
        above it (1 and 2 stay as they are: every step, every other)."""
        return next_prime(self.sample_every)

    def keeps(self, step: int, steps_seen: int) -> bool:
        return steps_seen < self.detail_steps or step % self.sample_stride == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "flush_every_steps": self.flush_every_steps,
            "flush_every_s": self.flush_every_s,
            "detail_steps": self.detail_steps,
            "sample_every": self.sample_every,
            "sample_stride": self.sample_stride,
            "window_steps": self.window_steps,
        }


def next_prime(n: int) -> int:
    """The smallest prime >= n, for n >= 3; n itself for 1 and 2."""
    if n <= 2:
        return n
    candidate = n
    while any(candidate % d == 0 for d in range(2, math.isqrt(candidate) + 1)):
        candidate += 1
    return candidate


def _json_default(obj: Any) -> Any:
    # Values from the trainer may be numpy scalars, paths or enums; the record keeps their plain form.
    if hasattr(obj, "item"):
        try:
            return obj.item()
        except Exception:
            pass
    return str(obj)


# Fields kept to significant digits rather than to microseconds: a loss of 1e-5 must not round to 0.
# "value" and "target": a logged metric's, in an event (target_reached).
_SIGNIFICANT = frozenset({"loss", "grad_norm", "gns_small_sq", "gns_big_sq", "value", "target"})


def _clean(key: str, value: Any) -> Any:
    if not isinstance(value, float):
        return value
    # JSON has no NaN or inf; a diverged loss is recorded as null rather than as an unreadable line.
    if not math.isfinite(value):
        return None
    return float(f"{value:.7g}") if key in _SIGNIFICANT else round(value, 3)


# The fields of a typed record's line, in its dataclass's order; one left out where it holds nothing (None,
# or a `checkpoint` that is False): the reader reads an absent field as not measured. Read with one
# attrgetter call: the writer's thread does this for every step.
_STEP_FIELDS = tuple(f.name for f in fields(StepRecord))
_step_values = operator.attrgetter(*_STEP_FIELDS)
_COLLECTIVE_FIELDS = tuple(f.name for f in fields(CollectiveRecord))
_collective_values = operator.attrgetter(*_COLLECTIVE_FIELDS)


def _typed_line(record: object, names: tuple[str, ...], values: Callable[[object], tuple[Any, ...]]) -> str:
    """A typed record's line: its fields that hold something, cleaned as `dumps_line` cleans them (one
    pass: this runs for every kept step)."""
    present = {
        k: _clean(k, v) if isinstance(v, float) else v
        for k, v in zip(names, values(record), strict=True)
        if v is not None and v is not False
    }
    return json.dumps(present, default=_json_default, separators=(",", ":")) + "\n"


def dumps_line(record: Mapping[str, Any]) -> str:
    # _clean only where it can change something: a call per field is most of a line's cost.
    cleaned = {k: _clean(k, v) if isinstance(v, float) else v for k, v in record.items()}
    return json.dumps(cleaned, default=_json_default, separators=(",", ":")) + "\n"


def write_json_atomic(path: Path, obj: Mapping[str, Any]) -> None:
    """Write JSON so that readers see the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, default=_json_default, allow_nan=False, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def write_manifest(run_dir: str | os.PathLike[str], manifest: Mapping[str, Any]) -> Path:
    """Write `manifest.json` (rank 0 only). `schema_version` is set here, not by the caller."""
    path = Path(run_dir) / MANIFEST_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"schema_version": SCHEMA_VERSION, **manifest})
    return path


def summarize(values: list[float]) -> dict[str, float]:
    """n, mean, p50, p95 and max of `values` (non-empty), to 6 significant digits."""
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "mean": _sig6(sum(ordered) / len(ordered)),
        "p50": _sig6(quantile(ordered, 0.50)),
        "p95": _sig6(quantile(ordered, 0.95)),
        "max": _sig6(ordered[-1]),
    }


def _sig6(value: float) -> float | int:
    return value if isinstance(value, int) else float(f"{value:.6g}")


# What a window needs of each step, in this order: one attrgetter call reads it from a StepRecord.
_WINDOW_FIELDS = ("step", "t_end", "micro_batches", *STEP_METRICS)
_window_values = operator.attrgetter(*_WINDOW_FIELDS)
_W = {name: i for i, name in enumerate(_WINDOW_FIELDS)}
_W_STEP, _W_T_END, _W_MICRO, _W_WALL = _W["step"], _W["t_end"], _W["micro_batches"], _W["wall_ms"]
_W_SAMPLES, _W_TOKENS = _W["samples"], _W["tokens"]


class _Window:
    """The steps of one window (what the window needs of each, `_WINDOW_FIELDS`), kept until it is
    complete; its statistics are computed once, at the end."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def add(self, row: tuple[Any, ...]) -> None:
        self.rows.append(row)

    @property
    def count(self) -> int:
        return len(self.rows)

    def as_record(self) -> dict[str, Any]:
        rows = self.rows
        first, last = rows[0], rows[-1]
        stats = {}
        for metric in STEP_METRICS:
            i = _W[metric]
            values = [v for r in rows if (v := r[i]) is not None and math.isfinite(v)]
            if values:
                stats[metric] = summarize(values)
        samples = [r[_W_SAMPLES] for r in rows if r[_W_SAMPLES] is not None]
        tokens = [r[_W_TOKENS] for r in rows if r[_W_TOKENS] is not None]
        return {
            "first_step": first[_W_STEP],
            "last_step": last[_W_STEP],
            "count": len(rows),
            "t_start": round(first[_W_T_END] - first[_W_WALL] / 1000.0, 3),
            "t_end": round(last[_W_T_END], 3),
            "samples": sum(samples) if samples else None,
            "tokens": sum(tokens) if tokens else None,
            "micro_batches": sum(r[_W_MICRO] or 0 for r in rows),
            "stats": stats,
        }


# How many values of the metrics the training logged (metrics.jsonl) a rank keeps, so that a long run's
# record stays small: see MetricBound.
METRIC_NAMES_MAX = 64
VALIDATION_VALUES_MAX = 10_000
DENSE_VALUES = 2_000
THINNING_BLOCK = 1_000
_NONFINITE = {math.inf: "inf", -math.inf: "-inf"}
_NAMES_DROPPED_LISTED = 20  # the rank's info lists this many of the names dropped, then counts values


class MetricBound:
    """Which logged metric values a rank keeps (the writer's thread decides; `keeps` is called in order).

    - At most `METRIC_NAMES_MAX` (64) names per run: the values of a 65th name and later are dropped, with
      one warning naming the first one dropped (`names_dropped` lists them for the rank's info).
    - Validation values (`source == "validation"`): every one, up to `VALIDATION_VALUES_MAX` (10,000) per
      name; past that, dropped with one warning. Validation comes every few hundred steps at most: a run
      that validates 10,000 times is long beyond any other part of the record.
    - Values read during training (`"train"`, at the trainer's logging interval) and handed over by an
      adapter's own call (`"log"`), per name: the first `DENSE_VALUES` (2,000) all kept, then every 2nd
      up to the 4,000th, every 4th up to the 8,000th, every 8th up to the 16,000th...: each doubling of
      the values offered adds `THINNING_BLOCK` (1,000) kept. A name logged at every one of 1,000,000 steps
      keeps about 11,000 values, one logged every 50 steps of that run about 5,300 (a few hundred KB).
      The values kept are a function of how many were offered, so every rank keeps the same steps.
    - The first non-finite value (NaN, inf) of each name is kept whatever the thinning: divergence must
      show.
    """

    __slots__ = ("_nonfinite_seen", "_offered", "names_dropped", "validation_capped", "values_dropped")

    def __init__(self) -> None:
        self._offered: dict[str, list[int]] = {}  # name -> [validation values offered, others offered]
        self._nonfinite_seen: set[str] = set()
        self.names_dropped: list[str] = []  # the first few names past the limit, in the order met
        self.values_dropped = 0  # values of names past the limit
        self.validation_capped: set[str] = set()

    def keeps(self, name: str, source: str, value: float) -> bool:
        counts = self._offered.get(name)
        if counts is None:
            if len(self._offered) >= METRIC_NAMES_MAX:
                if not self.names_dropped:
                    warn_once(
                        "metrics-names",
                        f"the training logs more than {METRIC_NAMES_MAX} metrics: tuneup records the first "
                        f"{METRIC_NAMES_MAX} and drops the others, first {name!r}",
                    )
                if len(self.names_dropped) < _NAMES_DROPPED_LISTED and name not in self.names_dropped:
                    self.names_dropped.append(name)
                self.values_dropped += 1
                return False
            counts = self._offered[name] = [0, 0]
        first_nonfinite = not math.isfinite(value) and name not in self._nonfinite_seen
        if first_nonfinite:
            self._nonfinite_seen.add(name)
        if source == "validation":
            index = counts[0]
            counts[0] += 1
            if index < VALIDATION_VALUES_MAX:
                return True
            if name not in self.validation_capped:
                self.validation_capped.add(name)
                warn_once(
                    f"metrics-validation-cap:{name}",
                    f"{name!r} was validated {VALIDATION_VALUES_MAX} times: tuneup records no more of its "
                    "validation values",
                )
            return first_nonfinite
        index = counts[1]
        counts[1] += 1
        return index % thinning_stride(index) == 0 or first_nonfinite


def thinning_stride(index: int) -> int:
    """Of the training values of a name, the `index`-th (from 0) is kept where it is a multiple of this:
    1 below DENSE_VALUES, then 2, 4, 8... doubling with each doubling of `index` (MetricBound)."""
    if index < DENSE_VALUES:
        return 1
    return 1 << ((index // THINNING_BLOCK).bit_length() - 1)


def metric_line(record: MetricRecord) -> str:
    """A metric's line: its value at full precision (a float's shortest exact form), a non-finite one as
    null with `nonfinite` "nan", "inf" or "-inf" (JSON has none of them); epoch and samples where known."""
    value = record.value
    line: dict[str, Any] = {"name": record.name, "step": record.step, "t": round(record.t, 3)}
    if math.isfinite(value):
        line["value"] = value
    else:
        line["value"] = None
        line["nonfinite"] = _NONFINITE.get(value, "nan")
    line["source"] = record.source
    if record.epoch is not None:
        line["epoch"] = record.epoch
    if record.samples is not None:
        line["samples"] = record.samples
    return json.dumps(line, separators=(",", ":")) + "\n"


class _Stream:
    """One append-only JSON-lines file with an in-memory buffer of whole lines.

    Safe to append to from one thread while another flushes: the training thread, the thread that
    writes steps and the telemetry thread all share a rank's writer.
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self.buffer: list[str] = []
        self.file: IO[str] | None = None
        self.failed = False
        self.lines_lost = 0
        self.lock = threading.Lock()

    def append(self, line: str) -> None:
        with self.lock:
            if self.failed:
                self.lines_lost += 1
                return
            self.buffer.append(line)

    def flush(self) -> None:
        with self.lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self.failed or not self.buffer:
            return
        lines, self.buffer = self.buffer, []
        try:
            if self.file is None:
                # Kept open for the run: reopening per flush would cost a syscall pair every flush.
                self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            self.file.write("".join(lines))
            self.file.flush()
        except OSError as exc:
            self.failed = True
            self.lines_lost += len(lines)
            warn_once(
                f"write:{self.path}",
                f"cannot write {self.path} ({exc.strerror or exc}); recording of {self.what} stops here, "
                "training goes on",
            )

    def close(self) -> None:
        with self.lock:
            self._flush_locked()
            if self.file is not None:
                with contextlib.suppress(OSError):
                    self.file.close()
                self.file = None


class RankWriter:
    """The streams of one rank of one run.

    Thread-safety: steps come from one thread (the one that resolves them), events from the training
    thread, telemetry from the sampler thread; each stream has its own lock and buffer, so none waits
    on another's I/O. `close` is called once, after the other threads have stopped.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        rank: int,
        policy: RecordingPolicy | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.policy = policy or RecordingPolicy()
        self.dir = self.run_dir / rank_dir_name(rank)
        self._steps = _Stream(self.dir / STEPS_FILE, "steps")
        self._windows = _Stream(self.dir / WINDOWS_FILE, "step windows")
        self._events = _Stream(self.dir / EVENTS_FILE, "events")
        self._telemetry = _Stream(self.dir / TELEMETRY_FILE, "telemetry")
        self._collectives = _Stream(self.dir / COLLECTIVES_FILE, "collectives")
        self._metrics = _Stream(self.dir / METRICS_FILE, "logged metrics")
        self.metric_bound = MetricBound()
        self._last_flush = time.monotonic()
        self._last_telemetry_flush = time.monotonic()
        self._steps_since_flush = 0
        self._window = _Window()
        self._window_id: int | None = None
        self.steps_seen = 0
        self.steps_kept = 0
        # The first step whose training loss was NaN or infinite has been recorded as an event: steps.jsonl
        # writes such a loss as null (JSON has no NaN), which would read as "not measured", not "diverged".
        self._nonfinite_loss_recorded = False
        self.last_step: int | None = None
        self._info: dict[str, Any] = {}
        self.usable = True
        self.closed = False
        # Called after each flush (a run on object storage wakes its uploader: record/remote.py).
        self.after_flush: Callable[[], None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def open(self, info: Mapping[str, Any]) -> bool:
        """Create the rank directory and write `info.json`; False (and one warning) if that fails."""
        self._info = {"rank": self.rank, **info, "closed": False}
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.dir / INFO_FILE, self._info)
        except OSError as exc:
            self.usable = False
            for stream in self._streams:
                stream.failed = True
            warn_once(
                f"open:{self.dir}",
                f"cannot write the run record under {self.dir} ({exc.strerror or exc}); "
                "tuneup goes on without recording. Pass TuneupCallback(dirpath=...) a writable directory.",
            )
            return False
        return True

    def close(self, **extra_info: Any) -> None:
        """Write the last partial window, flush everything and mark the rank closed."""
        if self.closed:
            return
        self.closed = True
        self._emit_window()
        self.flush()
        for stream in self._streams:
            stream.close()
        if not self.usable:
            return
        dropped = {s.what: s.lines_lost for s in self._streams if s.lines_lost}
        self._info.update(
            extra_info,
            closed=True,
            end_unix=round(time.time(), 3),
            last_step=self.last_step,
            steps_seen=self.steps_seen,
            steps_kept=self.steps_kept,
            dropped=dropped,
            **self._metric_bound_info(),
        )
        try:
            write_json_atomic(self.dir / INFO_FILE, self._info)
        except OSError as exc:
            warn_once(f"close:{self.dir}", f"cannot mark {self.dir} closed ({exc.strerror or exc})")

    def amend_info(self, **fields: Any) -> None:
        """Add fields to `info.json` after `close` (the end of the fit's teardown, which follows it)."""
        if not self.usable or not self._info:
            return
        self._info.update(fields)
        try:
            write_json_atomic(self.dir / INFO_FILE, self._info)
        except OSError as exc:
            warn_once(f"amend:{self.dir}", f"cannot update {self.dir / INFO_FILE} ({exc.strerror or exc})")

    # -- records -----------------------------------------------------------------------------------

    def add_step(self, record: StepRecord | Mapping[str, Any]) -> None:
        """Record one optimizer step: a StepRecord (a RecordedStep carries the step's collectives), or, as
        written before the record was typed at its source, a mapping of the StepRecord fields with the
        step's collectives (CollectiveRecord fields but `step`) under "_collectives"."""
        collectives: Any
        if isinstance(record, StepRecord):
            collectives = getattr(record, "collectives", None)
            step = record.step
            row = _window_values(record)
        else:
            collectives = record.get("_collectives")
            if collectives is not None:
                record = {k: v for k, v in record.items() if k != "_collectives"}
            step = record["step"]
            row = tuple(map(record.get, _WINDOW_FIELDS))
        loss = record.loss if isinstance(record, StepRecord) else record.get("loss")
        if not self._nonfinite_loss_recorded and isinstance(loss, float) and not math.isfinite(loss):
            self._nonfinite_loss_recorded = True
            self.add_event("nonfinite_loss", step=step, value=_NONFINITE.get(loss, "nan"))
        window_id = step // self.policy.window_steps
        if self._window_id is not None and window_id != self._window_id:
            self._emit_window()
        self._window_id = window_id
        self._window.add(row)
        if self.policy.keeps(step, self.steps_seen):
            if isinstance(record, StepRecord):
                self._steps.append(_typed_line(record, _STEP_FIELDS, _step_values))
            else:
                self._steps.append(dumps_line(record))
            self.steps_kept += 1
            # Every collective of a kept step; the others are in the step's comm_* figures and windows.
            for collective in collectives or ():
                if isinstance(collective, CollectiveRecord):
                    self._collectives.append(_typed_line(collective, _COLLECTIVE_FIELDS, _collective_values))
                else:
                    self._collectives.append(dumps_line({"step": step, **collective}))
        self.steps_seen += 1
        self.last_step = step
        self._steps_since_flush += 1
        if (
            self._steps_since_flush >= self.policy.flush_every_steps
            or time.monotonic() - self._last_flush >= self.policy.flush_every_s
        ):
            self.flush()

    @property
    def _streams(self) -> tuple[_Stream, ...]:
        return (self._steps, self._windows, self._events, self._telemetry, self._collectives, self._metrics)

    def add_metric(self, record: MetricRecord) -> bool:
        """One value of a metric the training logged, where the bound keeps it (`MetricBound`); True if
        kept. Written with the next flush. From one thread at a time (the session's drainer)."""
        if not self.metric_bound.keeps(record.name, record.source, record.value):
            return False
        self._metrics.append(metric_line(record))
        return True

    def _metric_bound_info(self) -> dict[str, Any]:
        """For info.json: the metric names dropped past the bound and those whose validation values were
        capped, where any were."""
        bound, out = self.metric_bound, {}
        if bound.names_dropped:
            out["metric_names_dropped"] = list(bound.names_dropped)
            out["metric_values_dropped"] = bound.values_dropped
        if bound.validation_capped:
            out["metric_validation_capped"] = sorted(bound.validation_capped)
        return out

    def add_collective(self, record: CollectiveRecord | Mapping[str, Any]) -> None:
        """One timed collective (a CollectiveRecord, or a mapping of its fields); written with the next
        flush."""
        if isinstance(record, CollectiveRecord):
            self._collectives.append(_typed_line(record, _COLLECTIVE_FIELDS, _collective_values))
        else:
            self._collectives.append(dumps_line(record))

    def add_event(self, kind: str, **fields: Any) -> None:
        self._events.append(dumps_line({"t": round(time.time(), 3), "kind": kind, **fields}))

    def add_telemetry(self, sample: Mapping[str, Any]) -> None:
        self._telemetry.append(dumps_line(sample))
        if time.monotonic() - self._last_telemetry_flush >= self.policy.flush_every_s:
            self._last_telemetry_flush = time.monotonic()
            self._telemetry.flush()

    def flush(self) -> None:
        self._steps.flush()
        self._windows.flush()
        self._events.flush()
        self._collectives.flush()
        self._metrics.flush()
        self._steps_since_flush = 0
        self._last_flush = time.monotonic()
        if self.after_flush is not None:
            self.after_flush()

    def _emit_window(self) -> None:
        if self._window.count:
            self._windows.append(dumps_line(self._window.as_record()))
        self._window = _Window()
