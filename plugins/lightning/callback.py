"""`TuneupCallback`: per-step timing and telemetry of a Lightning training run, written as a run record.

A thin adapter: it translates Lightning's hooks into `tuneup.recording.RecordingSession` calls, which own
the run directory, the record and everything measured. Hooks used, in the order Lightning fires them per
batch: `on_train_batch_start` -> `on_before_backward` -> `on_after_backward` -> `on_before_optimizer_step`
(when an optimizer steps) -> `on_train_batch_end`; manual optimization may repeat the middle three.
`trainer_taps` adds the marks Lightning has no hook for (an optimizer step's end, the trainer's own
collectives, checkpoint saves, batch fetches). A step closes at the batch end at which `trainer.global_step`
moved (by one per optimizer stepped), so a step is a batch that stepped the optimizers, Lightning's
training step. `setup` agrees on the run directory across ranks (one broadcast, once) and applies a
`tuneup tune` trial; `on_train_start` opens the record; `on_train_end`, `on_exception` and `teardown` all
close it, whichever comes first. The fit's own times (setup, sanity check, validation, saves, teardown) are
recorded for the job timeline.

The metrics the training logs are recorded as Lightning reduced them, at no extra synchronization: at
each validation's end (not the sanity check's), the entries of the trainer's callback metrics that the
validation set (source "validation"); during training, what Lightning hands its loggers at its logging
interval and at an epoch's end (`trainer_taps`: source "train"). Both are read from Lightning's own dicts,
never through `trainer.callback_metrics`, whose every read converts the progress bar's values to numbers
(a device synchronization on a GPU). Step: `trainer.global_step`.

Every hook is guarded: if tuneup itself fails, it warns once, stops recording, and training goes on.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tuneup._log import warn_once
from tuneup.collect.batch import BatchCounter
from tuneup.cost.pricing import PriceChoice
from tuneup.plugins.lightning.introspect import (
    exception_stop_reason,
    on_cuda,
    stop_reason,
    training_facts,
    training_steps_done,
)
from tuneup.plugins.lightning.trainer_taps import TrainerTaps
from tuneup.plugins.lightning.trial import TrialControl, trial_run_dir
from tuneup.record.writer import RecordingPolicy
from tuneup.recording import RecordingSession, TrainerRanks
from tuneup.recording.policies import KEYWORD_POLICY, PricingPolicy, ProfilingPolicy, keywords_beside
from tuneup.target import Target
from tuneup.tune.protocol import ENV_TRIAL, TrialSpec


def _callback_bases() -> tuple[type, ...]:
    # Subclassing the Callback of both namespaces makes one class pass the isinstance checks of a
    # `lightning.pytorch` Trainer, a `pytorch_lightning` Trainer and either LightningCLI.
    bases: list[type] = []
    try:
        from lightning.pytorch import Callback as LightningCallback

        bases.append(LightningCallback)
    except ImportError:
        pass
    try:
        from pytorch_lightning import Callback as PLCallback

        bases.append(PLCallback)
    except ImportError:
        pass
    if not bases:
        raise ImportError(
            "TuneupCallback needs `pytorch-lightning` or `lightning`: pip install pytorch-lightning"
        )
    return tuple(bases)


F = TypeVar("F", bound=Callable[..., Any])
OWNER = "TuneupCallback"


def _guarded(hook: F) -> F:
    @functools.wraps(hook)
    def wrapper(self: TuneupCallback, *args: Any, **kwargs: Any) -> Any:
        if self._session.disabled:
            return None
        try:
            return hook(self, *args, **kwargs)
        except Exception as exc:
            self._session.fail(hook.__name__, exc)
            return None

    return wrapper  # type: ignore[return-value]


class TuneupCallback(*_callback_bases()):  # type: ignore[misc]
    """Record where the time of every optimizer step goes, plus GPU and host telemetry.

    Args:
        dirpath: the run directory to write. Default: ``$TUNEUP_DIR`` where set (``tuneup bench`` sets it),
            else ``<trainer.default_root_dir>/tuneup/<run id>``.
            A directory that already holds a run is never overwritten: ``-1``, ``-2``... is appended.
            Under ``tuneup tune`` each trial records to its own directory, whatever is given here.
        batch_size_fn: ``batch -> int``, samples in a batch, when tuneup cannot tell by itself.
        tokens_fn: ``batch -> int``, tokens in a batch; by default read from integer token-id matrices.
        log_to_trainer: also send headline metrics to the trainer's loggers every ``log_every_n_steps``.
        flush_every_steps, flush_every_s, detail_steps, sample_every, window_steps: how much is kept, and
            how often it reaches the disk (a killed process loses at most this much): ``RecordingPolicy``.
        telemetry_interval_s, timing, grad_norm, max_lag_steps, profile_communication, count_flops,
            flops_per_sample, profile_steps, profile_start_step, noise_scale, noise_scale_every: what is
            measured and how: ``tuneup.recording.ProfilingPolicy``.
        instance, spot, price_per_hour, price_per, catalog, electricity_usd_per_kwh: what the job costs
            (``instance`` is a catalog key such as ``"aws:p4d.24xlarge"``, checked now: an unknown key
            raises, naming the closest ones): ``tuneup.recording.PricingPolicy``.
        recording, profiling, pricing: a policy whole (``recording=RecordingPolicy(flush_every_steps=10)``),
            instead of its keywords above; a keyword left at its default defers to it, and one set beside
            its policy raises ValueError, naming both.
        target: a quality target on a metric the training logs, ``"val_acc>=0.9"`` or
            ``"val_loss<=2.1"`` (or a ``tuneup.target.Target``), checked now (one that cannot be read raises
            ValueError). When a recorded value first meets it, rank 0 logs the step and the time since the
            fit started, and the record holds a ``target_reached`` event; the manifest keeps the target, the
            default of ``tuneup report --target``. The run goes on: stopping is the trainer's choice
            (``EarlyStopping(stopping_threshold=...)``).
        tags: the run's tags, ``{"project": "vision", "user": "ana", "experiment": "lr-sweep"}``, over
            ``$TUNEUP_TAGS``'s (``project=vision,user=ana``): kept in the manifest, and what ``tuneup index``
            and ``tuneup fleet`` group runs by. Checked now (a name or value that cannot be kept raises
            ValueError).

    Without ``instance`` or ``price_per_hour``, the environment may price the run: ``TUNEUP_INSTANCE``
    (with ``TUNEUP_SPOT=1``, ``TUNEUP_CATALOG``) or ``TUNEUP_PRICE_PER_HOUR`` (with ``TUNEUP_PRICE_PER``).
    ``tuneup report --instance ...`` can price or re-price the run afterwards.

    After ``fit`` the directory written is ``callback.run_dir``.
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        *,
        telemetry_interval_s: float = 1.0,
        batch_size_fn: Callable[[Any], int] | None = None,
        tokens_fn: Callable[[Any], int | None] | None = None,
        grad_norm: bool = False,
        timing: str = "auto",
        log_to_trainer: bool = True,
        flush_every_steps: int = 50,
        flush_every_s: float = 10.0,
        detail_steps: int = 1000,
        sample_every: int = 100,
        window_steps: int = 100,
        max_lag_steps: int = 4,
        profile_communication: bool = True,
        instance: str | None = None,
        spot: bool = False,
        price_per_hour: float | None = None,
        price_per: str = "node",
        catalog: str | os.PathLike[str] | None = None,
        electricity_usd_per_kwh: float | None = None,
        count_flops: bool = True,
        flops_per_sample: float | None = None,
        profile_steps: int = 0,
        profile_start_step: int = 10,
        noise_scale: bool = True,
        noise_scale_every: int | None = None,
        recording: RecordingPolicy | None = None,
        profiling: ProfilingPolicy | None = None,
        pricing: PricingPolicy | None = None,
        target: str | Target | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        for name, fn in (("batch_size_fn", batch_size_fn), ("tokens_fn", tokens_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{OWNER}({name}=...) must be a function of the batch, got {fn!r}")
        # Every other keyword is a policy's field of the same name; one left at its default defers to its
        # policy given whole.
        keywords = {k: v for k, v in locals().items() if k in KEYWORD_POLICY}
        options = keywords_beside(keywords, recording, profiling, pricing)
        self._session = RecordingSession(
            dirpath,
            recording=recording,
            profiling=profiling,
            pricing=pricing,
            owner=OWNER,
            target=target,
            tags=tags,
            **options,
        )
        self.counter = BatchCounter(batch_size_fn, tokens_fn)
        self.log_to_trainer = bool(log_to_trainer)
        self._trial: TrialControl | None = None  # a `tuneup tune` trial (TUNEUP_TRIAL set), else None
        self._trainer: Any = None
        self._taps: TrainerTaps | None = None
        self._resumed_from: dict[str, Any] | None = None  # a checkpoint's state, until on_train_start
        self._first_batch = True
        self._automatic_optimization = True
        self._sanity_started: float | None = None
        self._validation_started: float | None = None
        # The trainer's callback metrics as the validation found them: what it changed is its own.
        self._metrics_before_validation: dict[str, Any] | None = None

    @property
    def run_dir(self) -> Path | None:
        """The run directory this fit wrote; also in the process that launched ddp_spawn workers."""
        return self._session.run_dir

    @property
    def run_id(self) -> str | None:
        return self._session.run_id

    @property
    def policy(self) -> RecordingPolicy:
        return self._session.recording

    @property
    def target(self) -> Target | None:
        """The run's quality target (``target=``), read; None where none was given."""
        return self._session.target

    @property
    def price(self) -> PriceChoice | None:
        """The price choice, checked: the callback's own, else the environment's."""
        return self._session.price

    @property
    def noise_scale(self) -> bool:
        return self._session.profiling.noise_scale

    @property
    def noise_scale_every(self) -> int | None:
        return self._session.profiling.noise_scale_every

    # The session's parts, as benchmarks and test workloads read them on the callback.
    _clock = property(lambda self: self._session.clock)
    _mirror = property(lambda self: self._session.mirror)
    _comm = property(lambda self: self._session.comm)

    # -- setup -------------------------------------------------------------------------------------

    @_guarded
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        session = self._session
        if stage != "fit" or session.is_open:
            return
        self._trainer = trainer
        cuda = on_cuda(trainer)
        broadcast = functools.partial(trainer.strategy.broadcast, src=0)
        ranks = TrainerRanks(int(trainer.global_rank), int(trainer.world_size), broadcast)
        # A tuning trial's settings travel with the run directory: rank 0's reading is every rank's.
        trial_text = session.prepare(
            ranks,
            str(trainer.default_root_dir),
            dirpath=trial_run_dir,
            share=lambda: os.environ.get(ENV_TRIAL) or None,
            on_cuda=cuda,
            # FSDP (Lightning's FSDPStrategy) and FSDP2 (fully_shard through ModelParallelStrategy) issue
            # their gathers and scatters from Python: every such collective during a step is the training's.
            sharded=type(trainer.strategy).__name__ in {"FSDPStrategy", "ModelParallelStrategy"},
        )
        self._trial = None
        if trial_text:
            # Now, before the strategy wraps the model and the dataloaders are built (trial.py). Each knob
            # that fails is reported as not applied (applied.json), and the tuner drops it.
            self._trial = TrialControl(TrialSpec.from_json(trial_text), ranks.rank)
            self._trial.apply_at_setup(trainer, pl_module, cuda)

    def state_dict(self) -> dict[str, Any]:
        """Saved in Lightning's checkpoints, so that a fit resumed from one continues this run."""
        return self._session.resume_state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Lightning restores callbacks after their setup and before on_train_start, where it is applied.
        self._resumed_from = dict(state_dict) if state_dict.get("run_root") else None

    @_guarded
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        session = self._session
        if not session.is_open:  # fit() called without setup (never in Lightning, but cheap to survive)
            self.setup(trainer, pl_module, "fit")
        if self._trial is not None:
            # Before the DDP hook is wired: a trial's comm hook goes through the probe's timed registration.
            self._trial.apply_at_train_start(trainer)
        if not session.is_open:
            return
        self._automatic_optimization = bool(getattr(pl_module, "automatic_optimization", True))
        self._first_batch = True
        self._say_dropped_comm_hook(trainer)
        resumed_from, self._resumed_from = self._resumed_from, None
        session.start(
            training_facts(
                trainer,
                pl_module,
                automatic_optimization=self._automatic_optimization,
                log_to_trainer=self.log_to_trainer,
                tune_trial=self._trial.manifest() if self._trial is not None else None,
                install_marks=lambda: self._install_taps(trainer),
            ),
            resumed_from=resumed_from,
        )

    def _say_dropped_comm_hook(self, trainer: Any) -> None:
        """Lightning ignores `DDPStrategy(ddp_comm_hook=...)` off CUDA: said in the log and in the record."""
        comm = self._session.comm
        dropped = getattr(trainer.strategy, "_ddp_comm_hook", None)
        if comm is None or comm.record_all or dropped is None or comm.on_cuda or comm.hook_registered:
            return
        name = getattr(dropped, "__qualname__", None) or dropped
        self._session.event(
            "ddp_comm_hook_dropped",
            hook=str(name)[:200],
            reason="Lightning applies ddp_comm_hook only on CUDA devices",
        )
        warn_once(
            "ddp-hook-dropped",
            f"Lightning ignores ddp_comm_hook off CUDA: {name} is not applied in this run (tuneup times the "
            "default all-reduce). To apply a hook on CPU, register it from on_fit_start: "
            "trainer.strategy.model.register_comm_hook(state, hook).",
        )

    def _install_taps(self, trainer: Any) -> Callable[[], None]:
        session, clock = self._session, self._session.clock
        assert clock is not None
        self._taps = taps = TrainerTaps(
            # Runs inside the trainer's methods and torch's optimizer step: a failure stops recording and
            # never reaches them.
            functools.partial(session.fail, "a trainer mark"),
            on_sync_start=clock.sync_start,
            on_sync_end=clock.sync_end,
            on_save_start=session.checkpoint_start,
            on_save_end=session.checkpoint_end,
            on_optimizer_step_end=clock.after_optimizer,
            on_fetch_start=clock.fetch_start,
            on_fetch_end=clock.fetch_end,
            on_logged_metrics=functools.partial(self._training_metrics_logged, trainer),
        )
        taps.install(trainer)
        if not taps.logged_metrics_tapped:
            warn_once(
                "logged-metrics-tap",
                "this Lightning has no logger connector tuneup knows: the metrics logged during training are "
                "not recorded (those of validation still are)",
            )
        return taps.remove

    def _training_metrics_logged(self, trainer: Any, metrics: Any) -> None:
        """Lightning hands `metrics` to its loggers (trainer_taps): during training, record them. The
        validation's own are read at its end, with those not logged (``self.log(..., logger=False)``)."""
        if trainer.training:
            self._session.log_metrics(metrics, "train", trainer.global_step, trainer.current_epoch)

    # -- per micro-batch: one session call each, nothing more (the session takes the marks) ---------

    @_guarded
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._session.epoch_start(trainer.current_epoch)  # read once an epoch, not at every step's end

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        session = self._session
        if session.clock is None or session.disabled:
            return
        entered = time.perf_counter()  # counting the batch is tuneup's own time, not the step's
        try:
            if self._first_batch:
                self._first_batch = False
                session.resync_steps(training_steps_done(trainer, self._automatic_optimization))
            samples, tokens = self.counter.samples(batch), self.counter.tokens(batch)
        except Exception as exc:
            session.fail("on_train_batch_start", exc)
            return
        session.batch_start(samples, tokens, at=entered)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._session.before_backward()

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self._session.after_backward()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._session.before_optimizer(optimizer)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        entered = time.perf_counter()
        if self._trial is not None:
            self._trial.batch_ended(trainer)  # recording or not: the trial's budget and stop rule hold
        session = self._session
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        # global_step moves once per optimizer stepped: a GAN's batch moves it by two, and is one step.
        session.batch_end(loss, trainer.global_step, at=entered)
        if session.headline_queue:
            self._log_to_trainer()

    def _log_to_trainer(self) -> None:
        """On the training thread: loggers are not all safe to call from another thread."""
        loggers = getattr(self._trainer, "loggers", None) or []
        for step, metrics in self._session.take_headline_metrics():
            for logger in loggers:
                try:
                    logger.log_metrics(metrics, step=step)
                except Exception as exc:
                    name = type(logger).__name__
                    warn_once(f"logger:{name}", f"{name}.log_metrics failed: {exc}")

    # -- between steps -----------------------------------------------------------------------------

    @_guarded
    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self._sanity_started = time.time()

    @_guarded
    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        started, self._sanity_started = self._sanity_started, None
        if started is not None:
            self._session.timed_event("sanity_check", started)

    @_guarded
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking and self._session.clock is not None:
            # Validation is part of no training step: the job timeline counts it on its own.
            self._validation_started = self._session.exclude_start()
            metrics = _callback_metrics(trainer)
            self._metrics_before_validation = dict(metrics) if metrics is not None else None

    @_guarded
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        started, self._validation_started = self._validation_started, None
        if started is not None:
            self._session.exclude_end("validation", started, step=self._session.steps_done)
        before, self._metrics_before_validation = self._metrics_before_validation, None
        metrics = _callback_metrics(trainer)
        if before is not None and metrics is not None:
            # Lightning stores each reduced value as a new tensor: the entries this validation set are those
            # whose value is not the one found at its start (the training's stay as they were).
            changed = {name: value for name, value in metrics.items() if before.get(name) is not value}
            if changed:
                self._session.log_metrics(changed, "validation", trainer.global_step, trainer.current_epoch)

    @_guarded
    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self._session.checkpoint_seen()

    # -- the end -----------------------------------------------------------------------------------

    @_guarded
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._session.train_end()
        self._close("completed", stop_reason(trainer))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self._trial is not None:
            self._trial.failed(exception)  # first: the tuner ends the trial on every rank when it sees it
        try:
            self._session.exception(exception)
            # The status says how the record closed; the stop reason why the fit ended (a user's Ctrl-C is a
            # stop, not an interruption: tuneup.analyze.interruptions).
            status = "interrupted" if isinstance(exception, KeyboardInterrupt) else "exception"
            self._close(status, exception_stop_reason(trainer, exception))
        except Exception as exc:
            warn_once("on_exception", f"closing the record after an exception failed: {exc}")

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        try:
            was_closed = self._session.closed
            self._close("teardown")
            if stage == "fit":
                self._session.finish(was_closed)
        except Exception as exc:
            warn_once("teardown", f"closing the record at teardown failed: {exc}")

    def _close(self, status: str, stop_reason: str | None = None) -> None:
        session = self._session
        if session.closed:
            return
        session.close(status, stop_reason)
        self._taps = None
        if not session.disabled:
            self._log_to_trainer()


def _callback_metrics(trainer: Any) -> dict[str, Any] | None:
    """The trainer's callback metrics as Lightning stored them (its logger connector's dict), without the
    conversion `trainer.callback_metrics` runs on every read; None where this Lightning has no such dict."""
    metrics = getattr(getattr(trainer, "_logger_connector", None), "_callback_metrics", None)
    if isinstance(metrics, dict):
        return metrics
    warn_once(
        "callback-metrics",
        "this Lightning keeps its callback metrics where tuneup does not look: validation metrics are not "
        "recorded",
    )
    return None
