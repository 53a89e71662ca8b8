"""What a tuning session maximises, and the figure it shows for it.

Every objective is ranked by a rate, higher is better:

    throughput            samples/s (all ranks)
    throughput-per-dollar samples per USD             = samples/s x 3600 / (USD/h)
    goodput               samples/s x E(B)            E(B) = (B_noise + B0)/(B_noise + B), Pollux
    goodput-per-dollar    goodput per USD
    time                  to --target-samples/--target-tokens (at goodput where B_noise is known), or to
                          --target-steps (at the trial's step time); shown in hours, lower is better.
                          Steps are counted as Lightning's max_steps counts them: optimizer steps, every
                          optimizer's (trainer.global_step), so a GAN stepping two optimizers per batch
                          reaches --target-steps N after N/2 batches
    cost                  the same target in USD, lower is better

B0 is the baseline's global batch: a sample there counts as one; the statistical efficiency of the noise
scale measured in the trials (tuneup.analyze.noise_scale) says what a sample at another global batch is
worth. Where no trial measured the noise scale, goodput is throughput, and the session says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneup.analyze.noise_scale import statistical_efficiency

OBJECTIVES = ("throughput", "throughput-per-dollar", "goodput", "goodput-per-dollar", "time", "cost")
S_PER_HOUR = 3600.0


class ObjectiveError(ValueError):
    """An objective that cannot be computed with what was given: names the option to add."""


@dataclass(frozen=True, slots=True)
class Objective:
    name: str
    target_samples: float | None = None
    target_tokens: float | None = None
    target_steps: float | None = None

    def __post_init__(self) -> None:
        if self.name not in OBJECTIVES:
            raise ObjectiveError(f"--objective {self.name!r} is not one of {', '.join(OBJECTIVES)}")
        targets = [t for t in (self.target_samples, self.target_tokens, self.target_steps) if t is not None]
        if self.name in ("time", "cost") and len(targets) != 1:
            raise ObjectiveError(
                f"--objective {self.name} needs one target: --target-samples, --target-tokens or --target-steps"
            )
        if any(not t > 0 for t in targets):
            raise ObjectiveError("a --target-* must be a positive number")

    @property
    def per_dollar(self) -> bool:
        return self.name in ("throughput-per-dollar", "goodput-per-dollar", "cost")

    @property
    def weighs_efficiency(self) -> bool:
        return self.name.startswith("goodput") or (
            self.name in ("time", "cost") and self.target_steps is None
        )

    @property
    def unit(self) -> str:
        return {
            "throughput": "samples/s",
            "throughput-per-dollar": "samples/USD",
            "goodput": "samples/s",
            "goodput-per-dollar": "samples/USD",
            "time": "h",
            "cost": "USD",
        }[self.name]

    @property
    def higher_is_better(self) -> bool:
        return self.name not in ("time", "cost")

    def rate(
        self,
        samples_per_s: float,
        global_batch: float,
        *,
        usd_per_hour: float | None,
        b_noise: float | None,
        b_reference: float,
        tokens_per_sample: float | None = None,
        optimizer_steps_per_step: float = 1.0,
    ) -> float | None:
        """The figure the search ranks by (higher is better); None where a price or a token count that it
        needs is missing. `optimizer_steps_per_step`: optimizers stepped per training step (a batch, or
        the batches of one accumulation), which --target-steps counts as Lightning's max_steps does."""
        if samples_per_s <= 0:
            return None
        if self.target_steps is not None:
            # Lightning's optimizer steps per second: training steps/s x the optimizers each one steps.
            value = samples_per_s / global_batch * optimizer_steps_per_step
        else:
            value = samples_per_s
            if self.weighs_efficiency and b_noise is not None:
                value *= statistical_efficiency(b_noise, b_reference, global_batch)
            if self.target_tokens is not None:
                if not tokens_per_sample:
                    return None
                value *= tokens_per_sample  # tokens/s
        if self.per_dollar:
            if not usd_per_hour:
                return None
            value = value * S_PER_HOUR / usd_per_hour
        return value

    def figure(self, rate: float) -> float:
        """The objective in its unit from the rate: itself, or the time (h) or cost (USD) to the target."""
        if self.name not in ("time", "cost"):
            return rate
        target = self.target_steps or self.target_tokens or self.target_samples
        assert target is not None
        if self.name == "time":
            return target / rate / S_PER_HOUR  # rate per second -> hours
        return target / rate  # rate per USD -> USD

    def format(self, rate: float | None) -> str:
        """The figure of a rate with its unit, for a line of text: "12,901 samples/s", "0.41 h"."""
        if rate is None or rate <= 0:
            return "-"
        value = self.figure(rate)
        digits = 0 if value >= 100 else (2 if value >= 1 else 4)
        return f"{value:,.{digits}f} {self.unit}"

    def describe(self) -> str:
        target = ""
        if self.target_samples is not None:
            target = f" to {self.target_samples:,.0f} samples"
        elif self.target_tokens is not None:
            target = f" to {self.target_tokens:,.0f} tokens"
        elif self.target_steps is not None:
            target = f" to {self.target_steps:,.0f} optimizer steps (as max_steps counts them)"
        return {
            "throughput": "throughput (samples/s)",
            "throughput-per-dollar": "throughput per dollar (samples/USD)",
            "goodput": "goodput (samples/s weighted by statistical efficiency)",
            "goodput-per-dollar": "goodput per dollar",
            "time": f"time{target}",
            "cost": f"cost{target}",
        }[self.name]
