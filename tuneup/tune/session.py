"""A tuning session: the baseline trial, the search, the confirmation, each trial saved as it ends.

1. The baseline: the user's command as it is. Its run says the current settings (batch per rank,
   accumulation, workers, precision, world size), which fill the knob ranges not given.
2. The search (tuneup.tune.search) until it stops, or the budget (trials, minutes, dollars) is spent.
3. The confirmation: the best configuration and the baseline rerun, interleaved (B W W B ...), and the
   compare rule (tuneup.compare.rule: Welch on logs and a change beyond max(5%, 2 x CV)) decides whether the
   winner is really better. When it cannot tell, the verdict says so and the current settings are kept.
   The comparison has one figure: the objective's ratio of geometric means, which the test tests, with the
   interval of the same test, named as the objective is.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuneup.compare.rule import Rule
from tuneup.compare.stats import geometric_gain
from tuneup.record.schema import ENV_RUN_DIR
from tuneup.tune import knobs as registry
from tuneup.tune.knobs import SpaceContext
from tuneup.tune.objective import Objective
from tuneup.tune.protocol import ENV_SESSION, ENV_TRIAL, StopRule, TrialSpec
from tuneup.tune.runner import Limits, run_supervised
from tuneup.tune.script import Script
from tuneup.tune.search import Decision, Search, rates_of
from tuneup.tune.space import Config, SearchSpace
from tuneup.tune.state import (
    FAILED,
    INFEASIBLE,
    OK,
    TRIALS_DIR,
    Prediction,
    Trial,
    TuneState,
    save_state,
)

CONFIRM_RUNS = 2  # extra runs a side: with the search's own trial, 3 a side, what the compare rule needs
# The confirmation's gain interval: two-sided at 1 - 2 x the compare rule's one-sided alpha (0.05), so that it
# leaves out "no change" exactly when the test the verdict rests on gives p < alpha in that direction.
GAIN_CONFIDENCE = 1.0 - 2.0 * Rule().alpha
GAIN_INTERVAL = (
    f"{GAIN_CONFIDENCE:.0%} interval of the ratio of geometric means, from the Welch t-test on log rates "
    "that the verdict uses"
)


class TuneError(Exception):
    """The session cannot go on (the baseline failed, bad options): one line, exit code 2."""


@dataclass(frozen=True, slots=True)
class Budget:
    max_trials: int = 12  # the baseline and the search's trials; confirmation runs come on top
    max_minutes: float | None = None
    max_dollars: float | None = None


@dataclass(slots=True)
class TuneOptions:
    objective: Objective
    budget: Budget = field(default_factory=Budget)
    stop: StopRule = field(default_factory=StopRule)
    limits: Limits = field(default_factory=Limits)
    min_gain: float = 0.05
    confirm_runs: int = CONFIRM_RUNS
    price_env: dict[str, str] = field(default_factory=dict)  # TUNEUP_INSTANCE... for every trial


def measure(trial: Trial, run_dir: Path) -> str | None:
    """Fill the trial's figures from its run record (a run that cannot carry them fails the trial); returns
    the Lightning namespace the run trained with."""
    from tuneup.advise.observe import AdviceInputError, observe
    from tuneup.analyze.analysis import analyze_run
    from tuneup.analyze.cost import optimizer_steps_per_step
    from tuneup.compare.runs import summarize_run
    from tuneup.record import RunRecordError, load_run

    try:
        run = load_run(run_dir)
        analysis = analyze_run(run)
        observation = observe(analysis)
    except (RunRecordError, AdviceInputError, ValueError) as exc:
        trial.status, trial.reason = FAILED, f"its record cannot be measured: {exc}"
        return None
    summary = summarize_run(run, analysis)
    trial.observation = observation
    trial.step_ms = analysis.step_time.mean_ms
    trial.samples_per_s = analysis.throughput.samples_per_s
    trial.tokens_per_s = analysis.throughput.tokens_per_s
    trial.steps = summary.steady_steps
    trial.peak_memory_bytes = summary.peak_memory_bytes
    trial.usd_per_hour = analysis.cost.figures.usd_per_hour if analysis.cost is not None else None
    trial.b_noise = analysis.noise_scale.b_simple if analysis.noise_scale is not None else None
    trial.optimizer_steps_per_step = optimizer_steps_per_step(run)
    return analysis.run.namespace


def _world_size(trial: Trial | None) -> int:
    return trial.observation.world_size if trial is not None and trial.observation else 1


def config_of_run(trial: Trial) -> Config:
    """The settings a trial's run really had, from its record (each knob's `from_run`)."""
    o = trial.observation
    assert o is not None
    return Config(**{k.name: k.from_run(o) for k in registry.knobs() if k.from_run is not None})


def default_space(
    requested: Mapping[str, Any],
    baseline: Config,
    world_size: int,
    ranks_per_node: int,
    on_gpu: bool,
    cpus: int,
) -> SearchSpace:
    """The knob values asked for, and around the baseline for those not given (each knob's `defaults`: the
    per-rank batch from half to 4x, accumulation 1/2/4, workers up to Lightning's suggestion (CPUs per rank -
    1), the fp16 hook (and bf16 on GPUs) where ranks communicate; precision only when asked)."""
    job = SpaceContext(world_size=world_size, ranks_per_node=ranks_per_node, on_gpu=on_gpu, cpus=cpus)
    values: dict[str, tuple[Any, ...]] = {
        k.name: k.defaults(getattr(baseline, k.name), job) for k in registry.knobs()
    }
    for knob, asked in requested.items():
        if asked:
            values[knob] = tuple(asked)
    return SearchSpace(**values)


class Session:
    def __init__(
        self,
        tune_dir: Path,
        state: TuneState,
        script: Script,
        options: TuneOptions,
    ) -> None:
        self.tune_dir = tune_dir
        self.state = state
        self.script = script
        self.options = options
        self.session_id = uuid.uuid4().hex[:12]
        self.spent_s = sum(t.wall_s for t in state.trials)  # a resumed session's earlier trials count

    # -- bookkeeping ---------------------------------------------------------------------------------

    @property
    def trials(self) -> list[Trial]:
        return self.state.trials

    def _save(self) -> None:
        save_state(self.tune_dir, self.state)

    def _usd_per_hour(self) -> float | None:
        prices = [t.usd_per_hour for t in self.trials if t.usd_per_hour]
        return prices[0] if prices else None

    def spent_usd(self) -> float | None:
        price = self._usd_per_hour()
        return self.spent_s / 3600.0 * price if price else None

    def _budget_left(self) -> str | None:
        """Why no further search trial may start, or None."""
        budget = self.options.budget
        searched = [t for t in self.trials if t.role != "confirm"]
        if len(searched) >= budget.max_trials:
            return f"the budget of {budget.max_trials} trials is spent"
        return self._time_or_money_left()

    def _time_or_money_left(self) -> str | None:
        """Why another trial (of the mean length so far) would pass --max-minutes or --max-dollars, or None;
        confirmation runs are held to these too."""
        budget = self.options.budget
        walls = [t.wall_s for t in self.trials if t.wall_s > 0]
        next_s = sum(walls) / len(walls) if walls else 0.0
        if budget.max_minutes is not None and (self.spent_s + next_s) / 60.0 > budget.max_minutes:
            return f"another trial (~{next_s:.0f} s) would pass the budget of {budget.max_minutes:g} minutes"
        price = self._usd_per_hour()
        if (
            budget.max_dollars is not None
            and price
            and (self.spent_s + next_s) / 3600.0 * price > budget.max_dollars
        ):
            return f"another trial would pass the budget of ${budget.max_dollars:g}"
        return None

    # -- trials --------------------------------------------------------------------------------------

    def run_trial(self, config: Config | None, role: str, predicted: Prediction | None = None) -> Trial:
        index = len(self.trials)
        baseline = self.baseline_config
        label = "baseline" if config is None else config.label().replace(" ", "-")
        name = (
            f"{index:02d}-{role if role != 'search' else label}"
            if role != "confirm"
            else f"{index:02d}-confirm-{label}"
        )
        status_dir = self.tune_dir / TRIALS_DIR / name
        if status_dir.exists():
            # A trial a killed session left unfinished (tune.json never counted it): its heartbeats and
            # failure files would be read as this trial's. Kept aside, not deleted.
            status_dir.rename(status_dir.with_name(f"{name}.unfinished-{time.strftime('%Y%m%d-%H%M%S')}"))
        run_dir = status_dir / "run"
        if config is None or baseline is None:
            argv, settings = list(self.script.argv), {}
            if self.script.add_callback:
                argv, settings = self.script.trial_argv(Config(), Config())
        else:
            argv, settings = self.script.trial_argv(config, baseline)
        spec = TrialSpec(
            trial=name,
            settings=settings,
            stop=self.options.stop,
            status_dir=str(status_dir),
            run_dir=str(run_dir.resolve()),  # over any dirpath the script gives TuneupCallback
        )
        env = {
            **os.environ,
            **self.options.price_env,
            ENV_TRIAL: spec.to_env(),
            ENV_RUN_DIR: str(run_dir.resolve()),
            ENV_SESSION: self.session_id,
        }
        trial = Trial(
            index=index,
            name=name,
            config=config or Config(),
            role=role,
            run_dir=str(run_dir.relative_to(self.tune_dir)),
            started_unix=time.time(),
            predicted=predicted,
        )
        finished = run_supervised(argv, env, status_dir.resolve(), self.options.limits, settings=settings)
        trial.wall_s = finished.wall_s
        self.spent_s += finished.wall_s
        trial.not_applied = {k: v for k, v in finished.not_applied.items() if k in settings}
        if finished.out_of_memory:
            trial.status, trial.reason = INFEASIBLE, f"out of memory: {finished.reason}"
        elif finished.ended not in ("exited", "not applied"):
            trial.status, trial.reason = FAILED, f"{finished.ended}: {finished.reason}"
        elif trial.not_applied:
            knobs = ", ".join(f"{k} ({v})" for k, v in trial.not_applied.items())
            trial.status, trial.reason = FAILED, f"the script could not apply {knobs}"
            for knob, why in trial.not_applied.items():
                self.state.dropped[knob] = why
        elif not (run_dir / "manifest.json").is_file():
            trial.status = FAILED
            trial.reason = (
                f"no run was recorded in {run_dir}: does the script train with TuneupCallback (of this "
                f"tuneup, which records a trial where {ENV_TRIAL} says)? output: {finished.output_tail}"
            )
        else:
            namespace = measure(trial, run_dir)
            if trial.status == OK:
                self._check_settings(trial, config)
            if config is None and trial.status == OK:
                trial.config = config_of_run(trial)
                self.state.options["namespace"] = namespace  # for the winner's code
        self.trials.append(trial)
        self._score(trial)
        self._save()
        return trial

    def _score(self, trial: Trial) -> None:
        """Every trial's objective under the economy of all of them: a later trial can bring the price or a
        better noise scale, and the stored figure is the one the search ranks by."""
        baseline = self.state.baseline
        world = _world_size(baseline if baseline is not None and baseline.observation else trial)
        rates = {
            id(t): r
            for t, r in rates_of(
                self.options.objective, self.trials, world, self.baseline_config or trial.config
            )
        }
        for t in self.trials:
            if t.status == OK:
                t.objective = rates.get(id(t))
        if trial.status == OK and trial.objective is None:
            trial.status = FAILED
            trial.reason = "its objective could not be computed (a price or a token count is missing)"

    def _check_settings(self, trial: Trial, config: Config | None) -> None:
        """A trial whose run had other settings than asked would mislead the search: it fails instead."""
        if config is None:
            return
        ran = config_of_run(trial)
        for knob in (k.name for k in registry.knobs() if k.verify):
            wanted, got = getattr(config, knob), getattr(ran, knob)
            if wanted is not None and got is not None and str(wanted) != str(got):
                trial.status = FAILED
                trial.reason = f"the run had {knob} {got}, not the {wanted} asked for"
                self.state.dropped.setdefault(knob, f"a trial asked for {wanted} and the run had {got}")
                return

    # -- the session ---------------------------------------------------------------------------------

    @property
    def baseline_config(self) -> Config | None:
        b = self.state.baseline
        return b.config if b is not None and b.status == OK else None

    @property
    def world_size(self) -> int:
        return _world_size(self.state.baseline)

    def search(self) -> Search:
        assert self.state.space is not None and self.baseline_config is not None
        return Search(
            self.state.space,
            self.baseline_config,
            self.options.objective,
            self.world_size,
            min_gain=self.options.min_gain,
        )

    def run(self, progress: Callable[[Session, Trial], None] | None = None) -> TuneState:
        if self.state.baseline is None:
            trial = self.run_trial(None, "baseline")
            if progress:
                progress(self, trial)
        baseline = self.state.baseline
        assert baseline is not None
        if baseline.status != OK:
            raise TuneError(
                f"the baseline run (your command as it is) failed: {baseline.reason}; see "
                f"{self.tune_dir / TRIALS_DIR / baseline.name / 'output.log'}"
            )
        if self.state.space is None:
            obs = baseline.observation
            assert obs is not None
            space = default_space(
                self.state.requested,
                baseline.config,
                obs.world_size,
                obs.ranks_per_node,
                obs.on_gpu,
                obs.cpu_count or 1,
            )
            if self.state.options.get("keep_global_batch"):
                space = space.replace(keep_global_batch=True)
            self.state.space = space.with_baseline(baseline.config)
            self._save()
        search = self.search()
        while self.state.result is None:
            why_not = self._budget_left()
            if why_not is not None:
                self.state.stopped_because = why_not
                break
            decision: Decision = search.decide(self.trials, tuple(self.state.dropped))
            if decision.candidate is None:
                self.state.stopped_because = decision.reason
                break
            c = decision.candidate
            trial = self.run_trial(c.config, "search", Prediction(c.rate.value, c.rate.low, c.rate.high))
            if progress:
                progress(self, trial)
        self._save()
        if self.state.result is None:
            self.state.result = self.confirm(search, progress)
            self._save()
        return self.state

    def confirm(self, search: Search, progress: Callable[[Session, Trial], None] | None) -> dict[str, Any]:
        from tuneup.compare.rule import Verdict, decide

        baseline = self.state.baseline
        assert baseline is not None
        best = search.winner(self.trials) or baseline
        result: dict[str, Any] = {"best_trial": best.index, "winner": best.config.as_dict()}
        if best.config == baseline.config:
            result.update(
                kept_current=True,
                verdict=None,
                reason="no configuration measured better than your current settings",
            )
            return result
        short_of_budget = None
        for i in range(self.options.confirm_runs):
            order = (baseline.config, best.config) if i % 2 else (best.config, baseline.config)
            for config in order:
                short_of_budget = self._time_or_money_left()
                if short_of_budget is not None:
                    break
                trial = self.run_trial(config, "confirm")
                if progress:
                    progress(self, trial)
            if short_of_budget is not None:
                result["confirmation_cut"] = f"confirmation runs stopped: {short_of_budget}"
                break

        rated = {id(t): r for t, r in search.rates(self.trials)}

        def rates(config: Config, first: Trial) -> list[float]:
            runs = [first, *(t for t in self.trials if t.role == "confirm" and t.config == config)]
            return [rated[id(t)] for t in runs if id(t) in rated]

        base_rates, best_rates = rates(baseline.config, baseline), rates(best.config, best)
        objective = self.options.objective
        # One comparison, one figure: the verdict is taken on the objective's own figure (hours and dollars
        # for time and cost, lower is better), under the objective's name, and the gain shown is the ratio
        # of geometric means that its test tests, with the interval of that same test.
        figures = [objective.figure(r) for r in base_rates], [objective.figure(r) for r in best_rates]
        verdict = decide(
            objective.name,
            *figures,
            higher_is_better=objective.higher_is_better,
            unit=objective.unit,
            rule=Rule(resamples=0),  # the bootstrap interval of medians is another estimator: not shown
        )
        improved = verdict.verdict is Verdict.IMPROVEMENT
        gain = geometric_gain(base_rates, best_rates, GAIN_CONFIDENCE)
        result.update(
            kept_current=not improved,
            verdict=verdict.verdict.value,
            reason=verdict.reason,
            gain=gain[0] if gain else None,
            gain_low=gain[1] if gain else None,
            gain_high=gain[2] if gain else None,
            gain_interval=GAIN_INTERVAL,
            baseline_rates=base_rates,
            winner_rates=best_rates,
        )
        if not improved:
            result["winner"] = baseline.config.as_dict()
        return result


def resumable(state: TuneState) -> TuneState:
    """The session to continue: its result cleared (a resumed session may search further) and no trial lost."""
    return replace(state, result=None, stopped_because=None)
