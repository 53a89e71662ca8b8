"""What does a setting deliver? The step-time model's step turned into samples/s, goodput and dollars.

    samples/s   = world size × batch × accumulation / mean step
    goodput     = samples/s × E(B),  E(B) = (B_noise + B₀)/(B_noise + B)   (Pollux; B₀ the run's global batch)
                  its interval: samples/s's ends times E at both ends of B_noise's own interval
    $ / 1M      = price per hour of the setting's devices / 3600 / samples/s × 1e6

The price of another world size is the run's price per device times the new device count.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneup.advise.model import Predicted, Range, Setting
from tuneup.advise.step_model import StepPrediction
from tuneup.analyze.noise_scale import statistical_efficiency


@dataclass(frozen=True, slots=True)
class Economics:
    """What the figures are priced and weighed with: the run's price and the measured noise scale."""

    usd_per_device_hour: float | None
    tokens_per_sample: float | None
    b_noise: float | None  # the gradient noise scale B_simple, in samples
    b_reference: int  # the global batch whose statistical efficiency is 1
    # B_simple's interval (the verdict's): its low end, and its high end (None: unbounded above, E → 1).
    b_noise_low: float | None = None
    b_noise_high: float | None = None

    def efficiency(self, global_batch: int) -> Range | None:
        """The statistical efficiency at `global_batch`: the point at B_simple, the ends at both ends of its
        interval (a goodput interval that ignored it once read [623.95, 1087.5], samples/s's x 0.9425)."""
        if self.b_noise is None:
            return None
        point = statistical_efficiency(self.b_noise, self.b_reference, global_batch)
        ends = [point, 1.0 if self.b_noise_high is None else self._at(self.b_noise_high, global_batch)]
        if self.b_noise_low is not None and self.b_noise_low > 0:
            ends.append(self._at(self.b_noise_low, global_batch))
        elif global_batch != self.b_reference:
            ends.append(self._at(0.0, global_batch))  # no lower bound: B_simple may be near zero
        return Range(point, min(ends), max(ends))

    def _at(self, b_noise: float, global_batch: int) -> float:
        return statistical_efficiency(b_noise, self.b_reference, global_batch)


def outcome(setting: Setting, step: StepPrediction, econ: Economics) -> Predicted:
    samples = setting.global_batch
    mean = step.mean_ms
    # samples/s falls as the step grows: the interval's ends swap.
    rate = Range(samples * 1000.0 / mean.value, samples * 1000.0 / mean.high, samples * 1000.0 / mean.low)
    usd_samples = usd_tokens = goodput = None
    efficiency = None
    if econ.usd_per_device_hour is not None:
        usd_per_s = econ.usd_per_device_hour * setting.world_size / 3600.0
        usd_samples = Range(
            usd_per_s / rate.value * 1e6, usd_per_s / rate.high * 1e6, usd_per_s / rate.low * 1e6
        )
        if econ.tokens_per_sample:
            usd_tokens = usd_samples.scaled(1.0 / econ.tokens_per_sample)
    eff = econ.efficiency(samples)
    if eff is not None:
        efficiency = eff.value
        goodput = Range(rate.value * eff.value, rate.low * eff.low, rate.high * eff.high)
    return Predicted(
        step_ms=step.median_ms,
        samples_per_s=rate,
        mean_step_ms=mean,
        usd_per_million_samples=usd_samples,
        usd_per_million_tokens=usd_tokens,
        goodput_samples_per_s=goodput,
        statistical_efficiency=efficiency,
        breakdown_ms=dict(step.terms_ms),
    )


def relative_gain(current: Predicted, proposed: Predicted, objective: str) -> Range:
    """The objective's relative change from the model's own figure at the current setting (the model's
    bias at this workload cancels); the interval is the proposed setting's."""
    return _objective(proposed, objective).change_from(_objective(current, objective).value)


def _objective(p: Predicted, objective: str) -> Range:
    if objective == "goodput" and p.goodput_samples_per_s is not None:
        return p.goodput_samples_per_s
    return p.samples_per_s


def cost_change(current: Predicted, proposed: Predicted) -> Range | None:
    if current.usd_per_million_samples is None or proposed.usd_per_million_samples is None:
        return None
    return proposed.usd_per_million_samples.change_from(current.usd_per_million_samples.value)
