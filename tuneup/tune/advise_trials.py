"""The trials `tuneup advise --measure -- COMMAND` runs: the baseline where no run is given, then the few short
trials that identify the step-time model (tuneup.advise.measure decides which), each one a `tuneup tune`
trial (tuneup.tune.session: the same supervisor, stop rule and run record), kept in a tuning directory.

A second batch size reaches the script as `tuneup tune`'s does (a LightningCLI override, or TuneupCallback
through the environment). A one-rank run needs the command's world size changed, which only a LightningCLI
script launched directly takes (`--trainer.devices=1` after the user's own arguments); for any other command
the plan says so and measures what it can.

The trials are bracketed by the baseline: the command as it is runs before them (or is the run given) and
again after them (A B ... A), within --max-trials (the rerun is one of them), so that a drift of the host's
speed common to the trials and the baseline cancels in the fit, which takes both baseline runs; how far the
baseline moved, and a trial measured on a contended host against a quiet baseline (or the reverse), are
said in the notes. On a shared host a trial run in a quiet moment measured 28x the baseline's samples/s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuneup.advise.measure import NotMeasured, PlannedTrial, describe_plan, plan_trials, short_blind
from tuneup.advise.observe import Observation, observe
from tuneup.tune.objective import Objective
from tuneup.tune.protocol import StopRule
from tuneup.tune.runner import Limits
from tuneup.tune.script import Script, ScriptError, inspect_script
from tuneup.tune.session import Budget, Session, TuneOptions
from tuneup.tune.space import Config
from tuneup.tune.state import FAILED, INFEASIBLE, OK, TRIALS_DIR, Trial, TuneState, is_tune_dir, save_state

ONE_RANK_OVERRIDE = "--trainer.devices=1"
# Launchers that start the ranks themselves: the Trainer's device count must match theirs.
LAUNCHERS = frozenset({"torchrun", "srun", "mpirun", "mpiexec", "deepspeed", "accelerate"})
# Where a run recorded no start-up time (older records): about what importing torch and Lightning and
# starting the ranks takes.
DEFAULT_STARTUP_S = 30.0
# The baseline's two runs (before and after the trials) apart by more than this: the host's speed moved
# during the measuring, and a trial's figure may be off by as much, which the notes say.
DRIFT_NOTE = 0.10
RERUN_LABEL = "the baseline, rerun after the trials"


class MeasureError(Exception):
    """The trials cannot start or the baseline failed: one line, exit code 2."""


@dataclass(frozen=True, slots=True)
class MeasureOptions:
    max_trials: int = 3  # measuring trials, the baseline not counted
    stop: StopRule = field(default_factory=StopRule)
    limits: Limits = field(default_factory=Limits)
    script_kind: str = "auto"
    out: Path | None = None  # the tuning directory (default: reports/measure/<time>)


@dataclass(frozen=True, slots=True)
class TrialResult:
    label: str
    status: str  # tuneup.tune.state's OK, FAILED, INFEASIBLE
    reason: str | None
    run_dir: Path
    step_ms: float | None
    predicted_step_ms: float | None
    contended: str | None = None  # where other processes took the host's CPU during it: a caution
    batch_size: int | None = None  # per rank, as asked (None: the command's own, for the baseline)


@dataclass(slots=True)
class Measurement:
    analyses: list[Any]  # RunAnalysis: the base first, the other runs given, then the trials that measured
    run_dirs: list[str]  # where each came from, in the same order
    trials: list[TrialResult]  # every trial run, the baseline included where it was run here
    notes: list[str]  # what stays unmeasured, and why
    tune_dir: Path


def one_rank_blocked(script: Script, base: Observation) -> str | None:
    """Why the command cannot be run on one rank by a trial (None: `--trainer.devices=1` does it)."""
    launcher = Path(script.argv[0]).name if script.argv else ""
    if launcher in LAUNCHERS or any(
        a in ("torch.distributed.run", "torch.distributed.launch") for a in script.argv
    ):
        return f"{launcher or 'its launcher'} starts the ranks, so a trial cannot change their number"
    if base.num_nodes > 1:
        return "the run spans several nodes, each launched apart"
    if script.kind != "cli":
        return (
            "the script sets its Trainer's devices itself, which a trial can change only for a LightningCLI script "
            "(--trainer.devices=1); record a run on one rank at the same per-rank batch and pass it too"
        )
    return None


def _startup_s(analysis: Any) -> float:
    """Launch to the first step and the end after the last, as the run recorded them."""
    timeline = analysis.timeline
    if timeline is None or timeline.before_fit_s is None:
        return DEFAULT_STARTUP_S
    parts = {p.name: p.seconds for p in timeline.parts}
    return timeline.before_fit_s + parts.get("setup", 0.0) + parts.get("teardown", 0.0)


def _given_baseline(path: str, analysis: Any, observation: Observation) -> Trial:
    """A run given on the command line as the session's baseline. Its settings are left empty, so that every
    knob a trial sets is passed to the command, whatever the command's own defaults are."""
    return Trial(
        index=0,
        name="given",
        config=Config(),
        role="baseline",
        run_dir=str(Path(path).resolve()),
        step_ms=analysis.step_time.mean_ms,
        samples_per_s=analysis.throughput.samples_per_s,
        observation=observation,
    )


def _new_tune_dir(out: Path | None) -> Path:
    tune_dir = out if out is not None else Path("reports") / "measure" / time.strftime("%Y%m%d-%H%M%S")
    if is_tune_dir(tune_dir) or (tune_dir.exists() and any(tune_dir.iterdir())):
        raise MeasureError(f"{tune_dir} already holds files; give --out a new directory")
    tune_dir.mkdir(parents=True, exist_ok=True)
    return tune_dir


def _analyze(run_dir: Path) -> Any:
    from tuneup.report import analyze

    return analyze(run_dir)


def contention(analysis: Any) -> str | None:
    """Why a run's step times are not the job's own: other processes took its host's CPU (None: not)."""
    busy = [c for c in analysis.telemetry.cpu_contention if c.contended]
    if not busy:
        return None
    c = busy[0]
    others = f" {c.others_percent_mean:.0f}% of" if c.others_percent_mean is not None else ""
    return (
        f"other processes took{others} the CPU of host {c.host or '?'} while it ran: its step time is slower "
        "and noisier than the job's own"
    )


def _run_planned(
    session: Session, planned: PlannedTrial, base_world_size: int
) -> tuple[TrialResult, Any, NotMeasured | None]:
    """One planned trial through the session: (its result, its RunAnalysis where it measured, else what
    rules it out)."""
    one_rank = planned.world_size == 1 and base_world_size > 1
    trial = session.run_trial(
        Config(batch_size=planned.batch_size), f"measure-{'1rank-' if one_rank else ''}b{planned.batch_size}"
    )
    ran_on = trial.observation.world_size if trial.observation is not None else None
    if trial.status == OK and ran_on != planned.world_size:
        trial.status = FAILED
        trial.reason = f"the run had {ran_on} rank(s), not the {planned.world_size} asked for"
        save_state(session.tune_dir, session.state)
    run_dir = session.tune_dir / str(trial.run_dir)
    result = TrialResult(
        planned.label(),
        trial.status,
        trial.reason,
        run_dir,
        trial.step_ms,
        planned.step_ms,
        batch_size=planned.batch_size,
    )
    if trial.status != OK:
        dropped = session.state.dropped
        return (
            result,
            None,
            NotMeasured(
                planned.batch_size,
                planned.world_size,
                out_of_memory=trial.status == INFEASIBLE,
                batch_refused="batch_size" in trial.not_applied or "batch_size" in dropped,
                world_refused=ran_on is not None and ran_on != planned.world_size,
            ),
        )
    analysis = _analyze(run_dir)
    return replace(result, contended=contention(analysis)), analysis, None


def _run_baseline(session: Session, say: Callable[[str], None]) -> tuple[Any, TrialResult]:
    """The command as it is, recorded: (its RunAnalysis, its result). MeasureError where it measured nothing."""
    tune_dir = session.tune_dir
    say(f"running your command as it is (the baseline), recorded in {tune_dir / TRIALS_DIR}")
    trial = session.run_trial(None, "baseline")
    run_dir = tune_dir / str(trial.run_dir)
    if trial.status != OK:
        raise MeasureError(
            f"your command as it is (the baseline) {trial.status}: {trial.reason}; see "
            f"{tune_dir / TRIALS_DIR / trial.name / 'output.log'}"
        )
    analysis = _analyze(run_dir)
    busy = contention(analysis)
    say(
        f"baseline: {trial.step_ms:.1f} ms mean step, {trial.samples_per_s or 0:,.1f} samples/s ({run_dir})"
        + (f"; caution: {busy}" if busy else "")
    )
    return analysis, TrialResult("the baseline", OK, None, run_dir, trial.step_ms, None, busy)


def _rerun_baseline(session: Session, say: Callable[[str], None]) -> tuple[Any, TrialResult]:
    """The command as it is, again after the trials: (its RunAnalysis or None, its result)."""
    say("running your command as it is again (the baseline's rerun, after the trials)")
    trial = session.run_trial(None, "baseline-rerun")
    run_dir = session.tune_dir / str(trial.run_dir)
    result = TrialResult(RERUN_LABEL, trial.status, trial.reason, run_dir, trial.step_ms, None)
    if trial.status != OK:
        say(f"the baseline's rerun {trial.status}: {trial.reason}")
        return None, result
    analysis = _analyze(run_dir)
    busy = contention(analysis)
    say(
        f"baseline rerun: {trial.step_ms:.1f} ms mean step ({run_dir})"
        + (f"; caution: {busy}" if busy else "")
    )
    return analysis, replace(result, contended=busy)


def drift_notes(
    base_step_ms: float | None,
    base_busy: str | None,
    trials: Sequence[TrialResult],
    rerun: TrialResult | None,
) -> list[str]:
    """What the bracket says of the measuring: how far the baseline moved between its runs, and each trial
    that ran on a contended host while neither baseline run did, or on a quiet one while both were
    contended (its step time then is not comparable with the baseline's)."""
    notes: list[str] = []
    measured = [t for t in trials if t.status == OK]
    if not measured:
        return notes
    rerun_ok = rerun is not None and rerun.status == OK and rerun.step_ms is not None
    if rerun_ok and base_step_ms:
        assert rerun is not None and rerun.step_ms is not None
        moved = rerun.step_ms / base_step_ms - 1.0
        line = (
            f"the baseline ran before and after the trials (A B ... A), and the fit takes both runs, so that a "
            f"change of the host's speed common to them cancels: {base_step_ms:.1f} ms mean step before, "
            f"{rerun.step_ms:.1f} ms after ({moved:+.0%})"
        )
        if abs(moved) > DRIFT_NOTE:
            line += (
                "; the host's speed moved during the measuring, so a trial's step time may be off by as much: "
                "take the intervals, not the points"
            )
        notes.append(line)
    elif rerun is None:
        notes.append(
            "the baseline was not rerun after the trials (--max-trials 1 leaves no room for it): a change of the "
            "host's load between the baseline and the trials is not cancelled; --max-trials 2 or more reruns it"
        )
    baseline_busy = [b for b in (base_busy, rerun.contended if rerun_ok and rerun else None) if b]
    baseline_runs = 2 if rerun_ok else 1
    for t in measured:
        if t.contended and not baseline_busy:
            notes.append(
                f"{t.label} ran on a contended host and the baseline did not: its step time is slower than the "
                "setting's own, and the comparison favours the baseline"
            )
        elif not t.contended and len(baseline_busy) == baseline_runs:
            notes.append(
                f"{t.label} ran on a quiet host and the baseline on a contended one: its step time is faster than "
                "the baseline's would be on the same host, and the comparison favours the trial"
            )
    return notes


def measure_for_advice(
    command: Sequence[str],
    given: Sequence[tuple[str, Any]],
    options: MeasureOptions,
    say: Callable[[str], None] = print,
) -> Measurement:
    """Run the baseline (where `given`, (path, RunAnalysis) pairs, is empty) and the trials that identify the
    model, within `options.max_trials`; a trial that fails is reported through `say` and the rest go on."""
    if not command:
        raise MeasureError(
            "no command to measure: put it after --, e.g. tuneup advise --measure -- python train.py"
        )
    try:
        script = inspect_script(list(command), os.environ, options.script_kind)
    except ScriptError as exc:
        raise MeasureError(str(exc)) from None
    tune_dir = _new_tune_dir(options.out)
    state = TuneState(
        command=list(command),
        script_kind=script.kind,
        objective="throughput",
        options={"advise_measure": True},
    )
    if script.kind == "cli":
        state.options["cli_overrides"] = dict(script.overrides)
    tune_options = TuneOptions(
        objective=Objective("throughput"),
        budget=Budget(max_trials=options.max_trials + 1),
        stop=options.stop,
        limits=options.limits,
    )
    session = Session(tune_dir, state, script, tune_options)
    analyses = [a for _, a in given]
    run_dirs = [p for p, _ in given]
    results: list[TrialResult] = []
    if given:
        observations = [observe(a) for a in analyses]
        state.trials.append(_given_baseline(run_dirs[0], analyses[0], observations[0]))
    else:
        analysis, result = _run_baseline(session, say)
        analyses.append(analysis)
        results.append(result)
        run_dirs.append(str(result.run_dir))
        observations = [observe(analysis)]
    base = observations[0]
    blocked = one_rank_blocked(script, base) if base.world_size > 1 else None
    one_rank_script = replace(script, argv=(*script.argv, ONE_RANK_OVERRIDE))
    failed: list[NotMeasured] = []
    # The rerun of the baseline after the trials is one of --max-trials; with only one, the trial runs alone.
    measuring = options.max_trials - 1 if options.max_trials > 1 else 1
    plan = plan_trials(observations, max_trials=measuring, one_rank_blocked=blocked)
    for line in describe_plan(plan, _startup_s(analyses[0]), options.stop.max_steps):
        say(line)
    if plan.trials:
        say(f"trial directories: {tune_dir / TRIALS_DIR}")
    if plan.trials:
        say(
            "then your command as it is again (the baseline's rerun, A B ... A), so that a change of the host's "
            "load common to the trials and the baseline cancels"
            if options.max_trials > 1
            else "the baseline is not rerun after the trial (--max-trials 1): a change of the host's load "
            "between them is not cancelled"
        )
    ran = 0
    spent: str | None = None
    while plan.trials and ran < measuring:
        planned = plan.trials[0]
        ran += 1
        session.script = one_rank_script if planned.world_size != base.world_size else script
        try:
            result, analysis, not_measured = _run_planned(session, planned, base.world_size)
        finally:
            session.script = script
        if analysis is not None:
            analyses.append(analysis)
            run_dirs.append(str(result.run_dir))
            observations.append(observe(analysis))
            predicted = f" (predicted {planned.step_ms:.1f} ms)" if planned.step_ms is not None else ""
            caution = f"; caution: {result.contended}" if result.contended else ""
            say(
                f"[{ran}] {planned.label()}: {result.step_ms:.1f} ms mean step{predicted} ({result.run_dir}){caution}"
            )
        else:
            say(f"[{ran}] {planned.label()}: {result.status}: {result.reason}")
        if not_measured is not None:
            failed.append(not_measured)
        results.append(result)
        remaining = [(t.batch_size, t.world_size) for t in plan.trials[1:]]
        left = measuring - ran
        plan = plan_trials(observations, max_trials=max(1, left), one_rank_blocked=blocked, failed=failed)
        if left == 0 and plan.trials:
            spent = (
                f"--max-trials {options.max_trials} is spent"
                + (" (one of them the baseline's rerun)" if options.max_trials > 1 else "")
                + "; the model stays blind to "
                + " and ".join(short_blind(k) for k in plan.blind)
            )
            break
        if plan.trials and [(t.batch_size, t.world_size) for t in plan.trials] != remaining:
            say("next, instead: " + "; ".join(f"{t.label()} ({t.purpose})" for t in plan.trials))
    trials_run = list(results[1:] if not given else results)
    rerun: TrialResult | None = None
    if options.max_trials > 1 and any(t.status == OK for t in trials_run):
        rerun_analysis, rerun = _rerun_baseline(session, say)
        results.append(rerun)
        if rerun_analysis is not None:
            analyses.append(rerun_analysis)
            run_dirs.append(str(rerun.run_dir))
    if ran == 0 and not any(tune_dir.iterdir()):
        tune_dir.rmdir()  # nothing was run: no empty directory left behind
    notes = [spent] if spent is not None else list(plan.notes)
    if spent is None and plan.blind and not plan.trials and not notes:
        notes.insert(0, "the model stays blind to " + " and ".join(short_blind(k) for k in plan.blind))
    notes.extend(drift_notes(analyses[0].step_time.mean_ms, contention(analyses[0]), trials_run, rerun))
    return Measurement(analyses, run_dirs, results, notes, tune_dir)
