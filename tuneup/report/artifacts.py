"""What the renderers share: the report's sections, the plots drawn for it, and a safe way to read it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    ("interruptions", "Interruptions and checkpoints"),
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


def dig(obj: Any, *keys: str) -> Any:
    """`obj[k1][k2]...`, or None where a level is missing or not a dict: renderers read a report from
    an older or newer tuneup, or a damaged one, without a traceback."""
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj
