"""The `tuneup` command.

    tuneup report RUN_DIR   the run as HTML, Markdown and JSON, with plots
    tuneup show RUN_DIR     headline figures, findings and warnings of a recorded run, in the terminal
    tuneup catalog          the cloud instances (USD/hour) a run can be priced with
    tuneup probe-network    time collectives over message sizes (under torchrun) and fit the link
    tuneup demo             train a small transformer LM with the callback, then report on its run
    tuneup bench            run a training workload N times, alternating with a baseline, and compare
    tuneup compare          a candidate's runs against a baseline's: a verdict per metric, exit 1 on regression
    tuneup baseline         save or update a baseline file to commit, for compare
    tuneup advise           what to change, with predicted gains and the Lightning code
    tuneup tune             find the best settings in short, supervised trials of your training command

Input errors print one line on stderr and exit with code 2; they never print a traceback. Heavy
imports (torch, Lightning) happen only inside the commands that train, so `tuneup --help` is fast.

RUN_DIR (report, show) is a run directory, or a directory that holds exactly one run one or two levels
down (such as the `reports/demo` that `tuneup demo` writes): that run is used, and stderr says which.

A reader that stops early (`tuneup catalog | head -1`) ends any command quietly, with no message and
exit status 141 (128 + SIGPIPE), as coreutils and git report it: a pipeline with `set -o pipefail`
tells it apart from success (0), a regression found by compare (1) and bad input (2).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tuneup._cli_common import UsageError, add_cost_arguments, cost_options, resolve_run_dir, target_option
from tuneup._gc import cyclic_gc_paused
from tuneup._version import __version__
from tuneup.launch import terminate_as_exit

if TYPE_CHECKING:
    from tuneup.catalog import InstanceCatalog
    from tuneup.cost.options import CostOptions
    from tuneup.report import WrittenReport
    from tuneup.target import Target

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for `cat` or `git log` cut off by `| head`
EXIT_INTERNAL_ERROR = (
    70  # sysexits.h EX_SOFTWARE: a bug of tuneup's, told apart from a regression (1) and bad input (2)
)


def format_summary(run_dir: str | Path, cost: CostOptions | None = None, target: Target | None = None) -> str:
    """The headline figures, findings and warnings of a run, for the terminal; `cost` prices it, `target`
    adds the time and cost to a quality target."""
    from tuneup.report import analyze
    from tuneup.report.terminal import render_terminal

    return render_terminal(analyze(run_dir, cost, target))


def add_target_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        metavar="METRIC<=VALUE",
        help="a quality target on a metric the run logged, e.g. 'val_loss<=2.1' or 'val_acc>=0.9': when and "
        "at what cost the run reached it, or a projection (default: the target the callback recorded)",
    )


def _write_report(
    run_dir: str | Path,
    out_dir: Path | None,
    formats: str,
    cost: CostOptions | None = None,
    target: Target | None = None,
) -> int:
    from tuneup.record import RunRecordError
    from tuneup.report import ReportError, write_report

    try:
        written = write_report(run_dir, out_dir, formats, cost, target)
    except (RunRecordError, ReportError) as exc:
        raise UsageError(str(exc)) from None
    _say_written(written)
    return 0


def _write_tune_report(tune_dir: Path, out_dir: Path | None, formats: str) -> int:
    from tuneup.tune.render import write_tune_report
    from tuneup.tune.state import TuneStateError

    try:
        written = write_tune_report(tune_dir, out_dir, formats)
    except TuneStateError as exc:
        raise UsageError(str(exc)) from None
    for path in written:
        print(f"wrote {path}")
    return 0


def _say_written(written: WrittenReport) -> None:
    for path in written.files:
        if path.suffix != ".png":
            print(f"wrote {path}")
    plots = [p for p in written.files if p.suffix == ".png"]
    if plots:
        print(f"wrote {len(plots)} plot(s) beside them in {written.out_dir}")
    for finding in written.findings:
        print(f"{finding.severity}: {finding.title}")
    if written.warnings:
        # The report holds them in full; one line each here so a CI log shows them too.
        for warning in written.warnings:
            print(f"warning: {warning}", file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> int:
    from tuneup.tune.state import is_tune_dir

    if is_tune_dir(Path(args.run_dir)):
        return _write_tune_report(Path(args.run_dir), Path(args.out) if args.out else None, args.format)
    target = target_option(args)
    return _write_report(
        resolve_run_dir(args.run_dir, args.command),
        Path(args.out) if args.out else None,
        args.format,
        cost_options(args),
        target,
    )


def _price_dates_text(catalog: InstanceCatalog) -> str:
    dates = catalog.as_of_dates()
    if dates.earliest is None:
        return "prices undated"
    span = dates.earliest if dates.earliest == dates.latest else f"{dates.earliest} to {dates.latest}"
    return f"prices as of {span}" + (f" ({dates.undated} undated)" if dates.undated else "")


def format_catalog(catalog: InstanceCatalog, gpu: str | None = None, doubt_width: int | None = None) -> str:
    """The catalog's rows as a table; the header's counts and dates describe these rows only.

    A doubtful row's doubt column points to a footnote under the table that says why (rows with the
    same doubt share one). `doubt_width` cuts each footnote to one line of that many characters;
    None prints them in full.
    """
    from tuneup.report.format import plural

    matching = f" with a GPU matching {gpu!r}" if gpu else ""
    lines = [
        f"catalog {catalog.version}: {plural(len(catalog), 'instance')}{matching}, {_price_dates_text(catalog)}"
        + (f", with {catalog.user_catalog}" if catalog.user_catalog else ""),
        f"  {'key':<42} {'GPUs':<18} {'USD/h':>9} {'spot':>9}  as of       doubt",
    ]
    footnotes: dict[str, int] = {}  # doubt text -> its footnote number, in order of first appearance
    for r in catalog:
        spot = f"{r.spot_usd_per_hour:,.2f}" if r.spot_usd_per_hour is not None else "-"
        mark = f"[{footnotes.setdefault(r.doubt, len(footnotes) + 1)}]" if r.doubt else ""
        lines.append(
            f"  {r.qualified_key:<42} {f'{r.gpu_count} x {r.gpu}':<18} {r.on_demand_usd_per_hour:>9,.2f} "
            f"{spot:>9}  {r.as_of_date or 'undated':<11} {mark}".rstrip()
        )
    shortened = False
    if footnotes:
        lines.append("why a row is doubtful:")
        for doubt, n in footnotes.items():
            marker = f"  [{n}] "
            if doubt_width is not None and len(marker) + len(doubt) > doubt_width:
                # At a word boundary, so that what is left reads as the start of the sentence.
                # Not at a hyphen either: "3rd- ..." reads as a typo.
                doubt = textwrap.TextWrapper(
                    width=max(doubt_width - len(marker), 20),
                    max_lines=1,
                    placeholder=" ...",
                    break_on_hyphens=False,
                ).fill(doubt)
                shortened = True
            lines.append(marker + doubt)
    if shortened:
        lines.append("(doubts cut to the terminal's width: `tuneup catalog | less` shows them in full)")
    lines.append(
        "the report shows the doubt of the row it prices with; --catalog FILE adds or overrides rows"
    )
    return "\n".join(lines)


def cmd_catalog(args: argparse.Namespace) -> int:
    from tuneup.catalog import CatalogError, load_instances

    try:
        catalog = load_instances(args.catalog).with_gpu(args.gpu)
    except CatalogError as exc:
        raise UsageError(str(exc)) from None
    if not len(catalog):
        raise UsageError(f"no instance with a GPU matching {args.gpu!r}; run tuneup catalog without --gpu")
    # On a terminal each doubt fits one line; into a pipe or a file (grep, less) it goes in full.
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    print(format_catalog(catalog, args.gpu, doubt_width=max(width, 40) if width else None))
    return 0


def cmd_probe_network(args: argparse.Namespace) -> int:
    from tuneup import probe

    try:
        return probe.run(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_show(args: argparse.Namespace) -> int:
    from tuneup.record import RunRecordError
    from tuneup.report import ReportError

    cost = cost_options(args)
    target = target_option(args)
    run_dir = resolve_run_dir(args.run_dir, args.command)
    try:
        print(format_summary(run_dir, cost, target))
    except (RunRecordError, ReportError) as exc:
        raise UsageError(str(exc)) from None
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from tuneup.demo import DemoConfig, run_demo

    try:
        config = DemoConfig(out_dir=Path(args.out), max_steps=args.steps, devices=args.devices)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    cost = cost_options(args)  # checked before training, so that a typo costs no training time
    run_dir = run_demo(config)
    if run_dir is not None:  # rank 0 only; the other DDP ranks return None
        from tuneup.record import RunRecordError
        from tuneup.report import ReportError, analyze, write_analysis
        from tuneup.report.terminal import render_terminal

        try:
            analysis = analyze(run_dir, cost)  # once, for the terminal and the report files alike
            print()
            print(render_terminal(analysis))
            print()
            print(f"run record: {run_dir}")
            _say_written(write_analysis(analysis, config.out_dir))
        except (RunRecordError, ReportError) as exc:
            raise UsageError(str(exc)) from None
        print(f"open {config.out_dir / 'report.html'} in a browser, or read {config.out_dir / 'report.md'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tuneup",
        description="Where the time and money of a PyTorch Lightning training run go, and what to change.",
    )
    parser.add_argument("--version", action="version", version=f"tuneup {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    report = sub.add_parser(
        "report",
        help="write the run's report as HTML, Markdown and JSON, with plots",
        description="Write the report of a recorded run: one self-contained HTML page, Markdown for a CI "
        "job summary or PR comment (plots as PNG files beside it), and versioned JSON for machines.",
    )
    report.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="a run directory written by TuneupCallback, or a directory that holds one run",
    )
    report.add_argument("-o", "--out", metavar="OUT_DIR", help="where to write (default: reports/<run id>/)")
    report.add_argument(
        "--format", default="html,md,json", help="comma-separated: html, md, json (default: %(default)s)"
    )
    add_cost_arguments(report)
    add_target_argument(report)
    report.set_defaults(func=cmd_report)

    catalog = sub.add_parser(
        "catalog",
        help="list the cloud instances tuneup can price a run with",
        description="List the packaged catalog of cloud GPU instances (on-demand and spot USD/hour, as-of "
        "dates), extended or overridden by --catalog.",
    )
    catalog.add_argument(
        "--gpu",
        help="only instances with this GPU: whole parts of its name, e.g. H100 or A100-80GB (L4 is not L40S)",
    )
    catalog.add_argument(
        "--catalog", metavar="CSV", help="instances that extend or override the packaged ones"
    )
    catalog.set_defaults(func=cmd_catalog)

    probe = sub.add_parser(
        "probe-network",
        help="time collectives over a range of message sizes, like nccl-tests, and fit the link's alpha-beta",
        description="Launch a collective benchmark under torchrun (all-reduce, all-gather, reduce-scatter over a "
        "range of message sizes), record it as a run, and print the algbw/busbw table and the alpha-beta fit.",
    )
    from tuneup import probe as probe_module

    probe_module.add_arguments(probe)
    probe.set_defaults(func=cmd_probe_network)

    show = sub.add_parser("show", help="headline figures and warnings of a recorded run")
    show.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="a run directory written by TuneupCallback, or a directory that holds one run",
    )
    add_cost_arguments(show)
    add_target_argument(show)
    show.set_defaults(func=cmd_show)

    demo = sub.add_parser(
        "demo",
        help="train a small transformer LM on synthetic tokens with TuneupCallback, then show the run",
        description="Train a small transformer language model on synthetic tokens with TuneupCallback "
        "(DDP over 2 processes where 2 CPU cores or GPUs exist), then show the recorded run.",
    )
    demo.add_argument(
        "--out", default="reports/demo", help="where the run record goes (default: %(default)s)"
    )
    demo.add_argument(
        "--steps", type=int, default=300, help="optimizer steps to train (default: %(default)s)"
    )
    demo.add_argument(
        "--devices",
        type=int,
        default=None,
        help="processes/GPUs (default: 2 where 2 cores or GPUs exist, else 1)",
    )
    add_cost_arguments(demo)
    demo.set_defaults(func=cmd_demo)

    from tuneup.compare.commands import add_commands

    add_commands(sub, UsageError)
    from tuneup.advise_cli import add_command

    add_command(sub, UsageError)
    from tuneup.tune.command import add_command as add_tune_command

    add_tune_command(sub, UsageError)
    from tuneup.fleet.index_cli import add_command as add_index_command

    add_index_command(sub, UsageError)
    from tuneup.fleet.fleet_cli import add_command as add_fleet_command

    add_fleet_command(sub, UsageError)
    from tuneup.compare.regressions_cli import add_command as add_regressions_command

    add_regressions_command(sub, UsageError)
    return parser


# Commands that read runs and exit. A run's records are millions of small objects without cycles; the
# cyclic collector would walk them again and again (seconds for a 1,024-rank run) and free nothing.
_READS_RUNS = frozenset({"report", "show", "compare", "advise"})


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _dispatch(argv)
        finally:
            # Output into a pipe is buffered: flushed here, a reader that stopped early raises below
            # rather than at interpreter exit, where Python could only print "Exception ignored".
            if sys.stdout is not None:
                sys.stdout.flush()
    except BrokenPipeError:
        # The reader has all it wanted (`| head`): not an error of anyone's, so nothing to say.
        _discard_output_to_closed_pipes()
        return EXIT_BROKEN_PIPE


def _discard_output_to_closed_pipes() -> None:
    """Point stdout, and stderr where its pipe is closed too, at the null device: what is still buffered
    for them is written there at interpreter exit, instead of raising BrokenPipeError again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
        try:
            sys.stderr.flush()
        except BrokenPipeError:
            os.dup2(devnull, sys.stderr.fileno())
    except (OSError, ValueError):
        pass  # a stream without a file descriptor (replaced in-process): nothing at exit to protect
    finally:
        os.close(devnull)


def _dispatch(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        # SIGTERM (a cancelled CI job, a scheduler's stop) ends the commands' process trees and runs their
        # cleanup (bench's baseline worktree, tune's trial), as Ctrl-C does; exit 143.
        with (
            terminate_as_exit(),
            cyclic_gc_paused() if args.command in _READS_RUNS else contextlib.nullcontext(),
        ):
            return int(args.func(args))
    except UsageError as exc:
        print(f"tuneup {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("tuneup: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise  # main's: the reader stopped early, whichever command was writing
    except Exception as exc:
        if os.environ.get("TUNEUP_DEBUG"):
            raise
        # A bug of tuneup's, not the user's input: say so in one line, and how to see the traceback.
        print(
            f"tuneup {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(rerun with TUNEUP_DEBUG=1 for the traceback, and please report it)",
            file=sys.stderr,
        )
        # Not 1: a CI job must not read tuneup's own failure as the regression `compare` exits 1 for.
        return EXIT_INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
