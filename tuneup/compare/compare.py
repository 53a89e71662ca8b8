"""A baseline against a candidate: a verdict per metric, as a terminal table, Markdown and JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tuneup.compare.rule import MetricComparison, Rule, Verdict, decide, effect_percent
from tuneup.compare.runs import METRICS, CompareInputError, RunSummary, Side, mismatches
from tuneup.compare.to_target import (
    TargetComparison,
    compare_to_target,
    run_figure,
    side_figure,
    side_to_target,
)
from tuneup.report.format import aligned_table, ms, size_bytes, usd, with_unit
from tuneup.report.markdown import markdown_text

# Exit codes. The default keeps 0 for every outcome but a regression, as CI jobs written against it
# expect (an improvement must not fail a job); `detailed=True` (`--detailed-exit-codes`) tells them apart.
# 2 is bad input (the CLI's usage error) in both.
EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_INCONCLUSIVE = 3
EXIT_IMPROVEMENT = 4

# The settings a tuning change sets (what `tuneup advise` recommends and `tuneup tune` tries). Runs that
# differ only in these are the comparison the advice asks for ("compare the runs with `tuneup compare`"),
# compared as they are and said to be the change; other differences (the hardware, the model) still need
# --allow-mismatch. A batch-32 against a batch-64 run was refused, and the printed follow-up failed.
CHANGE_UNDER_TEST = (
    "workload.batch_size",
    "workload.accumulate_grad_batches",
    "workload.precision",
    "workload.strategy",
)
# Where these differ a step does different work on each side: step time is no like-for-like figure (a batch
# twice as large takes longer a step and may still deliver more a second), and throughput compares them.
WORK_PER_STEP = ("workload.batch_size", "workload.accumulate_grad_batches")


def _key(phrase: str) -> str:
    """'workload.batch_size: 32 vs 64' -> 'workload.batch_size' (tuneup.compare.runs.mismatches)."""
    return phrase.split(":", 1)[0]


@dataclass(frozen=True)
class Comparison:
    baseline: Side
    candidate: Side
    rule: Rule
    results: tuple[MetricComparison, ...]
    skipped: dict[str, str] = field(default_factory=dict)  # metric -> why it was not compared
    mismatches: tuple[str, ...] = ()  # what differs between the sides, compared anyway when allowed
    changed: tuple[str, ...] = ()  # the settings the sides differ in on purpose (CHANGE_UNDER_TEST)
    to_target: TargetComparison | None = None  # `--target`: time and $ to a quality target (to_target.py)

    def count(self, verdict: Verdict) -> int:
        return sum(r.verdict == verdict for r in self.results)

    @property
    def regression(self) -> bool:
        """A metric's REGRESSION, or slower to the target by the rule of tuneup.compare.to_target."""
        return bool(self.count(Verdict.REGRESSION)) or (
            self.to_target is not None and self.to_target.regression
        )

    def exit_code(self, *, inconclusive_fails: bool = False, detailed: bool = False) -> int:
        """0 no regression, 1 regression (or an INCONCLUSIVE metric with `inconclusive_fails`). `detailed`:
        1 regression, 3 inconclusive, 4 improvement, 0 no change, the first that applies in that order."""
        if self.regression:
            return EXIT_REGRESSION
        inconclusive = bool(self.count(Verdict.INCONCLUSIVE))
        if detailed:
            if inconclusive:
                return EXIT_INCONCLUSIVE
            return EXIT_IMPROVEMENT if self.count(Verdict.IMPROVEMENT) else EXIT_OK
        if inconclusive_fails and inconclusive:
            return EXIT_REGRESSION
        return EXIT_OK

    def as_dict(self) -> dict[str, Any]:
        return {
            "baseline": {
                "source": self.baseline.label,
                "kind": self.baseline.kind,
                "runs": len(self.baseline.runs),
            },
            "candidate": {
                "source": self.candidate.label,
                "kind": self.candidate.kind,
                "runs": len(self.candidate.runs),
            },
            "rule": {
                "alpha": self.rule.alpha,
                "min_effect": self.rule.min_effect,
                "cv_multiplier": self.rule.cv_multiplier,
                "confidence": self.rule.confidence,
                "description": self.rule.describe(),
            },
            "metrics": [r.as_dict() for r in self.results],
            "skipped": self.skipped,
            "mismatches": list(self.mismatches),
            "changed": list(self.changed),
            "target": self.to_target.as_dict() if self.to_target is not None else None,
            "regression": self.regression,
        }


def compare(
    baseline: Side,
    candidate: Side,
    *,
    metrics: Sequence[str] = tuple(METRICS),
    rule: Rule | None = None,
    allow_mismatch: bool = False,
    target: str | None = None,
) -> Comparison:
    """Compare the sides metric by metric; CompareInputError for sides that must not be compared. `target`
    (its text, `val_loss<=2.1`; the sides loaded with it, `load_side(path, target)`) adds the time and $ to
    it, each run's from its `RunSummary.to_target`."""
    rule = rule or Rule()
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise CompareInputError(f"unknown metric {', '.join(unknown)}; choose from {', '.join(METRICS)}")
    shared = {r.run_id for r in baseline.runs} & {r.run_id for r in candidate.runs}
    if shared:
        raise CompareInputError(
            f"a run compared with itself ({', '.join(sorted(shared))} on both sides); "
            "the candidate must be new runs"
        )
    every_difference = mismatches(baseline.fingerprint, [candidate.fingerprint])
    changed = tuple(d for d in every_difference if _key(d) in CHANGE_UNDER_TEST)
    differs = tuple(d for d in every_difference if d not in changed)
    if differs and not allow_mismatch:
        raise CompareInputError(
            "the sides ran different hardware or workloads (" + "; ".join(differs) + "); "
            "compare like with like, or pass --allow-mismatch"
        )
    results, skipped = [], {}
    other_work = [d for d in changed if _key(d) in WORK_PER_STEP]
    for key in metrics:
        metric = METRICS[key]
        if key == "step_time" and other_work:
            skipped[key] = (
                f"a step does different work on each side ({'; '.join(other_work)}); throughput compares them"
            )
            continue
        base = [r.value(key) for r in baseline.runs]
        cand = [r.value(key) for r in candidate.runs]
        unit = metric.unit
        if key == "throughput":
            units = {r.throughput_unit for r in (*baseline.runs, *candidate.runs)}
            if len(units) > 1:
                skipped[key] = f"one side counts samples, the other only steps ({', '.join(sorted(units))})"
                continue
            unit = units.pop()
        if key == "peak_memory" and (why := mixed_memory_reason((*baseline.runs, *candidate.runs))):
            skipped[key] = why
            continue
        if any(v is None for v in base + cand):
            skipped[key] = not_recorded_reason(key)
            continue
        if any(v <= 0 for v in base + cand):  # type: ignore[operator]
            # Fully overlapped communication is 0 ms: a ratio, which the rule tests, cannot hold it.
            skipped[key] = zero_reason(metric.label, base + cand)  # type: ignore[arg-type]
            continue
        results.append(
            decide(
                metric.label,
                [float(v) for v in base],  # type: ignore[arg-type]
                [float(v) for v in cand],  # type: ignore[arg-type]
                higher_is_better=metric.higher_is_better,
                unit=unit,
                rule=rule,
                deterministic=metric.deterministic,
            )
        )
    return Comparison(
        baseline,
        candidate,
        rule,
        tuple(results),
        skipped,
        differs if allow_mismatch else (),
        changed,
        None if target is None else _to_target(target, baseline, candidate, rule),
    )


def not_recorded_reason(key: str) -> str:
    """Why a metric some run lacks is not compared, and what records it."""
    return {
        "peak_memory": "not recorded on every run (GPU peak memory, or the process tree's PSS or RSS from telemetry)",
        "cost_per_sample": "a run is not priced (TuneupCallback(instance=...) or TUNEUP_INSTANCE records one)",
        "exposed_comm": "not recorded on every run (one process has no collectives)",
    }.get(key, "not recorded on every run")


def zero_reason(label: str, values: Sequence[float]) -> str:
    """Why a metric with zeros is not compared (the rule tests ratios)."""
    zeros = sum(v <= 0 for v in values)
    if zeros == len(values):
        return f"0 in every run ({label} fully hidden on both sides): nothing to compare"
    return f"0 in {zeros} of {len(values)} runs: a ratio cannot compare it; step time carries the change"


def _to_target(target: str, baseline: Side, candidate: Side, rule: Rule) -> TargetComparison:
    """Both sides' time and $ to the target; CompareInputError where no run of either logged its metric
    (a misspelt name must not read as "neither reached it")."""
    runs = [*baseline.runs, *candidate.runs]
    figures = [r.to_target for r in runs]
    if any(f is None for f in figures):
        raise CompareInputError(f"the sides were loaded without the target {target}; load them with it")
    if all(f.status == "not_recorded" for f in figures if f is not None):
        raise CompareInputError(figures[0].reason)  # type: ignore[union-attr]
    units = {r.throughput_unit for r in runs}

    def side(name: str, s: Side) -> Any:
        return side_to_target(
            name,
            [r.to_target for r in s.runs if r.to_target is not None],
            [r.throughput for r in s.runs],
            s.runs[0].throughput_unit if s.runs else "samples/s",
        )

    return compare_to_target(
        target,
        side("baseline", baseline),
        side("candidate", candidate),
        min_effect=rule.min_effect,
        throughput_comparable=len(units) == 1,
    )


# -- rendering ---------------------------------------------------------------------------------------


def format_value(v: float | None, unit: str) -> str:
    """A compared figure as the report writes it (tuneup.report.format): thousands grouped, as many
    decimals as its size deserves, never an exponent. Every figure compare and bench print goes
    through here, so that a run's throughput reads alike in each of their lines."""
    if v is None:
        return "-"  # as the table's other empty cells
    if unit == "bytes":
        return size_bytes(v)
    if unit == "USD":
        return usd(v)
    if unit == "ms":
        return ms(v)
    return with_unit(v, unit)  # rates: samples/s, steps/s


def _interval(r: MetricComparison) -> str:
    """The effect's interval, in the effect's own terms (percent change of the candidate)."""
    if r.ci_low is None or r.ci_high is None:
        return "-"
    return f"[{effect_percent(r.ci_low)}, {effect_percent(r.ci_high)}]"


def _p(p: float | None) -> str:
    return "-" if p is None else (f"{p:.3g}" if p >= 0.001 else "<0.001")


def _rows(c: Comparison) -> list[list[str]]:
    return [
        [
            r.metric,
            r.verdict.value,
            format_value(r.baseline_mean, r.unit),
            format_value(r.candidate_mean, r.unit),
            r.effect_text,
            _interval(r),
            _p(r.p_worse),
            f"{r.threshold:.1%}",
        ]
        for r in c.results
    ]


HEADER = ["metric", "verdict", "baseline", "candidate", "change", "CI", "p (worse)", "threshold"]


def mixed_memory_reason(runs: Sequence[RunSummary]) -> str | None:
    """Why the runs' peak memory cannot be compared, where they measured different memory (a run
    recorded before PSS was against one with it; a rank's high-water mark against a tree's PSS)."""
    kinds = {r.memory_kind for r in runs}
    if len(kinds) > 1:
        return f"the sides measured different memory ({', '.join(sorted(map(str, kinds)))})"
    return None


def _ratio_note(rule: Rule) -> str:
    return (
        "baseline and candidate: geometric means of the runs' figures; change = candidate / baseline - 1, "
        f"the change the test tests and the threshold is compared with, with its {rule.confidence:.0%} "
        "interval (CI)"
    )


def _sides(c: Comparison) -> str:
    return (
        f"baseline {c.baseline.label} ({len(c.baseline.runs)} run(s), {c.baseline.kind}) against "
        f"candidate {c.candidate.label} ({len(c.candidate.runs)} run(s), {c.candidate.kind})"
    )


def format_table(c: Comparison) -> str:
    # The metric and its verdict read left to right; the figures line up on the right.
    figures = range(2, len(HEADER))
    lines = [_sides(c), "", *aligned_table(HEADER, _rows(c), figures, indent="  ")]
    lines.append("")
    lines.extend(f"  {r.metric}: {r.reason}" for r in c.results)
    lines.extend(f"  {metric}: not compared, {why}" for metric, why in c.skipped.items())
    if c.changed:
        lines.append("  the change compared: " + "; ".join(c.changed))
    if c.mismatches:
        lines.append("  compared despite differences (--allow-mismatch): " + "; ".join(c.mismatches))
    lines.append(f"  rule: {c.rule.describe()}; {_ratio_note(c.rule)}")
    if c.to_target is not None:
        lines.extend(["", *target_lines(c.to_target)])
    return "\n".join(lines)


def target_lines(t: TargetComparison) -> list[str]:
    """Time and $ to the target: each side's figure beside its samples/s, then the verdict sentence."""
    out = [f"to the target {t.target}:"]
    for s in (t.baseline, t.candidate):
        rate = format_value(s.samples_per_s, s.throughput_unit)
        out.append(f"  {s.side:<9}  {rate:>16}  {side_figure(s)}")
        for run in s.per_run if s.runs > 1 else ():
            out.append(f"    {run.run_id}: {run_figure(run)}")
    out.append("  " + t.verdict)
    return out


def format_markdown(c: Comparison) -> str:
    """For a GitHub job summary or a PR comment."""
    regressions = c.count(Verdict.REGRESSION)
    slower = c.to_target is not None and c.to_target.regression
    head = (
        f"**tuneup compare: {regressions} regression(s)**"
        if regressions
        else "**tuneup compare: slower to the target**"
        if slower
        else "**tuneup compare: no regression**"
    )
    inconclusive = c.count(Verdict.INCONCLUSIVE)
    if inconclusive:
        head += f" ({inconclusive} inconclusive)"
    lines = [head, "", markdown_text(_sides(c)), ""]
    lines.append("| " + " | ".join(HEADER) + " |")
    lines.append("| --- | --- | " + " | ".join("---:" for _ in HEADER[2:]) + " |")
    for row in _rows(c):
        row[1] = f"**{row[1]}**" if row[1] in ("REGRESSION", "INCONCLUSIVE") else row[1]
        lines.append(
            "| " + " | ".join(markdown_text(cell) if i != 1 else cell for i, cell in enumerate(row)) + " |"
        )
    lines.append("")
    # Each metric's verdict and its one effect figure (the table's change column), then why.
    lines.extend(
        f"- {markdown_text(r.metric)}: **{r.verdict.value}**, {markdown_text(r.effect_text)}: "
        f"{markdown_text(r.reason)}"
        for r in c.results
    )
    lines.extend(f"- {markdown_text(m)}: not compared, {markdown_text(why)}" for m, why in c.skipped.items())
    if c.changed:
        lines.append("- the change compared: " + markdown_text("; ".join(c.changed)))
    if c.mismatches:
        lines.append("- compared despite differences: " + markdown_text("; ".join(c.mismatches)))
    lines.append(f"- rule: {markdown_text(c.rule.describe())}; {markdown_text(_ratio_note(c.rule))}")
    if c.to_target is not None:
        t = c.to_target
        lines.extend(["", f"**to the target {markdown_text(t.target)}**", ""])
        for s in (t.baseline, t.candidate):
            rate = format_value(s.samples_per_s, s.throughput_unit)
            lines.append(f"- {s.side}: {markdown_text(rate)}; {markdown_text(side_figure(s))}")
        lines.append(f"- {markdown_text(t.verdict)}")
    return "\n".join(lines) + "\n"
