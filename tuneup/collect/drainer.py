"""A background thread that turns closed steps into records and writes them.

The training thread only takes marks and appends a closed step to a queue; reading the times, building
records, aggregating windows, encoding JSON and writing files happen here. PyTorch releases the GIL
while its operators run, so this work can overlap the training step instead of lengthening it, but only
if it gives the GIL back often: `work` gets a `pause` to call between pieces (tuneup.collect.gil).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tuneup._log import warn_once
from tuneup.collect.gil import GilPacer, no_pause


class Drainer:
    """Runs `work(pause)` when woken, or every `interval_s` seconds, until stopped.

    `work` must be safe to run while the training thread keeps appending steps, and should call `pause()`
    between pieces of its work: on this thread it lets the training thread have the GIL; in `run_now`, on
    the training thread, it does nothing. An exception in `work` is reported once through `on_error` and
    ends the thread; it never reaches the training thread.
    """

    def __init__(
        self,
        work: Callable[[Callable[[], None]], None],
        interval_s: float,
        on_error: Callable[[BaseException], None],
        thread_init: Callable[[], None] | None = None,
        name: str = "tuneup-writer",
    ) -> None:
        self._work = work
        self._interval_s = interval_s
        self._on_error = on_error
        self._thread_init = thread_init
        self._wake = threading.Event()
        self._working = threading.Lock()  # `work` runs on one thread at a time: this one or run_now's caller
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def run_now(self) -> None:
        """Do the work on the calling thread, now: for when this thread has fallen behind (a machine so busy
        that it was not scheduled), so that the steps a kill would lose stay bounded."""
        try:
            with self._working:
                self._work(no_pause)
        except Exception as exc:
            self._on_error(exc)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop after the work in progress; True if the thread ended within `timeout_s`."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            warn_once("drainer-stuck", f"the record writer did not stop within {timeout_s:.0f} s; leaving it")
            return False
        return True

    def _run(self) -> None:
        try:
            if self._thread_init is not None:
                self._thread_init()
            while not self._stopping:
                self._wake.wait(self._interval_s)
                self._wake.clear()
                if self._stopping:
                    return  # the caller does the last drain itself, after this thread has ended
                with self._working:
                    self._work(GilPacer())
        except BaseException as exc:
            self._on_error(exc)
