"""What an adapter tells the recording session when training starts: the trainer's facts, each one what
the trainer says, and None (or the documented default) where it does not say: the session records an
unknown as unknown and never guesses it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tuneup.record.schema import PHASE_NAMES

Events = Callable[[], list[tuple[str, dict[str, Any]]]]


@dataclass
class TrainingFacts:
    """The training as the adapter sees it at its start (`RecordingSession.start`).

    Args:
        device: the device the model is on (a ``torch.device``); decides the timer (CUDA events on a GPU).
        local_rank, node_rank, num_nodes, ranks_per_node: where this rank runs.
        steps_done: training steps (batches that stepped the optimizers) before this fit: the first step's
            id. Non-zero when resuming from a checkpoint.
        optimizer_steps_done: the trainer's count of optimizer steps before this fit (Lightning's
            ``global_step``); the count `batch_end(optimizer_steps=...)` is compared with.
        epoch: the epoch the fit starts in (`epoch_start` updates it).
        automatic_optimization: the trainer runs one backward per micro-batch, divides each micro-batch's
            loss by the accumulation count, and hands `batch_end` a detached loss (Lightning's automatic
            optimization). False: losses are detached here and averaged over the step's micro-batches, and
            the noise scale is not measured.
        accumulation: the trainer's gradient accumulation count, read when needed (it may change during a
            fit); None: the trainer does not say (the one-process noise scale is then not measured).
        parameters: the model's parameters, for the gradient norm and the noise scale; None: neither.
        loss_scale: ``optimizer -> (scale, gradients already unscaled)``, the fp16 GradScaler's scale of the
            step (a tensor copy, never read on the training thread), or None without a scaler.
        ddp_model: a ``DistributedDataParallel`` model, on which the comm probe registers its timed hook when
            no hook was registered through it.
        compiled: the model is torch.compile'd (FLOPs are then not counted: see `ProfilingPolicy`).
        checkpoint: the checkpoint the fit resumed from, for the manifest.
        trainer, dataloader, model: the manifest's sections, as the adapter reads them.
        tune_trial: the manifest's `tune_trial` section under `tuneup tune`.
        log_every_steps: headline figures for the trainer's loggers every this many steps
            (`take_headline_metrics`); None: none are computed.
        sync_events: returns the strategy's events since the last call (read at each step's end);
            sync_summary: its summary, recorded at close.
        install_marks: installs the adapter's own marks (e.g. wrappers on the trainer's methods, calling the
            session's `clock` methods) as the last part of tuneup's start-up; returns what removes them,
            which `close` calls first.
        gap_is_data: the time between a batch's end and the next batch's start is the data loader's until the
            adapter marks a fetch (`fetch_start`/`fetch_end`; Lightning's gap is its fetch where its loop has no
            fetch calls to wrap). False: only marked fetches are data, the rest of the gap is "other".
        phases_timed: the phases the adapter marks (data, forward, backward, optimizer, sync): written to
            the rank's info, so that a phase an adapter cannot see reads as not timed rather than as zero.
            The time it cannot attribute is in "other".
        trainer_name: which adapter recorded the run (the rank's info).
    """

    device: Any = None
    local_rank: int = 0
    node_rank: int = 0
    num_nodes: int = 1
    ranks_per_node: int = 1
    steps_done: int = 0
    optimizer_steps_done: int = 0
    epoch: int = 0
    automatic_optimization: bool = True
    accumulation: Callable[[], int] | None = None
    parameters: Callable[[], Iterable[Any]] | None = None
    loss_scale: Callable[[Any], tuple[Any, bool]] | None = None
    ddp_model: Any = None
    compiled: bool = False
    checkpoint: str | None = None
    trainer: Mapping[str, Any] = field(default_factory=dict)
    dataloader: Mapping[str, Any] = field(default_factory=dict)
    model: Mapping[str, Any] = field(default_factory=dict)
    tune_trial: Mapping[str, Any] | None = None
    log_every_steps: int | None = None
    sync_events: Events | None = None
    sync_summary: Callable[[], dict[str, Any] | None] | None = None
    install_marks: Callable[[], Callable[[], None] | None] | None = None
    gap_is_data: bool = True
    phases_timed: tuple[str, ...] = tuple(PHASE_NAMES[:-1])  # all but "other", which is the rest
    trainer_name: str | None = None
