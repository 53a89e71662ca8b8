"""Summary and findings: the headline figures, what steady state covers, and what the run's figures say.

The tiles name their statistic: throughput is a steady-state mean (THROUGHPUT_STATISTIC), so the step
shown beside it is the mean step, the step the throughput is made of, with the median and p95 as
detail. A median step next to a mean-based rate would not multiply back to it. Where a few slow steps carry
the mean step (the analysis marks it noisy), the tile says so, and the median beside it is the typical step.
"""

from __future__ import annotations

from collections.abc import Sequence

from tuneup.analyze.model import RunAnalysis
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, FindingItem, FindingList, Metric, Metrics, Paragraph
from tuneup.report.format import count, is_number, ms, number, plural, sentence, text
from tuneup.report.sections.badput import ledger_line
from tuneup.report.sections.convergence import target_line
from tuneup.report.sections.timeline import summary_line

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
                Metric(
                    "Training steps/s",
                    number(tp.steps_per_s),
                    f"the slowest rank's, {STEADY_MEAN}; a step is a batch that stepped the optimizers",
                ),
                Metric(
                    "Mean step",
                    ms(st.mean_ms),
                    f"{STEADY_MEAN}; median {ms(st.median_ms)}, p95 {ms(st.p95_ms)}"
                    + ("; heavy-tailed: slow steps pull the mean above the median" if st.noisy else ""),
                ),
            )
        ),
        *([Paragraph(summary_line(analysis.timeline, analysis))] if analysis.timeline is not None else []),
        *([Paragraph(ledger_line(analysis.badput))] if analysis.badput is not None else []),
        *(
            [Paragraph(sentence(f"Target: {target_line(conv.target)}"))]
            if (conv := analysis.convergence) and conv.target
            else []
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
    if warm.no_steady_state:
        return (
            f"No steady state: {text(warm.no_steady_state)}. No throughput, step time or cost per sample is "
            "quoted; run more steps (a few dozen past warm-up) for figures worth reading."
        )
    steps, recorded = warm.steps, analysis.run.steps_recorded
    of = f" of {count(recorded)} recorded" if is_number(recorded) else ""
    slow = analysis.step_time.slow_periods
    # Slow periods are not warm-up: say that they are inside the figures, so no one looks for them outside.
    kept = (
        f" {plural(len(slow), 'slow period')} ({sum(p.steps for p in slow):,} recorded steps) "
        f"{'is' if len(slow) == 1 else 'are'} kept in them: see Where step time goes."
        if slow
        else ""
    )
    if is_number(steps) and steps > 0:
        rule = f" ({text(warm.rule)})" if warm.rule else ""
        first = "the first step" if steps == 1 else f"the first {count(steps)} steps"
        verb = "is" if steps == 1 else "are"
        return (
            f"Steady state: {first}{of} {verb} left out as warm-up{rule}; "
            f"throughput and step times cover the steps after.{kept}"
        )
    if is_number(steps):
        return f"Steady state: no step was left out as warm-up; figures cover all steps{of}.{kept}"
    return "Steady state: warm-up was not determined."
