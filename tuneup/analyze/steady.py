"""Where steady state begins: the warm-up steps a throughput figure must leave out.

The first steps of a run are slower for reasons that do not recur (allocator growth, cuDNN autotuning,
lazy initialisation, compilation, the first dataloader workers starting). Steady state begins at the
first step that is itself within `WARMUP_FACTOR` of the steady step time (the median of the second
half of the run) and starts a window of steps whose median is too. Requiring the window keeps an early
burst of fast steps from ending warm-up; requiring the step itself keeps one slow step inside that window
from being taken for steady state. An isolated slow step later on (a data stall, a checkpoint) does not
extend warm-up. At least one step is always warm-up, since the first carries setup.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

WARMUP_FACTOR = 1.5


def warmup_steps(wall_ms: Sequence[float]) -> int:
    """How many leading steps are warm-up, given the step times in order."""
    n = len(wall_ms)
    if n <= 1:
        return 0
    if n < 4:
        return 1
    limit = WARMUP_FACTOR * statistics.median(wall_ms[n // 2 :])
    window = max(5, min(50, n // 20))
    for k in range(1, n // 2 + 1):
        if wall_ms[k] <= limit and statistics.median(wall_ms[k : k + window]) <= limit:
            return k
    return n // 2


def steady_steps(steps: Sequence[T]) -> Sequence[T]:
    """The steps after warm-up, of one rank's steps in order (anything with a `wall_ms`)."""
    return steps[warmup_steps([s.wall_ms for s in steps]) :]  # type: ignore[attr-defined]
