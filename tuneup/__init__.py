"""tuneup: where the time and money of a PyTorch Lightning training run go, and what to change.

`load_run` reads a recorded run (no torch needed). `TuneupCallback` is imported on first use, so that
`import tuneup` and the `tuneup` command stay fast on machines that only read reports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuneup._version import __version__
from tuneup.record import RunRecordError, load_run

if TYPE_CHECKING:
    from tuneup.plugins.lightning import TuneupCallback

__all__ = ["RunRecordError", "TuneupCallback", "__version__", "load_run"]


def __getattr__(name: str) -> Any:
    if name == "TuneupCallback":
        from tuneup.plugins.lightning import TuneupCallback

        return TuneupCallback
    raise AttributeError(f"module 'tuneup' has no attribute {name!r}")
