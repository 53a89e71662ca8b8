"""Hugging Face `transformers.Trainer`: a `TrainerCallback` records the run.

    trainer = Trainer(model=model, args=args, train_dataset=train,
                      callbacks=[TuneupTrainerCallback(dirpath="runs/today")])  # the line to add
    trainer.train()

The Trainer's events mark an optimizer step's edges and its optimizer step; the model's own forward hooks
and autograd mark the micro-batches inside it:

- a micro-batch starts at the model's forward (a forward pre-hook, in training only), and its forward ends
  when the model returns (the loss is computed inside the model when the batch has labels);
- backward runs from there to the end of autograd's backward pass (a hook on the output asks autograd to
  call back when the whole pass is done, after DDP's own end-of-backward work: its exposed all-reduce is
  in backward);
- optimizer: from there through gradient clipping (`on_pre_optimizer_step`) to the step's end
  (`on_optimizer_step`); the scheduler's step and zeroing the gradients that follow are other;
- a step ends at `on_step_end`, once per optimizer step: with `gradient_accumulation_steps=k` it holds k
  micro-batches (each one that does not step ends at `on_substep_end`);
- between steps, what the flow callback announces at `on_step_end` / `on_epoch_end`
  (`control.should_log`, `should_evaluate`, `should_save`): logging (the Trainer gathers the loss from
  every rank) is sync, up to `on_log`; evaluation and checkpoint saves belong to no step, and are
  recorded in the job timeline (up to `on_evaluate`, `on_save`).

The metrics the Trainer logs are recorded as it logged them (it has reduced them across ranks, and made
them numbers, by then): each training log of `on_log` (the loss, the gradient norm, the learning rate) with
source "train", and the `eval_*` metrics of `on_evaluate` with source "validation"; step: the Trainer's
`global_step`. The training's closing summary (`train_runtime`, ...) is not a metric of a step, and is left
out.

What the Trainer hides: where fetching batches starts and ends. It fetches all the micro-batches of an
optimizer step at once, before `on_step_begin`, with no event around it, so data is the gap between the
previous step's end and the next micro-batch's forward (the fetches, the Trainer's input preparation, the
copy to the device), and the record says so (`data_timing: gap`). Under DDP the Trainer hands callbacks the
model inside the DDP wrapper only: the wrapper is met at its first forward, before any backward, and its
all-reduce is timed by the session's comm hook (`watch_ddp`), which also takes the gradient noise scale's
norms. A comm hook of the user's own (accelerate's `DistributedDataParallelKwargs(comm_hook=...)`) is
timed instead, as long as the callback was given to `Trainer(callbacks=...)`: the comm probe is installed
at `on_init_end`, before the Trainer wraps the model.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from tuneup.collect.batch import BatchCounter
from tuneup.recording import RecordingSession, TorchRanks, TrainingFacts
from tuneup.recording.describe import loader_summary, model_summary

__all__ = ["TuneupTrainerCallback"]

_OWNER = "TuneupTrainerCallback"


class TuneupTrainerCallback(TrainerCallback):
    """Record where the time of every optimizer step goes, plus GPU and host telemetry (see the module).

    Args:
        dirpath: the run directory; default ``$TUNEUP_DIR`` where set, else
            ``<args.output_dir>/tuneup/<run id>``.
        batch_size_fn, tokens_fn: ``batch -> int``, the samples and tokens of a batch (the model's forward
            arguments) where tuneup cannot tell by itself; by default ``input_ids``' shape.
        **options: the recording session's options by their ``TuneupCallback`` names
            (``telemetry_interval_s``, ``instance``, ``flush_every_steps``, ...).

    After ``trainer.train()`` the directory written is ``callback.run_dir``.
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        *,
        batch_size_fn: Callable[[Any], int] | None = None,
        tokens_fn: Callable[[Any], int | None] | None = None,
        **options: Any,
    ) -> None:
        self.session = RecordingSession(dirpath, owner=_OWNER, **options)
        self.counter = BatchCounter(batch_size_fn, tokens_fn)
        self._handles: list[Any] = []
        self._ddp_watch: Any = None  # the global forward pre-hook that looks for the DDP wrapper
        self._accumulation = 1
        self._loss_divisor = 1
        self._in_batch = False  # a micro-batch's forward started, and the micro-batch has not ended
        self._backward_pending = False  # its forward ended: the end of its backward is still to mark
        self._loss: Any = None
        # What the flow announced between steps, still to come ("log", "evaluate", "save", in the Trainer's
        # order), and when the open one started.
        self._announced: list[str] = []
        self._open_since: float | None = None

    @property
    def run_dir(self) -> Path | None:
        return self.session.run_dir

    # -- the run ------------------------------------------------------------------------------------

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The end of Trainer(...): the process group is up, and the model is not wrapped in DDP yet (the
        # Trainer wraps it in train()), so that a comm hook registered with it is timed.
        self._prepare(args)

    def _prepare(self, args: Any) -> None:
        try:
            on_cuda = getattr(args.device, "type", None) == "cuda"
            sharded = bool(getattr(args, "fsdp", None))
        except Exception as exc:
            self.session.fail("reading TrainingArguments", exc)
            return
        self.session.prepare(TorchRanks(), args.output_dir or os.getcwd(), on_cuda=on_cuda, sharded=sharded)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        session = self.session
        self._accumulation = max(1, int(getattr(args, "gradient_accumulation_steps", 1) or 1))
        if not session.is_open:  # added after Trainer(...), or a second train()
            self._prepare(args)
        accumulation = self._accumulation
        facts = TrainingFacts(
            device=args.device,
            local_rank=max(int(getattr(args, "local_process_index", 0) or 0), 0),
            steps_done=int(state.global_step),
            optimizer_steps_done=int(state.global_step),
            # One backward per micro-batch, each micro-batch's loss scaled to the step's (by the count, or
            # by the step's items): the one-process noise scale holds.
            automatic_optimization=True,
            accumulation=lambda: accumulation,
            parameters=(lambda: model.parameters()) if model is not None else None,
            trainer=_trainer_config(args, state),
            dataloader=loader_summary(kwargs.get("train_dataloader")),
            model=model_summary(model) if model is not None else {},
            trainer_name="transformers",
        )
        session.start(facts)
        if model is not None and session.is_open:
            self._handles = [
                model.register_forward_pre_hook(self._forward_starts, with_kwargs=True),
                model.register_forward_hook(self._forward_ends),
            ]
            if session.comm is not None:
                self._ddp_watch = _time_ddp_from_its_first_forward(model, session)
            atexit.register(self._close_at_exit)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._announced.clear()  # the clock's restart ends whatever was open
        self.session.epoch_start(int(state.epoch or 0))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._micro_batch_ends(state)
        max_steps = int(state.max_steps or 0)
        self._close(stop_reason="max_steps" if 0 < max_steps <= int(state.global_step) else None)

    def _close_at_exit(self) -> None:
        # The Trainer has no exception event: an exception that ended the script is known here (the
        # interpreter keeps it for post-mortems).
        self._close(getattr(sys, "last_value", None))

    def _close(self, exc: BaseException | None = None, stop_reason: str | None = None) -> None:
        for handle in [*self._handles, self._ddp_watch]:
            if handle is not None:
                handle.remove()
        self._handles, self._ddp_watch = [], None
        atexit.unregister(self._close_at_exit)
        session = self.session
        if session.closed or session.run_dir is None:
            return
        session.end(exc, stop_reason=stop_reason)

    # -- one micro-batch ------------------------------------------------------------------------------

    def _forward_starts(self, module: Any, args: Any, kwargs: Any) -> None:
        if not module.training or self._in_batch:
            return  # evaluation, or a second forward of the same micro-batch
        entered = time.perf_counter()
        if self._ddp_watch is not None:
            # The DDP wrapper's forward runs before this one: met by now, or there is none (a global hook
            # costs a call on every module's forward).
            self._ddp_watch.remove()
            self._ddp_watch = None
        if self._announced:
            self._end_announced()  # announced between steps, never came: over by now
        self._in_batch = True
        # The Trainer scales each micro-batch's loss to the step's inside the model where it hands it the
        # step's item count, and divides it by the accumulation count after the model returns otherwise.
        self._loss_divisor = 1 if kwargs.get("num_items_in_batch") is not None else self._accumulation
        batch = kwargs or (args[0] if args else None)
        try:
            samples, tokens = self.counter.samples(batch), self.counter.tokens(batch)
        except Exception as exc:
            self.session.fail("counting a batch", exc)
            return
        self.session.batch_start(samples, tokens, at=entered)

    def _forward_ends(self, module: Any, args: Any, output: Any) -> None:
        if not self._in_batch or self._backward_pending or not module.training:
            return
        loss = _loss_of(output)
        if loss is not None:
            # Summed over the step's micro-batches, the step's loss as the Trainer logs it.
            self._loss = loss.detach() / self._loss_divisor
        tensor = loss if loss is not None and loss.requires_grad else _first_grad_tensor(output)
        self._backward_pending = tensor is not None
        self.session.before_backward()
        if tensor is not None:
            tensor.register_hook(self._backward_runs)

    def _backward_runs(self, grad: Any) -> None:
        # Early in the backward pass. Autograd runs the callbacks queued during a pass when the pass is
        # done, in order, and those queued by a callback after them: DDP queues its own (which waits for
        # the last all-reduce) when its last bucket is ready, after this one, so this one queues the mark.
        _queue_at_backward_end(lambda: _queue_at_backward_end(self._backward_ends))

    def _backward_ends(self) -> None:
        if self._backward_pending:
            self._backward_pending = False
            self.session.after_backward()

    def _micro_batch_ends(self, state: Any) -> None:
        self._backward_ends()  # where the backward's own end was not seen (no output took part in it)
        if self._in_batch:
            self._in_batch = False
            loss, self._loss = self._loss, None
            # The step closes where the Trainer's count of optimizer steps moved.
            self.session.batch_end(loss, optimizer_steps=int(state.global_step))

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._micro_batch_ends(state)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._backward_ends()
        self.session.before_optimizer(kwargs.get("optimizer"))

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.after_optimizer()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._micro_batch_ends(state)
        self._announce(control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._announce(control)

    # -- between steps: logging, evaluation, saves ------------------------------------------------------

    def _announce(self, control: Any) -> None:
        """The flow callback (which runs before this one) announced what the Trainer does next."""
        self._end_announced()
        self._announced = [
            name
            for name, announced in (
                ("log", control.should_log),
                ("evaluate", control.should_evaluate),
                ("save", control.should_save),
            )
            if announced
        ]
        self._open_next()

    def _open_next(self) -> None:
        if not self._announced:
            return
        name = self._announced[0]
        if name == "log":
            self.session.sync_start()  # the loss gathered from every rank: a fast rank waits here
        elif name == "evaluate":
            self._open_since = self.session.exclude_start()
        else:
            self.session.checkpoint_start()

    def _close_open(self, kind_done: bool) -> None:
        name = self._announced.pop(0)
        if name == "log":
            self.session.sync_end()
        elif name == "evaluate":
            started, self._open_since = self._open_since, None
            self.session.exclude_end("validation" if kind_done else None, started)
        else:
            self.session.checkpoint_end()

    def _done(self, name: str) -> None:
        if self._announced and self._announced[0] == name:
            self._close_open(kind_done=True)
            self._open_next()

    def _end_announced(self) -> None:
        while self._announced:
            self._close_open(kind_done=False)

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._done("log")
        logs = kwargs.get("logs")
        # The evaluation's own metrics come whole at on_evaluate; the closing summary is no step's.
        if isinstance(logs, dict) and not any(k in logs for k in _SUMMARY_KEYS):
            training = {k: v for k, v in logs.items() if not k.startswith(_EVAL_PREFIX)}
            if training:
                self.session.log_metrics(training, "train", int(state.global_step), _epoch(state))

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._done("evaluate")
        metrics = kwargs.get("metrics")
        if isinstance(metrics, dict):
            evaluated = {
                k: v for k, v in metrics.items() if k.startswith(_EVAL_PREFIX) and k not in _EVAL_TIMING
            }
            if evaluated:
                self.session.log_metrics(evaluated, "validation", int(state.global_step), _epoch(state))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._done("save")


# The keys of the Trainer's closing log (`train_runtime`, ...), a summary of the training, not a step's metric.
_SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second")
_EVAL_PREFIX = "eval_"
# Timings of the evaluation loop, not metrics of the model.
_EVAL_TIMING = frozenset({"eval_runtime", "eval_samples_per_second", "eval_steps_per_second"})


def _epoch(state: Any) -> int | None:
    """The Trainer's epoch (a fraction: the share of epochs done) as the whole epoch under way."""
    epoch = getattr(state, "epoch", None)
    return int(epoch) if isinstance(epoch, (int, float)) else None


def _queue_at_backward_end(callback: Any) -> None:
    from torch.autograd import Variable

    Variable._execution_engine.queue_callback(callback)


def _loss_of(output: Any) -> Any:
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    return loss if hasattr(loss, "detach") else None


def _first_grad_tensor(output: Any) -> Any:
    """The first tensor of the model's output that backward will run through (the logits, where the loss
    is computed outside the model)."""
    values = output.values() if hasattr(output, "values") else output if isinstance(output, tuple) else ()
    for value in values:
        if getattr(value, "requires_grad", False) and hasattr(value, "register_hook"):
            return value
    return None


def _time_ddp_from_its_first_forward(model: Any, session: RecordingSession) -> Any:
    """A global forward pre-hook that meets the DDP wrapper of `model` at its first forward (before any
    backward), has the comm probe time its all-reduce (DDP's default, registered timed), and removes itself."""
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.nn.parallel import DistributedDataParallel

    def first_forward(module: Any, args: Any) -> None:
        if isinstance(module, DistributedDataParallel) and module.module is model:
            handle.remove()
            session.watch_ddp(module)

    handle = register_module_forward_pre_hook(first_forward)
    return handle


def _trainer_config(args: Any, state: Any) -> dict[str, Any]:
    """The manifest's trainer section as TrainingArguments say it (`tuneup compare` reads strategy,
    accelerator, precision and accumulation)."""
    precision = "bf16-mixed" if args.bf16 else "16-mixed" if args.fp16 else "32-true"
    mode = getattr(args, "parallel_mode", None)
    max_steps = int(state.max_steps or 0)
    epochs = args.num_train_epochs
    return {
        "namespace": "transformers",
        # "distributed" (DDP, or FSDP/DeepSpeed through accelerate), "not_distributed", ...
        "strategy": str(getattr(mode, "value", mode)),
        "accelerator": getattr(args.device, "type", None),
        "precision": precision,
        "accumulate_grad_batches": int(args.gradient_accumulation_steps),
        "devices": int(getattr(args, "n_gpu", 0) or 1),
        "world_size": int(args.world_size),
        "max_steps": max_steps if max_steps > 0 else None,
        # Epochs bound the run only without max_steps; a fraction of an epoch is no whole number of them.
        "max_epochs": int(epochs) if args.max_steps <= 0 and float(epochs).is_integer() else None,
        "gradient_clip_val": args.max_grad_norm,
        "log_every_n_steps": args.logging_steps,
    }
