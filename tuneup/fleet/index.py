"""The index of many runs: INDEX_DIR/runs.parquet (one row per run) and INDEX_DIR/steps.parquet (each
run's step-time summary), kept up to date incrementally.

- A run is keyed by its location (an absolute path or a URL). Its fingerprint (tuneup.fleet.scan) says
  whether it changed: an unchanged run is never read again, its rows are copied from the index as they
  are; a new or changed one is loaded, analysed and advised on, in a pool of processes when there are many.
- A run whose record cannot be read keeps a row with `error` set and its figures null; it is tried again
  only when its fingerprint changes.
- A run that is gone from a location being indexed loses its rows; runs under locations not named this
  time are kept, so that `tuneup index A` then `tuneup index B` indexes both.
- Both files are rewritten whole and atomically (a temporary file, then os.replace): a reader sees the old
  index or the new one, never half of one.

Parquet, written by pyarrow, is read alike by DuckDB (`query`), Spark, Trino, Athena and BigQuery. The
column list is here only (RUNS_SCHEMA, STEPS_SCHEMA): the dashboard reads these names.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tuneup.analyze.model import BADPUT_CATEGORIES
from tuneup.fleet.scan import FoundRun, ScanError, normalized_location, scan
from tuneup.record.schema import MANIFEST_FILE

if TYPE_CHECKING:
    from tuneup.cost.options import CostOptions

RUNS_FILE = "runs.parquet"
STEPS_FILE = "steps.parquet"
DEFAULT_INDEX_DIR = "tuneup-index"

_F64 = pa.float64()
_TS = pa.timestamp("us", tz="UTC")

RUNS_SCHEMA = pa.schema(
    [
        ("run_key", pa.string()),  # the run's location: an absolute path or a URL (the primary key)
        ("run_id", pa.string()),
        ("fingerprint", pa.string()),
        ("indexed_unix", _F64),  # when this row was made
        ("error", pa.string()),  # why the record could not be read; null for a run that was
        ("start", _TS),
        ("end", _TS),
        ("duration_s", _F64),  # the badput ledger's wall time (restarts included), else the record's span
        ("tags", pa.map_(pa.string(), pa.string())),
        ("instance", pa.string()),  # the priced catalog instance's key (aws:p4d.24xlarge); null: none
        ("gpu", pa.string()),  # the GPU model(s) the run saw; "cpu" for none
        ("world_size", pa.int32()),
        ("num_nodes", pa.int32()),
        ("strategy", pa.string()),
        ("precision", pa.string()),
        ("global_batch_size", pa.int64()),
        ("accumulate_grad_batches", pa.int32()),
        ("git_commit", pa.string()),
        ("git_dirty", pa.bool_()),
        ("status", pa.string()),  # the stop reason (max_steps, ...), else completed / interrupted / ...
        ("usd", _F64),  # the ledger's dollars, else the cost section's so far
        ("usd_per_hour", _F64),
        ("device_hours", _F64),
        ("samples", pa.int64()),  # trained, every rank and segment
        ("tokens", pa.int64()),
        ("samples_per_s", _F64),  # steady state, summed over ranks (the report's)
        ("tokens_per_s", _F64),
        ("usd_per_million_samples", _F64),
        ("usd_per_million_tokens", _F64),
        ("mfu", _F64),
        ("step_median_ms", _F64),
        ("step_p95_ms", _F64),  # the report's step-time p95 (the analysis quotes no p90)
        ("useful_share", _F64),
        ("badput_usd", _F64),
        *[(f"{c}_{unit}", _F64) for c in BADPUT_CATEGORIES for unit in ("s", "usd")],
        ("top_recommendation", pa.string()),  # the advice's first recommendation's title
        ("top_gain", _F64),  # its predicted relative gain (+0.2: 20% better on its objective)
        ("recommendations", pa.int32()),
    ]
)

STEPS_SCHEMA = pa.schema(
    [
        ("run_key", pa.string()),
        ("window", pa.int32()),  # 0, 1, ... in step order; at most row.MAX_STEP_WINDOWS per run
        ("first_step", pa.int64()),
        ("last_step", pa.int64()),
        ("step_median_ms", _F64),
        ("samples_per_s", _F64),
    ]
)

# Fewer runs to read than this are read in this process: starting a pool (each worker imports the
# analysis) costs more than it saves, and a re-index with one new run must take seconds.
POOL_FROM_RUNS = 16
ROWS_PER_TASK = 16  # runs a worker takes at a time: few enough round trips, even enough ends
COLLECT_AFTER_OBJECTS = 100_000


class FleetIndexError(Exception):
    """An index directory that cannot be read or written; the message names it and the fix."""


@dataclass(frozen=True, slots=True)
class IndexResult:
    runs: int  # rows in the index now
    found: int  # runs under the locations indexed this time
    read: int  # new or changed: loaded and analysed
    unchanged: int  # same fingerprint as indexed: skipped
    unreadable: int  # found runs whose row holds an error (read now or kept)
    dropped: int  # rows of runs gone from the locations indexed
    seconds: float
    index_dir: Path


# -- reading ------------------------------------------------------------------------------------------


def read_index(index_dir: str | os.PathLike[str]) -> tuple[pa.Table, pa.Table]:
    """(runs, steps) as pyarrow tables; empty tables of the schemas where the index has no file yet.
    FleetIndexError names a file that is not an index tuneup wrote."""
    return _read(Path(index_dir) / RUNS_FILE, RUNS_SCHEMA), _read(Path(index_dir) / STEPS_FILE, STEPS_SCHEMA)


def _read(path: Path, schema: pa.Schema) -> pa.Table:
    if not path.exists():
        return schema.empty_table()
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise FleetIndexError(f"cannot read {path}: {exc}; remove it to index from scratch") from None
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise FleetIndexError(
            f"{path} lacks the columns {', '.join(missing[:5])}: an index of another tuneup version; remove "
            "it to index from scratch"
        )
    return table.select(schema.names).cast(schema)


def connect(index_dir: str | os.PathLike[str]) -> Any:
    """A DuckDB connection with the index's tables as `runs` and `steps` (read by `read_index`, which checks
    their columns), its time zone UTC so that days, weeks and months are the same wherever it runs.
    FleetIndexError says what is missing: DuckDB, the directory, or the index in it."""
    try:
        import duckdb
    except ImportError as exc:
        raise FleetIndexError(
            f"querying the index needs DuckDB ({exc}); install the fleet extra: pip install 'tuneup[fleet]'"
        ) from None
    root = Path(index_dir)
    if not root.exists():
        raise FleetIndexError(
            f"{root} does not exist; build an index first: tuneup index RUN_DIR... --index {root}"
        )
    if not (root / RUNS_FILE).is_file():
        raise FleetIndexError(
            f"{root} is not a fleet index (no {RUNS_FILE} in it); pass the directory tuneup index wrote"
        )
    runs, steps = read_index(root)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("runs", runs)
    con.register("steps", steps)
    return con


def query(index_dir: str | os.PathLike[str], sql: str) -> Any:
    """A DuckDB relation for `sql` over the index, with `runs` and `steps` as `connect` gives them
    (`query(d, "SELECT instance, sum(exposed_communication_usd) FROM runs GROUP BY 1").fetchall()`)."""
    return connect(index_dir).sql(sql)


# -- one run ------------------------------------------------------------------------------------------


def index_run(found: FoundRun, cost: CostOptions | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(runs row, steps rows) of one run: loaded (every segment), analysed and advised on as its report
    would be; an unreadable record gives an error row and no steps."""
    from tuneup.record import RunRecordError
    from tuneup.record.remote import is_url

    try:
        if is_url(found.key):
            with tempfile.TemporaryDirectory(prefix="tuneup-index-") as local:
                return _analysed(found, _materialized(found.key, Path(local)), cost)
        return _analysed(found, found.key, cost)
    except (RunRecordError, ValueError, OSError) as exc:
        from tuneup.fleet.row import error_row

        return error_row(found.key, found.fingerprint, _one_line(exc)), []


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _materialized(url: str, into: Path) -> Path:
    """The run at `url` copied into `into` (a directory removed after the run is read: the reader's own
    copy of a URL run lives until the process ends, and pool workers never run their exit handlers)."""
    from tuneup.record import RunRecordError
    from tuneup.record.remote import materialize

    try:
        return materialize(url, into)
    except FileNotFoundError:
        raise RunRecordError(f"{url} holds nothing") from None


def _analysed(
    found: FoundRun, location: str | Path, cost: CostOptions | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from tuneup.analyze.analysis import analyze_run
    from tuneup.fleet.row import run_row, step_rows
    from tuneup.record.segments import load_segments

    runs = load_segments(location)
    last = runs[-1]
    analysis = analyze_run(last, _cost_for(last, cost), runs)
    return (
        run_row(found.key, found.fingerprint, runs, analysis, _advice(analysis)),
        step_rows(found.key, runs),
    )


def _advice(analysis: Any) -> Any:
    """The report's recommendations for the run; None where there are none to make (no steady state, no
    batch size) or the advice failed (the run's figures are still indexed)."""
    from tuneup.advise import advise
    from tuneup.advise.model import AdviceOptions

    try:
        # Without the what-if over the catalog's instances: it makes no recommendation (advise ranks them
        # before it runs), the index keeps none of its table, and it is the advice's costliest part
        # (about 25 ms of a run's 35).
        return advise([analysis], AdviceOptions(whatif=False))
    except Exception:  # AdviceInputError, ModelError, or a defect: the figures stand without advice
        return None


def _cost_for(run: Any, cost: CostOptions | None) -> CostOptions | None:
    """The index's price options for `run`: all of them where the run recorded no price; where it did, its
    own price stands (the electricity price and the targets still apply)."""
    if cost is None or cost.price is None:
        return cost
    recorded = run.manifest.raw.get("pricing")
    if isinstance(recorded, dict) and (recorded.get("instance") or recorded.get("price_per_hour")):
        import dataclasses

        return dataclasses.replace(cost, price=None)
    return cost


def _index_chunk(
    chunk: list[FoundRun], cost: CostOptions | None
) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    from tuneup._gc import cyclic_gc_paused

    # A run's analysis makes many objects and no cycles: the cyclic collector walking them again and
    # again took a third of a run's time. One collection after the chunk, where it kept many.
    with cyclic_gc_paused(collect_after_objects=COLLECT_AFTER_OBJECTS):
        return [index_run(found, cost) for found in chunk]


# -- the whole index ----------------------------------------------------------------------------------


def _settings_digest(cost: CostOptions | None) -> str:
    """What else a row depends on than the run's files: the price options and tuneup's version. In the
    stored fingerprint, so that indexing again with another price (or after an upgrade) reads every run
    again rather than keeping rows made another way."""
    import hashlib

    from tuneup._version import __version__

    text = f"{__version__}|{cost!r}"
    return hashlib.blake2b(text.encode("utf-8"), digest_size=4).hexdigest()


def _under(key: str, locations: Sequence[str]) -> bool:
    return any(key == loc or key.startswith(loc.rstrip("/") + "/") for loc in locations)


def _chunks(items: list[FoundRun], size: int) -> list[list[FoundRun]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _read_all(
    todo: list[FoundRun], cost: CostOptions | None, workers: int
) -> Iterable[tuple[dict[str, Any], list[dict[str, Any]]]]:
    if workers <= 1 or len(todo) < POOL_FROM_RUNS:
        return [row for chunk in _chunks(todo, ROWS_PER_TASK) for row in _index_chunk(chunk, cost)]
    import multiprocessing

    # Forked where the platform can: a worker starts in milliseconds with the analysis already imported,
    # and a script that calls update_index without a `__main__` guard is not run again in each worker. The
    # workers never touch pyarrow (whose threads the parent may have started): they read runs, return dicts.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    chunks = _chunks(todo, ROWS_PER_TASK)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_worker_start) as pool:
        return [item for part in pool.map(_index_chunk, chunks, [cost] * len(chunks)) for item in part]


def _worker_start() -> None:
    """A worker's start: what it inherited (modules, the parent's objects) moved out of the collector's
    sight, so that each collection after a chunk walks the chunk's objects only."""
    import gc

    gc.freeze()


def default_workers() -> int:
    """One worker per core the process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def update_index(
    locations: Sequence[str],
    index_dir: str | os.PathLike[str],
    cost: CostOptions | None = None,
    workers: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> IndexResult:
    """Index the runs at or under `locations` (directories or fsspec URLs) into `index_dir`, reading only
    the new and changed ones. Raises ScanError for a location that cannot be walked or holds no run, and
    FleetIndexError for an index directory that cannot be read or written."""
    started = clock()
    index_path = Path(index_dir)
    if index_path.exists() and not index_path.is_dir():
        raise FleetIndexError(f"--index {index_path} is a file; pass a directory (it holds {RUNS_FILE})")
    old_runs, old_steps = read_index(index_path)

    roots = [normalized_location(loc) for loc in locations]
    salt = _settings_digest(cost)
    found: dict[str, FoundRun] = {}
    for location, root in zip(locations, roots, strict=True):
        runs_here = scan(root)
        if not runs_here:
            raise ScanError(
                f"{location} holds no run record (no {MANIFEST_FILE} in it or below it); pass a run "
                "directory or a directory of runs"
            )
        found.update((r.key, FoundRun(r.key, f"{r.fingerprint}.{salt}")) for r in runs_here)

    known = dict(
        zip(old_runs.column("run_key").to_pylist(), old_runs.column("fingerprint").to_pylist(), strict=True)
    )
    todo = [r for key, r in sorted(found.items()) if known.get(key) != r.fingerprint]
    unchanged = len(found) - len(todo)
    # Kept: unchanged runs, and runs under locations not indexed this time; dropped: the rest.
    keep_keys = [
        k for k in known if (k in found and found[k].fingerprint == known[k]) or not _under(k, roots)
    ]
    dropped = sum(1 for k in known if k not in found and _under(k, roots))

    results = list(_read_all(todo, cost, workers if workers is not None else default_workers()))
    now = time.time()
    new_runs = [{**row, "indexed_unix": now} for row, _ in results]
    new_steps = [s for _, steps in results for s in steps]

    keep = pa.array(keep_keys, pa.string())
    runs = pa.concat_tables(
        [
            old_runs.filter(pc.is_in(old_runs.column("run_key"), value_set=keep)),
            pa.Table.from_pylist(new_runs, schema=RUNS_SCHEMA),
        ]
    ).sort_by("run_key")
    steps = pa.concat_tables(
        [
            old_steps.filter(pc.is_in(old_steps.column("run_key"), value_set=keep)),
            pa.Table.from_pylist(new_steps, schema=STEPS_SCHEMA),
        ]
    )
    _write(index_path, {RUNS_FILE: runs, STEPS_FILE: steps})
    errors = runs.filter(pc.invert(pc.is_null(runs.column("error"))))
    unreadable = sum(1 for key in errors.column("run_key").to_pylist() if key in found)
    return IndexResult(
        runs=runs.num_rows,
        found=len(found),
        read=len(todo),
        unchanged=unchanged,
        unreadable=unreadable,
        dropped=dropped,
        seconds=clock() - started,
        index_dir=index_path,
    )


def _write(index_dir: Path, tables: dict[str, pa.Table]) -> None:
    """Each table to its file, atomically: written beside it under a temporary name, then moved over it."""
    try:
        index_dir.mkdir(parents=True, exist_ok=True)
        for name, table in tables.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=index_dir)
            os.close(fd)
            try:
                pq.write_table(table, tmp, compression="zstd")
                os.replace(tmp, index_dir / name)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
    except OSError as exc:
        raise FleetIndexError(
            f"cannot write the index in {index_dir}: {exc.strerror or exc}; pass a writable --index directory"
        ) from None
