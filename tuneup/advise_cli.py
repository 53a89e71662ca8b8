"""`tuneup advise RUN_DIR [RUN_DIR...]`: what to change, as text, Markdown or JSON.

Each RUN_DIR is a run directory or a report.json; several runs of one workload (other batch sizes,
world sizes) fit the step-time model jointly, and the first is the setting to improve."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tuneup.advise import Advice, AdviceOptions
from tuneup.advise.model import MIN_GAIN

FORMATS = ("text", "md", "json")


def add_command(sub: Any, usage_error: type[Exception]) -> None:
    advise = sub.add_parser(
        "advise",
        help="recommend what to change (batch, data loading, communication, precision, instance), with "
        "predicted gains and the Lightning code",
        description="Recommend changes to a recorded run: each with its predicted gain and interval from a "
        "step-time model fitted to the run(s), the evidence, and the exact Lightning code. Pass several runs "
        "of one workload (other batch sizes or world sizes) to fit the model jointly; the first is the one "
        "to improve.",
    )
    advise.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (or report.json files)")
    advise.add_argument(
        "--format", default="text", choices=FORMATS, help="output format (default: %(default)s)"
    )
    advise.add_argument(
        "--link",
        metavar="PROBE_RUN",
        help="a `tuneup probe-network` run: the measured link the interconnect advice predicts with",
    )
    advise.add_argument(
        "--catalog", metavar="CSV", help="instances that extend the packaged catalog (what-if)"
    )
    advise.add_argument(
        "--instance", action="append", default=[], help="limit the what-if to this instance key (repeatable)"
    )
    advise.add_argument(
        "--target-samples", type=float, default=None, help="samples to train, for the what-if's $ to a target"
    )
    advise.add_argument(
        "--interruptions-per-hour",
        type=float,
        default=None,
        help="spot interruption rate for the what-if's expected rework",
    )
    advise.add_argument(
        "--global-batch", type=int, default=None, help="the what-if's global batch (default: the run's)"
    )
    advise.add_argument(
        "--nodes", type=int, default=None, help="the what-if's nodes per instance (default: 1)"
    )
    advise.add_argument(
        "--min-gain",
        type=float,
        default=MIN_GAIN,
        help="smallest predicted gain to recommend, a fraction (default: %(default)s)",
    )
    advise.add_argument("--no-whatif", action="store_true", help="skip the what-if over instances")

    def run(args: argparse.Namespace) -> int:
        return cmd_advise(args, usage_error)

    advise.set_defaults(func=run)


def _load(path: str | Path, usage_error: type[Exception]) -> Any:
    from tuneup.analyze.model import AnalysisFormatError, from_json
    from tuneup.record import RunRecordError
    from tuneup.record.remote import is_url
    from tuneup.report import ReportError, analyze

    if not is_url(path) and Path(path).is_file() and Path(path).suffix == ".json":
        path = Path(path)
        try:
            return from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, AnalysisFormatError) as exc:
            raise usage_error(f"{path} is not a report.json tuneup can read: {exc}") from None
    from tuneup.cli import resolve_run_dir

    try:
        return analyze(resolve_run_dir(path, "advise"))
    except (RunRecordError, ReportError) as exc:
        raise usage_error(str(exc)) from None


def _options(args: argparse.Namespace, usage_error: type[Exception]) -> AdviceOptions:
    for name in ("global_batch", "nodes"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise usage_error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    for name in ("target_samples", "interruptions_per_hour", "min_gain"):
        value = getattr(args, name)
        if value is not None and not (value >= 0 and value != float("inf")):
            raise usage_error(f"--{name.replace('_', '-')} must be a non-negative number, got {value}")
    if args.catalog is not None:
        from tuneup.catalog import CatalogError, load_instances

        try:
            load_instances(args.catalog)
        except CatalogError as exc:
            raise usage_error(str(exc)) from None
    fits = None
    if args.link:
        probe = _load(args.link, usage_error)
        if probe.communication is None or not probe.communication.fits:
            raise usage_error(
                f"{args.link} has no link fit; pass a run written by `tuneup probe-network` (or a multi-rank run)"
            )
        fits = tuple(probe.communication.fits)
    return AdviceOptions(
        link_fits=fits,
        whatif=not args.no_whatif,
        user_catalog=args.catalog,
        instances=tuple(args.instance),
        target_samples=args.target_samples,
        interruptions_per_hour=args.interruptions_per_hour,
        global_batch=args.global_batch,
        nodes=args.nodes,
        min_gain=args.min_gain,
    )


def cmd_advise(args: argparse.Namespace, usage_error: type[Exception]) -> int:
    from tuneup.advise import AdviceInputError, ModelError, advise

    analyses = [_load(p, usage_error) for p in args.runs]
    options = _options(args, usage_error)
    try:
        result = advise(analyses, options)
    except (AdviceInputError, ModelError) as exc:
        raise usage_error(str(exc)) from None
    print(render(result, args.format), end="")
    return 0


def render(advice: Advice, fmt: str) -> str:
    if fmt == "json":
        from tuneup.analyze.model import to_json
        from tuneup.report import json_text

        return json_text(to_json(advice))
    if fmt == "md":
        from tuneup.report.advice import advice_blocks
        from tuneup.report.blocks import Section
        from tuneup.report.markdown import render_section

        return (
            render_section(Section("recommendations", "Recommendations", tuple(advice_blocks(advice)))) + "\n"
        )
    from tuneup.report.advice import advice_text

    return "\n".join(advice_text(advice)) + "\n"
