"""A plot written for a report: what the sections, the serializers and the plot writer pass around."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class PlotFile:
    """One PNG written for a report."""

    name: str  # file name, e.g. "step_time.png"
    path: Path  # where it was written
    title: str
    section: str  # the id of the section it belongs to (tuneup.report.sections.SECTIONS)
    caption: str  # one sentence: what the plot shows and how to read it (also the image's alt text)
