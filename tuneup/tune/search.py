"""Which configuration to measure next, and when to stop: the most promising first, by the model refitted
after every trial.

Each untried configuration gets a predicted objective with an interval (tuneup.tune.predict). The next
trial is the one with the highest `value + optimism x (high - value)`: mostly the best prediction, pulled
towards settings whose interval says they could be much better (a worker count never tried when the step
waits for data). The search stops when no untried configuration's *optimistic* figure beats the best
measured one by `min_gain`: what is left could not be worth a trial even if the model erred its way.

A candidate brings at most one level of the knobs the model does not predict (workers, comm hook,
precision) that no trial has measured, so that every trial's surprise can be put down to one knob.

Out of memory is a result: a micro-batch that did not fit rules out every larger one at the same
precision. A knob the script could not apply is dropped (its other values are not tried).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuneup.advise.model import Range
from tuneup.tune.objective import Objective
from tuneup.tune.predict import TrialModel, fit_trial_model
from tuneup.tune.space import Config, SearchSpace
from tuneup.tune.state import INFEASIBLE, OK, Trial

OPTIMISM = 0.5
MIN_GAIN = 0.05
# Measured within this fraction of the best, a configuration is as good as the best (half the smallest
# gain worth acting on): the winner is then the one that changes the fewest knobs.
TIE = 0.025


@dataclass(frozen=True, slots=True)
class Candidate:
    config: Config
    rate: Range  # the objective's rate (higher is better), for the predicted step's interval

    @property
    def acquisition(self) -> float:
        return self.rate.value + OPTIMISM * (self.rate.high - self.rate.value)


@dataclass(frozen=True, slots=True)
class Decision:
    candidate: Candidate | None  # None: stop
    reason: str  # why this one, or why stop


@dataclass(frozen=True, slots=True)
class Economy:
    """What turns a step time into the objective's rate: the same for every configuration of a session."""

    world_size: int
    usd_per_hour: float | None
    b_noise: float | None
    b_reference: float
    tokens_per_sample: float | None
    optimizer_steps_per_step: float = 1.0  # Lightning's steps (max_steps counts them) per training step


def economy_of(trials: Sequence[Trial], world_size: int, baseline: Config) -> Economy:
    # Trials that ran (not `measured`, which needs the objective this economy is for).
    measured = [t for t in trials if t.status == OK and t.samples_per_s]
    prices = [t.usd_per_hour for t in measured if t.usd_per_hour]
    noise = sorted(t.b_noise for t in measured if t.b_noise)
    tokens = [
        t.observation.tokens_per_sample for t in measured if t.observation and t.observation.tokens_per_sample
    ]
    # The script's loop fixes how many optimizers step per batch; every trial of it records the same.
    per_step = [t.optimizer_steps_per_step for t in measured if t.optimizer_steps_per_step]
    return Economy(
        world_size=world_size,
        usd_per_hour=prices[0] if prices else None,
        b_noise=noise[len(noise) // 2] if noise else None,
        b_reference=float(baseline.global_batch(world_size) or 1),
        tokens_per_sample=tokens[0] if tokens else None,
        optimizer_steps_per_step=per_step[0] if per_step else 1.0,
    )


def rate_of(objective: Objective, economy: Economy, config: Config, samples_per_s: float) -> float | None:
    return objective.rate(
        samples_per_s,
        float(config.global_batch(economy.world_size) or 1),
        usd_per_hour=economy.usd_per_hour,
        b_noise=economy.b_noise,
        b_reference=economy.b_reference,
        tokens_per_sample=economy.tokens_per_sample,
        optimizer_steps_per_step=economy.optimizer_steps_per_step,
    )


def rates_of(
    objective: Objective, trials: Sequence[Trial], world_size: int, baseline: Config
) -> list[tuple[Trial, float]]:
    """Every trial that ran, with its objective's rate, all under the economy of the trials together."""
    economy = economy_of(trials, world_size, baseline)
    out = []
    for t in trials:
        if t.status == OK and t.samples_per_s:
            rate = rate_of(objective, economy, t.config, t.samples_per_s)
            if rate is not None:
                out.append((t, rate))
    return out


def excluded(config: Config, trials: Sequence[Trial], baseline: Config, dropped: Sequence[str]) -> str | None:
    """Why `config` is not a candidate, or None."""
    for trial in trials:
        if trial.config == config:
            return f"tried in trial {trial.index} ({trial.status})"
        if (
            trial.status == INFEASIBLE
            and trial.config.precision == config.precision
            and (config.batch_size or 0) >= (trial.config.batch_size or 0)
        ):
            return f"micro-batch {config.batch_size} >= {trial.config.batch_size}, which ran out of memory"
    for knob in dropped:
        if getattr(config, knob) != getattr(baseline, knob):
            return f"{knob} cannot be applied to this script"
    return None


class Search:
    def __init__(
        self,
        space: SearchSpace,
        baseline: Config,
        objective: Objective,
        world_size: int,
        *,
        min_gain: float = MIN_GAIN,
    ) -> None:
        self.space = space
        self.baseline = baseline
        self.objective = objective
        self.world_size = world_size
        self.min_gain = min_gain
        self.configs = space.configs(baseline)

    def model(self, trials: Sequence[Trial]) -> TrialModel:
        return fit_trial_model(trials, self.baseline, self.world_size)

    def candidates(self, trials: Sequence[Trial], dropped: Sequence[str] = ()) -> list[Candidate]:
        measured = [t for t in trials if t.measured]
        if not measured:
            return []
        model = self.model(trials)
        economy = economy_of(trials, self.world_size, self.baseline)
        out = []
        for config in self.configs:
            if excluded(config, trials, self.baseline, dropped):
                continue
            if len(model.unmeasured_knobs(config)) > 1:
                # One new level at a time: a trial that tries a worker count and a hook never measured cannot
                # tell which of them made the difference (batch and accumulation the model predicts).
                continue
            step = model.predict(config)
            samples = float(config.global_batch(self.world_size) or 1)

            def rate(step_ms: float, config: Config = config, samples: float = samples) -> float:
                value = rate_of(self.objective, economy, config, samples * 1000.0 / step_ms)
                return value if value is not None else 0.0

            # A longer step is a lower rate: the interval's ends swap.
            out.append(Candidate(config, Range(rate(step.value), rate(step.high), rate(step.low))))
        return out

    def rates(self, trials: Sequence[Trial]) -> list[tuple[Trial, float]]:
        """Every trial that ran, with its rate under one economy (one price, one noise scale for all)."""
        return rates_of(self.objective, trials, self.world_size, self.baseline)

    def _searched(self, trials: Sequence[Trial]) -> list[tuple[Trial, float]]:
        """The search's trials with their rates (confirmation reruns are judged apart)."""
        return [(t, r) for t, r in self.rates(trials) if t.role != "confirm"]

    def best(self, trials: Sequence[Trial]) -> Trial | None:
        """The search's best measured trial."""
        return max(self._searched(trials), key=lambda tr: tr[1], default=(None, 0.0))[0]

    def winner(self, trials: Sequence[Trial]) -> Trial | None:
        """The configuration to confirm: of those measured within TIE of the best, the one that changes the
        fewest knobs from the current settings (a knob that made no measurable difference stays as it is)."""
        searched = self._searched(trials)
        if not searched:
            return None
        top = max(r for _, r in searched)
        close = [(t, r) for t, r in searched if r >= top * (1 - TIE)]
        return min(close, key=lambda tr: (len(tr[0].config.changes_from(self.baseline)), -tr[1]))[0]

    def decide(self, trials: Sequence[Trial], dropped: Sequence[str] = ()) -> Decision:
        searched = self._searched(trials)
        if not searched:
            return Decision(None, "no trial has measured anything yet")
        best_rate = max(r for _, r in searched)
        candidates = self.candidates(trials, dropped)
        if not candidates:
            return Decision(None, "every configuration of the space has been tried or ruled out")
        top = max(candidates, key=lambda c: (c.acquisition, c.rate.value))
        hopeful = max(c.rate.high for c in candidates)
        if best_rate > 0 and hopeful < best_rate * (1 + self.min_gain):
            return Decision(
                None,
                f"no untried configuration is predicted to beat the best measured by {self.min_gain:.0%} even at "
                f"the optimistic end of its interval (at most {hopeful / best_rate - 1:+.1%})",
            )
        gain = top.rate.change_from(best_rate) if best_rate > 0 else None
        why = (
            f"predicted {gain.value:+.1%} [{gain.low:+.1%}, {gain.high:+.1%}] over the best so far"
            if gain
            else "the best prediction"
        )
        return Decision(top, why)
