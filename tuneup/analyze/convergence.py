"""Convergence: the metrics the training logged, against steps, hours, samples and dollars; when it stopped
improving or diverged; how the ranks' losses spread; the gradient norm; and the time and cost to a target.

Pure arithmetic over the run record's metrics (`RankRecord.metrics`, tuneup.record.schema.MetricRecord) and
steps, and the analysis's own figures (throughput, the cost section's price and loop overhead): no torch.

The rules, each a named constant below:
- Direction: a metric whose name (split into words at `_`, `/`, `-`, `.`) holds loss, error or perplexity,
  or has the word ppl, wer, cer, mse, mae, mape, nll or rmse, falls to its best; one with a word starting
  acc, f1, auc, precision, recall, bleu, rouge, map, iou or dice rises (a loss word wins: "dice_loss"
  falls). Any other is "unknown", with no best. A target on a metric says its direction (`<=` falls, `>=`
  rises) and overrides the name's.
- Best and since-last-improvement: the best finite value so far (strictly better than every earlier one),
  and the steps, hours and dollars from it to the metric's last value.
- Plateau: no improvement over the last PLATEAU_EVALUATIONS values of a validation metric (or one an
  adapter handed over), the count Lightning's EarlyStopping patience is commonly set to. A training metric
  read at the logging interval is one batch's value, whose noise makes "no new best" meaningless: it gets
  no plateau finding.
- Divergence: a NaN or infinite value, or a spike: a value more than SPIKE_DEVIATIONS robust deviations
  (1.4826 × the median absolute deviation) worse than the median of the SPIKE_WINDOW values before it.
- Ranks drifting apart: the ranks' training losses over windows of DRIFT_WINDOW_STEPS steps; the spread of
  their window means (max - min) against the spread their within-window scatter alone would give
  (NOISE_RANGE × the standard error of a window mean). Drifting: the last window's spread exceeds
  DRIFT_NOISE_MULTIPLE × that noise and DRIFT_GROWTH × the first window's spread.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tuneup.analyze.model import (
    Convergence,
    Cost,
    CurvePoint,
    Finding,
    GradNorm,
    LossSpread,
    MetricCurve,
    RunInfo,
    TargetOutcome,
    Throughput,
)
from tuneup.analyze.projection import project_to_target
from tuneup.analyze.sync_strategy import strategy_phases
from tuneup.record.schema import MetricRecord, Run
from tuneup.target import Target, TargetError, parse_target

S_PER_HOUR = 3600.0

PLATEAU_EVALUATIONS = 5
SPIKE_DEVIATIONS = 5.0
SPIKE_WINDOW = 10
SPIKE_MIN_HISTORY = 5
# The gradient norm is read every step, and one step's norm scatters far more than a validation value: its
# median and MAD come from more steps, so that a window's few quiet values do not make any step a spike.
GRAD_SPIKE_WINDOW = 50
GRAD_SPIKE_MIN_HISTORY = 20
# 1.4826 × MAD estimates a normal distribution's standard deviation.
MAD_TO_SIGMA = 1.4826
DRIFT_WINDOW_STEPS = 20
DRIFT_NOISE_MULTIPLE = 3.0
DRIFT_GROWTH = 2.0
# The expected range (max - min) of a handful of normal draws is about 2-4 standard deviations (2 ranks:
# 1.13σ·√2 for a difference of two; 8 ranks: 2.85σ): 3σ stands for "what noise alone spreads them by".
NOISE_RANGE = 3.0
DRIFT_MIN_STEPS_PER_WINDOW = 3

SPIKE_RULE = (
    f"a value more than {SPIKE_DEVIATIONS:g} robust deviations (1.4826 × MAD) worse than the median of the "
    f"{SPIKE_WINDOW} values before it (after at least {SPIKE_MIN_HISTORY}; for the gradient norm, of the "
    f"{GRAD_SPIKE_WINDOW} steps before it), and worse than every one of them"
)
DRIFT_RULE = (
    f"windows of {DRIFT_WINDOW_STEPS} steps; the ranks' window-mean losses spread (max - min) against "
    f"{NOISE_RANGE:g} × the standard error of a window mean; drifting when the last window's spread exceeds "
    f"{DRIFT_NOISE_MULTIPLE:g} × that noise and {DRIFT_GROWTH:g} × the first window's spread"
)

# The ids of the findings this module adds to the report's list (the report's section shows these).
FINDING_IDS = frozenset(
    {
        "metric_plateau",
        "metric_nonfinite",
        "metric_spike",
        "rank_loss_drift",
        "grad_norm_spike",
        "validation_between_averages",
    }
)

# Long words may sit inside a word of the name (trainloss, val_error_rate); short ones must be a whole word
# ("answer" is no word error rate), and the rising ones must start one ("accuracy", "f1macro"; "heatmap" is
# no mean average precision).
_LOWER_ANYWHERE = ("loss", "error", "perplexity")
_LOWER_WORDS = frozenset({"ppl", "wer", "cer", "mse", "mae", "mape", "nll", "rmse"})
_HIGHER = ("acc", "f1", "auc", "auroc", "precision", "recall", "bleu", "rouge", "map", "iou", "dice")
_TOKENS = re.compile(r"[^a-z0-9]+")


class TargetMetricError(TargetError):
    """A target on a metric the run did not log; the message lists the metrics it did log."""


def metric_direction(name: str) -> str:
    """ "lower", "higher" or "unknown", from the metric's name (the module docstring's word lists). A
    loss word wins over an accuracy word ("dice_loss" falls)."""
    tokens = [t for t in _TOKENS.split(name.lower()) if t]
    if any(word in token for token in tokens for word in _LOWER_ANYWHERE) or any(
        token in _LOWER_WORDS for token in tokens
    ):
        return "lower"
    if any(token.startswith(word) for token in tokens for word in _HIGHER):
        return "higher"
    return "unknown"


@dataclass(frozen=True, slots=True)
class _Axes:
    """What turns a step or a time into the other axes: the run's start, price, samples and step time."""

    t0: float | None
    usd_per_hour: float | None
    samples_at: dict[int, int]  # step -> samples, all ranks, where every rank recorded them
    global_batch: int | None
    s_per_step: float | None

    def hours(self, t: float) -> float | None:
        return None if self.t0 is None else max(0.0, (t - self.t0) / S_PER_HOUR)

    def usd(self, hours: float | None) -> float | None:
        return None if hours is None or self.usd_per_hour is None else hours * self.usd_per_hour

    def samples(self, step: int) -> int | None:
        if step in self.samples_at:
            return self.samples_at[step]
        return step * self.global_batch if self.global_batch else None


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _series(records: list[MetricRecord]) -> list[MetricRecord]:
    """One rank's values of one metric in step order, each reading once: a value read at a validation's
    end and again at the next logging interval, unchanged at the same step, is one value."""
    out: list[MetricRecord] = []
    for rec in sorted(records, key=lambda r: (r.step, r.t)):
        prev = out[-1] if out else None
        same = (
            prev is not None
            and prev.step == rec.step
            and (prev.value == rec.value or not (_finite(prev.value) or _finite(rec.value)))
        )
        if not same:
            out.append(rec)
    return out


def _better(direction: str, a: float, b: float) -> bool:
    return a < b if direction == "lower" else a > b


def _point(rec: MetricRecord, axes: _Axes) -> CurvePoint:
    hours = axes.hours(rec.t)
    return CurvePoint(rec.value, rec.step, hours, axes.samples(rec.step), axes.usd(hours))


def _spikes(
    values: Sequence[float | None],
    steps: Sequence[int],
    direction: str,
    window: int = SPIKE_WINDOW,
    min_history: int = SPIKE_MIN_HISTORY,
) -> list[int]:
    """Steps where a value is SPIKE_DEVIATIONS robust deviations worse than its recent median, and worse
    than every recent value (a few values' MAD can come out small by chance)."""
    if direction == "unknown":
        return []
    out = []
    history: list[float] = []
    for value, step in zip(values, steps, strict=True):
        if value is None:
            continue
        recent = history[-window:]
        if len(recent) >= min_history:
            median = statistics.median(recent)
            mad = statistics.median(abs(v - median) for v in recent)
            # A flat history (MAD 0) would call any change a spike: a floor of 1% of the median's size.
            sigma = max(MAD_TO_SIGMA * mad, 0.01 * abs(median), 1e-12)
            worse = value - median if direction == "lower" else median - value
            worst = max(recent) if direction == "lower" else min(recent)
            if worse > SPIKE_DEVIATIONS * sigma and _better(direction, worst, value):
                out.append(step)
        history.append(value)
    return out


def _curve(
    name: str, by_rank: dict[int, list[MetricRecord]], axes: _Axes, target: Target | None
) -> MetricCurve:
    rank = min(by_rank)
    series = _series(by_rank[rank])
    direction = metric_direction(name)
    basis = "from its name"
    if target is not None and target.metric == name:
        wanted = "lower" if target.lower_is_better else "higher"
        if direction == "unknown":
            basis = f"from the target {target}: its name does not say"
        elif direction != wanted:
            basis = f"from the target {target}, which reads it the other way from its name"
        direction = wanted
    elif direction == "unknown":
        basis = "its name does not say (no loss or accuracy word), and no target names it: no best is picked"
    sources = {r.source for r in series}
    source = sources.pop() if len(sources) == 1 else "mixed"
    points = [_point(r, axes) for r in series]
    finite_points = [p for p in points if math.isfinite(p.value)]
    best: CurvePoint | None = None
    best_index: int | None = None
    if direction != "unknown":
        for i, p in enumerate(points):
            if math.isfinite(p.value) and (best is None or _better(direction, p.value, best.value)):
                best, best_index = p, i
    last = finite_points[-1] if finite_points else None
    since = (len(points) - 1 - best_index) if best_index is not None else None
    end = points[-1] if points else None

    def diff(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else max(0.0, a - b)

    # Plateau: validation metrics only (the module docstring says why), and only with enough values after
    # the best to say so.
    plateau = bool(
        best is not None and source != "train" and since is not None and since >= PLATEAU_EVALUATIONS
    )
    values = [p.value if math.isfinite(p.value) else None for p in points]
    steps = [p.step for p in points]
    return MetricCurve(
        name=name,
        rank=rank,
        ranks=len(by_rank),
        source=source,
        direction=direction,
        direction_basis=basis,
        step=steps,
        hours=[p.hours for p in points],
        samples=[p.samples for p in points],
        usd=[p.usd for p in points],
        values=values,
        best=best,
        last=last,
        evaluations_since_best=since,
        steps_since_best=max(0, end.step - best.step) if end and best else None,
        hours_since_best=diff(end.hours, best.hours) if end and best else None,
        usd_since_best=diff(end.usd, best.usd) if end and best else None,
        plateau=plateau,
        nonfinite_steps=[p.step for p in points if not math.isfinite(p.value)],
        spike_steps=_spikes(values, steps, direction),
        rank_spread_max=_rank_spread(by_rank),
    )


def _rank_spread(by_rank: dict[int, list[MetricRecord]]) -> float | None:
    """The largest max - min across ranks of one metric's values at the same step."""
    if len(by_rank) < 2:
        return None
    at: dict[int, list[float]] = {}
    for records in by_rank.values():
        for rec in _series(records):
            if _finite(rec.value):
                at.setdefault(rec.step, []).append(rec.value)
    spreads = [max(v) - min(v) for v in at.values() if len(v) >= 2]
    return max(spreads) if spreads else None


def _samples_at(run: Run) -> dict[int, int]:
    """Samples trained on up to each step, summed over ranks, at the steps where every rank's metrics
    said how many it had trained on."""
    per_rank: dict[int, dict[int, int]] = {}
    for r, rec in run.ranks.items():
        per_rank[r] = {m.step: m.samples for m in rec.metrics if isinstance(m.samples, int)}
    if not per_rank or any(not v for v in per_rank.values()):
        return {}
    common = set.intersection(*(set(v) for v in per_rank.values()))
    return {step: sum(v[step] for v in per_rank.values()) for step in common}


def _seconds_per_step(throughput: Throughput, cost: Cost | None) -> tuple[float | None, str]:
    """Seconds of the fit per training step: the steady step time, times 1 plus the validation, saves and
    fit-loop time each second of training brought along in this run (the cost section's loop overhead),
    so that hours to a projected step include the validations on the way."""
    if not throughput.steps_per_s:
        return None, "no steady step time (too few steps): projected steps are not turned into hours"
    overhead = cost.loop_overhead_share if cost is not None else None
    seconds = (1.0 / throughput.steps_per_s) * (1.0 + (overhead or 0.0))
    if overhead is None:
        return seconds, "the steady step time (the run recorded no timeline: validation time is not in it)"
    return seconds, (
        f"the steady step time × (1 + {overhead:.1%} validation, checkpoint and fit-loop time per second of "
        "training)"
    )


def _loss_spread(run: Run) -> LossSpread | None:
    """The ranks' training losses over windows of steps that every rank recorded (see the module's rule)."""
    losses: dict[int, dict[int, float]] = {}
    for r, rec in run.ranks.items():
        values = {s.step: s.loss for s in rec.steps if s.loss is not None and math.isfinite(s.loss)}
        if values:
            losses[r] = values
    if len(losses) < 2:
        return None
    common = sorted(set.intersection(*(set(v) for v in losses.values())))
    windows: dict[int, list[int]] = {}
    for step in common:
        windows.setdefault(step // DRIFT_WINDOW_STEPS, []).append(step)
    ends, spreads, noises = [], [], []
    for key in sorted(windows):
        steps = windows[key]
        if len(steps) < DRIFT_MIN_STEPS_PER_WINDOW:
            continue
        means, errors = [], []
        for values in losses.values():
            xs = [values[s] for s in steps]
            means.append(statistics.fmean(xs))
            errors.append(statistics.stdev(xs) / math.sqrt(len(xs)))
        ends.append(steps[-1])
        spreads.append(max(means) - min(means))
        noises.append(NOISE_RANGE * statistics.median(errors))
    if not ends:
        return None
    drifting = len(spreads) >= 2 and (
        spreads[-1] > DRIFT_NOISE_MULTIPLE * noises[-1] and spreads[-1] > DRIFT_GROWTH * spreads[0]
    )
    return LossSpread(
        ranks=len(losses),
        window_steps=DRIFT_WINDOW_STEPS,
        step=ends,
        spread=spreads,
        noise=noises,
        drifting=drifting,
        rule=DRIFT_RULE,
    )


def _grad_norm(run: Run) -> GradNorm | None:
    """The reporting rank's gradient norm per recorded step: the clipping norm where recorded, else the
    noise scale's averaged gradient's (sqrt of gns_big_sq)."""
    for r in sorted(run.ranks):
        steps = run.ranks[r].steps
        for source, read in (
            ("grad_norm", lambda s: s.grad_norm),
            (
                "sqrt(gns_big_sq)",
                lambda s: math.sqrt(s.gns_big_sq) if s.gns_big_sq and s.gns_big_sq > 0 else None,
            ),
        ):
            pairs = [(s.step, read(s)) for s in steps]
            pairs = [(step, v) for step, v in pairs if v is not None and math.isfinite(v)]
            if len(pairs) >= 2:
                xs = [v for _, v in pairs]
                ys = [step for step, _ in pairs]
                return GradNorm(
                    source=source,
                    rank=r,
                    step=ys,
                    values=xs,
                    median=statistics.median(xs),
                    spike_steps=_spikes(xs, ys, "lower", GRAD_SPIKE_WINDOW, GRAD_SPIKE_MIN_HISTORY),
                )
    return None


def _nonfinite_loss(run: Run) -> tuple[int | None, int | None]:
    """The first step (and its rank) whose training loss was NaN or infinite: the run diverged. The writer
    records the first such step of each rank as a `nonfinite_loss` event (steps.jsonl holds the loss as null,
    which reads as not measured); a loss held in memory as NaN counts too."""
    found = [
        (event["step"], r)
        for r, rec in run.ranks.items()
        for event in rec.events
        if event.get("kind") == "nonfinite_loss" and isinstance(event.get("step"), int)
    ]
    first: tuple[int, int] | None = min(found) if found else None
    for r, rec in run.ranks.items():
        for s in rec.steps:
            if s.loss is not None and not math.isfinite(s.loss):
                if first is None or (s.step, r) < first:
                    first = (s.step, r)
                break
    return (first[0], first[1]) if first else (None, None)


def _recorded_target(run: Run) -> tuple[Target | None, str | None]:
    """The target the callback recorded in the manifest, and a note where it could not be read."""
    text = (run.manifest.recording or {}).get("target")
    if not text:
        return None, None
    try:
        return parse_target(str(text)), None
    except TargetError as exc:
        return None, f"the target the callback recorded is not used: {exc}"


def _target_outcome(
    target: Target,
    given_by: str,
    curves: list[MetricCurve],
    by_name: dict[str, list[MetricRecord]],
    axes: _Axes,
) -> TargetOutcome:
    base = {
        "target": str(target),
        "metric": target.metric,
        "value": target.value,
        "lower_is_better": target.lower_is_better,
        "given_by": given_by,
    }
    curve = next((c for c in curves if c.name == target.metric), None)
    if curve is None:
        return TargetOutcome(
            **base, status="not_recorded", reason=not_recorded_text(target, curves), reached=None
        )
    series = _series(by_name[target.metric])
    for rec in series:
        if target.reached(rec.value):
            return TargetOutcome(**base, status="reached", reason="reached", reached=_point(rec, axes))
    if curve.plateau:  # the curve's direction is the target's (_curve)
        what = "validations" if curve.source == "validation" else "values"
        return TargetOutcome(
            **base,
            status="not_projected",
            reason=f"no improvement over the last {curve.evaluations_since_best} {what}: a plateau is not "
            "projected as if it were still improving",
            reached=None,
        )
    finite = [r for r in series if _finite(r.value)]
    # The whole series: a NaN or inf at its end is the projection's "diverging", not a value to drop.
    p = project_to_target([r.step for r in series], [r.value for r in series], target)
    projected = {
        "projection_status": p.status,
        "form": p.form,
        "points_used": p.points_used,
        "asymptote": p.asymptote if p.asymptote is None or math.isfinite(p.asymptote) else None,
    }
    if p.status != "projected" or p.step is None or not finite:
        return TargetOutcome(**base, status="not_projected", reason=p.reason, reached=None, **projected)
    last = finite[-1]
    last_hours = axes.hours(last.t)

    def hours(step: float | None) -> float | None:
        if step is None or axes.s_per_step is None or last_hours is None:
            return None
        return last_hours + max(0.0, step - last.step) * axes.s_per_step / S_PER_HOUR

    h, h_low, h_high = hours(p.step), hours(p.step_low), hours(p.step_high)
    last_samples = axes.samples(last.step)
    per_step = (last_samples / last.step) if last_samples and last.step else None
    return TargetOutcome(
        **base,
        status="projected",
        reason=p.reason,
        reached=None,
        **projected,
        step=p.step,
        step_low=p.step_low,
        step_high=p.step_high,
        hours=h,
        hours_low=h_low,
        hours_high=h_high,
        usd=axes.usd(h),
        usd_low=axes.usd(h_low),
        usd_high=axes.usd(h_high),
        samples=p.step * per_step if per_step else None,
    )


def not_recorded_text(target: Target, curves: Sequence[MetricCurve]) -> str:
    names = ", ".join(c.name for c in curves)
    logged = (
        f"it logged {names}"
        if names
        else "it logged no metric (self.log in validation_step or training_step)"
    )
    return f"the target {target} names {target.metric!r}, which this run did not log; {logged}"


def convergence_section(
    run: Run,
    info: RunInfo,
    throughput: Throughput,
    cost: Cost | None,
    target: Target | None = None,
) -> Convergence | None:
    """The convergence section; `target` (else the one the callback recorded) adds its time and cost.
    None where no rank logged a metric or a training loss, and no target was asked for."""
    notes: list[str] = []
    given_by = "command line"
    if target is None:
        target, note = _recorded_target(run)
        given_by = "callback"
        if note:
            notes.append(note)
    by_name: dict[str, dict[int, list[MetricRecord]]] = {}
    for r, rec in sorted(run.ranks.items()):
        for m in rec.metrics:
            by_name.setdefault(m.name, {}).setdefault(r, []).append(m)
    has_loss = any(s.loss is not None for rec in run.ranks.values() for s in rec.steps)
    if not by_name and not has_loss and target is None:
        return None
    usd_per_hour = cost.price.usd_per_hour if cost is not None and cost.price is not None else None
    not_priced = (
        None
        if usd_per_hour is not None
        else ((cost.not_priced_reason if cost is not None else None) or "the run has no price")
    )
    samples_at = _samples_at(run)
    s_per_step, s_basis = _seconds_per_step(throughput, cost)
    axes = _Axes(info.start_unix, usd_per_hour, samples_at, info.global_batch_size, s_per_step)
    if samples_at:
        samples_basis = "each rank's samples trained on, as recorded with its metrics, summed over the ranks"
    elif info.global_batch_size:
        samples_basis = f"steps × the global batch of {info.global_batch_size:,} samples"
    else:
        samples_basis = "not recorded: no rank counted its samples and the batch size is unknown"
    curves = [
        _curve(name, ranks, axes, target) for name, ranks in sorted(by_name.items(), key=lambda kv: kv[0])
    ]
    outcome = None
    if target is not None:
        lowest = {name: ranks[min(ranks)] for name, ranks in by_name.items()}
        outcome = _target_outcome(target, given_by, curves, lowest, axes)
    nonfinite_step, nonfinite_rank = _nonfinite_loss(run)
    period, unaveraged = _validations_between_averages(run, by_name)
    return Convergence(
        metrics=curves,
        usd_per_hour=usd_per_hour,
        not_priced_reason=not_priced,
        samples_basis=samples_basis,
        s_per_step=s_per_step,
        s_per_step_basis=s_basis,
        plateau_evaluations=PLATEAU_EVALUATIONS,
        spike_rule=SPIKE_RULE,
        loss_spread=_loss_spread(run),
        grad_norm=_grad_norm(run),
        target=outcome,
        notes=notes,
        train_loss_nonfinite_step=nonfinite_step,
        train_loss_nonfinite_rank=nonfinite_rank,
        local_sgd_period=period,
        validations_between_averages=unaveraged,
    )


def _validations_between_averages(
    run: Run, by_name: dict[str, dict[int, list[MetricRecord]]]
) -> tuple[int | None, list[int]]:
    """Under local SGD (TuneupDDPStrategy(local_sgd_period=H)): H, and the steps of validations that ran
    between two parameter averages. There each rank evaluates its own drifted model (a `sync_dist` metric is
    the mean of the ranks' results, not the averaged model's): the goodput benchmark's first local SGD runs,
    validated two steps after each average, looked 11% slower to their target than they were. The parameters
    are averaged after every H-th local step counted from the strategy's start, so a validation after S
    optimizer steps follows an average when (S - start) is a multiple of H."""
    phases = strategy_phases(run)
    if phases is None or phases.local_sgd_period is None or phases.started_at is None:
        return None, []
    period, start = phases.local_sgd_period, phases.started_at
    steps = {
        m.step
        for ranks in by_name.values()
        for m in ranks[min(ranks)]
        if m.source == "validation" and m.step > 0 and phases.local(m.step - 1)
    }
    return period, sorted(step for step in steps if (step - start) % period)


def _at(p: CurvePoint) -> str:
    parts = [f"step {p.step:,}"]
    if p.hours is not None:
        parts.append(f"{p.hours:.3g} h")
    if p.usd is not None:
        parts.append(f"${p.usd:,.2f}")
    return ", ".join(parts)


def convergence_findings(conv: Convergence | None) -> list[Finding]:
    """The section's findings, for the report's list: plateaus, divergence, ranks drifting apart, gradient
    norm spikes."""
    if conv is None:
        return []
    out: list[Finding] = []
    for c in conv.metrics:
        if c.nonfinite_steps:
            out.append(
                Finding(
                    "metric_nonfinite",
                    "warning",
                    f"{c.name} became NaN or infinite (diverged)",
                    f"{c.name} was not finite at {len(c.nonfinite_steps):,} of its {len(c.step):,} recorded "
                    f"values, first at step {c.nonfinite_steps[0]:,}: the training diverged (a learning rate "
                    "too high, an overflow in low precision, or bad data)",
                )
            )
        if c.spike_steps:
            out.append(
                Finding(
                    "metric_spike",
                    "warning",
                    f"{c.name} spiked at step {c.spike_steps[0]:,}",
                    f"{len(c.spike_steps):,} value(s) of {c.name} jumped the wrong way, at step(s) "
                    f"{', '.join(f'{s:,}' for s in c.spike_steps[:5])}: {SPIKE_RULE}",
                )
            )
        if c.plateau and c.best is not None:
            cost = f" and ${c.usd_since_best:,.2f}" if c.usd_since_best is not None else ""
            hours = f"{c.hours_since_best:.3g} h" if c.hours_since_best is not None else "an unknown time"
            out.append(
                Finding(
                    "metric_plateau",
                    "warning",
                    f"{c.name} stopped improving: no new best over its last {c.evaluations_since_best} values",
                    f"its best, {c.best.value:.6g}, was at {_at(c.best)}; since then {c.steps_since_best:,} "
                    f"steps, {hours}{cost} brought no improvement (plateau: none over "
                    f"{conv.plateau_evaluations} validations)",
                )
            )
    if conv.train_loss_nonfinite_step is not None:
        out.append(
            Finding(
                "metric_nonfinite",
                "warning",
                f"The training loss became NaN or infinite at step {conv.train_loss_nonfinite_step:,}",
                f"rank {conv.train_loss_nonfinite_rank}'s recorded loss at step {conv.train_loss_nonfinite_step:,} "
                "was not finite: the training diverged (a learning rate too high, an overflow in low precision, "
                "or bad data)",
            )
        )
    spread = conv.loss_spread
    if spread is not None and spread.drifting:
        out.append(
            Finding(
                "rank_loss_drift",
                "warning",
                f"The {spread.ranks} ranks' training losses drift apart",
                f"the spread of the ranks' mean losses grew from {spread.spread[0]:.4g} (steps to "
                f"{spread.step[0]:,}) to {spread.spread[-1]:.4g} (steps to {spread.step[-1]:,}), against "
                f"{spread.noise[-1]:.4g} that the steps' scatter alone would give: the ranks' models or data "
                f"differ ({spread.rule})",
            )
        )
    if conv.validations_between_averages:
        steps = conv.validations_between_averages
        out.append(
            Finding(
                "validation_between_averages",
                "warning",
                f"{len(steps):,} validation(s) ran between local SGD's parameter averages",
                f"with local_sgd_period={conv.local_sgd_period}, the validations at step(s) "
                f"{', '.join(f'{s:,}' for s in steps[:5])}{' ...' if len(steps) > 5 else ''} evaluated each "
                "rank's own model, drifted since the last average, not the averaged one: their metrics, and a "
                "time to target read from them, understate the model. Validate right after an average: "
                f"val_check_interval a multiple of {conv.local_sgd_period}, counted from the strategy's start",
            )
        )
    gn = conv.grad_norm
    if gn is not None and gn.spike_steps:
        out.append(
            Finding(
                "grad_norm_spike",
                "info",
                f"The gradient norm spiked at step {gn.spike_steps[0]:,}",
                f"{len(gn.spike_steps):,} step(s) had a gradient norm ({gn.source}) well above its recent "
                f"median (median over the run {gn.median:.4g}): {SPIKE_RULE}",
            )
        )
    return out
