"""How long would a step take at an untried configuration? The advice's step-time model, refitted after every
trial, corrected by what the trials measured for the knobs it does not model.

    step(c) = M(b, s) x exp(mu + e_workers(w) + e_hook(h) + e_precision(p) + ...)

The knobs the predictor reads are the registry's (tuneup.tune.knobs): those with `model_input` go into M
under their own names; those with `unmeasured` bounds are residual knobs, each with its effect e.

M is tuneup.advise.step_model fitted to every measured trial of the baseline's precision: it predicts how
the per-rank batch b and the accumulation s change compute, data wait and collectives. mu and the effects
e are the trials' log residuals against M, fitted as main effects (the baseline's level is 0, ridge-shrunk
towards 0 with few trials): a worker count or a comm hook the trials measured moves every prediction that
shares it. A level no trial has measured gets no effect, and an interval that reaches as far as the knob
could go: all of the data wait gone for more workers, half the exposed communication for a compressing
hook, a precision's whole plausible range. The interval also carries the model's own interval and twice
the residual spread the fit leaves, so that the search's optimism shrinks as trials agree with it.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from tuneup.advise.model import Range, Setting
from tuneup.advise.step_model import ModelError, StepTimeModel, fit_step_model
from tuneup.tune import knobs as registry
from tuneup.tune.knobs import StepShares
from tuneup.tune.space import Config
from tuneup.tune.state import Trial

RIDGE = 0.5  # pseudo-trials at effect 0: one trial at a level moves it two thirds of the way
DEFAULT_SPREAD = 0.05  # log residual spread before three trials have measured it
BACKFIT_ROUNDS = 25
MIN_LOW_FRACTION = 0.1  # the shortest a predicted step may be, as a fraction of its point


def residual_knobs() -> tuple[str, ...]:
    """The knobs whose effects the trials measure (the step-time model alone does not predict them)."""
    return tuple(k.name for k in registry.knobs() if k.unmeasured is not None)


def model_setting(config: Config, world_size: int) -> Setting:
    """The step-time model's setting for `config`: each knob with `model_input`, under its own name."""
    inputs = {}
    for k in registry.knobs():
        if k.model_input:
            value = getattr(config, k.name)
            inputs[k.name] = k.model_default if value is None else value
    return Setting(world_size=world_size, **inputs)


@dataclass(slots=True)
class TrialModel:
    world_size: int
    baseline: Config
    on_gpu: bool
    model: StepTimeModel | None
    offset: float = 0.0
    effects: dict[tuple[str, object], float] = field(default_factory=dict)
    measured_levels: dict[str, set[object]] = field(default_factory=dict)
    spread: float = DEFAULT_SPREAD
    fallback: tuple[Config, float] | None = None  # (config, step ms) when no model could be fitted

    def predict(self, config: Config) -> Range:
        """The mean step (ms) at `config`, with its interval."""
        b = config.batch_size or 1
        s = config.accumulate_grad_batches or 1
        if self.model is not None:
            step = self.model.predict(model_setting(config, self.world_size))
            mid, low, high = step.mean_ms.value, step.mean_ms.low, step.mean_ms.high
            data_share = step.terms_ms.get("data", 0.0) / mid if mid > 0 else 0.0
            comm_share = max(0.0, step.terms_ms.get("exposed_comm", 0.0)) / mid if mid > 0 else 0.0
        else:
            assert self.fallback is not None
            base, base_ms = self.fallback
            scale = (b * s) / ((base.batch_size or 1) * (base.accumulate_grad_batches or 1))
            mid = base_ms * scale
            low, high = base_ms * min(1.0, scale), base_ms * max(1.0, scale) * 1.1
            data_share, comm_share = 0.5, 0.5
        correction = self.offset
        low_factor, high_factor = 1.0, 1.0
        unmeasured = self.unmeasured_knobs(config)
        shares = StepShares(data=data_share, comm=comm_share, on_gpu=self.on_gpu)
        for entry in registry.knobs():
            if entry.unmeasured is None:
                continue  # the step-time model predicts it
            level = getattr(config, entry.name)
            if entry.name not in unmeasured:
                correction += self.effects.get((entry.name, level), 0.0)
                continue
            lo, hi = entry.unmeasured(level, shares)
            low_factor *= lo
            high_factor *= hi
        k = math.exp(correction)
        widen = math.exp(2 * self.spread)
        # A step takes time: the model's extremes (a compute line extrapolated far) must not reach zero.
        low = max(low, mid * MIN_LOW_FRACTION)
        return Range(mid * k, low * k * low_factor / widen, high * k * high_factor * widen)

    def unmeasured_knobs(self, config: Config) -> list[str]:
        """The residual knobs at a level no trial has measured (the baseline's level counts as measured)."""
        return [
            k
            for k in residual_knobs()
            if getattr(config, k) != getattr(self.baseline, k)
            and getattr(config, k) not in self.measured_levels.get(k, ())
        ]


def fit_trial_model(trials: Sequence[Trial], baseline: Config, world_size: int) -> TrialModel:
    """The model of the measured trials (at least one); `baseline` is the reference for the effects."""
    measured = [t for t in trials if t.measured and t.observation is not None and t.step_ms]
    if not measured:
        raise ModelError("no measured trial to fit the tuner's model to")
    on_gpu = any(t.observation.on_gpu for t in measured if t.observation)
    # The step model describes the baseline's workers, hook and precision (its data wait, collectives and
    # compute are theirs); other levels are the effects' to say. Without such trials, the baseline's
    # precision; without those, every trial.
    residual = residual_knobs()
    at_baseline = [t for t in measured if all(getattr(t.config, k) == getattr(baseline, k) for k in residual)]
    same = at_baseline or [t for t in measured if t.config.precision == baseline.precision] or measured
    # The baseline first, when measured: the advice model's "current" setting.
    same.sort(key=lambda t: (t.config != baseline, t.index))
    model: StepTimeModel | None
    try:
        model = fit_step_model([t.observation for t in same if t.observation is not None], base_index=0)
    except ModelError:
        model = None
    out = TrialModel(world_size=world_size, baseline=baseline, on_gpu=on_gpu, model=model)
    if model is None:
        out.fallback = (same[0].config, float(same[0].step_ms or 0.0))
        return out
    residuals: list[tuple[Config, float]] = []
    for t in measured:
        predicted = out.predict(t.config)  # with no effects fitted yet: the model alone
        residuals.append((t.config, math.log(float(t.step_ms) / predicted.value)))
    _fit_effects(out, residuals)
    return out


def _fit_effects(out: TrialModel, residuals: list[tuple[Config, float]]) -> None:
    """Main effects of the residual knobs by backfitting, the baseline's level fixed at 0."""
    residual = residual_knobs()
    levels: dict[str, set[object]] = defaultdict(set)
    for config, _ in residuals:
        for knob in residual:
            levels[knob].add(getattr(config, knob))
    out.measured_levels = dict(levels)
    effects: dict[tuple[str, object], float] = {}

    def effect_sum(config: Config, skip: str | None = None) -> float:
        return sum(effects.get((k, getattr(config, k)), 0.0) for k in residual if k != skip)

    offset = statistics.fmean(r for _, r in residuals)
    for _ in range(BACKFIT_ROUNDS):
        for knob in residual:
            reference = getattr(out.baseline, knob)
            sums: dict[object, list[float]] = defaultdict(list)
            for config, r in residuals:
                sums[getattr(config, knob)].append(r - offset - effect_sum(config, skip=knob))
            for level, values in sums.items():
                if level != reference:
                    effects[(knob, level)] = sum(values) / (len(values) + RIDGE)
        offset = statistics.fmean(r - effect_sum(c) for c, r in residuals)
    out.offset, out.effects = offset, effects
    left = [r - offset - effect_sum(c) for c, r in residuals]
    if len(left) >= 3:
        out.spread = max(0.01, math.sqrt(sum(x * x for x in left) / (len(left) - 1)))
