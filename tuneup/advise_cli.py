"""`tuneup advise RUN_DIR [RUN_DIR...]`: what to change, as text, Markdown or JSON.

Each RUN_DIR is a run directory or a report.json; several runs of one workload (other batch sizes,
world sizes) fit the step-time model jointly, and the first is the setting to improve.

`tuneup advise --measure [RUN_DIR...] -- COMMAND...`: where the model would rest on a prior, first run the
few short trials of COMMAND that identify it (tuneup.advise.measure decides which, tuneup.tune.advise_trials
runs them as `tuneup tune` trials), then advise from all the runs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from tuneup._cli_common import target_option
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
        usage="tuneup advise [options] RUN_DIR [RUN_DIR...]\n"
        "       tuneup advise --measure [options] [RUN_DIR...] -- COMMAND [ARG...]",
    )
    advise.add_argument(
        "runs",
        nargs="*",
        metavar="RUN_DIR",
        help="run directories (or report.json files); with --measure, optional (the first: the one to improve)",
    )
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
    advise.add_argument(
        "--target",
        metavar="METRIC<=VALUE",
        help="a quality target on a metric the run logged ('val_loss<=2.1', 'val_acc>=0.9'; default: the one "
        "the callback recorded): adds how the goodput model's steps to it (S = S_min(1 + B_noise/B)) stand "
        "against the recorded curve, at the run's batch and at the batch advice's",
    )
    _add_measure_arguments(advise)
    _split_command_at_dashes(advise)

    def run(args: argparse.Namespace) -> int:
        return cmd_advise(args, usage_error)

    advise.set_defaults(func=run)


MEASURE_TRIALS = 3  # trials --measure may run, the baseline not counted: the two that identify, its rerun


def _add_measure_arguments(advise: argparse.ArgumentParser) -> None:
    from tuneup.tune.protocol import TRIAL_STEPS_HELP, StopRule
    from tuneup.tune.runner import Limits

    stop, limits = StopRule(), Limits()
    group = advise.add_argument_group(
        "measuring first (--measure -- COMMAND)",
        "Where the model would rest on a prior (one batch size seen; interference unknown for a multi-rank "
        "run), run the few short trials of COMMAND that identify it, as `tuneup tune` runs its trials "
        "(supervised, every process ended), then advise from the runs. Without RUN_DIR the command runs as "
        "it is first (the baseline). The trials' runs are kept under --out.",
    )
    group.add_argument("--measure", action="store_true", help="measure first, then advise")
    group.add_argument(
        "--out", metavar="DIR", help="where the trials are kept (default: reports/measure/<time>)"
    )
    group.add_argument(
        "--max-trials",
        metavar="N",
        type=int,
        help="trials after the baseline: the measuring trials and, with 2 or more, the baseline's rerun after "
        f"them (A B ... A), so that a change of the host's load common to both cancels (default: {MEASURE_TRIALS})",
    )
    for flag, help_text, default in (
        ("--trial-steps", TRIAL_STEPS_HELP, stop.max_steps),
        ("--warmup-steps", "steps not timed", stop.warmup_steps),
        ("--min-steps", "fewest timed steps", stop.min_steps),
    ):
        group.add_argument(flag, metavar="N", type=int, help=f"{help_text} (default: {default})")
    for flag, help_text, default in (
        ("--startup-timeout", "s to the first step", limits.startup_s),
        ("--stall-timeout", "s without a step on any rank: a hang", limits.stall_s),
        ("--trial-timeout", "s for a whole trial", limits.trial_s),
    ):
        group.add_argument(flag, metavar="S", type=float, help=f"{help_text} (default: {default:g})")
    group.add_argument(
        "--script-kind",
        choices=("auto", "cli", "callback"),
        help="how a trial's settings reach the script: LightningCLI overrides or TuneupCallback (default: "
        "by its source)",
    )


MEASURE_OPTIONS = (
    "out", "max_trials", "trial_steps", "warmup_steps", "min_steps", "startup_timeout", "stall_timeout",
    "trial_timeout", "script_kind",
)  # fmt: skip


def _split_command_at_dashes(parser: argparse.ArgumentParser) -> None:
    """Everything after the first `--` is the training command (`training_command`), never a RUN_DIR:
    argparse alone would take `RUN -- python train.py` as three runs, since both are positionals."""
    parse = parser.parse_known_args

    def parse_known_args(args: Any = None, namespace: Any = None) -> Any:
        words = list(sys.argv[1:] if args is None else args)
        command: list[str] = []
        if "--" in words:
            at = words.index("--")
            words, command = words[:at], words[at + 1 :]
        namespace, rest = parse(words, namespace)
        namespace.training_command = command
        return namespace, rest

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def _load(path: str | Path, usage_error: type[Exception], target: Any = None) -> Any:
    from tuneup.analyze.model import AnalysisFormatError, from_json
    from tuneup.record import RunRecordError
    from tuneup.record.remote import is_url
    from tuneup.report import ReportError, analyze

    if not is_url(path) and Path(path).is_file() and Path(path).suffix == ".json":
        path = Path(path)
        if target is not None:
            raise usage_error(
                f"{path}: a report.json keeps the target it was made with; pass the run directory with --target"
            )
        try:
            return from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, AnalysisFormatError) as exc:
            raise usage_error(f"{path} is not a report.json tuneup can read: {exc}") from None
    from tuneup._cli_common import resolve_run_dir

    try:
        return analyze(resolve_run_dir(path, "advise"), target=target)
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
    if args.measure:
        return _cmd_measure(args, usage_error)
    given = [f"--{name.replace('_', '-')}" for name in MEASURE_OPTIONS if getattr(args, name) is not None]
    if args.training_command or given:
        what = "a command after --" if args.training_command else ", ".join(given)
        raise usage_error(
            f"{what} is for measuring first: add --measure (tuneup advise --measure [RUN_DIR] -- COMMAND)"
        )
    if not args.runs:
        raise usage_error(
            "give a run directory (or report.json) to advise on, or --measure -- COMMAND to record one"
        )
    target = target_option(args)
    analyses = [_load(p, usage_error, target) for p in args.runs]
    options = _options(args, usage_error)
    result = _advise(analyses, options, usage_error)
    from tuneup.advise.measure import blind_spots, measure_hint, short_blind

    blind = blind_spots(result.model) if result.model is not None else []
    if blind and not any("--measure" in note for note in result.notes):
        # Where the model rests on a prior, the trials that would identify it are one command away.
        rests_on = " and ".join(short_blind(k) for k in blind)
        hint = measure_hint([str(p) for p in args.runs])
        result = dataclasses.replace(
            result, notes=[*result.notes, f"the model assumes {rests_on} rather than measuring it; {hint}"]
        )
    print(render(result, args.format, _check(analyses, result)), end="")
    return 0


def _check(analyses: list[Any], advice: Advice) -> Any:
    """The goodput model against the recorded curve, where the run has a quality target (None otherwise)."""
    from tuneup.advise.convergence import convergence_check

    return convergence_check(analyses, advice)


def _advise(analyses: list[Any], options: AdviceOptions, usage_error: type[Exception]) -> Advice:
    from tuneup.advise import AdviceInputError, ModelError, advise

    try:
        return advise(analyses, options)
    except (AdviceInputError, ModelError) as exc:
        raise usage_error(str(exc)) from None


def _measure_options(args: argparse.Namespace, usage_error: type[Exception]) -> Any:
    from tuneup.tune.advise_trials import MeasureOptions
    from tuneup.tune.protocol import StopRule, TrialSpecError
    from tuneup.tune.runner import Limits

    stop_default, limits_default = StopRule(), Limits()
    if args.max_trials is not None and args.max_trials < 1:
        raise usage_error(f"--max-trials must be at least 1, got {args.max_trials}")
    for flag, value in (
        ("--startup-timeout", args.startup_timeout),
        ("--stall-timeout", args.stall_timeout),
        ("--trial-timeout", args.trial_timeout),
    ):
        if value is not None and not value > 0:
            raise usage_error(f"{flag} must be a positive number, got {value}")
    try:
        stop = StopRule(
            max_steps=args.trial_steps if args.trial_steps is not None else stop_default.max_steps,
            warmup_steps=args.warmup_steps if args.warmup_steps is not None else stop_default.warmup_steps,
            min_steps=args.min_steps if args.min_steps is not None else stop_default.min_steps,
        )
    except TrialSpecError as exc:
        raise usage_error(str(exc)) from None
    if stop.min_steps + stop.warmup_steps > stop.max_steps:
        raise usage_error(
            f"--trial-steps {stop.max_steps} leaves no room for --warmup-steps {stop.warmup_steps} and "
            f"--min-steps {stop.min_steps}: raise it or lower those"
        )
    limits = Limits(
        startup_s=args.startup_timeout or limits_default.startup_s,
        stall_s=args.stall_timeout or limits_default.stall_s,
        trial_s=args.trial_timeout or limits_default.trial_s,
    )
    return MeasureOptions(
        max_trials=args.max_trials or MEASURE_TRIALS,
        stop=stop,
        limits=limits,
        script_kind=args.script_kind or "auto",
        out=Path(args.out) if args.out else None,
    )


def _within_memory(advice: Advice, out_of_memory: list[int | None]) -> Advice:
    """The advice without a per-rank batch at least as large as one a measuring trial ran out of memory at,
    whatever the model predicts for it (on a CPU the model checks no memory): said among what was left alone."""
    smallest = min((b for b in out_of_memory if b is not None), default=None)
    if smallest is None:
        return advice
    from tuneup.advise.model import Considered

    kept, ruled_out = [], []
    for rec in advice.recommendations:
        batches = [int(c.proposed) for c in rec.changes if c.knob == "batch_size" and c.proposed.isdigit()]
        if batches and max(batches) >= smallest:
            reason = f"{rec.title}: a measuring trial at batch {smallest} per rank ran out of memory"
            ruled_out.append(Considered("batch_size", reason))
        else:
            kept.append(rec)
    return dataclasses.replace(advice, recommendations=kept, considered=[*advice.considered, *ruled_out])


def _trial_note(trial: Any) -> str:
    """One trial of --measure, for the advice's notes: what it measured (and what the model had predicted
    for it), or why it measured nothing."""
    if trial.status != "ok":
        return f"not measured: {trial.label}: {trial.status}: {trial.reason}"
    predicted = (
        f" (the model predicted {trial.predicted_step_ms:.1f} ms before it ran)"
        if trial.predicted_step_ms is not None
        else ""
    )
    caution = f"; caution: {trial.contended}" if trial.contended else ""
    return (
        f"measured for this advice: {trial.label}, {trial.step_ms:.1f} ms mean step{predicted}: {trial.run_dir}"
        f"{caution}"
    )


def _cmd_measure(args: argparse.Namespace, usage_error: type[Exception]) -> int:
    from tuneup.advise import AdviceInputError, ModelError
    from tuneup.tune.advise_trials import MeasureError, measure_for_advice

    command = list(args.training_command)
    if not command:
        raise usage_error(
            "no command to measure: put it after --, e.g. tuneup advise --measure -- python train.py"
        )
    measure_options = _measure_options(args, usage_error)
    options = _options(args, usage_error)  # checked before any trial runs
    target = target_option(args)
    given = [(str(p), _load(p, usage_error, target)) for p in args.runs]
    # The advice document is stdout's; with --format json what the trials do goes to stderr.
    stream = sys.stderr if args.format == "json" else sys.stdout

    def say(line: str) -> None:
        print(f"tuneup advise --measure: {line}", file=stream, flush=True)

    try:
        measured = measure_for_advice(command, given, measure_options, say)
    except (MeasureError, AdviceInputError, ModelError) as exc:
        raise usage_error(str(exc)) from None
    result = _advise(measured.analyses, options, usage_error)
    trial_runs = measured.run_dirs[len(given) :]
    result = _within_memory(result, [t.batch_size for t in measured.trials if t.status == "infeasible"])
    notes = [_trial_note(t) for t in measured.trials]
    result = dataclasses.replace(result, notes=[*result.notes, *notes, *measured.notes])
    print(render(result, args.format, _check(measured.analyses, result)), end="")
    if trial_runs:
        say(
            "the trials' runs are kept; advise on them again with: tuneup advise "
            + " ".join(measured.run_dirs)
        )
    return 0


def render(advice: Advice, fmt: str, check: Any = None) -> str:
    """The advice in `fmt`; `check` (tuneup.advise.convergence.ConvergenceCheck) adds the statement of the
    goodput model against the recorded curve: a `convergence_check` key in JSON, a short block otherwise."""
    if fmt == "json":
        from tuneup.analyze.model import to_json
        from tuneup.report import json_text

        document = to_json(advice)
        if check is not None:
            document["convergence_check"] = to_json(check)
        return json_text(document)
    if fmt == "md":
        from tuneup.report.advice import advice_blocks
        from tuneup.report.blocks import Section
        from tuneup.report.markdown import markdown_text, render_section

        out = (
            render_section(Section("recommendations", "Recommendations", tuple(advice_blocks(advice)))) + "\n"
        )
        if check is not None:
            out += "\n" + "".join(f"- {markdown_text(line)}\n" for line in check.lines)
        return out
    from tuneup.report.advice import advice_text

    lines = advice_text(advice)
    if check is not None:
        lines = [*lines, "", *check.lines]
    return "\n".join(lines) + "\n"
