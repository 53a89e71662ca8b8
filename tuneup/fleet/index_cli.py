"""`tuneup index PATH_OR_URL... --index INDEX_DIR`: keep a Parquet index of the run records at or under
each location (directories or fsspec URLs), reading only the runs that are new or changed.

pyarrow (and DuckDB, to query the index) are the `fleet` extra; without them the command says so in one
line. Imports stay inside the command so that `tuneup --help` never loads them.
"""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_INDEX_DIR = "tuneup-index"  # tuneup.fleet.index's, spelled here so that --help imports no pyarrow
FLEET_EXTRA_HINT = "install the fleet extra: pip install 'tuneup[fleet]'"


def add_command(sub: Any, usage_error: type[Exception]) -> None:
    from tuneup._cli_common import add_cost_arguments

    index = sub.add_parser(
        "index",
        help="index many run records (directories or object-storage prefixes) into Parquet, incrementally",
        description="Walk directories or object-storage prefixes (s3://, gs://, memory://) for run records "
        "and keep INDEX_DIR/runs.parquet (one row per run: tags, instance, world size, start, duration, "
        "dollars, samples, tokens, rates, MFU, badput by category, the top recommendation) and "
        "INDEX_DIR/steps.parquet (each run's step-time summary). Runs already indexed and unchanged are not "
        "read again; runs gone from a location indexed lose their rows. Query the files with DuckDB, or "
        "any engine that reads Parquet (Spark, Trino, Athena, BigQuery).",
        usage="tuneup index [options] PATH_OR_URL [PATH_OR_URL...]",
    )
    index.add_argument(
        "locations", nargs="+", metavar="PATH_OR_URL", help="a run, or a directory or URL prefix of runs"
    )
    index.add_argument(
        "--index",
        metavar="INDEX_DIR",
        default=DEFAULT_INDEX_DIR,
        help="the local directory of the index (default: ./%(default)s)",
    )
    index.add_argument(
        "--workers",
        metavar="N",
        type=int,
        default=None,
        help="processes that read runs (default: one per core)",
    )
    add_cost_arguments(
        index,
        "price the runs that recorded no price (a run's own recorded price stands); `tuneup catalog` lists "
        "the instances",
    )

    def run(args: argparse.Namespace) -> int:
        return cmd_index(args, usage_error)

    index.set_defaults(func=run)


def cmd_index(args: argparse.Namespace, usage_error: type[Exception]) -> int:
    from tuneup._cli_common import cost_options
    from tuneup.record.remote import is_url

    if is_url(args.index):
        raise usage_error(f"--index {args.index}: the index is a local directory; pass a path")
    if args.workers is not None and args.workers < 1:
        raise usage_error(f"--workers must be at least 1, got {args.workers}")
    cost = cost_options(args)
    try:
        from tuneup.fleet.index import FleetIndexError, update_index
        from tuneup.fleet.scan import ScanError
    except ImportError as exc:
        raise usage_error(f"tuneup index needs pyarrow ({exc}); {FLEET_EXTRA_HINT}") from None
    try:
        result = update_index(
            args.locations,
            args.index,
            cost,
            workers=args.workers,
        )
    except (ScanError, FleetIndexError) as exc:
        raise usage_error(str(exc)) from None
    print(
        f"tuneup index: {result.found} runs indexed ({result.read} new or changed, {result.unchanged} "
        f"unchanged, {result.unreadable} unreadable"
        + (f", {result.dropped} gone and dropped" if result.dropped else "")
        + f") in {result.seconds:.1f} s: {result.index_dir}"
        + (f" ({result.runs} runs in all)" if result.runs != result.found else "")
    )
    return 0
