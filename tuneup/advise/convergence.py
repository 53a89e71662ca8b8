"""How the goodput model's prediction stands against the recorded curve, for a quality target.

The noise-scale model (McCandlish et al. 2018; DESIGN.md "Formulas") says the steps to a target fall with
the global batch B as S = S_min(1 + B_noise/B). Where the run recorded the target's metric, the curve gives
S at the run's own batch (reached, or projected), so S_min = S / (1 + B_noise/B), and another batch B'
needs S' = S (1 + B_noise/B') / (1 + B_noise/B) steps. With B_noise measured, that is a prediction with
the noise scale's interval; without it, the law still bounds S' between S·B/B' (B_noise far above the
batches: steps fall in proportion) and S (far below: no fewer steps). Where other runs of the workload at
other batches recorded the same target, their steps are checked against it: a bigger batch that took
*more* steps is something no B_noise gives, and is said as such (the learning rate, or something else,
changed between them).

Pure: reads the analyses' convergence sections and the advice; no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tuneup.advise.model import Advice
from tuneup.analyze.model import RunAnalysis, TargetOutcome, decimals, significant
from tuneup.analyze.noise_scale import noise_verdict


@dataclass(frozen=True, slots=True)
class CurveAtBatch:
    """Another run's recorded steps to the target at its own batch, against the model's prediction."""

    run_id: str
    global_batch: int
    status: str  # "reached" or "projected"
    step: float = significant(6)
    predicted_step_low: float = significant(6)
    predicted_step_high: float = significant(6)
    within: bool  # the recorded step lies within the model's range
    implied_b_noise: float | None = significant(
        4, default=None
    )  # from the two curves; None where no B_noise fits them


@dataclass(frozen=True, slots=True)
class ConvergenceCheck:
    """The statement: the run's curve at its batch, the model's steps (and time) at another batch, and
    what other recorded runs say. `lines` is the statement in plain words, as `tuneup advise` prints it."""

    target: str
    run_id: str
    global_batch: int | None
    status: str  # the run's target outcome: "reached", "projected", "not_projected", "not_recorded"
    step: float | None = significant(6, default=None)  # reached at, or projected to
    hours: float | None = decimals(6, default=None)
    b_noise: float | None = significant(
        4, default=None
    )  # the measured gradient noise scale B_simple, where there is one
    b_noise_low: float | None = significant(4, default=None)
    b_noise_high: float | None = significant(4, default=None)  # None: unbounded above
    proposed_batch: int | None = None  # the other batch the model is asked about (global)
    proposed_basis: str | None = None
    predicted_step: float | None = significant(
        6, default=None
    )  # None where only bounds are known (no B_noise)
    predicted_step_low: float | None = significant(6, default=None)
    predicted_step_high: float | None = significant(6, default=None)
    predicted_hours_low: float | None = decimals(6, default=None)
    predicted_hours_high: float | None = decimals(6, default=None)
    others: list[CurveAtBatch] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def steps_ratio(b: float, b_new: float, b_noise: float) -> float:
    """S'/S = (1 + B_noise/B') / (1 + B_noise/B)."""
    return (1.0 + b_noise / b_new) / (1.0 + b_noise / b)


def steps_range(
    step: float, b: float, b_new: float, b_noise_low: float | None, b_noise_high: float | None
) -> tuple[float, float]:
    """The steps at B' over B_noise's interval (None low: 0; None high: unbounded): S'/S moves monotonically
    from 1 (B_noise = 0) to B/B' (B_noise -> infinity)."""
    at_low = steps_ratio(b, b_new, b_noise_low or 0.0)
    at_high = b / b_new if b_noise_high is None else steps_ratio(b, b_new, b_noise_high)
    return step * min(at_low, at_high), step * max(at_low, at_high)


def implied_b_noise(step: float, b: float, step_other: float, b_other: float) -> float | None:
    """The B_noise that makes S = S_min(1 + B_noise/B) pass through both recorded points; None where none
    does (a bigger batch that took more steps, or the same batch)."""
    r = step / step_other
    denominator = r / b_other - 1.0 / b
    if b == b_other or denominator == 0.0:
        return None
    value = (1.0 - r) / denominator
    return value if value > 0.0 else None


def _step_of(outcome: TargetOutcome) -> float | None:
    if outcome.status == "reached" and outcome.reached is not None:
        return float(outcome.reached.step)
    if outcome.status == "projected":
        return outcome.step
    return None


def _hours_of(outcome: TargetOutcome) -> float | None:
    if outcome.status == "reached" and outcome.reached is not None:
        return outcome.reached.hours
    return outcome.hours if outcome.status == "projected" else None


def _elapsed(hours: float | None) -> str:
    """Seconds or minutes below a tenth of an hour, else hours (the report's reading; advise sits below
    tuneup.report and cannot import its formatter)."""
    if hours is None:
        return "-"
    seconds = hours * 3600.0
    if seconds < 60.0:
        return f"{seconds:.3g} s"
    return f"{seconds / 60.0:.1f} min" if hours < 0.1 else f"{hours:,.2f} h"


def _proposal(advice: Advice | None, batch: int) -> tuple[int, str, float | None]:
    """The other global batch to ask the model about, why, and the predicted step time's ratio to the
    current one (None: not predicted): the batch advice's proposal where it made one, else twice the batch."""
    for rec in advice.recommendations if advice is not None else ():
        if rec.id != "batch.size":
            continue
        factor = 1.0
        for change in rec.changes:
            if change.knob in ("batch_size", "accumulate_grad_batches"):
                try:
                    factor *= int(change.proposed) / int(change.current)
                except (ValueError, ZeroDivisionError):
                    factor = 0.0
        step_ratio = None
        if rec.predicted is not None and rec.current is not None and rec.current.step_ms.value > 0:
            step_ratio = rec.predicted.step_ms.value / rec.current.step_ms.value
        if factor > 0 and round(batch * factor) != batch:
            return (
                round(batch * factor),
                f"the batch advice's: {rec.title[:1].lower()}{rec.title[1:]}",
                step_ratio,
            )
    return 2 * batch, "twice the run's; the batch advice proposes none", None


def _steps(value: float) -> str:
    return f"{value:,.0f}"


def convergence_check(
    analyses: Sequence[RunAnalysis], advice: Advice | None = None
) -> ConvergenceCheck | None:
    """The statement for `analyses[0]`'s quality target (its convergence section's); None where it has none."""
    base = analyses[0]
    conv = base.convergence
    outcome = conv.target if conv is not None else None
    if outcome is None:
        return None
    batch = base.run.global_batch_size
    step, hours = _step_of(outcome), _hours_of(outcome)
    head = f"convergence check ({outcome.target}): "
    common = {
        "target": outcome.target,
        "run_id": base.run.run_id,
        "global_batch": batch,
        "status": outcome.status,
    }
    if step is None or not step > 0 or not batch:
        why = (
            outcome.reason
            if step is None
            else "the run's global batch is unknown"
            if not batch
            else "reached at step 0"
        )
        line = f"{head}this run gives no step for it ({why}): nothing to hold the goodput model against"
        return ConvergenceCheck(**common, step=step, hours=hours, lines=[line])
    how = "reached it" if outcome.status == "reached" else "is projected to reach it"
    lines = [
        f"{head}this run, at a global batch of {batch:,}, {how} at step {_steps(step)} after {_elapsed(hours)}"
    ]
    verdict = noise_verdict(base.noise_scale, base.run)
    b_noise = verdict.b_simple
    low, high = (verdict.b_low, verdict.b_high) if b_noise is not None else (None, None)
    proposed, basis, step_time_ratio = _proposal(advice, batch)
    # Without B_noise, low and high are None: the law's own bounds, B_noise from 0 to unbounded.
    s_low, s_high = steps_range(step, batch, proposed, low, high)
    predicted = step * steps_ratio(batch, proposed, b_noise) if b_noise is not None else None
    h_low = h_high = None
    if hours is not None and step_time_ratio is not None:
        h_low, h_high = (hours * s / step * step_time_ratio for s in (s_low, s_high))
    time_text = (
        f", {_elapsed(h_low)} to {_elapsed(h_high)} at the batch advice's predicted step time "
        f"({'sooner' if h_high < hours else 'later' if h_low > hours else 'either side of'} this run's "
        f"{_elapsed(hours)})"
        if h_low is not None and h_high is not None and hours is not None
        else ""
    )
    if b_noise is not None:
        spread = f" [{low:,.0f}, {'open' if high is None else f'{high:,.0f}'}]" if low is not None else ""
        lines.append(
            f"the noise-scale goodput model, S = S_min(1 + B_noise/B) with B_noise ~ {b_noise:,.0f}{spread} "
            f"samples, predicts a global batch of {proposed:,} ({basis}) reaches it at step "
            f"{_steps(predicted)} [{_steps(s_low)}, {_steps(s_high)}]{time_text}"  # type: ignore[arg-type]
        )
    else:
        lines.append(
            f"{verdict.text}; so the goodput model cannot place the steps to it at another batch, but "
            f"S = S_min(1 + B_noise/B) still puts a global batch of {proposed:,} ({basis}) between step "
            f"{_steps(s_low)} and step {_steps(s_high)}{time_text}"
        )
    others = []
    for other in analyses[1:]:
        oc = other.convergence.target if other.convergence is not None else None
        if oc is None or oc.target != outcome.target:
            continue
        b2, s2 = other.run.global_batch_size, _step_of(oc)
        if s2 is None or not s2 > 0 or not b2 or b2 == batch:
            continue
        lo2, hi2 = steps_range(step, batch, b2, low, high)
        within = lo2 * 0.999 <= s2 <= hi2 * 1.001  # the steps are whole: rounding is no disagreement
        implied = implied_b_noise(step, batch, s2, b2)
        others.append(CurveAtBatch(other.run.run_id, b2, oc.status, s2, lo2, hi2, within, implied))
        how2 = "reached" if oc.status == "reached" else "is projected to reach"
        said = (
            f"run {other.run.run_id}, at a global batch of {b2:,}, {how2} it at step {_steps(s2)}; the model "
            f"allows [{_steps(lo2)}, {_steps(hi2)}]"
        )
        if within:
            fit = (
                f", and the two curves imply B_noise ~ {implied:,.0f} samples" if implied is not None else ""
            )
            lines.append(f"{said}: the recorded curve agrees with the model{fit}")
        elif implied is None:
            lines.append(
                f"{said}: the recorded curves contradict it: the {'larger' if b2 > batch else 'smaller'} batch "
                f"took {'more' if b2 > batch else 'fewer'} steps, which no B_noise gives; something else changed "
                "between the runs (the learning rate, the schedule, the data order), so compare them by time to "
                "the target (tuneup compare --target), not by the model"
            )
        else:
            lines.append(
                f"{said}: outside it; the two curves imply B_noise ~ {implied:,.0f} samples"
                + (f", the measured {b_noise:,.0f} does not fit them" if b_noise is not None else "")
            )
    return ConvergenceCheck(
        **common,
        step=step,
        hours=hours,
        b_noise=b_noise,
        b_noise_low=low,
        b_noise_high=high,
        proposed_batch=proposed,
        proposed_basis=basis,
        predicted_step=predicted,
        predicted_step_low=s_low,
        predicted_step_high=s_high,
        predicted_hours_low=h_low,
        predicted_hours_high=h_high,
        others=others,
        lines=lines,
    )
