"""What the renderers hand each other: the plots drawn for a report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The report's sections, in page order, with their HTML ids. Every format keeps this order.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("summary", "Summary and findings"),
    ("run", "The run"),
    ("throughput", "Throughput"),
    ("step-time", "Where step time goes"),
    ("timeseries", "Over the run"),
    ("hardware", "GPUs, processes and hosts"),
    ("ranks", "Ranks side by side"),
    ("data-loader", "Data loading"),
    ("communication", "Communication"),
    ("cost", "Cost"),
    ("environment", "Environment"),
    ("warnings", "Warnings"),
)


@dataclass(frozen=True, slots=True)
class PlotFile:
    """One PNG written for a report."""

    name: str  # file name, e.g. "step_time.png"
    path: Path  # where it was written
    title: str
    section: str  # one of the SECTIONS ids
    caption: str  # one sentence: what the plot shows and how to read it (also the image's alt text)
