"""Recommendations: what to change, each with its predicted gain and interval, the evidence, and the code
(tuneup.advise; tuneup/report/advice.py turns the advice into blocks). Right after the summary: it is what
a reader of the report came for."""

from __future__ import annotations

from collections.abc import Sequence

from tuneup.analyze.model import RunAnalysis
from tuneup.report.advice import advice_blocks, advice_for
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block

ID = "recommendations"
TITLE = "Recommendations"
PLOTS = ()


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    return advice_blocks(advice_for(analysis))
