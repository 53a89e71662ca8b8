"""The `tuneup compare`, `tuneup baseline` and `tuneup bench` commands.

Exit codes: 0 no regression, 1 regression (or, with `--inconclusive fail`, an inconclusive metric; with
`--target`, slower to the target by tuneup.compare.to_target's rule),
2 bad input (a missing or damaged side, a run compared with itself, different hardware, a workload that
fails). The CLI's UsageError is raised for code 2, so that every command reports input errors alike.
With `--detailed-exit-codes`: 0 no change, 1 regression, 2 bad input, 3 inconclusive, 4 improvement
(tuneup.compare.compare.Comparison.exit_code); not the default, since a CI job written for 0/1/2 would
fail on an improvement.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuneup.compare.runs import METRICS, CompareInputError, RunSummary, Side, load_side
from tuneup.compare.sequential import DEFAULT_LOOKS

ENV_GITHUB_SUMMARY = "GITHUB_STEP_SUMMARY"


def add_rule_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("decision rule and output")
    group.add_argument(
        "--metrics",
        default=",".join(METRICS),
        help="comma-separated, from: %(default)s (default: all; a metric a run did not record is skipped)",
    )
    group.add_argument(
        "--alpha",
        type=float,
        help="significance level (default: 0.05; 0.01 with --ab, whose job gates every pull request)",
    )
    group.add_argument(
        "--min-effect",
        type=float,
        default=0.05,
        help="smallest change that counts, as a fraction; the threshold is max(this, 2 x the baseline's "
        "run-to-run CV) (default: %(default)s)",
    )
    group.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="compare runs on different hardware or workload configurations anyway (the output says what differs)",
    )
    group.add_argument(
        "--inconclusive",
        choices=("pass", "fail"),
        default="pass",
        help="exit code for an INCONCLUSIVE metric: pass (0, with a warning) or fail (1) (default: %(default)s)",
    )
    group.add_argument(
        "--target",
        metavar="METRIC<=VALUE",
        help="also compare the time and $ to a quality target on a metric the runs logged, e.g. "
        "'val_loss<=2.1' or 'val_acc>=0.9': each side's, measured where its runs reached it (the median of "
        "those that did), projected with an interval where they did not, beside samples/s, and which side "
        "is faster to it. Slower to the target by more than --min-effect fails the comparison (exit 1) only "
        "when both sides reached it or the intervals do not overlap; otherwise it is reported",
    )
    group.add_argument("--markdown", metavar="PATH", help="also write the result as Markdown (PR comment)")
    group.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    group.add_argument(
        "--junit",
        metavar="PATH",
        help="also write the result as JUnit XML, a test case per metric (a regression fails it, an "
        "inconclusive metric skips it), for CI dashboards",
    )
    group.add_argument(
        "--history",
        metavar="PATH_OR_URL",
        help="after deciding, append the candidate's figures, its commit and the verdict to this CI history "
        "(a JSON Lines file, or a prefix on object storage such as s3://bucket/perf), for `tuneup "
        "regressions`",
    )
    group.add_argument(
        "--detailed-exit-codes",
        action="store_true",
        help="exit 0 no change, 1 regression, 2 bad input, 3 inconclusive, 4 improvement (default: 0 for "
        "anything but a regression; --inconclusive is then not needed)",
    )
    group.add_argument(
        "--github-summary",
        action="store_true",
        help=f"append the Markdown to ${ENV_GITHUB_SUMMARY} (the GitHub Actions job summary)",
    )


def add_commands(sub: Any, usage_error: type[Exception]) -> None:
    """Register the commands on the CLI's subparsers; `usage_error` is the CLI's exit-code-2 error."""
    compare = sub.add_parser(
        "compare",
        help="compare a candidate's runs with a baseline's: REGRESSION, IMPROVEMENT, NO CHANGE or INCONCLUSIVE",
        description="Compare steady-state throughput, step time, peak memory and cost per sample of a "
        "candidate with a baseline, one figure per run, with a one-sided Welch test on log values and a "
        "minimum effect; with --target, also the time and $ to a quality target beside samples/s. Each side "
        "is a run directory, a directory of runs, or a baseline file. Peak memory repeats from run to run, "
        "so it is judged against a 2% tolerance, from one run a side too. Exit code 0: no regression; "
        "1: regression; 2: bad input (with --detailed-exit-codes also 3: inconclusive, 4: improvement).",
    )
    compare.add_argument(
        "baseline", metavar="BASELINE", help="run directory, directory of runs, or baseline file"
    )
    compare.add_argument(
        "candidate", metavar="CANDIDATE", help="run directory, directory of runs, or baseline file"
    )
    add_rule_arguments(compare)
    compare.set_defaults(func=lambda args: _cmd_compare(args, usage_error))

    baseline = sub.add_parser(
        "baseline",
        help="save or update a baseline file to commit, for `tuneup compare`",
        description="A baseline file keeps each run's figures (not the runs themselves) and the hardware and "
        "workload they ran: small enough to commit, so CI compares against it.",
    )
    actions = baseline.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    save = actions.add_parser("save", help="write a new baseline file from runs")
    save.add_argument("runs", nargs="+", metavar="RUNS", help="run directories or directories of runs")
    save.add_argument("-o", "--out", required=True, metavar="FILE", help="the baseline file to write")
    save.add_argument("--force", action="store_true", help="replace an existing file")
    update = actions.add_parser(
        "update", help="replace a baseline file's runs with new ones of the same workload"
    )
    update.add_argument("file", metavar="FILE", help="the baseline file")
    update.add_argument("runs", nargs="+", metavar="RUNS", help="run directories or directories of runs")
    update.add_argument("--allow-mismatch", action="store_true", help="accept other hardware or workload")
    baseline.set_defaults(func=lambda args: _cmd_baseline(args, usage_error))

    bench = sub.add_parser(
        "bench",
        help="run a training workload N times (alternating with a baseline workload), then compare",
        description="Run a short training workload that uses TuneupCallback N times, each run recorded in "
        "its own directory (through TUNEUP_DIR), alternating with a baseline workload when one is given, "
        "then compare the two sets as `tuneup compare` does.",
    )
    what = bench.add_mutually_exclusive_group(required=True)
    what.add_argument("--cmd", metavar="COMMAND", help="the candidate workload, a shell-style command line")
    what.add_argument(
        "--entry", metavar="MODULE:FUNCTION", help="the candidate workload, a Python entry point"
    )
    base = bench.add_mutually_exclusive_group()
    base.add_argument("--baseline-cmd", metavar="COMMAND", help="the baseline workload, a command line")
    base.add_argument(
        "--baseline-entry", metavar="MODULE:FUNCTION", help="the baseline workload, an entry point"
    )
    bench.add_argument("--baseline", metavar="PATH", help="or compare with recorded runs or a baseline file")
    bench.add_argument(
        "--baseline-ref",
        metavar="REF",
        help="run the baseline from this git commit or branch (main, origin/main), checked out in a worktree "
        "of its own under --out: the candidate's command (or --baseline-cmd/--baseline-entry) run there, "
        "its root first on PYTHONPATH",
    )
    bench.add_argument(
        "--baseline-setup",
        metavar="COMMAND",
        help="with --baseline-ref: a shell command run once in the baseline's worktree before the runs "
        "(its own environment: 'make .venv', 'python -m venv .venv && .venv/bin/pip install -e .')",
    )
    bench.add_argument("--runs", type=int, default=5, help="runs of each workload (default: %(default)s)")
    bench.add_argument("--out", metavar="DIR", help="where the runs go (default: reports/bench/<time>)")
    bench.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds one run may take (default: %(default)s)"
    )
    add_ab_arguments(bench)
    add_rule_arguments(bench)
    bench.set_defaults(func=lambda args: _cmd_bench(args, usage_error))


def add_ab_arguments(bench: argparse.ArgumentParser) -> None:
    group = bench.add_argument_group(
        "interleaved A/B (--ab)",
        "runs the two workloads in blocks of A B B A or B A A B and decides on the blocks' paired "
        "differences, so that a drift common to both cancels (tuneup.compare.ab); with --json, --history, "
        "--markdown, --github-summary, --junit and the exit-code options; not yet --target",
    )
    group.add_argument(
        "--ab",
        action="store_true",
        help="interleaved A/B: needs --baseline-cmd, --baseline-entry or --baseline-ref",
    )
    group.add_argument("--blocks", type=int, help="blocks to run (default: as the A/A calibration plans)")
    group.add_argument("--seed", type=int, default=0, help="seed of the blocks' order (default: %(default)s)")
    group.add_argument(
        "--min-detectable",
        type=float,
        default=0.05,
        help="the change to detect with power 0.9, a fraction; the threshold is half of it "
        "(default: %(default)s)",
    )
    group.add_argument("--max-minutes", type=float, help="the time the blocks may take, calibration included")
    group.add_argument(
        "--calibrate-blocks",
        type=int,
        default=3,
        help="A/A blocks (the baseline on both sides) run first to measure the noise (default: %(default)s; "
        "0: none, then give --blocks)",
    )
    group.add_argument(
        "--calibration",
        metavar="JSON",
        help="plan from a previous A/A's --json (the same command on both sides) instead of running one",
    )
    group.add_argument(
        "--side-by-side",
        action="store_true",
        help="run A and B at once, each pinned to half of the CPUs (swapped within each block), instead of "
        "A B B A one after another: about twice the blocks in the time, for workloads that use at most "
        "half of the runner's cores or whose processes can share them, as a 2-rank DDP run's ranks on one "
        "core (Linux; benchmarks/README.md has the trials)",
    )
    group.add_argument(
        "--looks",
        type=int,
        default=DEFAULT_LOOKS,
        help="times the blocks are tested on the way, the last at the end: the job stops at a look once "
        "the verdict is settled, with alpha spent over the looks (default: %(default)s; 1: no early stop)",
    )


def _rule(args: argparse.Namespace) -> Any:
    from tuneup.compare.rule import Rule

    return Rule(alpha=Rule.alpha if args.alpha is None else args.alpha, min_effect=args.min_effect)


def _compare_and_report(baseline: Side, candidate: Side, args: argparse.Namespace) -> int:
    from tuneup.compare.compare import compare, format_markdown, format_table
    from tuneup.compare.rule import Verdict

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    target = _target(args)
    result = compare(
        baseline,
        candidate,
        metrics=metrics,
        rule=_rule(args),
        allow_mismatch=args.allow_mismatch,
        target=str(target) if target is not None else None,
    )
    print(format_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result.as_dict(), indent=1) + "\n", encoding="utf-8")
    _write_ci_outputs(args, lambda: format_markdown(result), result)
    _append_history(args, candidate, _verdict_word(result))
    inconclusive = result.count(Verdict.INCONCLUSIVE)
    if inconclusive and args.inconclusive == "pass" and not args.detailed_exit_codes:
        print(
            f"warning: {inconclusive} metric(s) INCONCLUSIVE (exit 0; their lines above say why and what "
            "would decide)",
            file=sys.stderr,
        )
    return result.exit_code(inconclusive_fails=args.inconclusive == "fail", detailed=args.detailed_exit_codes)


def _write_ci_outputs(args: argparse.Namespace, markdown: Callable[[], str], junit: Any) -> None:
    """--markdown (written whole), --github-summary (appended to $GITHUB_STEP_SUMMARY, as steps share
    it) and --junit (a Comparison, or a JUnit document's text)."""
    paths = [args.markdown, os.environ.get(ENV_GITHUB_SUMMARY) if args.github_summary else None]
    for path in filter(None, paths):
        with open(path, "a" if path != args.markdown else "w", encoding="utf-8") as f:
            f.write(markdown())
    if args.junit:
        from tuneup.compare.junit import write_junit

        write_junit(junit, args.junit)


def _verdict_word(result: Any) -> str:
    """The gate's word for a comparison, as the history keeps it: the first of these that applies."""
    from tuneup.compare.rule import Verdict

    if result.regression:
        return "regression"
    if result.count(Verdict.INCONCLUSIVE):
        return "inconclusive"
    return "improvement" if result.count(Verdict.IMPROVEMENT) else "no_change"


def _commit(candidate: Side) -> tuple[str, str | None]:
    """(commit, branch) of the candidate: its runs' recorded git state, else the checkout this runs in
    (a CI job's), else 'unknown'."""
    from tuneup.collect.environment import git_state

    recorded = next((r.commit for r in candidate.runs if r.commit), None)
    if recorded is not None:
        return recorded, None
    state = git_state()
    if state is not None and state.get("commit"):
        return str(state["commit"]), state.get("branch")
    return "unknown", None


def _candidate_figure(values: list[float | None]) -> float | None:
    """The candidate's figure for the history: the geometric mean of its runs', the figure compare's table
    prints as 'candidate'; 0 where every run's is 0 (exposed communication fully overlapped); None where a
    run lacks it."""
    if not values or any(v is None or v < 0 for v in values):
        return None
    if all(v == 0 for v in values):
        return 0.0
    if any(v == 0 for v in values):
        return None  # no geometric mean, and no second definition beside it
    return math.exp(math.fsum(math.log(v) for v in values if v is not None) / len(values))


def _append_history(args: argparse.Namespace, candidate: Side, verdict: str | None) -> None:
    if getattr(args, "history", None):
        from tuneup.compare.history import append

        append(args.history, history_record(candidate, verdict, time.time()))
        print(f"appended the candidate's figures to the history {args.history}")


def history_record(candidate: Side, verdict: str | None, timestamp_unix: float) -> Any:
    """The candidate's CI result as a `tuneup.compare.history.HistoryRecord`: its figures, commit and the
    comparison's verdict word (regression, inconclusive, improvement, no_change; None where nothing was
    compared: a bench without a baseline still adds a point to the history)."""
    from tuneup.compare.history import HistoryRecord

    runs = candidate.runs
    per_million = [None if r.usd_per_sample is None else r.usd_per_sample * 1e6 for r in runs]
    figures = {
        "samples_per_s": [r.throughput if r.throughput_unit == "samples/s" else None for r in runs],
        "step_time_ms": [r.step_time_ms for r in runs],
        "peak_memory_bytes": [r.peak_memory_bytes for r in runs],
        "usd_per_million_samples": per_million,
        "exposed_comm_ms": [r.exposed_comm_ms for r in runs],
    }
    metrics = {
        name: figure for name, values in figures.items() if (figure := _candidate_figure(values)) is not None
    }
    commit, branch = _commit(candidate)
    return HistoryRecord(
        commit=commit,
        timestamp_unix=timestamp_unix,
        metrics=metrics,
        branch=branch,
        run_url=None,
        verdict=verdict,
    )


def _target(args: argparse.Namespace) -> Any:
    """--target, parsed (tuneup.target.TargetError, a ValueError: exit code 2 through `_guarded`)."""
    from tuneup.target import parse_target

    text = getattr(args, "target", None)
    return parse_target(text) if text is not None else None


def _guarded(action: Callable[[], int], usage_error: type[Exception]) -> int:
    """Input errors of every kind, as the CLI's one-line exit-code-2 error."""
    from tuneup.compare.bench import BenchError

    try:
        return action()
    except (CompareInputError, BenchError, ValueError) as exc:
        raise usage_error(str(exc)) from None
    except BrokenPipeError:
        raise  # the reader of stdout stopped early: not bad input; the CLI's main ends quietly
    except OSError as exc:
        raise usage_error(f"{getattr(exc, 'filename', '') or ''} {exc.strerror or exc}".strip()) from None


def _cmd_compare(args: argparse.Namespace, usage_error: type[Exception]) -> int:
    def run() -> int:
        target = _target(args)  # a target that cannot be read fails before any run is analysed
        return _compare_and_report(load_side(args.baseline, target), load_side(args.candidate, target), args)

    return _guarded(run, usage_error)


def _cmd_baseline(args: argparse.Namespace, usage_error: type[Exception]) -> int:
    from tuneup.compare.compare import format_value
    from tuneup.compare.runs import baseline_document, load_baseline, mismatches

    def run() -> int:
        runs = [r for path in args.runs for r in load_side(path).runs]
        differs = mismatches(runs[0].fingerprint, [r.fingerprint for r in runs[1:]])
        if differs:
            raise CompareInputError("the runs differ from each other (" + "; ".join(differs) + ")")
        if args.action == "save":
            out = Path(args.out)
            if out.exists() and not args.force:
                raise CompareInputError(f"{out} exists; use `tuneup baseline update` or --force")
            document = baseline_document(runs)
        else:
            out = Path(args.file)
            old = load_baseline(out)
            differs = mismatches(old.fingerprint, [runs[0].fingerprint])
            if differs and not args.allow_mismatch:
                raise CompareInputError(
                    f"{out}: the new runs ran a different workload or hardware ({'; '.join(differs)}); "
                    "pass --allow-mismatch to replace it anyway"
                )
            created = json.loads(out.read_text(encoding="utf-8")).get("created")
            document = baseline_document(runs, created=created)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, out)  # a baseline is replaced whole or not at all
        print(f"wrote {out}: {len(runs)} run(s)")
        for r in runs:
            shown = format_value(r.throughput, r.throughput_unit) if r.throughput else "no throughput"
            print(f"  {r.run_id}: {shown}")
        return 0

    return _guarded(run, usage_error)


def _cmd_bench(args: argparse.Namespace, usage_error: type[Exception]) -> int:
    from tuneup.compare.bench import Workload, run_bench
    from tuneup.compare.compare import format_value

    def run() -> int:
        if args.ab:
            return _bench_ab(args)
        if args.side_by_side:
            raise CompareInputError("--side-by-side runs the blocks of --ab; add --ab")
        candidate = Workload("candidate", args.cmd, args.entry)
        workloads = [candidate]
        if (args.baseline_cmd or args.baseline_entry or args.baseline_ref) and args.baseline:
            raise CompareInputError(
                "give --baseline-cmd/--baseline-entry/--baseline-ref or --baseline, not both"
            )
        target = _target(args)
        # A bad path fails before any run.
        baseline = load_side(args.baseline, target) if args.baseline else None
        out = _bench_out(args)
        with contextlib.ExitStack() as stack:
            baseline_workload = _baseline_workload(args, out, stack)
            if baseline_workload is not None:
                workloads.insert(0, baseline_workload)
            sets = run_bench(workloads, args.runs, out, timeout_s=args.timeout)
        candidate_side = load_side(sets["candidate"], target)
        print()
        for r in candidate_side.runs:
            print(
                f"candidate {r.run_id}: {format_value(r.throughput, r.throughput_unit)}"
                if r.throughput
                else r.run_id
            )
        if "baseline" in sets:
            baseline = load_side(sets["baseline"], target)
        if baseline is None:
            print(
                f"\nno baseline given: the runs are in {sets['candidate']} (compare them later with tuneup compare)"
            )
            _append_history(args, candidate_side, None)
            return 0
        print()
        return _compare_and_report(baseline, candidate_side, args)

    return _guarded(run, usage_error)


def _bench_out(args: argparse.Namespace) -> Path:
    return Path(args.out) if args.out else Path("reports") / "bench" / time.strftime("%Y%m%d-%H%M%S")


def _baseline_workload(args: argparse.Namespace, out: Path, stack: contextlib.ExitStack) -> Any:
    """The baseline to run: --baseline-cmd/--baseline-entry as given, or with --baseline-ref that command
    (else the candidate's) in the ref's worktree (OUT/baseline-tree, removed when `stack` closes); None
    when there is none to run."""
    from tuneup.compare.bench import Workload

    if args.baseline_ref is None:
        if args.baseline_setup:
            raise CompareInputError(
                "--baseline-setup needs --baseline-ref (it runs in the baseline's worktree)"
            )
        if args.baseline_cmd or args.baseline_entry:
            return Workload("baseline", args.baseline_cmd, args.baseline_entry)
        return None
    from tuneup.compare.worktree import baseline_worktree, python_path

    given = bool(args.baseline_cmd or args.baseline_entry)
    command, entry = (args.baseline_cmd, args.baseline_entry) if given else (args.cmd, args.entry)
    tree = (out / "baseline-tree").resolve()
    print(
        f"baseline: {args.baseline_ref} checked out in {tree}"
        + (", setting up" if args.baseline_setup else "")
    )
    here = stack.enter_context(
        baseline_worktree(args.baseline_ref, tree, setup=args.baseline_setup, timeout_s=args.timeout)
    )
    return Workload(
        "baseline",
        command,
        entry,
        cwd=here,
        env={"PYTHONPATH": python_path(tree, os.environ.get("PYTHONPATH"))},
    )


def _bench_ab(args: argparse.Namespace) -> int:
    """`tuneup bench --ab`: calibrate (A/A), plan, run the blocks, decide on the paired differences."""
    from tuneup.compare import ab
    from tuneup.compare.bench import Workload

    if not (args.baseline_cmd or args.baseline_entry or args.baseline_ref) or args.baseline:
        raise CompareInputError(
            "--ab needs --baseline-cmd, --baseline-entry or --baseline-ref (and no --baseline)"
        )
    if args.target:
        raise CompareInputError(
            "--target is not supported with --ab yet; compare the runs with tuneup compare"
        )
    if args.blocks is not None and args.blocks < ab.MIN_BLOCKS:
        raise CompareInputError(f"--blocks must be at least {ab.MIN_BLOCKS}, got {args.blocks}")
    if args.looks < 1:
        raise CompareInputError(f"--looks must be at least 1 (1: no early stop), got {args.looks}")
    if args.calibrate_blocks < 0 or args.calibrate_blocks == 1:
        raise CompareInputError(f"--calibrate-blocks must be 0 or at least {ab.MIN_BLOCKS}")
    if args.side_by_side:
        try:
            ab.cpu_halves()
        except ValueError as exc:
            raise CompareInputError(f"--side-by-side: {exc}; run the blocks one after another") from None
    rule = ab.ab_rule(ab.DEFAULT_ALPHA if args.alpha is None else args.alpha, args.min_detectable)
    if rule.alpha >= 0.5:
        # A one-sided test at 0.5 or more flags a coin's toss; the looks' boundaries are not defined there.
        raise CompareInputError(f"--alpha must be below 0.5 with --ab (0.01 by default), got {rule.alpha}")
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise CompareInputError(f"--metrics: unknown {', '.join(unknown)}; choose from {', '.join(METRICS)}")
    # The plan follows the first metric that varies from run to run (peak memory repeats).
    plan_metric = next((m for m in metrics if not METRICS[m].deterministic), metrics[0])
    candidate = Workload("candidate", args.cmd, args.entry)
    out = _bench_out(args)
    if out.exists() and any(out.iterdir()):
        raise CompareInputError(f"{out} already holds runs; give --out an empty or new directory")
    with contextlib.ExitStack() as stack:
        baseline = _baseline_workload(args, out, stack)
        assert baseline is not None  # checked above
        return _run_ab(args, baseline, candidate, out, rule, metrics, plan_metric)


def _run_ab(
    args: argparse.Namespace,
    baseline: Any,
    candidate: Any,
    out: Path,
    rule: Any,
    metrics: list[str],
    plan_metric: str,
) -> int:
    from tuneup.compare import ab, sequential
    from tuneup.compare.compare import mixed_memory_reason, not_recorded_reason, zero_reason
    from tuneup.compare.junit import suite_xml

    started_s = time.monotonic()

    summaries: dict[Path, RunSummary] = {}  # each run analysed once, whatever the metrics

    def summary(run_dir: Path) -> RunSummary:
        if run_dir not in summaries:
            summaries[run_dir] = load_side(run_dir).runs[0]
        return summaries[run_dir]

    def figures(run_dirs: list[Path], metric: str) -> list[float | None]:
        return [summary(d).value(metric) for d in run_dirs]

    def block_figures(
        blocks: list[dict[str, list[Path]]], metric: str
    ) -> list[tuple[list[float], list[float]]] | str:
        """Each block's (A figures, B figures), or why the metric cannot be compared."""
        pairs = [
            (figures(block[ab.BASELINE], metric), figures(block[ab.CANDIDATE], metric)) for block in blocks
        ]
        values = [v for a, b in pairs for v in (*a, *b)]
        if any(v is None for v in values):
            return not_recorded_reason(metric)
        if metric == "peak_memory":
            runs = [summary(d) for block in blocks for side in block.values() for d in side]
            if why := mixed_memory_reason(runs):
                return why
        if any(v <= 0 for v in values):  # type: ignore[operator]
            return zero_reason(METRICS[metric].label, values)  # type: ignore[arg-type]
        return pairs  # type: ignore[return-value]

    plan = None
    if args.calibration:
        document = json.loads(Path(args.calibration).read_text(encoding="utf-8"))
        if bool(document.get("side_by_side")) != args.side_by_side:
            # The two ways' blocks differ in noise and in time: a plan from the other's would be wrong.
            ran = "side by side" if document.get("side_by_side") else "one after another"
            raise CompareInputError(
                f"{args.calibration}: its blocks ran {ran}; calibrate the way this job runs "
                f"({'with' if args.side_by_side else 'without'} --side-by-side)"
            )
        entry = next(
            (m for m in document.get("metrics", []) if m.get("metric") == METRICS[plan_metric].label), None
        )
        if entry is None:
            raise CompareInputError(
                f"{args.calibration}: no {plan_metric} block figures; give a --json of a --ab run"
            )
        calibration, seconds_per_block = entry["log_ratios"], document.get("seconds_per_block")
    elif args.calibrate_blocks:
        print(f"A/A calibration: {args.calibrate_blocks} blocks of the baseline on both sides")
        aa_blocks, seconds_per_block = ab.run_blocks(
            baseline,
            baseline,
            args.calibrate_blocks,
            args.seed + 1,
            out / "calibration",
            timeout_s=args.timeout,
            side_by_side=args.side_by_side,
        )
        aa_pairs = block_figures(aa_blocks, plan_metric)
        if isinstance(aa_pairs, str):
            raise CompareInputError(
                f"the calibration runs cannot plan on {plan_metric} ({aa_pairs}); choose another --metrics"
            )
        calibration = [ab.block_log_ratio(a, b) for a, b in aa_pairs]
    else:
        calibration, seconds_per_block = None, None
    if calibration is not None:
        left_s = (
            None if args.max_minutes is None else args.max_minutes * 60.0 - (time.monotonic() - started_s)
        )
        plan = ab.plan(
            calibration,
            min_detectable=args.min_detectable,
            alpha=rule.alpha,
            seconds_per_block=seconds_per_block,
            max_seconds=left_s,
            blocks=args.blocks,
            looks=args.looks,
        )
        print(plan.text())
    elif args.blocks is None:
        raise CompareInputError("without a calibration (--calibrate-blocks 0) give --blocks")
    else:
        print("no A/A calibration: what change these blocks can detect is not known")
    blocks_to_run = plan.blocks if plan is not None else args.blocks
    design = sequential.design(blocks_to_run, rule.alpha, args.looks)
    print(
        f"\nA/B: at most {blocks_to_run} blocks of {ab.block_shape(args.side_by_side)}, seed {args.seed}; "
        f"{design.text()}"
    )

    def decide(blocks: list[dict[str, list[Path]]]) -> tuple[list[Any], dict[str, str]]:
        """Every metric's verdict at the look these blocks reach, and the metrics that cannot be compared."""
        look = design.look_at(len(blocks))
        results, skipped = [], {}
        for name in metrics:
            pairs = block_figures(blocks, name)
            if isinstance(pairs, str):
                skipped[name] = pairs
                continue
            metric = METRICS[name]
            results.append(
                ab.decide_paired(
                    metric.label,
                    pairs,
                    higher_is_better=metric.higher_is_better,
                    rule=rule,
                    unit=metric.unit,
                    look=look,
                )
            )
        return results, skipped

    ab_started_s = time.monotonic()

    def settled(blocks: list[dict[str, list[Path]]]) -> bool:
        nonlocal design
        now_s = time.monotonic()
        next_block_s = (now_s - ab_started_s) / len(blocks)
        if (
            args.max_minutes is not None
            and len(blocks) >= ab.MIN_BLOCKS
            and now_s - started_s + next_block_s > args.max_minutes * 60.0
        ):
            # Out of time: an end that does not depend on what the blocks said, so this block becomes
            # the last look and spends what is left of alpha (tuneup.compare.sequential.design).
            design = sequential.design(blocks_to_run, rule.alpha, args.looks, end_blocks=len(blocks))
            print(
                f"stopping after {len(blocks)} of {blocks_to_run} blocks: another ({next_block_s:.0f} s) "
                f"would pass --max-minutes {args.max_minutes:g}; deciding on these at the remaining alpha"
            )
            return True
        if design.look_at(len(blocks)) is None:
            return False
        results, _ = decide(blocks)
        if ab.gate_settled(results):
            print(
                f"settled after {len(blocks)} blocks: "
                + "; ".join(f"{r.metric} {r.verdict.value}" for r in results)
            )
            return True
        return False

    ab_blocks, seconds_per_block = ab.run_blocks(
        baseline,
        candidate,
        blocks_to_run,
        args.seed,
        out / "ab",
        timeout_s=args.timeout,
        stop=settled,
        side_by_side=args.side_by_side,
    )
    results, skipped = decide(ab_blocks)
    for name, why in skipped.items():
        print(f"{name}: {why}; skipped")
    print()
    print(ab.format_table(results))
    blocks_run = len(ab_blocks)
    planned = next((r for r in results if r.metric == METRICS[plan_metric].label), None)
    noise = (
        None
        if plan is None or planned is None
        else ab.noise_seen(plan, planned, seconds_per_block, rule.alpha)
    )
    if noise is not None:
        print(f"\n{noise.text()}")
    properties = (
        ("baseline", baseline.shown),
        ("candidate", candidate.shown),
        ("blocks", f"{blocks_run} of at most {blocks_to_run} (seed {args.seed})"),
        ("rule", ab.describe_rule(rule, design)),
    )
    _write_ci_outputs(
        args,
        lambda: ab.format_markdown(
            results,
            baseline=baseline.shown,
            candidate=candidate.shown,
            blocks=blocks_run,
            seed=args.seed,
            rule=rule,
            plan=plan,
            skipped=skipped,
            design=design,
            noise=noise,
            side_by_side=args.side_by_side,
        ),
        suite_xml("tuneup bench --ab", properties, results, skipped),
    )
    if args.json:
        document = {
            "seed": args.seed,
            "side_by_side": args.side_by_side,
            "seconds_per_block": seconds_per_block,
            "plan": None if plan is None else dataclasses.asdict(plan),
            "rule": dataclasses.asdict(rule),
            "blocks_run": blocks_run,
            "blocks_planned": blocks_to_run,
            "looks": [dataclasses.asdict(look) for look in design.looks],
            "verdict": ab.verdict_word(results),
            "metrics": [r.as_dict() for r in results],
            "noise_seen": None if noise is None else dataclasses.asdict(noise),
        }
        Path(args.json).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    if getattr(args, "history", None):
        candidate_runs = tuple(summary(d) for block in ab_blocks for d in block[ab.CANDIDATE])
        _append_history(args, Side(str(out / "ab"), "set", candidate_runs), ab.verdict_word(results))
    return ab.exit_code(
        results, inconclusive_fails=args.inconclusive == "fail", detailed=args.detailed_exit_codes
    )
