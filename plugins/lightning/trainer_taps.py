"""Marks the step clock needs that Lightning has no hook for, taken by wrapping a few trainer methods.

- The end of each optimizer step: torch's `Optimizer.register_step_post_hook`. Manual optimization can
  step several optimizers per batch, with a forward between them; without this mark the second forward
  would be counted as the first optimizer's step.
- The trainer's own collectives between batches: Lightning 2.x broadcasts a SIGTERM flag from rank 0
  before every batch (`_broadcast_sigterm_tensor`), and strategies run barriers and broadcasts. A rank
  that is faster than the others waits in them; untimed, that wait was "other".
- Checkpoint saves: `trainer.save_checkpoint`, which ModelCheckpoint and users call. `on_save_checkpoint`
  fires before the file is written, so it cannot time the save.
- The input pipeline: the training epoch loop's `_on_before_fetch`/`_on_after_fetch` (Lightning >= 2.0
  hands them to its data fetcher around every fetch) and `strategy.batch_to_device` (the copy to the
  device, and the user's batch-transfer hooks; not on the CPU without such hooks, where it does nothing).
  Why not the profiler calls Lightning makes for the same two actions: the profiler is called
  for every hook of every callback, about 30 times a step, and a Python wrapper on it cost more than
  all of tuneup's hooks together (30 us a step at ~2 ms steps). These wrappers run twice a step each.
- The metrics the training logs, as Lightning hands them to its loggers: the logger connector's
  `log_metrics(metrics)`, which Lightning calls at its logging interval (`log_every_n_steps`, from
  `update_train_step_metrics`, after the batch's `on_train_batch_end`: a callback's `on_train_batch_end`
  still sees the previous logging's values), at a training epoch's end, and at a validation's end, with
  the values it has already reduced (`sync_dist` included), whether or not the trainer has a logger. It runs
  only when Lightning logs: nothing per batch.

Wrappers are instance attributes (the class is untouched, other trainers are not affected) and are
removed at the end of the fit. A wrapper never lets tuneup's own failure reach the trainer: the marks are
caught where they are taken and handed to `on_error` (which stops recording), and the wrapped method
always runs. The catching is written into each wrapper rather than done by one more wrapped function:
these run several times a step, and every call layer costs, in caches the step has just emptied, about
a microsecond.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

# Strategy methods that are collectives the trainer issues between batches (and at epoch ends).
STRATEGY_SYNC_METHODS = ("barrier", "broadcast", "reduce_boolean_decision")
# The training epoch loop's calls around each batch fetch (the data fetcher's `_start_profiler`/`_stop_profiler`).
FETCH_START_METHOD, FETCH_END_METHOD = "_on_before_fetch", "_on_after_fetch"
# The logger connector's call that hands the reduced metrics to the loggers (Lightning 2.x).
LOG_METRICS_METHOD = "log_metrics"


def _nothing() -> None:
    return None


# The hooks Lightning runs inside strategy.batch_to_device, on the LightningModule and the DataModule.
_BATCH_TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


_LIGHTNING = ("lightning", "pytorch_lightning")  # the packages whose classes hold the hooks' defaults


def _copies_or_prepares(trainer: Any, strategy: Any) -> bool:
    """Whether `batch_to_device` does anything worth timing: a copy to an accelerator, or the user's own
    batch-transfer hooks (augmentation on the batch, say), which are data preparation. On the CPU with
    neither, it returns the batch as it is, and not wrapping it saves a wrapper and two marks a step."""
    if getattr(getattr(strategy, "root_device", None), "type", "cpu") != "cpu":
        return True
    for owner in (getattr(trainer, "lightning_module", None), getattr(trainer, "datamodule", None)):
        if owner is None:
            continue
        # The first class in the MRO that is Lightning's own defines the defaults.
        base = next((k for k in type(owner).__mro__ if k.__module__.split(".")[0] in _LIGHTNING), None)
        if base is not None and any(
            getattr(type(owner), name, None) is not getattr(base, name, None)
            for name in _BATCH_TRANSFER_HOOKS
        ):
            return True
    return False


class TrainerTaps:
    """Installs the wrappers on one trainer; `remove` restores it."""

    def __init__(
        self,
        on_error: Callable[[BaseException], None],
        on_sync_start: Callable[[], None],
        on_sync_end: Callable[[], None],
        on_save_start: Callable[[], None],
        on_save_end: Callable[[], None],
        on_optimizer_step_end: Callable[[], None],
        on_fetch_start: Callable[[], None],
        on_fetch_end: Callable[[], None],
        on_logged_metrics: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> None:
        self._on_error = on_error
        self._on_logged_metrics = on_logged_metrics
        self._fetch = (on_fetch_start, on_fetch_end)
        self._sync = (on_sync_start, on_sync_end)
        self._save = (on_save_start, on_save_end)
        self._step_end = on_optimizer_step_end
        self._patched: list[tuple[Any, str, Any]] = []  # (object, attribute, the wrapper set)
        self._handles: list[Any] = []
        self.optimizers_hooked = 0
        self.sigterm_broadcast_tapped = False
        # False where this Lightning has no such methods: the step clock then counts the whole gap between
        # batches as data (and the run's info says so).
        self.fetches_tapped = False
        self.logged_metrics_tapped = False

    def install(self, trainer: Any) -> None:
        strategy = getattr(trainer, "strategy", None)
        for name in STRATEGY_SYNC_METHODS:
            self._wrap(strategy, name, *self._sync)
        epoch_loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        self.sigterm_broadcast_tapped = self._wrap(epoch_loop, "_broadcast_sigterm_tensor", *self._sync)
        self._wrap(trainer, "save_checkpoint", *self._save)
        self.fetches_tapped = self._tap_fetches(trainer, epoch_loop, strategy, *self._fetch)
        if self._on_logged_metrics is not None:
            connector = getattr(trainer, "_logger_connector", None)
            self.logged_metrics_tapped = self._tap_logged_metrics(connector, self._on_logged_metrics)
        step_end, on_error = self._step_end, self._on_error

        def after_step(*_: Any) -> None:
            try:
                step_end()
            except Exception as exc:
                on_error(exc)

        for optimizer in getattr(trainer, "optimizers", None) or []:
            register = getattr(optimizer, "register_step_post_hook", None)
            if register is not None:
                self._handles.append(register(after_step))
                self.optimizers_hooked += 1

    def _tap_fetches(
        self, trainer: Any, epoch_loop: Any, strategy: Any, start: Callable[[], None], end: Callable[[], None]
    ) -> bool:
        found = all(
            callable(getattr(epoch_loop, name, None)) for name in (FETCH_START_METHOD, FETCH_END_METHOD)
        )
        if not found or not callable(getattr(strategy, "batch_to_device", None)):
            return False
        # The fetch's start mark comes before the loop's own call, its end after: the profiler's action
        # (if the user has one) stays inside the timed interval, as it always was.
        self._wrap(epoch_loop, FETCH_START_METHOD, start, _nothing)
        self._wrap(epoch_loop, FETCH_END_METHOD, _nothing, end)
        if _copies_or_prepares(trainer, strategy):
            self._wrap(strategy, "batch_to_device", start, end)
        return True

    def _tap_logged_metrics(self, connector: Any, seen: Callable[[Mapping[str, Any]], None]) -> bool:
        """`seen(metrics)` before the logger connector hands `metrics` to the loggers."""
        original = getattr(connector, LOG_METRICS_METHOD, None) if connector is not None else None
        if original is None or not callable(original):
            return False
        on_error = self._on_error

        @functools.wraps(original)
        def log_metrics(metrics: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                if metrics:
                    seen(metrics)
            except Exception as exc:
                on_error(exc)
            return original(metrics, *args, **kwargs)

        try:
            setattr(connector, LOG_METRICS_METHOD, log_metrics)
        except (AttributeError, TypeError):
            return False
        self._patched.append((connector, LOG_METRICS_METHOD, log_metrics))
        return True

    def _wrap(self, obj: Any, name: str, before: Callable[[], None], after: Callable[[], None]) -> bool:
        original = getattr(obj, name, None) if obj is not None else None
        if original is None or not callable(original):
            return False
        on_error = self._on_error

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                before()
            except Exception as exc:
                on_error(exc)
            try:
                return original(*args, **kwargs)
            finally:
                try:
                    after()
                except Exception as exc:
                    on_error(exc)

        try:
            setattr(obj, name, wrapper)
        except (AttributeError, TypeError):
            return False
        self._patched.append((obj, name, wrapper))
        return True

    def remove(self) -> None:
        for obj, name, wrapper in reversed(self._patched):
            # Only our own wrapper is taken off: if something wrapped ours since, leave the chain alone.
            if obj.__dict__.get(name) is wrapper:
                delattr(obj, name)
        self._patched.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
