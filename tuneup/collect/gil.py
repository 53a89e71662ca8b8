"""How tuneup's background threads share the GIL with the training thread.

PyTorch releases the GIL while an operator runs, so a background thread (the record writer, the
telemetry sampler) gets it at once; when the operator returns, the training thread needs it back and
waits until the background thread lets go of it: at a blocking call, or after CPython's switch interval
(5 ms), when the waiting thread asks for it. A background thread's Python work is therefore paid almost
one for one by the training thread, however idle the machine's other cores. Measured with
benchmarks/gil_share.py (2 ms of Python every 50 ms beside a loop of 0.3 ms matrix products): +3.1% to
+3.8% on the loop when the work ran in one go; +0.2% to +0.3% when it paused every 100 us with
`time.sleep(0)`; +0.7% to +1.1% when it slept 50 us instead (a real sleep spreads the work over more of the
loop's operator returns).

So the background threads do their work in pieces of at most PIECE_S, through `GilPacer`, and the training
thread waits for the GIL at most about that long.
"""

from __future__ import annotations

import time

# The most Python work between two pauses: about the longest the training thread waits for the GIL. A
# pause costs a system call (a few us), so pausing after every record (10 us of work each) would add a
# third to the writer's work for nothing.
PIECE_S = 100e-6


def yield_gil() -> None:
    """Release the GIL for a moment: a thread waiting for it takes it (CPython wakes it as it is dropped)."""
    time.sleep(0)


class GilPacer:
    """Call it after each small piece of work (a step's record, a sensor): it gives the GIL back once
    `piece_s` of work has gone by since the last time. One per batch of work: the clock starts at creation."""

    __slots__ = ("_piece_s", "_since")

    def __init__(self, piece_s: float = PIECE_S) -> None:
        self._piece_s = piece_s
        self._since = time.perf_counter()

    def __call__(self) -> None:
        if time.perf_counter() - self._since >= self._piece_s:
            yield_gil()
            self._since = time.perf_counter()


def no_pause() -> None:
    """For work done on the training thread itself, where pausing would only slow it."""
    return None
