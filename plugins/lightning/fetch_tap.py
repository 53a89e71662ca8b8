"""Marks around the trainer's own batch fetches, read from the profiler calls Lightning makes for them.

The gap between two training batches holds more than data loading: other callbacks' hooks, the
trainer's per-batch bookkeeping and, in DDP under Lightning 2.6, a per-batch broadcast of a SIGTERM flag
in which a fast rank waits for a slow one. Calling all of that "data wait" would blame the dataloader for
a straggler. Lightning brackets the fetch (`[_TrainingEpochLoop].train_dataloader_next`) and the copy to
the device (`[Strategy]<name>.batch_to_device`) with `trainer.profiler.start/stop`; tapping those two
calls times exactly the input pipeline. The user's own profiler still receives every call.

If a Lightning version names these actions differently, no marks arrive and the step clock falls back
to counting the whole gap as data (and the run's info says which one was used).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FETCH_ACTION = "[_TrainingEpochLoop].train_dataloader_next"


def fetch_actions(strategy_name: str) -> frozenset[str]:
    """The exact profiler action names of a training batch's fetch and its copy to the device."""
    return frozenset({FETCH_ACTION, f"[Strategy]{strategy_name}.batch_to_device"})


class FetchTap:
    """Installs itself on `trainer.profiler` (instance attributes), and removes itself on `remove()`.

    Lightning calls the profiler for every hook of every callback (two dozen times a step), so the
    test for the two actions that matter is one set lookup of the exact names.
    """

    def __init__(
        self,
        profiler: Any,
        actions: frozenset[str],
        on_start: Callable[[], None],
        on_stop: Callable[[], None],
    ) -> None:
        self.profiler = profiler
        self._actions = actions
        self._on_start = on_start
        self._on_stop = on_stop
        self._had_own = {name: name in vars(profiler) for name in ("start", "stop")}
        self._orig_start = profiler.start
        self._orig_stop = profiler.stop
        profiler.start = self._start
        profiler.stop = self._stop

    def _start(self, action_name: str) -> None:
        if action_name in self._actions:
            self._on_start()
        self._orig_start(action_name)

    def _stop(self, action_name: str) -> None:
        self._orig_stop(action_name)
        if action_name in self._actions:
            self._on_stop()

    def remove(self) -> None:
        for name, orig in (("start", self._orig_start), ("stop", self._orig_stop)):
            if self._had_own[name]:
                setattr(self.profiler, name, orig)
            else:
                vars(self.profiler).pop(name, None)
