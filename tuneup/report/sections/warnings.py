"""The Warnings section: what went wrong while the run was recorded or read (a damaged line, a missing
rank, a sensor that gave up), one bullet each."""

from __future__ import annotations

from collections.abc import Sequence

from tuneup.analyze.model import RunAnalysis
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, Bullets, Paragraph
from tuneup.report.format import text
from tuneup.report.plotting import Plot

ID = "warnings"
TITLE = "Warnings"
PLOTS: tuple[Plot, ...] = ()


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    if analysis.warnings:
        return [Bullets(tuple(text(w) for w in analysis.warnings))]
    return [Paragraph("No warnings were recorded.", True)]
