"""tuneup: where the time and money of a PyTorch Lightning training run go, and what to change.

`load_run` reads a recorded run (no torch needed). `TuneupCallback` (Lightning), `track` (a plain PyTorch
loop: ``with tuneup.track(...) as run:``) and the subpackages (`tuneup.report`,
`tuneup.analyze`, `tuneup.compare`, ...) are imported on first use (PEP 562), so that `import tuneup`
and the `tuneup` command stay fast on machines that only read reports, and never import torch or
matplotlib for a program that does not need them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tuneup._version import __version__
from tuneup.record import RunRecordError, load_run

if TYPE_CHECKING:
    # The lazy subpackages, for type checkers (the redundant alias marks a re-export).
    from tuneup import analyze as analyze
    from tuneup import catalog as catalog
    from tuneup import collect as collect
    from tuneup import compare as compare
    from tuneup import cost as cost
    from tuneup import plugins as plugins
    from tuneup import record as record
    from tuneup import report as report
    from tuneup.plugins.lightning import PLTuneupDDPStrategy, TuneupCallback, TuneupDDPStrategy
    from tuneup.plugins.loop import track

__all__ = [
    "PLTuneupDDPStrategy",
    "RunRecordError",
    "TuneupCallback",
    "TuneupDDPStrategy",
    "__version__",
    "load_run",
    "track",
]
# The Lightning plugin's names, imported with it on first use.
_PLUGIN_NAMES = frozenset({"TuneupCallback", "TuneupDDPStrategy", "PLTuneupDDPStrategy"})

# Reachable as `tuneup.<name>` after a plain `import tuneup`, as they would be after `import tuneup.<name>`.
_SUBPACKAGES = frozenset({"analyze", "catalog", "collect", "compare", "cost", "plugins", "record", "report"})


def __getattr__(name: str) -> Any:
    if name == "track":
        from tuneup.plugins.loop import track

        return track
    if name in _PLUGIN_NAMES:
        import tuneup.plugins.lightning as plugin

        return getattr(plugin, name)
    if name in _SUBPACKAGES:
        # import_module also binds the attribute on this package, so this runs once per name.
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'tuneup' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBPACKAGES})
