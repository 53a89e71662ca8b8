"""What every piece of advice reads: the run's analysis and observation, the fitted step-time model, the
economics (price, noise scale), and one way to turn a proposed setting into a recommendation with its
predicted gain, so that each advice module only says *what* to try and *why*."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tuneup.advise.model import MIN_GAIN, Change, Considered, Predicted, Range, Recommendation, Setting
from tuneup.advise.observe import Observation
from tuneup.advise.outcomes import Economics, cost_change, outcome, relative_gain
from tuneup.advise.step_model import StepTimeModel
from tuneup.analyze.model import CollectiveFit, RunAnalysis


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
        step = self.model.predict(setting, compute_scale, data_ms_per_sample, fits)
        return outcome(setting, step, self.economics)

    @property
    def current(self) -> Predicted:
        if self._current is None:
            self._current = self.predict(self.setting)
        return self._current

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
        current = self.current
        gain = relative_gain(current, proposed, objective)
        knob = describe(changes)
        if gain.value < self.min_gain:
            self.skip(
                knob,
                f"predicted {objective} change {gain.value:+.1%} [{gain.low:+.1%}, {gain.high:+.1%}], under the "
                f"{self.min_gain:.0%} threshold",
            )
            return None
        if gain.low <= 0:  # the evidence does not rule out a loss: say what would settle it instead
            self.skip(
                knob,
                f"predicted {objective} change {gain.value:+.1%}, but the interval [{gain.low:+.1%}, "
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
