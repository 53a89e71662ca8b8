"""What every piece of advice reads: the run's analysis and observation, the fitted step-time model, the
economics (price, noise scale), and one way to turn a proposed setting into a recommendation with its
predicted gain, so that each advice module only says *what* to try and *why*."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from tuneup.advise.model import MIN_GAIN, Change, Considered, Predicted, Range, Recommendation, Setting
from tuneup.advise.observe import Observation
from tuneup.advise.outcomes import Economics, cost_change, outcome, relative_gain
from tuneup.advise.step_model import StepPrediction, StepTimeModel, observed_setting
from tuneup.analyze.model import CollectiveFit, RunAnalysis

# How far a rerun of one setting lands from another on the same machine (mean step): the interval of a setting
# that was measured rather than predicted, where the runs given do not show their own spread. The advice's
# threshold (5%) is set above it.
RUN_TO_RUN_NOISE = 0.03


def measured_step(runs: Sequence[Observation], terms_ms: dict[str, float]) -> StepPrediction:
    """The step of a setting some runs measured: their mean, within their spread or the run-to-run noise."""
    mean = statistics.fmean(o.step_mean_ms for o in runs)
    median = statistics.fmean(o.step_median_ms for o in runs)
    spread = (
        (max(o.step_mean_ms for o in runs) - min(o.step_mean_ms for o in runs)) / mean if mean > 0 else 0.0
    )
    noise = max(RUN_TO_RUN_NOISE, spread)
    return StepPrediction(
        Range(mean, mean / (1 + noise), mean * (1 + noise)),
        Range(median, median / (1 + noise), median * (1 + noise)),
        dict(terms_ms),
    )


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

    model_observations: Sequence[Observation] = ()  # every run the model was fitted to
    # The model's figures at the current setting, once: every recommendation is judged against them.
    _current: Predicted | None = field(default=None, init=False, repr=False)
    _measured_current: Predicted | None = field(default=None, init=False, repr=False)

    @property
    def namespace(self) -> str | None:
        return self.analysis.run.namespace

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
            step = measured_step(runs, step.terms_ms)
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
