"""Summary and findings: the headline figures, what steady state covers, and what the run's figures say.

The tiles name their statistic: throughput is a steady-state mean (THROUGHPUT_STATISTIC), so the step
shown beside it is the mean step, the step the throughput is made of, with the median and p95 as
detail. A median step next to a mean-based rate would not multiply back to it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tuneup.analyze.model import RunAnalysis
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, FindingItem, FindingList, Metric, Metrics, Paragraph
from tuneup.report.format import count, is_number, ms, number, plural, sentence, text

ID = "summary"
TITLE = "Summary and findings"
PLOTS = ()

STEADY_MEAN = "steady-state mean"


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    tp, st = analysis.throughput, analysis.step_time
    tokens = tp.tokens_per_s
    out: list[Block] = [
        Metrics(
            (
                Metric("Samples/s", number(tp.samples_per_s), f"all ranks, {STEADY_MEAN}"),
                Metric(
                    "Tokens/s",
                    number(tokens),
                    f"all ranks, {STEADY_MEAN}" if is_number(tokens) else "no token count recorded",
                ),
                Metric("Optimizer steps/s", number(tp.steps_per_s), f"the slowest rank's, {STEADY_MEAN}"),
                Metric(
                    "Mean step",
                    ms(st.mean_ms),
                    f"{STEADY_MEAN}; median {ms(st.median_ms)}, p95 {ms(st.p95_ms)}",
                ),
            )
        ),
        Paragraph(steady_state(analysis)),
        FindingList(
            tuple(
                FindingItem(text(f.severity), text(f.title), sentence(f.evidence)) for f in analysis.findings
            )
        ),
    ]
    if analysis.warnings:
        out.append(
            Paragraph(
                f"{plural(len(analysis.warnings), 'warning')} came up while the run was recorded or read: "
                "see Warnings."
            )
        )
    return out


def steady_state(analysis: RunAnalysis) -> str:
    """Which steps the headline figures cover: the warm-up left out, by which rule."""
    warm = analysis.warmup
    steps, recorded = warm.steps, analysis.run.steps_recorded
    of = f" of {count(recorded)} recorded" if is_number(recorded) else ""
    if is_number(steps) and steps > 0:
        rule = f" ({text(warm.rule)})" if warm.rule else ""
        first = "the first step" if steps == 1 else f"the first {count(steps)} steps"
        verb = "is" if steps == 1 else "are"
        return (
            f"Steady state: {first}{of} {verb} left out as warm-up{rule}; "
            "throughput and step times cover the steps after."
        )
    if is_number(steps):
        return f"Steady state: no step was left out as warm-up; figures cover all steps{of}."
    return "Steady state: warm-up was not determined."
