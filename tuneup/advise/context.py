"""What every piece of advice reads: the run's analysis and observation, the fitted step-time model, the
economics (price, noise scale), and one way to turn a proposed setting into a recommendation with its
predicted gain, so that each advice module only says *what* to try and *why*."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from tuneup.advise.code import TrainerCode, for_run
from tuneup.advise.model import MIN_GAIN, Change, Considered, Predicted, Range, Recommendation, Setting
from tuneup.advise.observe import RUN_TO_RUN_NOISE, Observation
from tuneup.advise.outcomes import Economics, cost_change, outcome, relative_gain
from tuneup.advise.step_model import StepPrediction, StepTimeModel, observed_setting
from tuneup.analyze.model import CollectiveFit, RunAnalysis


def measured_step(
    runs: Sequence[Observation], terms_ms: dict[str, float], baseline: Sequence[Observation] = ()
) -> StepPrediction:
    """The step of a setting some runs measured: their mean, within what the runs' own evidence allows. The
    interval holds the spread between the runs, each run's own noise (its tail, its host's contention:
    `Observation.step_noise`), and, where `baseline` (the runs it is compared with) is given, theirs too,
    and a contention that one side had and the other not: a contended side may have run up to
    1 / (1 − the others' share of its CPUs) slower than it would have alone."""
    mean = statistics.fmean(o.step_mean_ms for o in runs)
    median = statistics.fmean(o.step_median_ms for o in runs)
    spread = (
        (max(o.step_mean_ms for o in runs) - min(o.step_mean_ms for o in runs)) / mean if mean > 0 else 0.0
    )
    noise = max(RUN_TO_RUN_NOISE, spread, *(o.step_noise for o in runs))
    if baseline:
        noise = (1 + noise) * (1 + max(o.step_noise for o in baseline)) - 1
    low_factor = high_factor = 1 + noise
    mismatch = contention_mismatch(baseline, runs) if baseline else None
    if mismatch is not None:
        contended_side, share = mismatch
        slower = 1 / (1 - min(share, MAX_OTHERS_SHARE))
        if contended_side == "baseline":  # this side ran quieter: alone as the baseline was, it may be slower
            high_factor *= slower
        else:
            low_factor *= slower
    return StepPrediction(
        Range(mean, mean / low_factor, mean * high_factor),
        Range(median, median / low_factor, median * high_factor),
        dict(terms_ms),
    )


# A contended side is taken as slowed by at most 1 / (1 - this): others taking every CPU leave the run a tenth.
MAX_OTHERS_SHARE = 0.9


def contention_mismatch(
    baseline: Sequence[Observation], runs: Sequence[Observation]
) -> tuple[str, float] | None:
    """("baseline" or "measured", the others' CPU share) where one side of a comparison ran on a contended
    host and the other did not; None where both sides ran alike (or nothing recorded it)."""

    def side(obs: Sequence[Observation]) -> tuple[bool, float]:
        return any(bool(o.contended) for o in obs), max((o.others_cpu_share or 0.0) for o in obs)

    (base_busy, base_share), (run_busy, run_share) = side(baseline), side(runs)
    if base_busy and not run_busy:
        return "baseline", base_share
    if run_busy and not base_busy:
        return "measured", run_share
    return None


def _most_samples_gain(changes: Sequence[Change]) -> float | None:
    """k − 1 for a change that only makes each step k× the samples (a larger batch, more accumulation): the
    most samples/s can gain, where the step does not get faster. None for any other change."""
    k = 1.0
    for c in changes:
        if c.knob not in ("batch_size", "accumulate_grad_batches"):
            return None
        try:
            k *= int(c.proposed) / int(c.current)
        except (ValueError, ZeroDivisionError):
            return None
    return k - 1 if k > 1 else None


def describe(changes: Sequence[Change]) -> str:
    """The changes in one line, as the list of what was looked at names them."""
    return ", ".join(f"{c.knob} {c.current} → {c.proposed}" for c in changes)


@dataclass(slots=True)
class AdviceContext:
    analysis: RunAnalysis  # the run whose setting is "current"
    observation: Observation
    model: StepTimeModel
    economics: Economics
    objective: str  # "goodput" where the noise scale was measured, else "samples/s"
    min_gain: float = MIN_GAIN
    link_fits: Sequence[CollectiveFit] | None = None  # another link to predict with (a probe run)
    considered: list[Considered] = field(default_factory=list)
    # Runs whose measured comparison with this one went beyond physics (the runs differ in something else):
    # a model fitted to them is as confounded, and a rule does not recommend from it.
    not_credible: list[str] = field(default_factory=list)

    model_observations: Sequence[Observation] = ()  # every run the model was fitted to
    # The model's figures at the current setting, once: every recommendation is judged against them.
    _current: Predicted | None = field(default=None, init=False, repr=False)
    _measured_current: Predicted | None = field(default=None, init=False, repr=False)

    @property
    def namespace(self) -> str | None:
        return self.analysis.run.namespace

    @property
    def code(self) -> TrainerCode:
        """The code of the trainer that recorded the run: what each recommendation prints."""
        return for_run(self.analysis.run.adapter, self.namespace)

    @property
    def setting(self) -> Setting:
        return self.model.setting()

    def predict(
        self,
        setting: Setting,
        compute_scale: Range | None = None,
        data_ms_per_sample: float | None = None,
        fits: Sequence[CollectiveFit] | None = None,
    ) -> Predicted:
        """What `setting` delivers: measured where a run given to the advice ran it as it is (the point is
        the runs' mean step, the interval their run-to-run noise), else the model's prediction."""
        step = self.model.predict(setting, compute_scale, data_ms_per_sample, fits)
        runs = (
            self.measured_runs(setting)
            if (compute_scale, data_ms_per_sample, fits) == (None, None, None)
            else []
        )
        if runs:
            base_runs = self.measured_runs(self.setting) if setting != self.setting else []
            step = measured_step(runs, step.terms_ms, base_runs)
            return replace(
                outcome(setting, step, self.economics), measured_run=", ".join(o.run_id for o in runs)
            )
        return outcome(setting, step, self.economics)

    def measured_runs(self, setting: Setting) -> list[Observation]:
        """The runs given that ran `setting` (every knob the model predicts for equal)."""
        return [o for o in self.model_observations or (self.observation,) if observed_setting(o) == setting]

    @property
    def current(self) -> Predicted:
        """The model's figures at the run's own setting: what a predicted setting is compared with (the
        model's bias at this workload cancels)."""
        if self._current is None:
            step = self.model.predict(self.setting)
            self._current = outcome(self.setting, step, self.economics)
        return self._current

    @property
    def measured_current(self) -> Predicted:
        """The run's own setting as measured: what a measured setting is compared with."""
        if self._measured_current is None:
            self._measured_current = self.predict(self.setting)
        return self._measured_current

    def baseline(self, proposed: Predicted) -> Predicted:
        """What `proposed` is judged against: a measurement against the measurement, a prediction against
        the model's own figure here."""
        return self.measured_current if proposed.measured_run is not None else self.current

    def _runs(self, ids: str) -> list[Observation]:
        wanted = set(ids.split(", "))
        return [o for o in self.model_observations or (self.observation,) if o.run_id in wanted]

    def _contention_words(self, runs: Sequence[Observation]) -> str:
        """ ", run X was contended (...) and run Y was not" where the two sides of a measured comparison ran
        under different host load; "" where they ran alike."""
        base = self.measured_runs(self.setting)
        mismatch = contention_mismatch(base, runs)
        if mismatch is None:
            return ""
        busy, quiet = (base, runs) if mismatch[0] == "baseline" else (runs, base)
        return (
            f": run {', '.join(o.run_id for o in busy)} ran on a host whose CPU other processes took "
            f"({mismatch[1]:.0%} of it, tuneup's contention warning) and run "
            f"{', '.join(o.run_id for o in quiet)} did not"
        )

    def skip(self, knob: str, reason: str) -> None:
        self.considered.append(Considered(knob, reason))

    def recommendation(
        self,
        id: str,
        title: str,
        changes: list[Change],
        proposed: Predicted,
        evidence: list[str],
        code: tuple[str, str | None],
        caveats: list[str] | None = None,
        confidence: str = "medium",
        objective: str | None = None,
        settle: str | None = None,
    ) -> Recommendation | None:
        """A recommendation when the predicted gain clears the threshold and its interval excludes a loss;
        else None and a line in `considered` saying what the gain would have been (and `settle`: what
        measurement would decide it)."""
        objective = objective or self.objective
        knob = describe(changes)
        if all(c.current == c.proposed for c in changes):  # a rule's defect: never advise what the run has
            self.skip(knob, "the run already has this setting")
            return None
        current = self.baseline(proposed)
        gain = relative_gain(current, proposed, objective)
        how = "predicted"
        if proposed.measured_run is not None:
            # Measured: a rerun of both runs settles it, not a model.
            how = f"measured (run {proposed.measured_run})"
            settle = (
                "within the run-to-run noise of one run each: rerun both settings, interleaved, and compare them "
                "with `tuneup compare`"
            )
            runs = self._runs(proposed.measured_run)
            physics = _most_samples_gain(changes)
            rate_gain = relative_gain(current, proposed, "samples/s")
            # The runs' own noise on both sides (their tails, their hosts' load), without a contention that
            # only one side had: that is what would explain a ratio beyond physics, not what excuses it.
            noise = (1 + max(o.step_noise for o in runs or [self.observation])) * (
                1 + max(o.step_noise for o in self.measured_runs(self.setting))
            ) - 1
            if physics is not None and 1 + rate_gain.value > (1 + physics) * (1 + noise):
                # A step never gets faster as its batch grows: beyond k× samples/s for k× the samples, more
                # than the runs' noise allows, the runs differ in something other than this change.
                self.skip(
                    knob,
                    f"{how} samples/s change {rate_gain.value:+.1%} [{rate_gain.low:+.1%}, {rate_gain.high:+.1%}] "
                    f"is not credible: {physics + 1:g}x the samples per step can give at most {physics:+.0%} "
                    f"(the step never gets faster as the batch grows), {noise:.0%} more with the runs' own noise, "
                    "so the two runs differ in something "
                    f"else{self._contention_words(runs)}; rerun both settings, interleaved, on a quiet host, and "
                    "compare them with `tuneup compare`",
                )
                self.not_credible.extend(o.run_id for o in runs)
                return None
            if physics is not None and rate_gain.value > physics:
                # Within the runs' noise, but the point itself is beyond physics: the noise is in it.
                confidence = "low"
                caveats = [
                    f"the measured {rate_gain.value:+.1%} is more than {physics + 1:g}x the samples per step can give "
                    f"({physics:+.0%}, a step that does not grow): the runs' own noise ({noise:.0%}) is in it, not "
                    "only the change's gain",
                    *(caveats or []),
                ]
            words = self._contention_words(runs)
            busy = [o.run_id for o in [*self.measured_runs(self.setting), *runs] if o.contended]
            if busy and not words:
                settle = (
                    f"run(s) {', '.join(busy)} ran on a host whose CPU other processes took (tuneup's contention "
                    "warning), whose load moves their steps: rerun both settings, interleaved, on a quiet host, "
                    "and compare them with `tuneup compare`"
                )
            if words:
                settle = (
                    f"a comparison of runs under different host load{words}: rerun both settings, interleaved, "
                    "and compare them with `tuneup compare`"
                )
                confidence = "low"
                caveats = [
                    f"a comparison of runs under different host load{words}: the gain may be the load's, not "
                    "the change's; rerun both settings, interleaved, and compare them with `tuneup compare`",
                    *(caveats or []),
                ]
        if gain.value < self.min_gain:
            self.skip(
                knob,
                f"{how} {objective} change {gain.value:+.1%} [{gain.low:+.1%}, {gain.high:+.1%}], under the "
                f"{self.min_gain:.0%} threshold"
                # Where the interval still reaches a gain, say what would settle it.
                + (
                    f"; it may gain up to {gain.high:+.1%}: {settle}"
                    if settle and gain.high >= self.min_gain
                    else ""
                ),
            )
            return None
        if gain.low <= 0:  # the evidence does not rule out a loss: say what would settle it instead
            self.skip(
                knob,
                f"{how} {objective} change {gain.value:+.1%}, but the interval [{gain.low:+.1%}, "
                f"{gain.high:+.1%}] includes no gain: {settle or 'measure it to know'}",
            )
            return None
        return Recommendation(
            id=id,
            title=title,
            changes=changes,
            objective=objective,
            gain=gain,
            confidence=confidence,
            evidence=evidence,
            code=code[0],
            yaml=code[1],
            caveats=caveats or [],
            current=current,
            predicted=proposed,
            cost_change=cost_change(current, proposed),
        )
