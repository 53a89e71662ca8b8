"""Throughput: the steady-state rates per rank and for the whole job, and how they are computed.

The rates are means over the steady steps' time (THROUGHPUT_STATISTIC): what the job delivers per second
it is paid for, so a periodic stall counts. The step quoted beside them is therefore the mean step.
"""

from __future__ import annotations

from collections.abc import Sequence

from tuneup.analyze.model import THROUGHPUT_STATISTIC, RankThroughput, RunAnalysis, Throughput
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, Paragraph, table
from tuneup.report.format import is_number, ms, number, text

ID = "throughput"
TITLE = "Throughput"
PLOTS = ()

NO_STEADY_STEPS = "No steady-state steps were recorded, so there is no throughput to show."


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    tp = analysis.throughput
    if not tp.per_rank:
        return [Paragraph(NO_STEADY_STEPS, True)]

    def row(label: str, r: RankThroughput | Throughput) -> tuple[str, ...]:
        return (label, number(r.samples_per_s), number(r.tokens_per_s), number(r.steps_per_s))

    rows = [row(text(r.rank), r) for r in tp.per_rank] + [row("All ranks", tp)]
    out: list[Block] = [
        table(
            "Steady-state rates per rank",
            ("Rank", "Samples/s", "Tokens/s", "Training steps/s"),
            rows,
            (1, 2, 3),
            total=True,
        ),
        Paragraph(f"How the rates are computed: {THROUGHPUT_STATISTIC}."),
        Paragraph(
            "For all ranks, samples and tokens add up; training steps/s is the slowest rank's, since ranks "
            "step together. A training step is a batch that stepped the optimizers, as Lightning counts "
            "training steps (with accumulation, all its micro-batches; a GAN stepping two optimizers per batch "
            "makes one step per batch, though its global_step moves by two)."
        ),
    ]
    st = analysis.step_time
    if is_number(st.mean_ms):
        out.append(
            Paragraph(
                f"The step these rates are made of is the steady-state mean step, {ms(st.mean_ms)} "
                f"(median {ms(st.median_ms)}, p95 {ms(st.p95_ms)}): see Where step time goes."
            )
        )
    return out
