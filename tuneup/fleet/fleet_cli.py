"""`tuneup fleet INDEX`: the fleet dashboard of an index that `tuneup index` wrote, as a static HTML page,
Markdown, JSON, or a summary on the terminal."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

DEFAULT_OUT = "reports/fleet"


def add_command(sub: Any, usage_error: type[Exception]) -> None:
    fleet = sub.add_parser(
        "fleet",
        help="the fleet dashboard of an index of runs: spend by tag and instance, $ per 1M samples, the badput "
        "ledger summed, the most expensive runs, regressions",
        description="Render the index `tuneup index` wrote: spend over time by tag and instance type, $ per 1M "
        "samples (and tokens) by configuration, the badput ledger summed across runs, the most expensive runs "
        "with their top recommendation, and regressions between consecutive runs of one tag value. The HTML "
        "page is static (no server, no script) and filters by tag value and period.",
    )
    fleet.add_argument("index", metavar="INDEX", help="the index directory (runs.parquet, steps.parquet)")
    fleet.add_argument(
        "-o",
        "--out",
        default=DEFAULT_OUT,
        metavar="OUT_DIR",
        help="where the files go (default: %(default)s)",
    )
    fleet.add_argument(
        "--format",
        default="html",
        help="comma-separated: html, md, json, text (text prints to the terminal; default: %(default)s)",
    )
    fleet.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only runs with this tag (repeatable: all must match)",
    )
    fleet.add_argument(
        "--since", metavar="DATE", help="only runs started on or after DATE (YYYY-MM-DD[THH:MM], UTC)"
    )
    fleet.add_argument(
        "--until", metavar="DATE", help="only runs started on or before DATE (a bare date: that whole day)"
    )
    fleet.add_argument(
        "--group-by",
        metavar="TAGKEY",
        help="the tag whose values group runs (filters, spend, regressions; default: project, else experiment)",
    )

    def run(args: argparse.Namespace) -> int:
        return cmd_fleet(args, usage_error)

    fleet.set_defaults(func=run)


def _formats(value: str, usage_error: type[Exception]) -> tuple[str, ...]:
    from tuneup.fleet.render import FORMATS

    chosen = [f.strip().lower() for f in value.split(",") if f.strip()]
    chosen = ["md" if f == "markdown" else f for f in chosen]
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown or not chosen:
        raise usage_error(
            f"--format {value!r}: choose one or more of {', '.join(FORMATS)}, comma-separated (e.g. --format html,text)"
        )
    return tuple(dict.fromkeys(chosen))


def cmd_fleet(args: argparse.Namespace, usage_error: type[Exception]) -> int:
    formats = _formats(args.format, usage_error)
    try:
        from tuneup.fleet.dashboard import build_fleet_view, parse_tag
        from tuneup.fleet.index import FleetIndexError
    except ImportError as exc:  # the fleet extra (pyarrow, DuckDB) is optional
        raise usage_error(
            f"tuneup fleet needs pyarrow and DuckDB ({exc.name} is missing): pip install 'tuneup[fleet]'"
        ) from None
    from tuneup.report import ReportError

    try:
        tags = dict(parse_tag(t) for t in args.tag)
        view = build_fleet_view(
            args.index, tags=tags, since=args.since, until=args.until, group_by=args.group_by
        )
    except FleetIndexError as exc:
        # One line: a Parquet reader's message can run to several.
        raise usage_error(" ".join(str(exc).split())) from None
    from tuneup.fleet.render import render_text, write_fleet

    files = [f for f in formats if f != "text"]
    if files:
        try:
            written = write_fleet(view, Path(args.out), files)
        except ReportError as exc:
            raise usage_error(str(exc)) from None
        for path in written:
            if path.suffix != ".png":
                print(f"tuneup fleet: wrote {path}", file=sys.stderr)
    if "text" in formats:
        print(render_text(view), end="")
    return 0
