"""`tuneup tune [options] -- COMMAND...`: short supervised trials of the user's training command, searched by
the step-time model, confirmed by the compare rule; `tuneup tune --resume TUNE_DIR` continues a session."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from tuneup.tune import knobs as registry
from tuneup.tune.objective import OBJECTIVES
from tuneup.tune.protocol import TRIAL_STEPS_HELP

ACTION_HELP = (
    "Knob values are comma-separated lists; one value fixes a knob; a knob not given is tuned around the "
    "current setting (batch: half to 4x; accumulation 1,2,4; workers up to CPUs per rank - 1; the fp16 comm "
    "hook where ranks communicate). Precision is tuned only when given."
)


def _list(kind: type) -> Any:
    def parse(text: str) -> list[Any]:
        try:
            values = [kind(v.strip()) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a comma-separated list of {kind.__name__}"
            ) from None
        if not values:
            raise argparse.ArgumentTypeError("give at least one value")
        return values

    return parse


def add_command(sub: Any, usage_error: type[Exception]) -> None:
    tune = sub.add_parser(
        "tune",
        help="find the fastest or cheapest settings in a few short, supervised trials of your training command",
        description="Run short trials of your training command (a LightningCLI script, or any script that "
        "trains with TuneupCallback) over batch size, accumulation, workers, comm hook and precision; "
        "measure each, predict the rest with the step-time model, and confirm the winner against your "
        "current settings with the compare rule. Every trial is a run record.",
        usage="tuneup tune [options] -- COMMAND [ARG...]\n       tuneup tune --resume TUNE_DIR [options]",
    )
    tune.add_argument("--out", metavar="TUNE_DIR", help="the tuning directory (default: reports/tune/<time>)")
    tune.add_argument("--resume", metavar="TUNE_DIR", help="continue the session in TUNE_DIR")
    tune.add_argument(
        "--objective",
        choices=OBJECTIVES,
        help="what to maximise (default: throughput-per-dollar where a price is given, else throughput)",
    )
    targets = {
        "samples": "samples to train",
        "tokens": "tokens to train",
        # trainer.global_step counts each optimizer's steps: a GAN's batch stepping two optimizers is two.
        "steps": "optimizer steps to train, counted as Lightning's max_steps counts them (every optimizer's)",
    }
    for name, what in targets.items():
        tune.add_argument(
            f"--target-{name}", type=float, metavar="N", help=f"for --objective time/cost: {what}"
        )
    knobs = tune.add_argument_group("knobs", ACTION_HELP)
    for knob in registry.knobs():
        knobs.add_argument(
            knob.option, dest=knob.name, type=_list(knob.value_type), metavar=knob.metavar, help=knob.help
        )
    knobs.add_argument(
        "--keep-global-batch", action="store_true", help="only batch x accumulation equal to the current one"
    )
    budget = tune.add_argument_group("budget")
    budget.add_argument(
        "--max-trials",
        metavar="N",
        type=int,
        default=12,
        help="trials, the baseline included (default: %(default)s)",
    )
    budget.add_argument(
        "--max-minutes", metavar="M", type=float, help="stop starting trials past this many minutes"
    )
    budget.add_argument(
        "--max-dollars", metavar="USD", type=float, help="stop starting trials past this cost (needs a price)"
    )
    budget.add_argument(
        "--min-gain",
        metavar="FRACTION",
        type=float,
        default=0.05,
        help="stop when no untried setting could gain this (default: %(default)s)",
    )
    budget.add_argument(
        "--confirm-runs",
        metavar="N",
        type=int,
        default=2,
        help="reruns a side to confirm the winner (default: %(default)s)",
    )
    trial = tune.add_argument_group("each trial")
    trial.add_argument(
        "--trial-steps",
        metavar="N",
        type=int,
        default=200,
        help=f"{TRIAL_STEPS_HELP} (default: %(default)s)",
    )
    trial.add_argument(
        "--warmup-steps", metavar="N", type=int, default=10, help="steps not timed (default: %(default)s)"
    )
    trial.add_argument(
        "--min-steps", metavar="N", type=int, default=30, help="fewest timed steps (default: %(default)s)"
    )
    trial.add_argument(
        "--step-precision",
        metavar="FRACTION",
        type=float,
        default=0.02,
        help="stop once the mean step is known to this fraction, 95%% interval (default: %(default)s)",
    )
    trial.add_argument(
        "--startup-timeout",
        metavar="S",
        type=float,
        default=300.0,
        help="s to the first step (default: %(default)s)",
    )
    trial.add_argument(
        "--stall-timeout",
        metavar="S",
        type=float,
        default=60.0,
        help="s without a step on any rank: a hang (default: %(default)s)",
    )
    trial.add_argument(
        "--trial-timeout",
        metavar="S",
        type=float,
        default=1800.0,
        help="s for a whole trial (default: %(default)s)",
    )
    tune.add_argument(
        "--script-kind",
        choices=("auto", "cli", "callback"),
        default="auto",
        help="how settings reach the script: LightningCLI overrides or TuneupCallback (default: by its source)",
    )
    price = tune.add_argument_group("price (passed to every trial)")
    which = price.add_mutually_exclusive_group()
    which.add_argument("--instance", metavar="KEY", help="a catalog instance, e.g. aws:p4d.24xlarge")
    which.add_argument("--price-per-hour", metavar="USD", type=float, help="the job's price in USD per hour")
    price.add_argument("--spot", action="store_true", help="with --instance: its spot price")
    tune.add_argument("training_command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    tune.set_defaults(func=lambda args: _cmd_tune(args, usage_error))


def _price_choice(args: argparse.Namespace, usage_error: type[Exception]) -> Any:
    """The price given on the command line, checked (a PriceChoice), or None."""
    from tuneup.cost.pricing import PriceChoice, PricingError, check_choice

    if args.instance:
        choice, where = (
            PriceChoice(instance=args.instance, spot=args.spot, source="command line"),
            "--instance",
        )
    elif args.price_per_hour is not None:
        choice, where = (
            PriceChoice(price_per_hour=args.price_per_hour, source="command line"),
            "--price-per-hour",
        )
    else:
        return None
    try:
        return check_choice(choice, where=where)
    except PricingError as exc:
        raise usage_error(str(exc)) from None


def _options(args: argparse.Namespace, usage_error: type[Exception]) -> Any:
    from tuneup.cost.pricing import env_of_choice
    from tuneup.tune.objective import Objective, ObjectiveError
    from tuneup.tune.protocol import StopRule, TrialSpecError
    from tuneup.tune.runner import Limits
    from tuneup.tune.session import Budget, TuneOptions

    price = _price_choice(args, usage_error)
    name = args.objective or ("throughput-per-dollar" if price is not None else "throughput")
    for flag, value, low in (
        ("--max-trials", args.max_trials, 1),
        ("--confirm-runs", args.confirm_runs, 0),
    ):
        if value < low:
            raise usage_error(f"{flag} must be at least {low}, got {value}")
    for flag, value in (
        ("--max-minutes", args.max_minutes),
        ("--max-dollars", args.max_dollars),
        ("--startup-timeout", args.startup_timeout),
        ("--stall-timeout", args.stall_timeout),
        ("--trial-timeout", args.trial_timeout),
    ):
        if value is not None and not value > 0:
            raise usage_error(f"{flag} must be a positive number, got {value}")
    if not 0 <= args.min_gain < 1:
        raise usage_error(f"--min-gain must be a fraction in [0, 1) (0.05 = 5%), got {args.min_gain}")
    try:
        objective = Objective(
            name,
            target_samples=args.target_samples,
            target_tokens=args.target_tokens,
            target_steps=args.target_steps,
        )
        stop = StopRule(
            max_steps=args.trial_steps,
            warmup_steps=args.warmup_steps,
            min_steps=args.min_steps,
            precision=args.step_precision,
        )
    except (ObjectiveError, TrialSpecError) as exc:
        raise usage_error(str(exc)) from None
    if (objective.per_dollar or args.max_dollars is not None) and price is None:
        raise usage_error(
            f"{'--max-dollars' if args.max_dollars is not None else '--objective ' + name} needs a price: "
            "add --instance KEY (tuneup catalog lists them) or --price-per-hour USD"
        )
    if stop.min_steps + stop.warmup_steps > stop.max_steps:
        raise usage_error(
            f"--trial-steps {stop.max_steps} leaves no room for --warmup-steps {stop.warmup_steps} and "
            f"--min-steps {stop.min_steps}: raise it or lower those"
        )
    return TuneOptions(
        objective=objective,
        budget=Budget(args.max_trials, args.max_minutes, args.max_dollars),
        stop=stop,
        limits=Limits(startup_s=args.startup_timeout, stall_s=args.stall_timeout, trial_s=args.trial_timeout),
        min_gain=args.min_gain,
        confirm_runs=args.confirm_runs,
        price_env=env_of_choice(price) if price is not None else {},
    )


def _requested(args: argparse.Namespace) -> dict[str, list[Any]]:
    """The knob values given on the command line (each knob's option stores under its name)."""
    return {k.name: getattr(args, k.name) for k in registry.knobs() if getattr(args, k.name, None)}


def _checked_requested(args: argparse.Namespace, usage_error: type[Exception]) -> dict[str, list[Any]]:
    from tuneup.tune.space import SearchSpace, SpaceError

    requested = _requested(args)
    try:
        SearchSpace(**{k: tuple(v) for k, v in requested.items()})  # checked now, before any trial runs
    except SpaceError as exc:
        raise usage_error(str(exc)) from None
    return requested


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = min(width, round(width * done / max(1, total)))
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def _progress(session: Any, trial: Any) -> None:
    state = session.state
    objective = session.options.objective
    searched = len([t for t in state.trials if t.role != "confirm"])
    total = session.options.budget.max_trials
    if trial.measured:
        what = f"{objective.format(trial.objective)}"
        if trial.predicted is not None:
            what += f" (predicted {objective.format(trial.predicted.value)})"
    else:
        what = f"{trial.status}: {trial.reason}"
    best = (
        session.search().best(state.trials) if state.space is not None and session.baseline_config else None
    )
    best_text = f" | best: #{best.index} {objective.format(best.objective)}" if best else ""
    usd = session.spent_usd()
    money = f", ${usd:,.2f}" if usd is not None else ""
    where = f"confirm {trial.config.label()}" if trial.role == "confirm" else trial.config.label()
    print(
        f"{_bar(searched, total)} trial {searched}/{total} #{trial.index} {where}: {what}{best_text} "
        f"| {session.spent_s / 60:.1f} min{money}",
        flush=True,
    )


def _resume_arguments(args: argparse.Namespace, state: Any, usage_error: type[Exception]) -> None:
    """A resumed session keeps its objective, targets and price; the budget and trial options are the ones
    given now (to search further, or with other limits)."""
    args.objective = state.objective
    for name in ("target_samples", "target_tokens", "target_steps"):
        setattr(args, name, state.options.get(name))
    if not (args.instance or args.price_per_hour is not None):
        from tuneup.cost.pricing import PricingError, choice_from_env

        try:
            choice = choice_from_env(state.options.get("price_env") or {})
        except PricingError as exc:
            raise usage_error(
                f"the session's price no longer holds ({exc}); give --instance or --price-per-hour"
            ) from None
        if choice is not None:
            args.instance, args.spot, args.price_per_hour = (
                choice.instance,
                choice.spot,
                choice.price_per_hour,
            )


def _cmd_tune(args: argparse.Namespace, usage_error: type[Exception]) -> int:
    from tuneup.tune.render import format_tune_text, write_tune_report
    from tuneup.tune.script import ScriptError, inspect_script
    from tuneup.tune.session import Session, TuneError, resumable
    from tuneup.tune.state import TuneState, TuneStateError, is_tune_dir, load_state, save_state

    command = list(args.training_command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        if args.resume:
            if command:
                raise usage_error("--resume continues the command it was started with: give no command")
            tune_dir = Path(args.resume)
            state = resumable(load_state(tune_dir))
            _resume_arguments(args, state, usage_error)
            options = _options(args, usage_error)
            state.options.update({"resumed_unix": time.time()})
        else:
            options = _options(args, usage_error)
            if not command:
                raise usage_error("no command to tune: put it after --, e.g. tuneup tune -- python train.py")
            tune_dir = (
                Path(args.out) if args.out else Path("reports") / "tune" / time.strftime("%Y%m%d-%H%M%S")
            )
            if is_tune_dir(tune_dir) or (tune_dir.exists() and any(tune_dir.iterdir())):
                raise usage_error(
                    f"{tune_dir} already holds files; give --out a new directory, or --resume it"
                )
            tune_dir.mkdir(parents=True, exist_ok=True)
            state = TuneState(
                command=command,
                script_kind=args.script_kind,
                objective=options.objective.name,
                requested=_checked_requested(args, usage_error),
                options={
                    "target_samples": args.target_samples,
                    "target_tokens": args.target_tokens,
                    "target_steps": args.target_steps,
                    "keep_global_batch": args.keep_global_batch,
                    "price_env": options.price_env,
                },
            )
        script = inspect_script(state.command, os.environ, state.script_kind)
        state.script_kind = script.kind
        if script.kind == "cli":
            state.options["cli_overrides"] = dict(script.overrides)
        if args.keep_global_batch:
            state.options["keep_global_batch"] = True
        save_state(tune_dir, state)
        print(
            f"tuneup tune: {script.kind} script; {options.objective.describe()}; up to {options.budget.max_trials} "
            f"trials in {tune_dir}",
            flush=True,
        )
        session = Session(tune_dir, state, script, options)
        session.run(progress=_progress)
    except (ScriptError, TuneError, TuneStateError) as exc:
        raise usage_error(str(exc)) from None
    except KeyboardInterrupt:
        print(f"tuneup tune: interrupted; continue with: tuneup tune --resume {tune_dir}", file=sys.stderr)
        return 130
    print()
    print(format_tune_text(session.state, tune_dir))
    written = write_tune_report(tune_dir, None)
    for path in written:
        if path.suffix != ".png":
            print(f"wrote {path}")
    return 0
