"""Lightning Fabric: one line records a Fabric training loop.

    fabric = Fabric(accelerator="cuda", devices=8, strategy="ddp")
    fabric.launch()
    recorder = tuneup.plugins.fabric.instrument(fabric, dirpath="runs/today")  # the line to add
    model, optimizer = fabric.setup(model, optimizer)
    train_loader, val_loader = fabric.setup_dataloaders(train_loader, val_loader)
    for batch in train_loader:  # the loop as it was
        ...
    recorder.close()  # optional: the end of the process closes the record too

Fabric's callbacks fire at setup and after an optimizer step only, so `instrument` wraps a few methods of
this one Fabric object (never its class) and registers torch's optimizer step post-hook:

- the first loader `fabric.setup_dataloaders` returns is the training loader: each fetch, Fabric's copy
  to the device included, is data; a batch starts when the loader hands it over and ends when the loop
  asks for the next one, or leaves the loader. Iterating any other loader Fabric set up (validation)
  belongs to no step: it is recorded as validation in the job timeline;
- `fabric.backward`: backward from its call to its return (DDP's exposed all-reduce included); forward is
  the batch's arrival up to it (the model, the loss and whatever else the loop does first);
- each optimizer's step (torch's step post-hook): optimizer is from the backward's end (clipping included)
  to the step's end. A step is every batch up to the one whose optimizer stepped: with gradient
  accumulation a step counts optimizer steps, not micro-batches;
- `fabric.setup` / `setup_module`: the model (for the manifest) and, under DDP, its gradient all-reduce
  timed by a comm hook; the comm probe is installed before Fabric wraps the model;
- `fabric.save`: no step's time, recorded as a checkpoint in the job timeline;
- `fabric.barrier`, `broadcast`, `all_reduce`, `all_gather`: the loop's own collectives, sync.
- `fabric.log_dict` (and `fabric.log`, which calls it): the metrics the loop logs, recorded with source
  "log" at the optimizer steps done so far (the loop's own `step=` is its loggers' axis, whatever it counts),
  read without blocking (tuneup.recording.logged_metrics). `recorder.log_metrics({...})` records metrics
  the loop does not hand to Fabric's loggers (a validation loss it computes itself).

Not seen, so not recorded rather than guessed: batches of a loader Fabric did not set up (pass it through
`recorder.loader(...)`), a backward the loop runs itself (`loss.backward()`: its time is forward's), how
many micro-batches the loop accumulates before it runs (the manifest's `accumulate_grad_batches` is
empty; each step records its own micro-batches) and how it scales their losses (so the gradient noise
scale is not measured).
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tuneup._log import warn_once
from tuneup.collect.batch import BatchCounter
from tuneup.recording import RecordingSession, TrainerRanks, TrainingFacts
from tuneup.recording.describe import loader_summary, model_summary, plain_value

__all__ = ["FabricRecorder", "instrument"]

_OWNER = "instrument"
_SYNC_METHODS = ("barrier", "broadcast", "all_reduce", "all_gather")
# Strategies whose every collective in a step is the training's (sharded parameters and gradients).
_SHARDED = ("FSDPStrategy", "ModelParallelStrategy")


def instrument(
    fabric: Any,
    dirpath: str | os.PathLike[str] | None = None,
    *,
    batch_size_fn: Callable[[Any], int] | None = None,
    tokens_fn: Callable[[Any], int | None] | None = None,
    **options: Any,
) -> FabricRecorder:
    """Record `fabric`'s training loop into a run directory (`tuneup report` reads it). Call it once after
    `Fabric(...)`, before `fabric.setup` and `fabric.setup_dataloaders`.

    Args:
        dirpath: the run directory; default ``$TUNEUP_DIR`` where set, else ``./tuneup/<run id>``.
        batch_size_fn, tokens_fn: ``batch -> int``, the samples and tokens of a batch where tuneup cannot
            tell by itself (as ``TuneupCallback`` takes them).
        **options: the recording session's options by their ``TuneupCallback`` names
            (``telemetry_interval_s``, ``instance``, ``flush_every_steps``, ...).

    Returns the recorder: ``recorder.run_dir`` is where the record went, ``recorder.close()`` ends it (the
    end of the process does too).
    """
    recorder = FabricRecorder(fabric, dirpath, batch_size_fn=batch_size_fn, tokens_fn=tokens_fn, **options)
    recorder.install()
    return recorder


class FabricRecorder:
    """Turns one Fabric object's calls into the recording session's marks (see the module)."""

    def __init__(
        self,
        fabric: Any,
        dirpath: str | os.PathLike[str] | None = None,
        *,
        batch_size_fn: Callable[[Any], int] | None = None,
        tokens_fn: Callable[[Any], int | None] | None = None,
        **options: Any,
    ) -> None:
        self.fabric = fabric
        self.session = RecordingSession(dirpath, owner=_OWNER, **options)
        self.counter = BatchCounter(batch_size_fn, tokens_fn)
        self._originals: dict[str, Any] = {}
        self._hooks: list[Any] = []  # the optimizers' step post-hook handles
        self._model: Any = None
        self._ddp_model: Any = None
        self._train_loader: Any = None  # the DataLoader inside the training loader, for the manifest
        self._prepared = False
        self._started = False
        self._closed = False
        self._in_batch = False  # a batch was handed over and has not ended
        self._optimizer_steps = 0  # optimizer steps seen (torch's post-hook), for the session's step count
        self._loss: Any = None
        self._epochs = 0

    @property
    def run_dir(self) -> Path | None:
        """The run directory written (on rank 0 and on the others alike)."""
        return self.session.run_dir

    # -- wiring ---------------------------------------------------------------------------------------

    def install(self) -> None:
        fabric = self.fabric
        for name in ("setup", "setup_module"):
            self._wrap(name, before=self._prepare, after=self._model_set_up)
        self._wrap("setup_optimizers", after=self._optimizers_set_up)
        self._wrap("setup_dataloaders", after=self._loaders_set_up)
        session = self.session
        original_backward = fabric.backward

        @functools.wraps(original_backward)
        def backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if self._in_batch and hasattr(tensor, "detach"):
                loss = tensor.detach()
                self._loss = loss if self._loss is None else self._loss + loss
            elif not self._started:
                warn_once(
                    "fabric-no-batches",
                    "tuneup sees no training batches: iterate the loader fabric.setup_dataloaders returns "
                    "(or recorder.loader(your_loader)) to record the loop's steps",
                )
            session.before_backward()
            try:
                return original_backward(tensor, *args, **kwargs)
            finally:
                session.after_backward()

        self._originals["backward"] = original_backward
        fabric.backward = backward
        for name in _SYNC_METHODS:
            self._wrap(name, before=session.sync_start, finally_=session.sync_end)
        self._wrap("save", before=session.checkpoint_start, finally_=session.checkpoint_end)
        original_log_dict = getattr(fabric, "log_dict", None)
        if original_log_dict is not None:

            @functools.wraps(original_log_dict)
            def log_dict(metrics: Any, *args: Any, **kwargs: Any) -> Any:
                if isinstance(metrics, Mapping):
                    self.log_metrics(metrics)
                return original_log_dict(metrics, *args, **kwargs)

            self._originals["log_dict"] = original_log_dict
            fabric.log_dict = log_dict
        atexit.register(self._close_at_exit)

    def _wrap(
        self,
        name: str,
        before: Callable[[], Any] | None = None,
        after: Callable[[Any], Any] | None = None,
        finally_: Callable[[], Any] | None = None,
    ) -> None:
        """`fabric.<name>`, with `before()` ahead of it, `after(result)` making its result, `finally_()`
        once it is done. The session's calls never raise; the adapter's own are caught here."""
        original = getattr(self.fabric, name, None)
        if original is None:
            return

        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if before is not None:
                before()
            try:
                result = original(*args, **kwargs)
            finally:
                if finally_ is not None:
                    finally_()
            if after is None:
                return result
            try:
                return after(result)
            except Exception as exc:
                self.session.fail(f"fabric.{name}", exc)
                return result

        self._originals[name] = original
        setattr(self.fabric, name, wrapped)

    def _uninstall(self) -> None:
        for name, original in self._originals.items():
            setattr(self.fabric, name, original)
        self._originals.clear()
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()

    # -- what setup hands over ------------------------------------------------------------------------

    def _prepare(self) -> None:
        """Once the processes are launched (Fabric sets up after `launch`), before the model is wrapped:
        the run directory, agreed on by every rank, and the comm probe."""
        if self._prepared:
            return
        self._prepared = True
        fabric = self.fabric
        broadcast = self._originals.get("broadcast", fabric.broadcast)  # not timed as the loop's sync
        try:
            ranks = TrainerRanks(
                int(fabric.global_rank), int(fabric.world_size), lambda obj: broadcast(obj, src=0)
            )
            on_cuda = getattr(fabric.device, "type", None) == "cuda"
            sharded = type(fabric.strategy).__name__ in _SHARDED
        except Exception as exc:
            self.session.fail("reading Fabric's ranks", exc)
            return
        self.session.prepare(ranks, os.getcwd(), on_cuda=on_cuda, sharded=sharded)

    def _model_set_up(self, result: Any) -> Any:
        module = result[0] if isinstance(result, tuple) else result
        if self._model is None:
            self._model = getattr(module, "module", module)  # the user's module, for the manifest
        forward_module = getattr(module, "_forward_module", None)
        if hasattr(forward_module, "register_comm_hook"):
            self._ddp_model = forward_module  # its all-reduce is timed from the start of the record
        if isinstance(result, tuple):
            self._optimizers_set_up(tuple(o for o in result[1:] if hasattr(o, "step")))
        return result

    def _optimizers_set_up(self, result: Any) -> Any:
        for optimizer in result if isinstance(result, (tuple, list)) else (result,):
            inner = getattr(optimizer, "optimizer", optimizer)  # Fabric's wrapper holds torch's optimizer
            if hasattr(inner, "register_step_post_hook"):
                self._hooks.append(inner.register_step_post_hook(self._optimizer_stepped))
        return result

    def _loaders_set_up(self, result: Any) -> Any:
        if isinstance(result, list):
            return [self._timed(loader) for loader in result]
        return self._timed(result)

    def _timed(self, loader: Any) -> Any:
        if self._train_loader is None:
            return self.loader(loader)
        return _ExcludedLoader(loader, self.session)

    def loader(self, loader: Any) -> Any:
        """`loader` as the training loader, its batches timed: for a loader the loop iterates without
        `fabric.setup_dataloaders`."""
        self._train_loader = getattr(loader, "_dataloader", loader)
        return _TrainingLoader(loader, self)

    # -- the record ---------------------------------------------------------------------------------

    def _start(self) -> None:
        """At the training loader's first batch: the processes are launched, the model and the loaders set up."""
        self._started = True
        self._prepare()
        fabric = self.fabric
        model = self._model
        try:
            summary = model_summary(model) if model is not None else {}
            num_nodes = int(getattr(fabric.strategy, "num_nodes", 1) or 1)
            facts = TrainingFacts(
                device=fabric.device,
                local_rank=int(fabric.local_rank),
                node_rank=int(fabric.node_rank),
                num_nodes=num_nodes,
                ranks_per_node=max(1, int(fabric.world_size) // num_nodes),
                # The loop, not Fabric, decides how it scales each micro-batch's loss: the session averages
                # the step's losses, and measures no noise scale.
                automatic_optimization=False,
                parameters=(lambda: model.parameters()) if model is not None else None,
                ddp_model=self._ddp_model,
                trainer=_fabric_config(fabric),
                dataloader=loader_summary(self._train_loader),
                model=summary,
                compiled=bool(summary.get("compiled")),
                gap_is_data=False,  # the fetches are marked: the rest of the gap is the loop's own
                trainer_name="lightning.fabric",
            )
        except Exception as exc:
            self.session.fail("reading Fabric's setup", exc)
            return
        self.session.start(facts)

    def _close_at_exit(self) -> None:
        # Fabric has no exception hook: an exception that ended the script is known here (the interpreter
        # keeps it for post-mortems).
        self.close(getattr(sys, "last_value", None))

    def close(self, exc: BaseException | None = None) -> None:
        """End the record (the batch still open ends now); `exc`: the exception that ended the loop, if any.
        Idempotent; the end of the process calls it too."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._close_at_exit)
        session = self.session
        try:
            self._batch_ends()
            # A loop does not say why it ended (its data ran out, a step budget, a decision of its own).
            session.end(exc)
        finally:
            self._uninstall()

    def log_metrics(
        self, values: Mapping[str, Any], step: int | None = None, epoch: int | None = None
    ) -> None:
        """Record metrics the loop computed (name -> a number or a scalar tensor, on any device; read
        without blocking), at `step` (default: the optimizer steps done so far) and `epoch` (default: the
        training loader's passes started, less one). Between the training loader's first batch and
        `close`; a no-op elsewhere."""
        if step is None:
            step = self._optimizer_steps
        if epoch is None and self._epochs:
            epoch = self._epochs - 1
        self.session.log_metrics(values, "log", step, epoch)

    # -- per batch ------------------------------------------------------------------------------------

    def _epoch_starts(self) -> None:
        if not self._started:
            self._start()
        self.session.epoch_start(self._epochs)  # the time before this loop (validation, setup) is no step's
        self._epochs += 1

    def _fetch_starts(self) -> None:
        self._batch_ends()
        self.session.fetch_start()

    def _batch_arrives(self, batch: Any) -> None:
        session = self.session
        session.fetch_end()
        entered = time.perf_counter()
        self._in_batch = True
        try:
            samples, tokens = self.counter.samples(batch), self.counter.tokens(batch)
        except Exception as exc:
            session.fail("counting a batch", exc)
            return
        session.batch_start(samples, tokens, at=entered)

    def _batch_ends(self) -> None:
        """The loop asked for the next batch, or left the loader: the batch it had ends now; the step with
        it where an optimizer stepped in it."""
        if self._in_batch:
            self._in_batch = False
            loss, self._loss = self._loss, None
            self.session.batch_end(loss, optimizer_steps=self._optimizer_steps)

    def _optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._optimizer_steps += 1
        self.session.after_optimizer()


class _LoaderWrapper:
    """Iterates like the loader it wraps, and reads like it (its length, its attributes)."""

    def __init__(self, loader: Any) -> None:
        self._tuneup_loader = loader

    def __len__(self) -> int:
        return len(self._tuneup_loader)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_tuneup"):
            raise AttributeError(name)
        return getattr(self._tuneup_loader, name)


class _TrainingLoader(_LoaderWrapper):
    """Tells the recorder where each fetch and each batch starts and ends."""

    def __init__(self, loader: Any, recorder: FabricRecorder) -> None:
        super().__init__(loader)
        self._tuneup_recorder = recorder

    def __iter__(self) -> Iterator[Any]:
        recorder = self._tuneup_recorder
        recorder._epoch_starts()
        batches = iter(self._tuneup_loader)
        try:
            while True:
                recorder._fetch_starts()
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                recorder._batch_arrives(batch)
                yield batch
        finally:
            # The loop is done with the loader: exhausted, left by `break` (Python closes the generator
            # then, at once), or by an exception.
            recorder._batch_ends()


class _ExcludedLoader(_LoaderWrapper):
    """Another loader (validation): iterating it belongs to no training step."""

    def __init__(self, loader: Any, session: RecordingSession) -> None:
        super().__init__(loader)
        self._tuneup_session = session

    def __iter__(self) -> Iterator[Any]:
        session = self._tuneup_session
        started = session.exclude_start()
        try:
            yield from self._tuneup_loader
        finally:
            session.exclude_end("validation", started)


def _fabric_config(fabric: Any) -> dict[str, Any]:
    """The manifest's trainer section as Fabric knows it (`tuneup compare` reads strategy, accelerator and
    precision); what Fabric does not decide (accumulation) is None."""
    strategy = getattr(fabric, "strategy", None)
    return {
        "namespace": "lightning.fabric",
        "strategy": type(strategy).__name__ if strategy is not None else None,
        "start_method": plain_value(strategy, "_start_method"),
        "accelerator": type(getattr(fabric, "accelerator", None)).__name__,
        "precision": plain_value(getattr(strategy, "precision", None), "precision"),
        "accumulate_grad_batches": None,  # the loop's own choice, not known before it runs
        "devices": len(getattr(strategy, "parallel_devices", None) or [None]),
        "num_nodes": plain_value(strategy, "num_nodes"),
        "world_size": plain_value(fabric, "world_size"),
    }
