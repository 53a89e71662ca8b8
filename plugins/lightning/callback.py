"""`TuneupCallback`: per-step timing and telemetry of a Lightning training run, written as a run record.

Hooks used, in the order Lightning fires them per batch (see tuneup.collect.step_clock):
`on_train_batch_start` -> `on_before_backward` -> `on_after_backward` -> `on_before_optimizer_step`
(when an optimizer steps) -> `on_train_batch_end`; manual optimization may repeat the middle three.
`trainer_taps` adds the marks Lightning has no hook for (an optimizer step's end, the trainer's own
collectives, checkpoint saves). A step closes at the batch end at which `trainer.global_step` moved (by
one per optimizer stepped), so a step is a batch that stepped the optimizers, Lightning's training step.
`setup` agrees on the run directory across ranks (one broadcast, once); `on_train_start` writes the
manifest (rank 0) and starts the telemetry sampler; `on_train_end`, `on_exception` and `teardown` all
close the record, whichever comes first. The fit's own times (setup, sanity check, validation, saves,
teardown) are recorded for the job timeline.

Every hook is guarded: if tuneup itself fails, it warns once, stops recording, and training goes on.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tuneup._log import first_time, info_once, warn_once
from tuneup.analyze.throughput import rate_per_s
from tuneup.collect.batch import BatchCounter
from tuneup.collect.comm import CommProbe
from tuneup.collect.drainer import Drainer
from tuneup.collect.environment import redact_value
from tuneup.collect.flops import MicroBatchFlopCounter
from tuneup.collect.step_clock import CudaEventTimer, HostTimer, StepClock
from tuneup.cost.pricing import PriceChoice, check_choice, choice_from_env
from tuneup.plugins.lightning.introspect import (
    dataloader_config,
    exception_stop_reason,
    model_summary,
    stop_reason,
    trainer_config,
)
from tuneup.plugins.lightning.run_dir_handoff import RunDirHandoff
from tuneup.plugins.lightning.trainer_taps import TrainerTaps
from tuneup.plugins.lightning.trial import TrialControl, trial_run_dir
from tuneup.record.remote import Mirror, bounded, is_url, join_url, put_text, spool_dir
from tuneup.record.remote import exists as remote_exists
from tuneup.record.schema import ENV_RUN_DIR, MANIFEST_FILE, RUN_MARKER_FILE, new_run_id
from tuneup.record.segments import elastic_identity, existing_manifest, next_segment_index, segment_dir
from tuneup.record.writer import RankWriter, RecordingPolicy, write_manifest
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

_TIMINGS = ("auto", "host", "cuda_event")

# torch.cuda.max_memory_allocated builds the allocator's whole statistics dict (tens of microseconds):
# read it every this many steps. The peak is never reset, so carrying it forward loses nothing but lag.
PEAK_MEMORY_EVERY_STEPS = 10


def _guarded(hook: F) -> F:
    @functools.wraps(hook)
    def wrapper(self: TuneupCallback, *args: Any, **kwargs: Any) -> Any:
        if self._disabled:
            return None
        try:
            return hook(self, *args, **kwargs)
        except Exception as exc:
            self._hook_failed(hook.__name__, exc)
            return None

    return wrapper  # type: ignore[return-value]


def _check_positive(name: str, value: Any, kind: type | tuple[type, ...] = (int, float)) -> None:
    if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
        raise ValueError(f"TuneupCallback({name}=...) must be a positive number, got {value!r}")


def _segment_root(run_dir: Path, index: int) -> Path:
    return run_dir.parent if index > 0 else run_dir


def _mark_run_dir(run_dir: str, run_id: str) -> None:
    """Rank 0 leaves a marker in the run directory before telling the other ranks where it is: a rank
    that cannot see it is writing somewhere rank 0's record will not have."""

    def mark() -> None:
        if is_url(run_dir):
            put_text(join_url(run_dir, RUN_MARKER_FILE), run_id + "\n")
            return
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / RUN_MARKER_FILE).write_text(run_id + "\n", encoding="utf-8")

    try:
        bounded(mark, MARKER_TIMEOUT_S, default=None, raise_errors=True)
    except Exception as exc:  # the writer (or the upload) will say why it cannot write there
        warn_once("run-marker", f"cannot mark the run directory {run_dir} ({type(exc).__name__}: {exc})")


def _marked(run_dir: str) -> bool:
    if is_url(run_dir):
        return remote_exists(join_url(run_dir, RUN_MARKER_FILE))
    return (Path(run_dir) / RUN_MARKER_FILE).exists()


# An unreachable store must not hold the setup for long: the marker's put and check wait this long at most.
MARKER_TIMEOUT_S = 20.0


def _unmark_run_dir(run_dir: Path) -> None:
    """Take the marker back from a run directory left unused, and the directory with it if it is empty."""
    with contextlib.suppress(OSError):  # a spool holds no marker: nothing to take back
        (run_dir / RUN_MARKER_FILE).unlink()
        run_dir.rmdir()


def _gather_hosts(world_size: int) -> list[str] | None:
    """Every rank's host name, by rank (one collective at setup), or None without a process group."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        hosts: list[Any] = [None] * world_size
        dist.all_gather_object(hosts, socket.gethostname())
        return [str(h) for h in hosts]
    except Exception as exc:  # every rank fails alike here; the record just lacks the hosts
        warn_once("gather-hosts", f"cannot gather the ranks' host names ({type(exc).__name__}: {exc})")
        return None


def _free_run_dir(base: Path) -> Path:
    # Never mix two runs in one directory: a reused dirpath gets a numbered sibling.
    if not (base / MANIFEST_FILE).exists() and not any(base.glob("rank-*")):
        return base
    n = 1
    while (base.parent / f"{base.name}-{n}").exists():
        n += 1
    return base.parent / f"{base.name}-{n}"


class TuneupCallback(*_callback_bases()):  # type: ignore[misc]
    """Record where the time of every optimizer step goes, plus GPU and host telemetry.

    Args:
        dirpath: the run directory to write. Default: ``$TUNEUP_DIR`` where set (``tuneup bench`` sets it),
            else ``<trainer.default_root_dir>/tuneup/<run id>``.
            A directory that already holds a run is never overwritten: ``-1``, ``-2``... is appended.
            Under ``tuneup tune`` each trial records to its own directory, whatever is given here.
        telemetry_interval_s: seconds between telemetry samples (NVML, psutil).
        batch_size_fn: ``batch -> int``, samples in a batch, when tuneup cannot tell by itself.
        tokens_fn: ``batch -> int``, tokens in a batch; by default read from integer token-id matrices.
        grad_norm: also record the total gradient norm per step (one extra pass over the gradients,
            no device synchronization).
        timing: ``"auto"`` (CUDA events on a GPU, the host clock otherwise), ``"host"`` or ``"cuda_event"``.
        log_to_trainer: also send headline metrics to the trainer's loggers every ``log_every_n_steps``.
        flush_every_steps, flush_every_s: how often buffered records reach the disk; a killed process
            loses at most this much.
        detail_steps, sample_every, window_steps: how much is kept (see ``RecordingPolicy``).
        profile_communication: time every gradient collective (DDP comm hooks, FSDP gathers and
            scatters) when more than one rank trains.
        max_lag_steps: how many steps, beyond the ``flush_every_steps`` that wait to be written anyway,
            CUDA timings may still be unreadable before tuneup waits for the device.
        instance: the cloud instance the job runs on, as a catalog key (``"aws:p4d.24xlarge"``,
            ``"gcp:a3-ultragpu-8g"``; ``tuneup.catalog.load_instances().keys()`` lists them), to price the run.
            Checked now: an unknown key raises, naming the closest ones.
        spot: price the instance at its spot price.
        price_per_hour: a price of your own in USD per hour, instead of an instance;
            ``price_per`` says whether it is per ``"node"`` (default) or per ``"gpu"``.
        catalog: a CSV of instances that extends or overrides the packaged catalog.
        electricity_usd_per_kwh: to turn the GPUs' measured energy into money.
        count_flops: count the FLOPs of the first micro-batch once (torch's FlopCounterMode; that one
            micro-batch runs several times slower) for achieved FLOP/s and MFU.
        flops_per_sample: your own FLOPs per sample (forward and backward), instead of counting.
        profile_steps: capture this many training steps with ``torch.profiler`` on each rank (off: 0). The
            Chrome trace is written beside the record (``rank-<r>/trace.json``: open it in Perfetto) and the
            report shows the top operators of each phase. Profiled steps run slower; nothing is done when 0.
        profile_start_step: how many steps into the fit profiling starts (default 10: past warm-up).
        noise_scale: measure the gradient noise scale B_simple (McCandlish et al. 2018), the batch size
            beyond which a bigger batch stops saving steps, from two gradient norms per measured step, with
            no extra communication and no copy of the gradients. Under DDP (more than one rank, with
            ``profile_communication``): each bucket's squared norm before and after its all-reduce, one
            fused norm per bucket each way. With one process and ``accumulate_grad_batches`` of 2 or more
            (automatic optimization): the gradient's norm after the first micro-batch and before the
            optimizer step, one ``torch._foreach_norm`` each. Either way two reads of the gradients, no
            synchronization, on the steps ``noise_scale_every`` picks. Not measured for FSDP (sharded
            gradients) or manual optimization. The mixed-precision loss scale is divided out. ``False``:
            nothing is computed.
        noise_scale_every: which optimizer steps take the two norms: those whose step number is a multiple
            of it. The norms are memory-bandwidth bound: measured on a 2-core CPU at 2 x 37 us a step for
            83k parameters and 2 x 141 us for 1.1M, i.e. up to ~3% of a 10 ms CPU step if taken every step.
            ``None`` (default, automatic): tuneup times the norm calls on the host (``perf_counter``) and
            the steps, and takes the norms on one step in k, k the smallest power of two with
            (norm time) / (k x step time) <= 0.5% (at most 256); it starts at every step and re-chooses
            after each measured step from the medians of recent times, at most doubling k at a time, so
            the estimate gets steps past the warm-up. On CUDA automatic means every step: the norms are
            asynchronous kernels (two reads of the gradients at memory bandwidth, small beside a step that
            computes on them) and the host, which runs ahead, times neither them nor the step; force a k
            for a model where they are not small. An integer forces one step in that many
            (1: every step, as before). Past ``detail_steps``, only steps the record keeps (about one in
            ``sample_every``: ``RecordingPolicy.sample_stride``) take the norms. The record's
            ``noise_scale_sampling`` event gives the final k and the times it was chosen from.

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
    ) -> None:
        super().__init__()
        if dirpath is not None and not isinstance(dirpath, (str, os.PathLike)):
            raise TypeError(
                f"TuneupCallback(dirpath=...) must be a path or None, got {type(dirpath).__name__}"
            )
        _check_positive("telemetry_interval_s", telemetry_interval_s)
        _check_positive("max_lag_steps", max_lag_steps, int)
        for name, fn in (("batch_size_fn", batch_size_fn), ("tokens_fn", tokens_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"TuneupCallback({name}=...) must be a function of the batch, got {fn!r}")
        if timing not in _TIMINGS:
            raise ValueError(f"TuneupCallback(timing={timing!r}) must be one of {', '.join(_TIMINGS)}")
        try:
            self.policy = RecordingPolicy(
                flush_every_steps=flush_every_steps,
                flush_every_s=flush_every_s,
                detail_steps=detail_steps,
                sample_every=sample_every,
                window_steps=window_steps,
            )
        except ValueError as exc:
            raise ValueError(str(exc).replace("RecordingPolicy.", "TuneupCallback(") + "") from None
        # As given: a URL made into a Path loses a slash ("s3:/bucket").
        self._dirpath_text = os.fspath(dirpath) if dirpath is not None else None
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.telemetry_interval_s = float(telemetry_interval_s)
        self.counter = BatchCounter(batch_size_fn, tokens_fn)
        self.grad_norm = bool(grad_norm)
        self.timing = timing
        self.log_to_trainer = bool(log_to_trainer)
        self.max_lag_steps = max_lag_steps
        self.profile_communication = bool(profile_communication)
        self.price = _price_choice(instance, spot, price_per_hour, price_per, catalog)
        if electricity_usd_per_kwh is not None:
            _check_positive("electricity_usd_per_kwh", electricity_usd_per_kwh)
        self.electricity_usd_per_kwh = electricity_usd_per_kwh
        if flops_per_sample is not None:
            _check_positive("flops_per_sample", flops_per_sample)
        self.flops_per_sample = flops_per_sample
        self.count_flops = bool(count_flops) and flops_per_sample is None
        if profile_steps:
            _check_positive("profile_steps", profile_steps, int)
        if (
            isinstance(profile_start_step, bool)
            or not isinstance(profile_start_step, int)
            or profile_start_step < 0
        ):
            raise ValueError(
                f"TuneupCallback(profile_start_step=...) must be a non-negative integer, got {profile_start_step!r}"
            )
        self.profile_steps = int(profile_steps)
        self.profile_start_step = profile_start_step
        if not isinstance(noise_scale, bool):
            raise ValueError(f"TuneupCallback(noise_scale=...) must be True or False, got {noise_scale!r}")
        self.noise_scale = noise_scale
        if noise_scale_every is not None and (
            isinstance(noise_scale_every, bool)
            or not isinstance(noise_scale_every, int)
            or noise_scale_every < 1
        ):
            raise ValueError(
                "TuneupCallback(noise_scale_every=...) must be a positive integer (1: every step, k: one "
                f"step in k) or None (chosen automatically), got {noise_scale_every!r}"
            )
        self.noise_scale_every = noise_scale_every
        # Which steps take the norms (NoiseSampling), from on_train_start where the noise scale is measured.
        self._noise_sampling: Any = None
        self._noise_taken = False  # the current step takes the norms
        self._noise_s = 0.0  # host seconds of the current step's norms (the accumulation method)
        self._noise_step_start: float | None = None  # perf_counter at the current step's first micro-batch
        self._noise_steps_seen = 0  # steps closed in this fit: the writer's steps_seen, for its policy
        # How this fit measures it (tuneup.collect.grad_noise's methods), decided at on_train_start; None: not.
        self._noise_method: str | None = None
        self._noise_first: tuple[Any, int] | None = None  # the first micro-batch's ‖g‖² and samples
        self._profiler: Any = None
        self._flops = MicroBatchFlopCounter()
        self._flops_batch: tuple[int | None, int | None, int] | None = None  # samples, tokens, step
        self._flops_done = False

        self._trial: TrialControl | None = None  # a `tuneup tune` trial (TUNEUP_TRIAL set), else None
        self._run_dir: Path | None = None
        # Under ddp_spawn the fit runs in worker processes: rank 0 leaves the run directory here for this one.
        self._handoff = RunDirHandoff()
        self.run_id: str | None = None
        self._writer: RankWriter | None = None
        self._clock: StepClock | None = None
        self._sampler: Any = None
        self._disabled = False
        self._closed = False
        self._trainer: Any = None
        self._rank = 0
        self._world_size = 1
        self._seen_global_step = 0
        self._steps_done = 0  # training steps completed: the next step's id
        self._first_batch = True
        self._taps: TrainerTaps | None = None
        # Unix times of the fit's stages on this rank, for the job timeline (written to info.json).
        self._fit_times: dict[str, float] = {}
        self._pending_events: list[tuple[str, dict[str, Any]]] = []  # before the record is open
        self._sanity_started: float | None = None
        self._saving_since: float | None = None
        self._device: Any = None
        self._on_cuda = False
        self._epoch = 0
        self._flush_every_steps = self.policy.flush_every_steps
        self._validation_started: float | None = None
        self._automatic_optimization = True
        self._last_gpu_util: float | None = None
        self._peak_mem_bytes: int | None = None
        self._drainer: Drainer | None = None
        self._comm: CommProbe | None = None
        self._url: str | None = None  # the run directory, where it is on object storage
        self._mirror: Mirror | None = None  # uploads the spool to it
        self._sync_events: Callable[[], list[tuple[str, dict[str, Any]]]] | None = None
        self._sync_summary: Callable[[], dict[str, Any] | None] | None = None
        self._segment: dict[str, Any] | None = None  # None: the run's first segment
        self._resumed_from: dict[str, Any] | None = None  # a checkpoint's state, until on_train_start
        self._log_queue: deque[tuple[int, dict[str, float]]] = deque()
        # The steps since the last log, summed: the logged figures are means over them (drainer thread).
        self._log_window: list[dict[str, Any]] = []

    @property
    def run_dir(self) -> Path | None:
        """The run directory this fit wrote; also in the process that launched ddp_spawn workers."""
        if self._run_dir is None:
            self._run_dir = self._handoff.take()
        return self._run_dir

    @run_dir.setter
    def run_dir(self, value: Path | None) -> None:
        self._run_dir = value

    # -- failure handling --------------------------------------------------------------------------

    def _hook_failed(self, hook: str, exc: Exception) -> None:
        self._disable(f"{hook} failed with {type(exc).__name__}: {exc}")

    def _disable(self, reason: str) -> None:
        self._disabled = True
        warn_once(f"disabled:{id(self)}", f"{reason}; tuneup stops recording, training goes on")
        with contextlib.suppress(Exception):
            self._shutdown("tuneup_error")

    # -- setup -------------------------------------------------------------------------------------

    @_guarded
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or (self._writer is not None and not self._closed):
            return
        if self._closed:  # a second fit() with the same callback: a new run, never appended to the last
            self._writer, self._clock, self._sampler, self._drainer = None, None, None, None
            self._closed, self._peak_mem_bytes, self._flops_done = False, None, False
            self._segment = None
            self._pending_events = []
            self._url, self._mirror = None, None
        # The fit as this rank sees it starts here: after the process group is up and data is prepared.
        self._fit_times = {"fit_start_unix": time.time(), **_process_start()}
        self._trainer = trainer
        self._rank = int(trainer.global_rank)
        self._world_size = int(trainer.world_size)
        where: tuple[str, str, dict[str, Any] | None] | None = None
        trial_text: str | None = None
        if self._rank == 0:
            # Whatever happens here, rank 0 must reach the broadcast below: the other ranks wait in it.
            try:
                where = self._choose_run_dir(trainer)
            except Exception as exc:
                warn_once("run-dir", f"cannot choose a run directory ({type(exc).__name__}: {exc})")
            trial_text = os.environ.get(ENV_TRIAL) or None
            if where is not None:
                _mark_run_dir(where[0], where[1])
        self._hosts: list[str] | None = None
        if self._world_size > 1:
            # One collective at setup, as Lightning's own loggers do; none per step. A tuning trial's
            # settings travel with it: rank 0's reading is the one decision every rank applies.
            where, trial_text = trainer.strategy.broadcast((where, trial_text), src=0)
            self._hosts = _gather_hosts(self._world_size)
        self._start_trial(trial_text, trainer, pl_module)
        if where is None:
            self._disable("no run directory could be chosen")
            return
        if self._rank != 0:
            self._check_run_dir_visible(where[0])
        self.run_id, self._segment = where[1], where[2]
        self._url = where[0] if is_url(where[0]) else None
        # A run on object storage is written to a local spool and uploaded from there (record/remote.py).
        self.run_dir = spool_dir(self.run_id) if self._url else Path(where[0])
        if self._rank == 0:
            self._handoff.publish(self.run_dir)
        self._writer = RankWriter(self.run_dir, self._rank, self.policy)
        if self._world_size > 1 and self.profile_communication:
            # Now, before the strategy wraps the model: Lightning registers the DDP comm hook in
            # strategy.setup, which runs after the callbacks' setup, and a DDP model takes one hook only.
            self._comm = CommProbe(on_cuda=_on_cuda(trainer), world_size=self._world_size)
            self._comm.record_all = _is_sharded(trainer.strategy)
            self._comm.noise_scale = self.noise_scale and not self._comm.record_all
            self._comm.install()

    def _check_run_dir_visible(self, run_dir: str) -> None:
        """A rank that cannot see the marker rank 0 left in the run directory writes to a directory of the
        same name on its own disk (a node without the filesystem rank 0's node has, or a relative path
        under another working directory): rank 0's record will miss it. Said once, with the fix."""
        if bounded(lambda: _marked(run_dir), MARKER_TIMEOUT_S, default=False):
            return
        host = socket.gethostname()
        host0 = self._hosts[0] if self._hosts else None
        where = f"rank 0 (host {host0})" if host0 else "rank 0"
        warn_once(
            "run-dir-not-shared",
            f"rank {self._rank} on host {host} cannot see the run directory {run_dir} that {where} chose: "
            "this node's ranks record to their own disk, and the run's report will list them as missing. "
            "Record to a path every node shares (a network filesystem, given as an absolute path in "
            "dirpath= or TUNEUP_DIR) or to object storage (an s3://, gs://... URL), or copy this node's "
            "rank-* directories into the run directory after the job.",
        )
        self._pending_events.append(
            (
                "run_dir_not_shared",
                {"rank": self._rank, "host": host, "rank0_host": host0, "run_dir": str(run_dir)},
            )
        )

    def _start_trial(self, trial_text: str | None, trainer: Any, pl_module: Any) -> None:
        """Apply a `tuneup tune` trial's settings now, before the strategy wraps the model and the
        dataloaders are built (plugins/lightning/trial.py)."""
        self._trial = None
        if not trial_text:
            return
        self._trial = TrialControl(TrialSpec.from_json(trial_text), self._rank)
        # Each knob that fails is reported as not applied (applied.json), and the tuner drops it.
        self._trial.apply_at_setup(trainer, pl_module, _on_cuda(trainer))

    def _choose_run_dir(self, trainer: Any) -> tuple[str, str, dict[str, Any] | None]:
        """(run directory, run id, segment): a new run, or, after a torchrun restart, the next segment of
        the run the first attempt began (torchrun's run id is the same across its restarts)."""
        run_id = new_run_id()
        elastic_id, restarts = elastic_identity()
        # A `tuneup tune` trial's directory wins (the tuner reads the run there); then an explicit dirpath;
        # then the directory `tuneup bench` gives each run through the environment.
        named = trial_run_dir(self._dirpath_text) or self._dirpath_text or os.environ.get(ENV_RUN_DIR) or None
        root_text = str(trainer.default_root_dir)
        if is_url(named) or (named is None and is_url(root_text)):
            # Object storage: a new run every time (a torchrun restart or a resumed fit starts another).
            if named is not None:
                # Never two runs in one place; a store that does not answer in time is taken as free.
                taken = bounded(
                    lambda: remote_exists(join_url(named, MANIFEST_FILE)), MARKER_TIMEOUT_S, False
                )
                url = f"{named.rstrip('/')}-{run_id}" if taken else named
                return url, f"{url.rstrip('/').rpartition('/')[2]}-{run_id}", None
            return join_url(root_text, "tuneup", run_id), run_id, None
        dirpath = Path(named) if named is not None else None
        root = Path(root_text)
        if dirpath is None and elastic_id is not None:
            dirpath = root / "tuneup" / f"elastic-{elastic_id}"
        if dirpath is not None and elastic_id is not None:
            earlier = existing_manifest(dirpath)
            if earlier is not None and earlier.get("elastic_run_id") == elastic_id:
                index = next_segment_index(dirpath)
                segment = {"index": index, "reason": "restart", "restart_count": restarts}
                return str(segment_dir(dirpath, index)), str(earlier.get("run_id")), segment
        if dirpath is not None:
            run_dir = _free_run_dir(dirpath)
            # A directory the user named ("run", "exp42") is not an id: the id names this run anywhere.
            run_id = f"{run_dir.name}-{run_id}"
        else:
            run_dir = root / "tuneup" / run_id
        return str(run_dir), run_id, None

    # -- resuming from a checkpoint: the next segment of the same run ---------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Saved in Lightning's checkpoints, so that a fit resumed from one continues this run."""
        if self.run_dir is None or self.run_id is None:
            return {}
        index = int((self._segment or {}).get("index", 0))
        return {"run_root": str(_segment_root(self.run_dir, index)), "run_id": self.run_id, "segment": index}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Lightning restores callbacks after their setup and before on_train_start, where it is applied.
        self._resumed_from = dict(state_dict) if state_dict.get("run_root") else None

    def _continue_resumed_run(self, trainer: Any) -> None:
        """Move this fit's record into the next segment of the run its checkpoint came from."""
        state = self._resumed_from
        self._resumed_from = None
        if state is None or self.run_dir is None or self._url is not None:
            return  # a run on object storage records a resumed fit as a new run
        root = Path(state["run_root"])
        here = _segment_root(self.run_dir, int((self._segment or {}).get("index", 0)))
        if here == root:
            return  # a torchrun restart already continued that run
        where: tuple[str, dict[str, Any]] | None = None
        if self._rank == 0 and existing_manifest(root) is not None and os.access(root, os.W_OK):
            index = next_segment_index(root)
            where = (str(segment_dir(root, index)), {"index": index, "reason": "resume"})
        if self._world_size > 1:
            where = trainer.strategy.broadcast(where, src=0)  # once, at the start of the fit
        if where is None:
            warn_once(
                "resume-elsewhere",
                f"resumed from a checkpoint of run {state.get('run_id')} at {root}, which is not here or not "
                f"writable: recording as a new run in {self.run_dir}",
            )
            return
        if self._rank == 0:
            _unmark_run_dir(self.run_dir)  # the directory setup chose holds nothing else: no stray run
        self.run_dir, self.run_id = Path(where[0]), str(state.get("run_id"))
        if self._rank == 0:
            self._handoff.publish(self.run_dir)
        self._segment = {**where[1], "restart_count": elastic_identity()[1]}
        self._writer = RankWriter(self.run_dir, self._rank, self.policy)

    @_guarded
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self._writer is None:  # fit() called without setup (never in Lightning, but cheap to survive)
            self.setup(trainer, pl_module, "fit")
        if self._trial is not None:
            # Before the DDP hook is wired: a trial's comm hook goes through the probe's timed registration.
            self._trial.apply_at_train_start(trainer)
        if self._writer is None:
            return
        self._device = getattr(pl_module, "device", None)
        self._on_cuda = getattr(self._device, "type", None) == "cuda"
        self._automatic_optimization = bool(getattr(pl_module, "automatic_optimization", True))
        self._seen_global_step = int(trainer.global_step)
        self._epoch = int(trainer.current_epoch)
        self._flush_every_steps = self.policy.flush_every_steps
        self._steps_done = _training_steps_done(trainer, self._automatic_optimization)
        self._first_batch = True
        started = time.time()
        self._continue_resumed_run(trainer)
        timer = self._make_timer()
        self._clock = StepClock(
            timer, self._on_step_resolved, max_pending=self.policy.flush_every_steps + self.max_lag_steps
        )
        # The training loop starts when this hook is done (set at its end): tuneup's own start-up (the
        # manifest, the environment's capture, the sampler) is part of the setup, and said so. Until then,
        # for a record that is never closed, the loop starts here.
        self._fit_times["train_start_unix"] = started
        self._writer.open(self._rank_info(trainer, timer.kind))
        for kind, fields in self._pending_events:
            self._writer.add_event(kind, **fields)
        self._pending_events = []
        if self._rank == 0:
            self._write_manifest(trainer, pl_module)
        self._start_mirror()
        self._start_sampler(trainer)
        self._wire_ddp_hook(trainer)
        # TuneupDDPStrategy's events (its start, checks, fallbacks), recorded as they happen.
        self._sync_events = getattr(trainer.strategy, "tuneup_sync_events", None)
        self._sync_summary = getattr(trainer.strategy, "tuneup_sync_summary", None)
        self._record_sync_events()
        self._noise_method = self._choose_noise_method(trainer)
        self._start_noise_sampling()
        if self.count_flops and _is_compiled(pl_module):
            # A dispatch mode around a compiled module can make it recompile or fail inside the user's
            # training_step, where tuneup cannot catch it for them: do not risk the training.
            self.count_flops = False
            info_once(
                "flops-compiled", "FLOPs are not counted for a torch.compile'd model; pass flops_per_sample="
            )
        clock = self._clock
        self._drainer = Drainer(
            lambda pause: clock.drain(pause=pause),
            interval_s=self.policy.flush_every_s,
            on_error=self._drainer_failed,
            thread_init=_cuda_thread_init(self._device),
        )
        self._drainer.start()
        self._install_taps(trainer)
        if self.profile_steps and self.run_dir is not None:
            from tuneup.collect.profiler import StepProfiler
            from tuneup.record.schema import rank_dir_name

            self._profiler = StepProfiler(
                self.run_dir / rank_dir_name(self._rank),
                steps=self.profile_steps,
                start_step=self._steps_done + self.profile_start_step,
                rank=self._rank,
            )
            self._clock.listener = self._profiler.phase
        self._restart_clock()
        done = time.time()
        self._fit_times["tuneup_start_s"] = done - started
        self._fit_times["train_start_unix"] = done

    def _install_taps(self, trainer: Any) -> None:
        clock = self._clock
        assert clock is not None

        self._taps = TrainerTaps(
            # Runs inside the trainer's methods and torch's optimizer step: a failure stops recording and
            # never reaches them.
            self._mark_failed,
            on_sync_start=clock.sync_start,
            on_sync_end=clock.sync_end,
            on_save_start=self._save_started,
            on_save_end=self._save_ended,
            on_optimizer_step_end=clock.after_optimizer,
            on_fetch_start=clock.fetch_start,
            on_fetch_end=clock.fetch_end,
        )
        self._taps.install(trainer)

    def _save_started(self) -> None:
        if self._saving_since is None:  # a save inside a save (a subclass calling super) is one save
            self._saving_since = time.time()
            if self._clock is not None:
                self._clock.exclude_start()

    def _save_ended(self) -> None:
        started, self._saving_since = self._saving_since, None
        if started is None:
            return
        if self._clock is not None:
            self._clock.exclude_end()
        self._add_timed_event("checkpoint", started, step=self._steps_done)

    def _add_timed_event(self, kind: str, started_unix: float, **fields: Any) -> None:
        """An event that began at `started_unix` and ends now: its start and duration, for the timeline."""
        duration_ms = (time.time() - started_unix) * 1000.0
        self._add_event(kind, t_start=round(started_unix, 3), duration_ms=round(duration_ms, 3), **fields)

    def _add_event(self, kind: str, **fields: Any) -> None:
        """An event now, or at on_train_start if the record is not open yet (setup, sanity check)."""
        if self._writer is not None and self._clock is not None:
            self._writer.add_event(kind, **fields)
        else:
            self._pending_events.append((kind, fields))

    def _start_mirror(self) -> None:
        """Object storage: this rank's files (and rank 0's manifest) go up from the spool, off the
        training thread, every flush interval (tuneup.record.remote)."""
        if self._url is None or self.run_dir is None or self._mirror is not None:
            return
        paths = [f"rank-{self._rank}"] + ([MANIFEST_FILE, RUN_MARKER_FILE] if self._rank == 0 else [])
        try:
            self._mirror = Mirror(self.run_dir, self._url, paths, interval_s=self.policy.flush_every_s)
            self._mirror.start()
            if self._writer is not None:
                self._writer.after_flush = self._mirror.wake  # each flush goes up as its own chunks
        except Exception as exc:  # a missing fsspec backend: the spool keeps the record
            warn_once(
                "mirror",
                f"cannot upload the run record to {self._url} ({type(exc).__name__}: {exc}); it stays in "
                f"{self.run_dir}",
            )

    def _record_sync_events(self) -> None:
        if self._sync_events is None or self._writer is None:
            return
        for kind, fields in self._sync_events():
            self._writer.add_event(kind, **fields)

    def _restart_clock(self) -> None:
        """Time before this point belongs to no step: nor do collectives issued in it (setup, validation)."""
        if self._clock is not None:
            self._clock.restart()
        if self._comm is not None:
            self._comm.take()

    def _wire_ddp_hook(self, trainer: Any) -> None:
        comm = self._comm
        if comm is None or comm.record_all:
            return
        ddp_model = getattr(trainer.strategy, "model", None)
        if ddp_model is None or not hasattr(ddp_model, "register_comm_hook"):
            return
        dropped = getattr(trainer.strategy, "_ddp_comm_hook", None)
        if dropped is not None and not comm.on_cuda and not comm.hook_registered:
            if self._writer is not None:
                # In the record too, so that the report says it: the training log is easily missed.
                self._writer.add_event(
                    "ddp_comm_hook_dropped",
                    hook=str(getattr(dropped, "__qualname__", None) or dropped)[:200],
                    reason="Lightning applies ddp_comm_hook only on CUDA devices",
                )
            warn_once(
                "ddp-hook-dropped",
                f"Lightning ignores ddp_comm_hook off CUDA: {getattr(dropped, '__qualname__', dropped)} is not "
                "applied in this run (tuneup times the default all-reduce). To apply a hook on CPU, register it "
                "from on_fit_start: trainer.strategy.model.register_comm_hook(state, hook).",
            )
        if not comm.hook_registered:
            comm.register_default_hook(ddp_model)

    def _choose_noise_method(self, trainer: Any) -> str | None:
        """How the gradient noise scale is measured in this fit (tuneup.collect.grad_noise), or None."""
        from tuneup.collect.grad_noise import ACCUMULATION_METHOD, DDP_METHOD

        if not self.noise_scale:
            return None
        why_not = None
        method = None
        if not self._automatic_optimization:
            why_not = "manual optimization (tuneup cannot tell which backward makes the step's gradient)"
        elif self._world_size > 1:
            comm = self._comm
            if comm is None:
                why_not = "profile_communication=False (the norms are taken in the DDP comm hook)"
            elif comm.record_all:
                why_not = "a sharded strategy (FSDP): its gradients are reduce-scattered, not all-reduced"
            elif not comm.hook_registered:
                why_not = "no DDP comm hook could be registered"
            else:
                method = DDP_METHOD
        elif int(getattr(trainer, "accumulate_grad_batches", 1) or 1) >= 2:
            method = ACCUMULATION_METHOD
        else:
            why_not = "one process without gradient accumulation (it needs two batch sizes in each step)"
        if method is not None and self._writer is not None:
            comm_hook = self._comm.hook_name if self._comm is not None else None
            self._writer.add_event("noise_scale", method=method, comm_hook=comm_hook)
        elif why_not is not None and self._rank == 0:
            info_once("noise-scale-off", f"the gradient noise scale is not measured in this run: {why_not}")
        if method is None and self._comm is not None:
            self._comm.noise_scale = False
        return method

    def _start_noise_sampling(self) -> None:
        from tuneup.collect.grad_noise import NoiseSampling

        every = self.noise_scale_every
        if every is None and self._on_cuda:
            # The host can judge neither side on CUDA: the norms are asynchronous kernels, and the host runs
            # ahead of the step (timed on the host, a 158 ms GPU step let k grow to leave 5 of 25 steps).
            every = 1
        self._noise_sampling = NoiseSampling(every) if self._noise_method else None
        self._noise_taken = False
        self._noise_s = 0.0
        self._noise_step_start = None
        self._noise_steps_seen = 0
        self._noise_first = None
        if self._comm is not None:
            self._comm.noise_scale = False  # until a step that takes the norms (_noise_step_starts)
            self._comm.take_noise_times()

    def _noise_step_starts(self) -> None:
        """At the first micro-batch of a step: whether the step takes the norms. Under DDP the hooks are
        told now, before any backward of the step."""
        # The step's own time, from its first micro-batch to its end: the time between step ends would also
        # hold whatever runs between steps (validation, checkpoints, another fit's turn in a benchmark's
        # lockstep), and a longer step makes the norms look cheaper than they are.
        self._noise_step_start = time.perf_counter()
        policy = self.policy
        kept_every = 1 if self._noise_steps_seen < policy.detail_steps else policy.sample_stride
        taken = self._noise_sampling.takes(self._steps_done, kept_every)
        self._noise_taken = taken
        if self._comm is not None and self._noise_method == "ddp":
            self._comm.noise_scale = taken

    def _noise_step_ends(self) -> None:
        """At the step's end: its host time and its norms' for the sampling to choose from."""
        now = time.perf_counter()
        started, self._noise_step_start = self._noise_step_start, None
        self._noise_steps_seen += 1
        norm_s = None
        if self._noise_taken:
            if self._noise_method == "ddp":
                times = self._comm.take_noise_times() if self._comm is not None else None
                norm_s = sum(times) if times else None
            else:
                norm_s, self._noise_s = self._noise_s, 0.0
        self._noise_sampling.observe(None if started is None else now - started, norm_s)

    def _noise_first_micro_batch(self, clock: StepClock, pl_module: Any) -> None:
        """The accumulation method: the gradient after the step's first micro-batch (a device tensor)."""
        from tuneup.collect.grad_noise import grads_squared_norm

        started = time.perf_counter()
        sq = grads_squared_norm(pl_module.parameters())
        self._noise_s += time.perf_counter() - started
        self._noise_first = None if sq is None else (sq, clock.samples or 0)

    def _noise_step(self, clock: StepClock, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """Before the optimizer step: the step's PendingNoise for the clock (or none for this step)."""
        from tuneup.collect.grad_noise import ACCUMULATION_METHOD, PendingNoise, grads_squared_norm

        first, self._noise_first = self._noise_first, None
        clock.noise = None
        accumulate = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        samples = clock.samples
        # A step short of micro-batches (an epoch's end) has a gradient that Lightning scaled by m/k: left out.
        if not samples or clock.micro_batches != accumulate:
            return
        scale, unscaled = _loss_scale(trainer, optimizer)
        if self._noise_method == ACCUMULATION_METHOD:
            if first is None or not first[1] or first[1] >= samples:
                return
            started = time.perf_counter()
            big_sq = grads_squared_norm(pl_module.parameters())
            self._noise_s += time.perf_counter() - started
            if big_sq is None:
                return
            clock.noise = PendingNoise(
                ACCUMULATION_METHOD,
                small_batch=first[1],
                big_batch=samples,
                small_sq=first[0],
                big_sq=big_sq,
                # Lightning divides each micro-batch's loss by k: the first one's gradient is 1/k of its mean.
                small_factor=float(accumulate * accumulate),
                loss_scale=scale,
                small_scaled=True,
                big_scaled=not unscaled,  # Lightning unscales before this hook, unless the optimizer does
            )
        else:
            clock.noise = PendingNoise(
                self._noise_method,  # type: ignore[arg-type]
                small_batch=samples,
                big_batch=samples * self._world_size,
                loss_scale=scale,
            )

    def _record_ddp_logging(self) -> None:
        """DDP's own sampled averages (private API), kept as a cross-check of the hook timings."""
        model = getattr(getattr(self._trainer, "strategy", None), "model", None)
        logging_data = getattr(model, "_get_ddp_logging_data", None)
        if logging_data is None or self._writer is None:
            return
        try:
            data = logging_data()
        except Exception:
            return
        keys = (
            "avg_forward_compute_time",
            "avg_backward_compute_time",
            "avg_backward_comm_time",
            "avg_backward_compute_comm_overlap_time",
            "bucket_sizes",
            "bucket_cap_bytes",
            "gradient_as_bucket_view",
            "comm_hook",
            "backend_name",
        )
        self._writer.add_event("ddp_logging", **{k: data[k] for k in keys if k in data})

    def _drainer_failed(self, exc: BaseException) -> None:
        # Runs on the drainer's thread: stop recording, but leave closing the record to the training
        # thread's next teardown hook (joining this thread from itself would deadlock).
        self._disabled = True
        warn_once(
            f"disabled:{id(self)}",
            f"writing step records failed with {type(exc).__name__}: {exc}; tuneup stops recording, training goes on",
        )

    def _mark_failed(self, exc: BaseException) -> None:
        if not self._disabled:
            self._disable(f"a trainer mark failed with {type(exc).__name__}: {exc}")

    @property
    def _log_every(self) -> int:
        return int(getattr(self._trainer, "log_every_n_steps", 50) or 50)

    def _make_timer(self) -> HostTimer | CudaEventTimer:
        on_cuda = getattr(self._device, "type", None) == "cuda"
        if self.timing == "cuda_event" or (self.timing == "auto" and on_cuda):
            if not on_cuda:
                raise ValueError("TuneupCallback(timing='cuda_event') needs the model on a CUDA device")
            return CudaEventTimer(self._device)
        return HostTimer()

    def _rank_info(self, trainer: Any, timing: str) -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "local_rank": int(getattr(trainer, "local_rank", 0)),
            "node_rank": int(getattr(trainer, "node_rank", 0)),
            "world_size": self._world_size,
            "device": str(self._device) if self._device is not None else None,
            "device_bus_id": _cuda_bus_id(self._device),
            "timing": timing,
            "start_unix": round(time.time(), 3),
            # tuneup's step ids count training steps (batches that stepped); Lightning's global_step counts
            # every optimizer's steps, which differs under manual optimization with several optimizers.
            "global_step_at_start": self._steps_done,
            "optimizer_steps_at_start": self._seen_global_step,
            **{k: round(v, 3) for k, v in self._fit_times.items()},
        }

    def _write_manifest(self, trainer: Any, pl_module: Any) -> None:
        from tuneup.collect.environment import capture_environment
        from tuneup.collect.nvml import gpu_inventory

        manifest = {
            "run_id": self.run_id,
            "created_unix": round(time.time(), 3),
            "elastic_run_id": elastic_identity()[0],
            "segment": {
                **(self._segment or {"index": 0, "reason": "start"}),
                "global_step_at_start": self._steps_done,
                "checkpoint": str(trainer.ckpt_path) if getattr(trainer, "ckpt_path", None) else None,
            },
            "world_size": self._world_size,
            "num_nodes": int(getattr(trainer, "num_nodes", 1) or 1),
            # Each rank's host, gathered at setup: the report names the hosts of ranks that left no record.
            **({"hosts_by_rank": self._hosts} if self._hosts else {}),
            "trainer": trainer_config(trainer),
            "dataloader": dataloader_config(trainer),
            "model": model_summary(pl_module),
            "environment": capture_environment(),
            "gpus": gpu_inventory(),
            "communication": _communication_environment(trainer),
            "pricing": {
                **(self.price.as_dict() if self.price is not None else {}),
                "electricity_usd_per_kwh": self.electricity_usd_per_kwh,
            },
            "flops": {"flops_per_sample": self.flops_per_sample, "count_flops": self.count_flops},
            **({"tune_trial": self._trial.manifest()} if self._trial is not None else {}),
            "recording": {
                **self.policy.as_dict(),
                "telemetry_interval_s": self.telemetry_interval_s,
                "grad_norm": self.grad_norm,
                "noise_scale": self.noise_scale,
                "noise_scale_every": self.noise_scale_every,
                "timing": self._clock.timer.kind if self._clock else None,
            },
        }
        try:
            write_manifest(self.run_dir, manifest)  # type: ignore[arg-type]
        except OSError as exc:
            warn_once("manifest", f"cannot write {self.run_dir}/{MANIFEST_FILE} ({exc.strerror or exc})")

    def _start_sampler(self, trainer: Any) -> None:
        from tuneup.collect.sampler import TelemetrySampler, default_sensors

        writer = self._writer
        assert writer is not None

        def sink(sample: dict[str, Any]) -> None:
            gpus = sample.get("gpus")
            if isinstance(gpus, list) and gpus:
                utils = [g["util_percent"] for g in gpus if isinstance(g.get("util_percent"), (int, float))]
                self._last_gpu_util = sum(utils) / len(utils) if utils else None
            writer.add_telemetry(sample)

        sensors = default_sensors(local_rank=int(getattr(trainer, "local_rank", 0)))
        self._sampler = TelemetrySampler(sensors, sink, interval_s=self.telemetry_interval_s)
        self._sampler.start()

    # -- per micro-batch ---------------------------------------------------------------------------

    @_guarded
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._epoch = int(trainer.current_epoch)  # read once an epoch, not at every step's end
        self._restart_clock()

    # The per-batch hooks guard themselves inline rather than through `_guarded`: its wrapper frame and
    # argument packing cost, in caches the step has just emptied, as much as a mark (issue 13).

    # Each per-batch hook takes its mark at its entry and hands the clock its own time at its exit
    # (`own_since`): the batch's size, the noise scale's norms, the step's bookkeeping are tuneup's own
    # time, the step's `tuneup_ms`, and none of them lands in the user's forward, backward or "other".

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        clock = self._clock
        if clock is None or self._disabled:
            return
        entered = time.perf_counter()
        try:
            if self._first_batch:
                self._first_batch = False
                if not clock.pending and not clock.micro_batches:
                    self._steps_done = _training_steps_done(trainer, self._automatic_optimization)
            samples, tokens = self.counter.samples(batch), self.counter.tokens(batch)
            if self._noise_sampling is not None and not clock.micro_batches:
                self._noise_step_starts()
            if self._profiler is not None:
                self._profiler.batch_start(self._steps_done)
            clock.batch_start(samples, tokens, at=entered)
            if self.count_flops and not self._flops_done:
                self._start_counting_flops(samples, tokens)
            clock.own_since(entered)
        except Exception as exc:
            self._hook_failed("on_train_batch_start", exc)

    def _start_counting_flops(self, samples: int | None, tokens: int | None) -> None:
        self._flops_done = True  # once, even if counting fails
        self._flops_batch = (samples, tokens, self._steps_done)
        self._flops.start()

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        clock = self._clock
        if clock is not None and not self._disabled:
            try:
                clock.before_backward()  # nothing of tuneup's own after it: the mark is the hook's cost
            except Exception as exc:
                self._hook_failed("on_before_backward", exc)

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        clock = self._clock
        if clock is not None and not self._disabled:
            try:
                if self._noise_taken and clock.micro_batches == 1 and self._noise_method == "accumulation":
                    entered = time.perf_counter()
                    clock.after_backward(at=entered)
                    self._noise_first_micro_batch(clock, pl_module)
                    clock.own_since(entered)
                else:
                    if self._noise_taken and self._comm is not None:
                        clock.add_own(self._comm.take_own_s())  # the DDP hook's norms in this backward
                    clock.after_backward()
            except Exception as exc:
                self._hook_failed("on_after_backward", exc)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        clock = self._clock
        if clock is not None and not self._disabled:
            try:
                entered = time.perf_counter()
                clock.before_optimizer(at=entered)
                if self.grad_norm:
                    clock.grad_norm = _total_grad_norm(pl_module)
                if self._noise_taken:
                    self._noise_step(clock, trainer, pl_module, optimizer)
                clock.own_since(entered)
            except Exception as exc:
                self._hook_failed("on_before_optimizer_step", exc)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        entered = time.perf_counter()
        if self._trial is not None:
            self._trial.batch_ended(trainer)  # recording or not: the trial's budget and stop rule hold
        clock = self._clock
        if clock is None or self._disabled:
            return
        try:
            self._batch_ended(clock, trainer, outputs, entered)
            # The step's bookkeeping (closing it, the noise scale's sampling, waking the writer) is in the
            # gap before the next batch: the next step's own time.
            clock.own_since(entered)
        except Exception as exc:
            self._hook_failed("on_train_batch_end", exc)

    def _batch_ended(self, clock: StepClock, trainer: Any, outputs: Any, entered: float) -> None:
        if self._flops_batch is not None:  # the first micro-batch: its FLOPs were being counted
            self._record_flops(trainer)
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None and hasattr(loss, "detach"):
            # Automatic optimization hands over a detached copy; a manual training_step may return the
            # loss with its graph, which must not be kept alive until the step is resolved.
            clock.batch_end(loss if self._automatic_optimization else loss.detach(), at=entered)
        else:
            clock.batch_end(at=entered)
        global_step = trainer.global_step
        if global_step == self._seen_global_step:
            if self._profiler is not None:
                self._profiler.batch_end()
            return  # still accumulating gradients: no optimizer stepped in this batch
        # global_step moves once per optimizer stepped: a GAN's batch moves it by two, and is one step.
        self._seen_global_step = global_step
        if clock.loss is not None and not self._automatic_optimization and clock.micro_batches > 1:
            # Lightning divides each micro-batch loss by the accumulation count only in automatic optimization.
            clock.loss = clock.loss / clock.micro_batches
        step = self._steps_done
        self._steps_done += 1
        if self._on_cuda and (step % PEAK_MEMORY_EVERY_STEPS == 0 or self._peak_mem_bytes is None):
            self._peak_mem_bytes = _peak_memory_bytes(self._device)
        clock.close_step(
            step,
            self._epoch,
            peak_mem_bytes=self._peak_mem_bytes,
            comm=self._comm.take() if self._comm is not None else None,
        )
        if self._noise_sampling is not None:
            self._noise_step_ends()
        if self._sync_events is not None:
            self._record_sync_events()
        if self._profiler is not None:
            self._profiler.step_end(step)
        # Records are built and written on the drainer's thread (which also wakes every flush_every_s).
        pending = clock.pending
        if pending >= self._flush_every_steps and self._drainer is not None:
            self._drainer.wake()
            if pending >= 2 * self._flush_every_steps:
                # The writer thread let a whole interval pass unwritten: write here rather than let a kill
                # lose more than about two intervals.
                self._drainer.run_now()
        if self._log_queue:
            self._log_to_trainer()

    def _record_flops(self, trainer: Any) -> None:
        flops = self._flops.stop()
        samples, tokens, step = self._flops_batch or (None, None, None)
        self._flops_batch = None
        if flops and self._writer is not None:
            self._writer.add_event("flops", flops=flops, samples=samples, tokens=tokens, step=step)

    # -- between steps -----------------------------------------------------------------------------

    @_guarded
    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self._sanity_started = time.time()

    @_guarded
    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        started, self._sanity_started = self._sanity_started, None
        if started is not None:
            self._add_timed_event("sanity_check", started)

    @_guarded
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking and self._clock is not None:
            self._validation_started = time.time()
            # Validation is part of no training step: the job timeline counts it on its own.
            self._clock.exclude_start()

    @_guarded
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._validation_started is None or self._clock is None:
            return
        started, self._validation_started = self._validation_started, None
        self._clock.exclude_end()
        if self._comm is not None:
            self._comm.take()  # collectives of the validation's forward passes are no step's
        self._add_timed_event("validation", started, step=self._steps_done)

    @_guarded
    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if self._clock is not None:
            self._clock.checkpoint = True
        if self._saving_since is None:
            # Saved by a path that bypasses trainer.save_checkpoint: seen, but its duration is unknown.
            self._add_event("checkpoint", step=self._steps_done, t_start=round(time.time(), 3))

    # -- resolved steps ----------------------------------------------------------------------------

    def _on_step_resolved(self, record: dict[str, Any]) -> None:
        """Runs on the drainer's thread: write the record, and queue what the trainer's loggers get."""
        if self._writer is not None:
            self._writer.add_step(record)
        if self.log_to_trainer and self._rank == 0:
            self._log_window.append(record)
            if (record["step"] + 1) % self._log_every == 0:
                self._log_queue.append(self._headline_metrics(self._log_window))
                self._log_window = []

    def _log_to_trainer(self) -> None:
        """On the training thread: loggers are not all safe to call from another thread."""
        loggers = getattr(self._trainer, "loggers", None) or []
        while self._log_queue:
            step, metrics = self._log_queue.popleft()
            for logger in loggers:
                try:
                    logger.log_metrics(metrics, step=step)
                except Exception as exc:
                    warn_once(
                        f"logger:{type(logger).__name__}",
                        f"{type(logger).__name__}.log_metrics failed: {exc}",
                    )

    def _headline_metrics(self, records: list[dict[str, Any]]) -> tuple[int, dict[str, float]]:
        """The report's headline figures over the steps since the last log, by the report's definitions
        (tuneup.analyze.throughput): means over the interval, a rate as its samples over its time."""
        wall_ms = sum(r["wall_ms"] for r in records)
        n = len(records)
        metrics: dict[str, float] = {
            "tuneup/step_time_ms": wall_ms / n,
            "tuneup/data_wait_ms": sum(r["data_ms"] for r in records) / n,
            "tuneup/forward_ms": sum(r["forward_ms"] for r in records) / n,
            "tuneup/backward_ms": sum(r["backward_ms"] for r in records) / n,
            "tuneup/optimizer_ms": sum(r["optimizer_ms"] for r in records) / n,
        }
        # Rank 0's count times the world size: exact when ranks see equal batches, as DDP's sampler makes them.
        for key, name in (("samples", "tuneup/samples_per_s"), ("tokens", "tuneup/tokens_per_s")):
            counts = [r.get(key) for r in records]
            if None not in counts and sum(counts):  # type: ignore[arg-type]
                rate = rate_per_s(sum(counts) * self._world_size, wall_ms)  # type: ignore[arg-type]
                if rate is not None:
                    metrics[name] = rate
        if self._last_gpu_util is not None:
            metrics["tuneup/gpu_util_percent"] = self._last_gpu_util
        return records[-1]["step"], metrics

    # -- the end -----------------------------------------------------------------------------------

    @_guarded
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._fit_times["train_end_unix"] = time.time()
        self._shutdown("completed", stop_reason=stop_reason(trainer))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self._trial is not None:
            self._trial.failed(exception)  # first: the tuner ends the trial on every rank when it sees it
        try:
            if self._writer is not None and not self._closed:
                self._writer.add_event(
                    # Redacted before it is cut, so that a cut cannot split a secret past the redaction.
                    "exception",
                    type=type(exception).__name__,
                    message=redact_value("", str(exception))[:500],
                )
            # The status says how the record closed; the stop reason why the fit ended (a user's Ctrl-C is a
            # stop, not an interruption: tuneup.analyze.interruptions).
            self._shutdown(
                "interrupted" if isinstance(exception, KeyboardInterrupt) else "exception",
                stop_reason=exception_stop_reason(trainer, exception),
            )
        except Exception as exc:
            warn_once("on_exception", f"closing the record after an exception failed: {exc}")

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        try:
            was_closed = self._closed
            self._shutdown("teardown")
            if stage == "fit" and self._writer is not None and self._writer.closed:
                # The fit's teardown (strategy teardown, on_fit_end) follows on_train_end: its end is the
                # fit's, which the job timeline needs.
                self._writer.amend_info(fit_end_unix=round(time.time(), 3))
                if self._mirror is not None:
                    bounded(self._mirror.sync, MARKER_TIMEOUT_S, default=False)
                if was_closed and self._rank == 0:
                    self._closing_line()
        except Exception as exc:
            warn_once("teardown", f"closing the record at teardown failed: {exc}")

    def _closing_line(self) -> None:
        # Printed, not logged: Python shows no INFO record unless the user configured logging, and this
        # one line is how a user learns where the record went.
        if self.run_dir is not None and first_time(f"wrote:{self.run_dir}"):
            where = self._url or self.run_dir
            spool = f" (local copy: {self.run_dir})" if self._url else ""
            print(
                f"tuneup: run record written to {where}{spool}; report it with: tuneup report {where}",
                file=sys.stderr,
                flush=True,
            )

    def _shutdown(self, status: str, stop_reason: str | None = None) -> None:
        if self._closed or self._writer is None:
            return
        self._closed = True
        self._flops.stop()  # a micro-batch that raised while being counted: leave the dispatch mode
        if self._taps is not None:
            self._taps.remove()
            self._taps = None
        if self._profiler is not None:
            self._profiler.close()
            self._profiler = None
        try:
            if self._drainer is not None:
                self._drainer.stop()
            if self._clock is not None and not self._disabled:
                self._clock.drain(force=True)
                self._log_to_trainer()
        finally:
            if self._sync_summary is not None:
                with contextlib.suppress(Exception):
                    self._record_sync_events()
                    summary = self._sync_summary()
                    if summary:
                        self._writer.add_event("sync_summary", **summary)
            if self._noise_sampling is not None:
                # Which steps took the norms, and what they cost (the automatic choice's inputs).
                with contextlib.suppress(Exception):
                    self._writer.add_event("noise_scale_sampling", **self._noise_sampling.summary())
            if self._comm is not None:
                self._comm.uninstall()
                self._record_ddp_logging()
            if self._sampler is not None:
                self._sampler.stop()
            data_timing = "fetch" if self._clock is not None and self._clock.fetch_marks_seen else "gap"
            times = {k: round(v, 3) for k, v in self._fit_times.items()}
            self._writer.close(
                status=status,
                data_timing=data_timing,
                stop_reason=stop_reason,
                steps_at_end=self._steps_done,
                optimizer_steps_at_end=self._seen_global_step,
                **times,
            )
            if self._mirror is not None:
                self._mirror.close()  # the last upload, bounded
            if self._rank == 0 and status != "completed":
                self._closing_line()  # no teardown may follow an exception


def _training_steps_done(trainer: Any, automatic: bool) -> int:
    """Training steps (batches that stepped the optimizers) done before this fit, restored from a
    checkpoint when resuming. With automatic optimization one optimizer steps once per step: global_step.
    Manual optimization may step several: Lightning's own count of batches that stepped (kept for its
    loggers, restored from checkpoints; read again at the first batch, once its loop has settled it)."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    done = getattr(loop, "_batches_that_stepped", None)
    if automatic or not isinstance(done, int):
        return int(trainer.global_step)
    return int(done)


def _process_start() -> dict[str, float]:
    """When this process started (imports, data preparation and launching come before the fit)."""
    try:
        import psutil

        return {"process_start_unix": float(psutil.Process().create_time())}
    except Exception:
        return {}


def _is_compiled(pl_module: Any) -> bool:
    try:
        return any(
            hasattr(m, "_orig_mod") or getattr(m, "_compiled_call_impl", None) is not None
            for m in pl_module.modules()
        )
    except Exception:
        return True  # cannot tell: the safe answer


def _price_choice(
    instance: str | None,
    spot: bool,
    price_per_hour: float | None,
    price_per: str,
    catalog: str | os.PathLike[str] | None,
) -> PriceChoice | None:
    """The callback's price choice, else the environment's; checked now, before any training starts."""
    if instance is None and price_per_hour is None:
        if spot or catalog is not None:
            raise ValueError(
                "TuneupCallback(spot=/catalog=) need instance=: e.g. instance='aws:p4d.24xlarge'"
            )
        return choice_from_env()
    choice = PriceChoice(
        instance=instance,
        spot=bool(spot),
        price_per_hour=price_per_hour,
        price_per=price_per,
        catalog=os.fspath(catalog) if catalog is not None else None,
        source="callback",
    )
    return check_choice(choice, where="TuneupCallback")


def _communication_environment(trainer: Any) -> dict[str, Any]:
    """Backend, NCCL version, ranks per node and NCCL_* settings: what the collectives ran over."""
    import torch

    from tuneup.collect.environment import redact_value

    env: dict[str, Any] = {
        "world_size": int(getattr(trainer, "world_size", 1)),
        "ranks_per_node": int(getattr(trainer, "num_devices", 1)),
        "num_nodes": int(getattr(trainer, "num_nodes", 1)),
        "backend": None,
        "nccl_version": None,
    }
    try:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            env["backend"] = str(torch.distributed.get_backend())
        if torch.cuda.is_available():
            env["nccl_version"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception as exc:
        warn_once("comm-env", f"cannot read the communication backend ({exc})")
    env["nccl_env"] = {k: redact_value(k, v) for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}
    return env


def _on_cuda(trainer: Any) -> bool:
    return getattr(getattr(trainer.strategy, "root_device", None), "type", None) == "cuda"


def _is_sharded(strategy: Any) -> bool:
    # FSDP (Lightning's FSDPStrategy) and FSDP2 (fully_shard through ModelParallelStrategy) issue their
    # gathers and scatters from Python: every such collective during a step is the training's.
    return type(strategy).__name__ in {"FSDPStrategy", "ModelParallelStrategy"}


def _cuda_thread_init(device: Any) -> Any:
    """For the drainer's thread on a GPU: the rank's device, so reading a loss copies from the right one."""
    if getattr(device, "type", None) != "cuda":
        return None

    def init() -> None:
        import torch

        torch.cuda.set_device(device)

    return init


def _cuda_bus_id(device: Any) -> str | None:
    if getattr(device, "type", None) != "cuda":
        return None
    try:
        import torch

        props = torch.cuda.get_device_properties(device)
        return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0".upper()
    except Exception:
        return None


def _loss_scale(trainer: Any, optimizer: Any) -> tuple[Any, bool]:
    """(the fp16 GradScaler's scale in this step's backward, whether the gradients are unscaled already);
    (None, False) without a scaler. The scale is a copy of the scaler's tensor, read later: `get_scale()`
    would synchronize the device, and `update()` changes the scaler's own tensor in place after this."""
    scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
    if scaler is None or not getattr(scaler, "_enabled", True):
        return None, False
    scale = getattr(scaler, "_scale", None)
    if scale is None:
        return None, False
    optimizer = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer wraps the scaler's key
    state = getattr(scaler, "_per_optimizer_states", {}).get(id(optimizer)) or {}
    stage = state.get("stage")
    unscaled = getattr(stage, "name", None) == "UNSCALED"
    return (scale.detach().clone() if hasattr(scale, "detach") else float(scale)), unscaled


def _peak_memory_bytes(device: Any) -> int | None:
    if getattr(device, "type", None) != "cuda":
        return None
    import torch

    # A host-side counter of the caching allocator: reading it does not synchronize the device.
    return int(torch.cuda.max_memory_allocated(device))


def _total_grad_norm(pl_module: Any) -> Any:
    import torch

    grads = []
    for p in pl_module.parameters():
        g = p.grad
        if g is None:
            continue
        if hasattr(g, "to_local"):
            # A sharded (DTensor) gradient: the global norm would need a collective, which tuneup never adds.
            warn_once("grad-norm-sharded", "gradient norm is not recorded for sharded (FSDP) gradients")
            return None
        grads.append(g.detach())
    if not grads:
        return None
    # One fused pass and a device tensor: read later with the step's timings, never synchronized here.
    norms = torch._foreach_norm(grads, 2.0)
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]), 2.0)
