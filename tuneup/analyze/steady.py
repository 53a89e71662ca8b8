"""Where steady state begins: the warm-up steps a throughput figure must leave out.

The first steps of a run are slower for reasons that do not recur (allocator growth, cuDNN autotuning,
lazy initialisation, compilation, the first dataloader workers starting). That is a leading transient:
short, and slowest at its start. A slow stretch that is flat (a contended host, a co-scheduled job, a cold
page cache) is not warm-up, even at the start of the run: it is part of what the job delivered, stays in
the figures, and is reported as a slow period (tuneup/analyze/slow_periods.py).

The rule, in three parts:

1. Settling. Steady state begins at the first step that is itself within `WARMUP_FACTOR` of the steady step
   time (the median of the second half of the run) and starts a window of steps whose median is too.
   Requiring the window keeps an early burst of fast steps from ending warm-up; requiring the step itself
   keeps one slow step inside that window from being taken for steady state. An isolated slow step later
   on (a data stall, a checkpoint) does not extend warm-up. At least one step is always warm-up, since the
   first carries setup.
2. Bounded. Warm-up is looked for only within the first `WARMUP_MAX_SHARE` of the recorded steps (and
   never fewer than `PLATEAU_MIN_STEPS`, nor more than half).
3. Decaying. A slow lead longer than `PLATEAU_MIN_STEPS` must fall: the median of its first half at least
   `DECAY_RATIO` times that of its second half. If it does not, it is a plateau, and only the transient
   ahead of the plateau (the steps above `WARMUP_FACTOR` times the plateau's own level) is warm-up.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

# A step within this factor of the steady step time is at steady state: well above the run-to-run jitter of
# a steady step (a few per cent on a GPU, tens of per cent on a shared CPU), well below a warm-up step.
WARMUP_FACTOR = 1.5
# A slow lead up to this many steps is warm-up whatever its shape: allocator growth, autotuning and worker
# start-up take a handful of steps, in no particular order of slowness. Longer than this, a stretch of
# slow steps is long enough to have a shape, and a flat one is a plateau, not a transient.
PLATEAU_MIN_STEPS = 10
# A transient falls: its first half at least this much slower than its second half. A plateau's halves sit
# at one level (a ratio near 1, within step-time jitter of about 10%), so 1.25 separates the two with room
# for that jitter.
DECAY_RATIO = 1.25
# Warm-up never covers more than this share of the recorded steps: dropping more would make the figures
# describe a different run than the one that was paid for. A slow stretch beyond it stays in the figures
# and is reported as a slow period. (Short runs still allow PLATEAU_MIN_STEPS: a 12-step test run may
# spend 5 of them warming up.)
WARMUP_MAX_SHARE = 0.25


def _window(n: int) -> int:
    return max(5, min(50, n // 20))


def _settles(wall_ms: Sequence[float], limit_ms: float, up_to: int, window: int) -> int:
    """The first step in 1..up_to that is within `limit_ms` and starts a window whose median is too;
    `up_to` where none is."""
    for k in range(1, up_to + 1):
        if wall_ms[k] <= limit_ms and statistics.median(wall_ms[k : k + window]) <= limit_ms:
            return k
    return up_to


def _decaying(wall_ms: Sequence[float]) -> bool:
    """Whether a stretch of slow steps falls (a transient) rather than sits level (a plateau)."""
    half = len(wall_ms) // 2
    return statistics.median(wall_ms[:half]) >= DECAY_RATIO * statistics.median(wall_ms[half:])


def warmup_steps(wall_ms: Sequence[float]) -> int:
    """How many leading steps are warm-up, given the step times in order."""
    n = len(wall_ms)
    if n <= 1:
        return 0
    if n < 4:
        return 1
    window = _window(n)
    cap = min(n // 2, max(PLATEAU_MIN_STEPS, int(WARMUP_MAX_SHARE * n)))
    k = _settles(wall_ms, WARMUP_FACTOR * statistics.median(wall_ms[n // 2 :]), cap, window)
    if k > PLATEAU_MIN_STEPS and not _decaying(wall_ms[1:k]):
        # A plateau: its level is where the slow lead ends up (its last steps); whatever ran above that
        # level before it is the transient, and the plateau itself is left in the steady steps.
        level_ms = statistics.median(wall_ms[k - PLATEAU_MIN_STEPS : k])
        k = _settles(wall_ms, WARMUP_FACTOR * level_ms, k, window)
    return k


def steady_steps(steps: Sequence[T]) -> Sequence[T]:
    """The steps after warm-up, of one rank's steps in order (anything with a `wall_ms`)."""
    return steps[warmup_steps([s.wall_ms for s in steps]) :]  # type: ignore[attr-defined]
