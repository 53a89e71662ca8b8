"""Data loading: how long each step waited for its batch, and the stalls where one came far too late."""

from __future__ import annotations

from collections.abc import Sequence

from tuneup.analyze.data_loading import STALL_FACTOR_OF_MEDIAN, STALL_SHARE_OF_STEP
from tuneup.analyze.model import RunAnalysis
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, KeyValues, figures, table
from tuneup.report.format import count, ms, number, text
from tuneup.report.plotting import Plot

ID = "data-loader"
TITLE = "Data loading"
PLOTS: tuple[Plot, ...] = ()


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    dl = analysis.data_loader
    stalls = count(dl.stall_count)
    if dl.stall_count:
        stalls += f", {ms(dl.stall_total_ms)} in all"
    pairs = (
        ("Median data wait per step", ms(dl.median_data_ms)),
        (
            "Stall threshold",
            f"{ms(dl.stall_threshold_ms)} (the larger of {number(STALL_FACTOR_OF_MEDIAN, 0)}× the "
            f"median data wait and {STALL_SHARE_OF_STEP:.0%} of the median step)",
        ),
        ("Stalls", stalls),
        ("Batch size", text(dl.batch_size)),
        ("num_workers", text(dl.num_workers)),
        ("pin_memory", text(dl.pin_memory)),
        ("persistent_workers", text(dl.persistent_workers)),
    )
    out: list[Block] = [KeyValues("", pairs)]
    # At most WORST_STALLS rows, however many ranks: the analysis keeps only the worst.
    if dl.worst_stalls:
        rows = [(text(s.rank), text(s.step), ms(s.data_ms), ms(s.wall_ms)) for s in dl.worst_stalls]
        out.append(table("Worst stalls", ("Rank", "Step", "Data wait", "Step time"), rows, (2, 3)))
    return out + figures(ID, plots)
