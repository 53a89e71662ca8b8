"""`RecordingSession`: one run's record, below every trainer adapter.

The session owns the run directory (local or on object storage, with the mirror that uploads it), the
segments of a resumed or restarted run, the manifest, the step clock, the telemetry sampler, the comm probe,
the gradient noise scale, the FLOP count, the operator profiler, the drainer and the writer. An adapter
(the Lightning callback, a plain loop, Fabric, the Hugging Face Trainer) translates its trainer's events
into a few calls, in this order:

    session = RecordingSession(dirpath, recording=..., profiling=..., pricing=...)
    session.prepare(ranks, default_root)      # every rank, before the model is wrapped: where the run goes
    session.start(TrainingFacts(...))         # the training loop is about to start: the record opens
    per micro-batch: [fetch_start/fetch_end] -> batch_start(samples, tokens) -> before_backward ->
        after_backward -> before_optimizer(optimizer) -> after_optimizer -> batch_end(loss, optimizer_steps)
        (the step closes where optimizer_steps moved; or `end_step()`); `idle()` after an explicit phase
        end; `mark(name)` for any of them by name
    between steps: restart / epoch_start, exclude_start/exclude_end (validation), checkpoint_start/_end,
        sync_start/sync_end, event(kind, **fields), timed_event(kind, started_unix), watch_ddp(model),
        log_metrics(values, source, step) (the metrics the training logged, where the trainer reduced them)
    session.close(status, stop_reason)        # the record closes (first call wins)
    session.finish()                          # after the trainer's own teardown: the fit's end, the upload

Every call is safe: when tuneup itself fails, the session warns once, stops recording, and the training
goes on; calls on a session that is not recording return at once. The per-micro-batch calls do nothing
but take marks and add up numbers: records are built and written on the drainer's thread.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from tuneup._log import info_once, warn_once
from tuneup.collect.comm import CommProbe
from tuneup.collect.drainer import Drainer
from tuneup.collect.environment import redact_value
from tuneup.collect.flops import MicroBatchFlopCounter
from tuneup.collect.step_clock import StepClock
from tuneup.record.remote import Mirror, bounded, is_url, spool_dir
from tuneup.record.schema import (
    MANIFEST_FILE,
    METRIC_SOURCES,
    STOP_USER_INTERRUPT,
    MetricRecord,
    RecordedStep,
    rank_dir_name,
)
from tuneup.record.segments import elastic_identity, existing_manifest, next_segment_index, segment_dir
from tuneup.record.writer import RankWriter, RecordingPolicy, write_manifest
from tuneup.recording import device as dev
from tuneup.recording.facts import TrainingFacts
from tuneup.recording.handoff import RunDirHandoff
from tuneup.recording.headline import HeadlineMetrics, Metrics
from tuneup.recording.logged_metrics import LoggedMetrics
from tuneup.recording.manifest import build_manifest
from tuneup.recording.memory_kinds import memory_by_kind
from tuneup.recording.mirror import start_mirror
from tuneup.recording.noise import NoiseScaleSteps, choose_method
from tuneup.recording.policies import (
    KEYWORD_POLICY,
    POLICY_ARGUMENTS,
    PricingPolicy,
    ProfilingPolicy,
    policies_from_keywords,
)
from tuneup.recording.ranks import Ranks, gather_hosts
from tuneup.recording.run_dir import (
    MARKER_TIMEOUT_S,
    RunPlace,
    choose_run_dir,
    mark_run_dir,
    print_closing_line,
    segment_root,
    unmark_run_dir,
    warn_if_not_shared,
)
from tuneup.recording.telemetry import start_sampler
from tuneup.tags import TagError, run_tags
from tuneup.target import Target, TargetError, parse_target

# torch.cuda.max_memory_allocated builds the allocator's whole statistics dict (tens of microseconds):
# read it every this many steps. The peak is never reset, so carrying it forward loses nothing but lag.
PEAK_MEMORY_EVERY_STEPS = 10

# The statuses a record closes with (the rank's info.json): how it closed, not why the training stopped.
STATUSES = ("completed", "exception", "interrupted", "teardown", "tuneup_error")

# DDP's own sampled averages (private API), kept as a cross-check of the hook timings.
_DDP_LOGGING_KEYS = (
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


def _is_ddp(model: Any) -> bool:
    return hasattr(model, "register_comm_hook")


def _process_start() -> dict[str, float]:
    """When this process started (imports, data preparation and launching come before the fit)."""
    try:
        import psutil

        return {"process_start_unix": float(psutil.Process().create_time())}
    except Exception:
        return {}


class RecordingSession:
    """One run's record on this rank, driven by a trainer adapter (see the module's docstring).

    Args:
        dirpath: the run directory (a path or an ``s3://``, ``gs://``... URL). Default: ``$TUNEUP_DIR`` where
            set, else ``<default_root>/tuneup/<run id>``. A directory that already holds a run is never
            overwritten: ``-1``, ``-2``... is appended.
        recording, profiling, pricing: the policies (tuneup.recording.policies); defaults where None.
        owner: the name errors and warnings give the user (``"TuneupCallback"``).
        target: the run's quality target on a metric the training logs (``"val_acc>=0.9"``, or a
            `tuneup.target.Target`): recorded in the manifest (``recording.target``, the default target of
            ``tuneup report``), and when a recorded value first meets it, rank 0 says so in one line and
            each rank records a ``target_reached`` event (metric, value, step, elapsed_s). Checked now: a
            target that cannot be read raises ValueError.
        tags: the run's tags (``{"project": "vision", "user": "ana"}``), over ``$TUNEUP_TAGS``'s
            (``project=vision,user=ana``): kept in the manifest, grouped by in the fleet index and dashboard.
            Checked now: a tag that cannot be kept raises ValueError.
        keywords: the policies' fields by their own names instead (``flush_every_steps=``, ``timing=``,
            ``instance=``...: TuneupCallback's keywords), for a policy not given whole; a keyword of a
            policy that is given too raises ValueError, naming both.

    The price choice is checked now (an unknown instance raises), before any training starts.
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        *,
        recording: RecordingPolicy | None = None,
        profiling: ProfilingPolicy | None = None,
        pricing: PricingPolicy | None = None,
        owner: str = "RecordingSession",
        target: Target | str | None = None,
        tags: Mapping[str, Any] | None = None,
        **keywords: Any,
    ) -> None:
        if dirpath is not None and not isinstance(dirpath, (str, os.PathLike)):
            raise TypeError(f"{owner}(dirpath=...) must be a path or None, got {type(dirpath).__name__}")
        self.target = _checked_target(owner, target)
        try:
            self.tags = run_tags(tags)
        except TagError as exc:
            raise ValueError(f"{owner}(tags=...): {exc}") from None
        given = {RecordingPolicy: recording, ProfilingPolicy: profiling, PricingPolicy: pricing}
        for cls, policy in given.items():
            if policy is not None and not isinstance(policy, cls):
                argument = POLICY_ARGUMENTS[cls]
                raise TypeError(f"{owner}({argument}=...) must be a {cls.__name__}, got {policy!r}")
        if keywords:  # TuneupCallback's flat names (policies_from_keywords), for a policy not given whole
            twice = sorted(k for k in keywords if given.get(KEYWORD_POLICY.get(k, object)) is not None)
            if twice:
                # Which of the two was meant cannot be told: name both.
                names = ", ".join(f"{k}=" for k in twice)
                classes = dict.fromkeys(KEYWORD_POLICY[k] for k in twice)
                policies = " and ".join(f"{POLICY_ARGUMENTS[c]}={c.__name__}(...)" for c in classes)
                raise ValueError(
                    f"{owner}: {names} given both as a keyword and in {policies}: give each option once, "
                    "as a keyword or in its policy"
                )
            options = policies_from_keywords(owner, **keywords)
            recording = recording or options.recording
            profiling = profiling or options.profiling
            pricing = pricing or options.pricing
        # As given: a URL made into a Path loses a slash ("s3:/bucket").
        self.dirpath = os.fspath(dirpath) if dirpath is not None else None
        self.recording = recording or RecordingPolicy()
        self.profiling = profiling or ProfilingPolicy()
        self.pricing = pricing or PricingPolicy()
        self.owner = owner
        self.price = self.pricing.choice(where=owner)
        # In the process that launched spawned workers, the run directory rank 0's worker left here.
        self._handoff = RunDirHandoff()
        self._run_dir: Path | None = None
        self.run_id: str | None = None
        self.disabled = False
        self._new_run()

    def _new_run(self) -> None:
        """Everything of one run: a second fit with the same adapter records a new run."""
        self._writer: RankWriter | None = None
        self.clock: StepClock | None = None
        self.comm: CommProbe | None = None
        self._sampler: Any = None
        self._drainer: Drainer | None = None
        self._metrics: LoggedMetrics | None = None
        # This rank's samples trained in the steps closed so far (the step clock's counts summed); None
        # where a step's were not counted, or where the record did not start at step 0 (a resumed fit).
        self._samples_done: int | None = None
        self._mirror: Mirror | None = None
        self._url: str | None = None  # the run directory, where it is on object storage
        self._profiler: Any = None
        self._noise: NoiseScaleSteps | None = None
        self._flops = MicroBatchFlopCounter()
        self._flops_batch: tuple[int | None, int | None, int] | None = None  # samples, tokens, step
        self._flops_done = False
        self._count_flops = self.profiling.counts_flops
        self._headline: HeadlineMetrics | None = None
        # Headline figures due for the trainer's loggers: a deque, so that checking it costs no call.
        self.headline_queue: deque[Metrics] = deque()
        self._remove_marks: Callable[[], None] | None = None
        self._facts = TrainingFacts()
        self._ranks: Ranks | None = None
        self._closed = False
        self._segment: dict[str, Any] | None = None  # None: the run's first segment
        self._pending_events: list[tuple[str, dict[str, Any]]] = []  # before the record is open
        self._saving_since: float | None = None
        self.hosts: list[str] | None = None
        self.rank = 0
        self.world_size = 1
        self.steps_done = 0  # training steps completed: the next step's id
        self.optimizer_steps = 0  # the trainer's optimizer steps seen at the last step's end
        self.epoch = 0
        self._on_cuda = False
        self._device: Any = None
        self._peak_mem_bytes: int | None = None
        # Memory by kind: read once, at this step (-1: the step after the first optimizer step seen).
        self._memory_step: int | None = -1
        self._optimizers_seen: dict[int, Any] = {}
        # Unix times of the fit's stages on this rank, for the job timeline (written to info.json).
        self.fit_times: dict[str, float] = {}

    # -- where the run goes ------------------------------------------------------------------------

    @property
    def run_dir(self) -> Path | None:
        """The run directory (a local spool for a run on object storage); also in the process that
        launched the workers that trained."""
        if self._run_dir is None:
            self._run_dir = self._handoff.take()
        return self._run_dir

    @run_dir.setter
    def run_dir(self, value: Path | None) -> None:
        self._run_dir = value

    @property
    def url(self) -> str | None:
        """The run's URL where it is recorded to object storage, else None."""
        return self._url

    @property
    def mirror(self) -> Mirror | None:
        return self._mirror

    @property
    def closed(self) -> bool:
        """The record was closed (`close`)."""
        return self._closed

    @property
    def is_open(self) -> bool:
        """Prepared (or started) and not closed yet."""
        return self._writer is not None and not self._closed

    def prepare(
        self,
        ranks: Ranks,
        default_root: str | os.PathLike[str],
        *,
        dirpath: Callable[[str | None], str | None] | None = None,
        share: Callable[[], Any] | None = None,
        on_cuda: bool = False,
        sharded: bool = False,
    ) -> Any:
        """On every rank, once the process group is up and before the model is wrapped (a DDP model takes
        one comm hook, registered when it is wrapped): rank 0 chooses and marks the run directory, and one
        broadcast tells the others. Returns what rank 0's `share()` returned (it travels in the same
        broadcast: e.g. a tuning trial's settings, one decision for every rank).

        `dirpath(given)`: rank 0's directory over the session's own (a tuning trial's), or None to keep it.
        `on_cuda`: the model trains on a GPU; `sharded`: FSDP, whose every collective in a step is the
        training's. Fails (disabling the session) where no run directory can be chosen."""
        try:
            return self._prepare(ranks, default_root, dirpath, share, on_cuda, sharded)
        except Exception as exc:
            self.fail("prepare", exc)
            return None

    def _prepare(
        self,
        ranks: Ranks,
        default_root: str | os.PathLike[str],
        dirpath: Callable[[str | None], str | None] | None,
        share: Callable[[], Any] | None,
        on_cuda: bool,
        sharded: bool,
    ) -> Any:
        if self._closed:
            self._new_run()
        # The fit as this rank sees it starts here: after the process group is up and data is prepared.
        self.fit_times = {"fit_start_unix": time.time(), **_process_start()}
        self._ranks = ranks
        self.rank, self.world_size = int(ranks.rank), int(ranks.world_size)
        place: RunPlace | None = None
        shared: Any = None
        if self.rank == 0:
            # Whatever happens here, rank 0 must reach the broadcast below: the other ranks wait in it.
            try:
                named = (dirpath(self.dirpath) if dirpath is not None else None) or self.dirpath
                place = choose_run_dir(named, os.fspath(default_root))
            except Exception as exc:
                warn_once("run-dir", f"cannot choose a run directory ({type(exc).__name__}: {exc})")
            shared = share() if share is not None else None
            if place is not None:
                mark_run_dir(place.location, place.run_id)
        if self.world_size > 1:
            # One collective at setup, as Lightning's own loggers do; none per step.
            place, shared = ranks.broadcast((place, shared))
            self.hosts = gather_hosts(self.world_size)
        if place is None:
            self._disable("no run directory could be chosen")
            return shared
        if self.rank != 0:
            not_shared = warn_if_not_shared(place.location, self.rank, self.hosts)
            if not_shared is not None:
                self.event("run_dir_not_shared", **not_shared)
        self.run_id, self._segment = place.run_id, place.segment
        self._url = place.location if is_url(place.location) else None
        # A run on object storage is written to a local spool and uploaded from there (record/remote.py).
        self.run_dir = spool_dir(self.run_id) if self._url else Path(place.location)
        if self.rank == 0:
            self._handoff.publish(self.run_dir)
        self._writer = RankWriter(self.run_dir, self.rank, self.recording)
        if self.world_size > 1 and self.profiling.profile_communication:
            # Now, before the model is wrapped: a DDP model takes one hook only.
            self.comm = CommProbe(on_cuda=on_cuda, world_size=self.world_size)
            self.comm.record_all = sharded
            self.comm.noise_scale = self.profiling.noise_scale and not sharded
            self.comm.install()
        return shared

    # -- resuming from a checkpoint: the next segment of the same run ---------------------------------

    def resume_state(self) -> dict[str, Any]:
        """To save in the trainer's checkpoints, so that a fit resumed from one continues this run."""
        if self.run_dir is None or self.run_id is None:
            return {}
        index = int((self._segment or {}).get("index", 0))
        return {"run_root": str(segment_root(self.run_dir, index)), "run_id": self.run_id, "segment": index}

    def _continue_resumed_run(self, state: dict[str, Any] | None) -> None:
        """Move this fit's record into the next segment of the run its checkpoint came from."""
        if state is None or self.run_dir is None or self._url is not None:
            return  # a run on object storage records a resumed fit as a new run
        root = Path(state["run_root"])
        here = segment_root(self.run_dir, int((self._segment or {}).get("index", 0)))
        if here == root:
            return  # a torchrun restart already continued that run
        where: tuple[str, dict[str, Any]] | None = None
        if self.rank == 0 and existing_manifest(root) is not None and os.access(root, os.W_OK):
            index = next_segment_index(root)
            where = (str(segment_dir(root, index)), {"index": index, "reason": "resume"})
        if self.world_size > 1 and self._ranks is not None:
            where = self._ranks.broadcast(where)  # once, at the start of the fit
        if where is None:
            warn_once(
                "resume-elsewhere",
                f"resumed from a checkpoint of run {state.get('run_id')} at {root}, which is not here or not "
                f"writable: recording as a new run in {self.run_dir}",
            )
            return
        if self.rank == 0:
            unmark_run_dir(self.run_dir)  # the directory setup chose holds nothing else: no stray run
        self.run_dir, self.run_id = Path(where[0]), str(state.get("run_id"))
        if self.rank == 0:
            self._handoff.publish(self.run_dir)
        self._segment = {**where[1], "restart_count": elastic_identity()[1]}
        self._writer = RankWriter(self.run_dir, self.rank, self.recording)

    # -- the start ---------------------------------------------------------------------------------

    def start(self, facts: TrainingFacts, resumed_from: dict[str, Any] | None = None) -> None:
        """The training loop is about to start: open the record (rank 0 writes the manifest), start the
        sampler, the mirror and the drainer, wire the comm hook, and start the clock. `resumed_from`: the
        `resume_state()` a checkpoint held, to continue that run as its next segment."""
        if self._writer is None or self.disabled:
            return
        try:
            self._start(facts, resumed_from)
        except Exception as exc:
            self.fail("start", exc)

    def _start(self, facts: TrainingFacts, resumed_from: dict[str, Any] | None) -> None:
        self._facts = facts
        self._device = facts.device
        self._on_cuda = dev.on_cuda(facts.device)
        self.optimizer_steps = facts.optimizer_steps_done
        self.epoch = facts.epoch
        self.steps_done = facts.steps_done
        started = time.time()
        self._continue_resumed_run(resumed_from)
        writer = self._writer
        assert writer is not None
        timer = dev.make_timer(self.profiling.timing, self._device, self.owner)
        max_pending = self.recording.flush_every_steps + self.profiling.max_lag_steps
        self.clock = StepClock(timer, self._on_step_resolved, max_pending=max_pending)
        if self.comm is not None:
            self.comm.phase_now = self.clock.phase_now  # FSDP's waits, given to the phase they held up
        # The training loop starts when this is done (set at its end): tuneup's own start-up (the manifest,
        # the environment's capture, the sampler) is part of the setup, and said so. Until then, for a
        # record that is never closed, the loop starts here.
        self.fit_times["train_start_unix"] = started
        writer.open(self._rank_info(facts, timer.kind))
        for kind, fields in self._pending_events:
            writer.add_event(kind, **fields)
        self._pending_events = []
        self._metrics = LoggedMetrics(writer.add_metric, self.target, self._target_reached)
        self._samples_done = 0 if self.steps_done == 0 else None
        if self.rank == 0:
            self._write_manifest(facts, timer.kind)
        if self._url is not None and self.run_dir is not None:
            self._mirror = start_mirror(
                self.run_dir, self._url, self.rank, writer, self.recording.flush_every_s
            )
        if facts.log_every_steps and self.rank == 0:
            self._headline = HeadlineMetrics(facts.log_every_steps, self.world_size)
            self.headline_queue = self._headline.queue
        self._sampler = start_sampler(
            writer, facts.local_rank, self.profiling.telemetry_interval_s, self._headline
        )
        comm = self.comm
        if comm is not None and not (comm.record_all or comm.hook_registered) and _is_ddp(facts.ddp_model):
            comm.register_default_hook(facts.ddp_model)
        self._record_sync_events()
        self._start_noise_scale(facts)
        if self._count_flops and facts.compiled:
            # A dispatch mode around a compiled module can make it recompile or fail inside the user's
            # step, where tuneup cannot catch it for them: do not risk the training.
            self._count_flops = False
            info_once(
                "flops-compiled", "FLOPs are not counted for a torch.compile'd model; pass flops_per_sample="
            )
        clock = self.clock
        self._drainer = Drainer(
            lambda pause: self._drain(clock, pause),
            interval_s=self.recording.flush_every_s,
            on_error=self._drainer_failed,
            thread_init=dev.cuda_thread_init(self._device),
        )
        self._drainer.start()
        if facts.install_marks is not None:
            self._remove_marks = facts.install_marks()
        if self.profiling.profile_steps and self.run_dir is not None:
            from tuneup.collect.profiler import StepProfiler

            self._profiler = StepProfiler(
                self.run_dir / rank_dir_name(self.rank),
                steps=self.profiling.profile_steps,
                start_step=self.steps_done + self.profiling.profile_start_step,
                rank=self.rank,
            )
            clock.listener = self._profiler.phase
        if not facts.gap_is_data:
            clock.fetch_marks_seen = True  # the gap between marks is "other" from the first step on
        self.restart()
        done = time.time()
        self.fit_times["tuneup_start_s"] = done - started
        self.fit_times["train_start_unix"] = done

    def _rank_info(self, facts: TrainingFacts, timing: str) -> dict[str, Any]:
        timed = list(facts.phases_timed)
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "local_rank": facts.local_rank,
            "node_rank": facts.node_rank,
            "world_size": self.world_size,
            "device": str(self._device) if self._device is not None else None,
            "device_bus_id": dev.cuda_bus_id(self._device),
            "timing": timing,
            "start_unix": round(time.time(), 3),
            # tuneup's step ids count training steps (batches that stepped); a trainer's optimizer steps
            # count every optimizer's steps, which differs under manual optimization with several.
            "global_step_at_start": self.steps_done,
            "optimizer_steps_at_start": self.optimizer_steps,
            **({"adapter": facts.trainer_name} if facts.trainer_name else {}),
            # Only where the adapter cannot see every phase: the others read as not timed, never as zero.
            **({"phases_timed": timed} if set(timed) != set(_ALL_TIMED) else {}),
            **{k: round(v, 3) for k, v in self.fit_times.items()},
        }

    def _write_manifest(self, facts: TrainingFacts, timing: str) -> None:
        manifest = build_manifest(
            run_id=self.run_id,
            segment=self._segment,
            steps_done=self.steps_done,
            checkpoint=facts.checkpoint,
            world_size=self.world_size,
            num_nodes=facts.num_nodes,
            ranks_per_node=facts.ranks_per_node,
            hosts=self.hosts,
            trainer=facts.trainer,
            dataloader=facts.dataloader,
            model=facts.model,
            price=self.price,
            electricity_usd_per_kwh=self.pricing.electricity_usd_per_kwh,
            profiling=self.profiling,
            count_flops=self._count_flops,
            recording=self.recording,
            timing=timing,
            tune_trial=facts.tune_trial,
        )
        if self.target is not None:
            manifest["recording"]["target"] = str(self.target)  # the default target of `tuneup report`
        manifest["tags"] = dict(self.tags)
        try:
            write_manifest(self.run_dir, manifest)  # type: ignore[arg-type]
        except OSError as exc:
            warn_once("manifest", f"cannot write {self.run_dir}/{MANIFEST_FILE} ({exc.strerror or exc})")

    def _start_noise_scale(self, facts: TrainingFacts) -> None:
        if self._noise is not None:
            self._noise.close()
        self._noise = None
        if not self.profiling.noise_scale:
            if self.comm is not None:
                self.comm.noise_scale = False
            return
        accumulation = facts.accumulation() if facts.accumulation is not None else None
        method, why_not = choose_method(
            automatic_optimization=facts.automatic_optimization,
            world_size=self.world_size,
            comm=self.comm,
            accumulation=accumulation,
            parameters=facts.parameters,
        )
        if method is None:
            if self.rank == 0:
                info_once(
                    "noise-scale-off", f"the gradient noise scale is not measured in this run: {why_not}"
                )
            if self.comm is not None:
                self.comm.noise_scale = False
            return
        self.event("noise_scale", method=method, comm_hook=self.comm.hook_name if self.comm else None)
        self._noise = NoiseScaleSteps(
            method,
            self.profiling.noise_scale_every,
            on_cuda=self._on_cuda,
            comm=self.comm,
            recording=self.recording,
            world_size=self.world_size,
            parameters=facts.parameters,
            accumulation=facts.accumulation,
            loss_scale=facts.loss_scale,
        )

    def watch_ddp(self, ddp_model: Any) -> None:
        """A DistributedDataParallel model the adapter meets only after `start` (a trainer that wraps the
        model inside its loop): its all-reduces are timed with the session's default hook, before its first
        backward, where no hook was registered, and the noise scale is measured through it."""
        comm = self.comm
        if comm is None or comm.record_all or comm.hook_registered or self.disabled or self._closed:
            return
        try:
            self._facts.ddp_model = ddp_model
            comm.register_default_hook(ddp_model)
            if self._noise is None:
                self._start_noise_scale(self._facts)
        except Exception as exc:
            self.fail("watch_ddp", exc)

    # -- between steps -----------------------------------------------------------------------------

    def restart(self) -> None:
        """Time before this point belongs to no step: nor do collectives issued in it (setup, validation)."""
        if self.clock is not None:
            self.clock.restart()
        if self.comm is not None:
            self.comm.take()

    def epoch_start(self, epoch: int) -> None:
        """A training epoch starts: the steps' epoch, and the time before it belongs to no step."""
        if self.clock is None or self.disabled:
            return
        self.epoch = int(epoch)
        try:
            self.restart()
        except Exception as exc:
            self.fail("epoch_start", exc)

    def exclude_start(self) -> float:
        """Time from now until `exclude_end` belongs to no training step (validation between batches).
        Returns the unix time it started, for `exclude_end`."""
        started = time.time()
        if self.clock is not None and not self.disabled:
            self.clock.exclude_start()
        return started

    def exclude_end(self, kind: str | None = None, started_unix: float | None = None, **fields: Any) -> None:
        """The excluded interval ends; `kind`: its event for the job timeline, from `started_unix` (what
        `exclude_start` returned) to now; None: no event."""
        if self.clock is None or self.disabled:
            return
        self.clock.exclude_end()
        if self.comm is not None:
            self.comm.take()  # collectives of the validation's forward passes are no step's
        if kind is not None and started_unix is not None:
            self.timed_event(kind, started_unix, **fields)

    def checkpoint_start(self) -> None:
        """The trainer starts saving a checkpoint: the save belongs to no step (a save within a save is one)."""
        if self._saving_since is None and not self.disabled:
            self._saving_since = time.time()
            if self.clock is not None:
                self.clock.exclude_start()

    def checkpoint_end(self) -> None:
        started, self._saving_since = self._saving_since, None
        if started is None or self.disabled:
            return
        if self.clock is not None:
            self.clock.exclude_end()
        self.timed_event("checkpoint", started, step=self.steps_done)

    def checkpoint_seen(self) -> None:
        """A checkpoint is being saved (the trainer's hook); its duration is known only between
        `checkpoint_start` and `checkpoint_end`."""
        if self.disabled:
            return
        if self.clock is not None:
            self.clock.checkpoint = True
        if self._saving_since is None:
            # Saved by a path that bypasses the timed save: seen, but its duration is unknown.
            self.event("checkpoint", step=self.steps_done, t_start=round(time.time(), 3))

    def sync_start(self) -> None:
        """The trainer enters one of its own collectives between batches (a barrier, a broadcast)."""
        if self.clock is not None:
            self.clock.sync_start()

    def sync_end(self) -> None:
        if self.clock is not None:
            self.clock.sync_end()

    def fetch_start(self) -> None:
        """The trainer starts fetching a batch (or copying it to the device): the step's data time."""
        if self.clock is not None:
            self.clock.fetch_start()

    def fetch_end(self) -> None:
        if self.clock is not None:
            self.clock.fetch_end()

    def event(self, kind: str, **fields: Any) -> None:
        """An event in this rank's record now, or when the record opens (`start`) if it is not open yet."""
        if self._writer is not None and self.clock is not None and not self._closed:
            self._writer.add_event(kind, **fields)
        elif not self._closed:
            self._pending_events.append((kind, fields))

    def timed_event(self, kind: str, started_unix: float, **fields: Any) -> None:
        """An event that began at `started_unix` and ends now: its start and duration, for the timeline."""
        duration_ms = (time.time() - started_unix) * 1000.0
        self.event(kind, t_start=round(started_unix, 3), duration_ms=round(duration_ms, 3), **fields)

    # -- the metrics the training logged ---------------------------------------------------------------

    def log_metrics(
        self,
        values: Mapping[str, Any],
        source: str = "log",
        step: int | None = None,
        epoch: int | None = None,
    ) -> None:
        """Record the metrics the training logged (name -> a number or a scalar tensor, on any device), as
        the trainer reduced them: `source` is where they were read ("validation": a validation's end;
        "train": the trainer's logging interval; "log": the adapter's own call), `step` the optimizer steps
        done (default: the training steps closed so far), `epoch` the epoch where the adapter knows it.
        Reads no device tensor's value here (tuneup.recording.logged_metrics); a value that is not one
        number is skipped. Between `start` and `close`; a no-op elsewhere."""
        if source not in METRIC_SOURCES:  # the adapter's mistake, said at once
            raise ValueError(f"unknown metric source {source!r}: one of {', '.join(METRIC_SOURCES)}")
        metrics = self._metrics
        if metrics is None or self.disabled or self._closed:
            return
        try:
            metrics.take(
                values,
                source,
                self.steps_done if step is None else int(step),
                None if epoch is None else int(epoch),
                self._samples_done,
            )
        except Exception as exc:
            # The metrics are an addition to the record: their failure leaves the rest of it recording.
            warn_once("log-metrics", f"cannot record the logged metrics ({type(exc).__name__}: {exc})")

    def _drain(self, clock: StepClock, pause: Callable[[], None]) -> None:
        """The drainer's work: the closed steps, then the metric reads whose copies have landed."""
        clock.drain(pause=pause)
        self._drain_metrics(force=False)

    def _drain_metrics(self, force: bool) -> None:
        metrics = self._metrics
        if metrics is None or not metrics.pending:
            return
        try:
            metrics.drain(force=force)
        except Exception as exc:
            self._metrics = None  # the rest of the record goes on without them
            warn_once(
                "log-metrics-drain",
                f"reading the logged metrics failed ({type(exc).__name__}: {exc}); tuneup stops recording "
                "them, the rest of the record goes on",
            )

    def _target_reached(self, record: MetricRecord) -> None:
        """The first recorded value that meets the run's target (the drainer's thread, or the closing one)."""
        started = self.fit_times.get("fit_start_unix", record.t)
        elapsed_s = max(0.0, record.t - started)
        fields = {
            "metric": record.name,
            "value": record.value,
            "step": record.step,
            "elapsed_s": round(elapsed_s, 3),
            "target": str(self.target),
            "source": record.source,
        }
        if self._writer is not None:
            self._writer.add_event("target_reached", **fields)  # the writer's streams are thread-safe
        if self.rank == 0:
            info_once(
                f"target-reached:{id(self)}:{self.run_id}",
                f"target {self.target} reached at step {record.step}: {record.name}={record.value:.6g}, "
                f"{_duration(elapsed_s)} after the fit started",
            )

    def _record_sync_events(self) -> None:
        events = self._facts.sync_events
        if events is None or self._writer is None:
            return
        for kind, fields in events():
            self._writer.add_event(kind, **fields)

    # -- per micro-batch (the hot path: marks and sums only) -----------------------------------------
    # Each call takes its mark at its entry and hands the clock its own time at its exit (`own_since`):
    # the noise scale's norms and the step's bookkeeping are tuneup's own time, the step's `tuneup_ms`.

    def resync_steps(self, steps_done: int) -> None:
        """At the fit's first batch: the trainer's count of steps done, where its loop settles it only then
        (a no-op once a step is under way)."""
        clock = self.clock
        if clock is not None and not clock.pending and not clock.micro_batches:
            self.steps_done = steps_done
            if steps_done:
                self._samples_done = None  # the trainer resumed past step 0: samples before it are unknown

    def batch_start(
        self, samples: int | None = None, tokens: int | None = None, at: float | None = None
    ) -> None:
        """A (micro-)batch starts: its forward. `at`: the adapter's own `perf_counter()` at its hook's entry,
        so that its work before this call (counting the batch) is tuneup's time, not the step's."""
        clock = self.clock
        if clock is None or self.disabled:
            return
        entered = time.perf_counter() if at is None else at
        try:
            if self._noise is not None and not clock.micro_batches:
                self._noise.step_starts(self.steps_done)
            if self._profiler is not None:
                self._profiler.batch_start(self.steps_done)
            clock.batch_start(samples, tokens, at=entered)
            if self._count_flops and not self._flops_done:
                self._flops_done = True  # once, even if counting fails
                self._flops_batch = (samples, tokens, self.steps_done)
                self._flops.start()
            clock.own_since(entered)
        except Exception as exc:
            self.fail("batch_start", exc)

    def before_backward(self) -> None:
        clock = self.clock
        if clock is not None and not self.disabled:
            try:
                clock.before_backward()  # nothing of tuneup's own after it: the mark is the call's cost
            except Exception as exc:
                self.fail("before_backward", exc)

    def after_backward(self) -> None:
        clock = self.clock
        if clock is None or self.disabled:
            return
        try:
            noise = self._noise
            if noise is not None and noise.taken:
                if clock.micro_batches == 1 and noise.method == "accumulation":
                    entered = time.perf_counter()
                    clock.after_backward(at=entered)
                    noise.after_first_micro_batch(clock)
                    clock.own_since(entered)
                    return
                clock.add_own(noise.backward_own_s())  # the DDP hook's or FSDP2's norms in this backward
            clock.after_backward()
        except Exception as exc:
            self.fail("after_backward", exc)

    def before_optimizer(self, optimizer: Any = None) -> None:
        """Before an optimizer step (after any gradient clipping or unscaling the trainer does first)."""
        clock = self.clock
        if clock is None or self.disabled:
            return
        try:
            entered = time.perf_counter()
            clock.before_optimizer(at=entered)
            if self.profiling.grad_norm and self._facts.parameters is not None:
                clock.grad_norm = dev.total_grad_norm(self._facts.parameters())
            if self._noise is not None and self._noise.taken:
                self._noise.before_optimizer(clock, optimizer)
            if self._memory_step is not None:
                self._memory_by_kind(optimizer)
            clock.own_since(entered)
        except Exception as exc:
            self.fail("before_optimizer", exc)

    def _memory_by_kind(self, optimizer: Any) -> None:
        """Once, at the second step's first optimizer: memory by kind (tuneup/recording/memory_kinds.py),
        with every optimizer the first step stepped (a GAN's two), whose state exists by then."""
        step = self.steps_done
        if self._memory_step is None or self._facts.parameters is None or self._writer is None:
            self._memory_step = None
            return
        if self._memory_step < 0:
            self._memory_step = step + 1  # this is the first step: read at the next one
        if optimizer is not None:
            raw = getattr(optimizer, "_optimizer", optimizer)  # Lightning's LightningOptimizer wraps it
            self._optimizers_seen.setdefault(id(raw), raw)
        if step < self._memory_step:
            return
        self._memory_step = None
        try:
            kinds = memory_by_kind(self._facts.parameters(), self._optimizers_seen.values(), self._device)
            self._writer.add_event("memory_kinds", step=step, **kinds)
        except Exception as exc:  # never the training's problem: the run just has no memory by kind
            warn_once("memory-kinds", f"cannot read memory by kind ({exc}); the report leaves it out")
        self._optimizers_seen.clear()

    def idle(self, at: float | None = None) -> None:
        """The marked phase ended: what follows, up to the next mark, is no marked phase ("other"; "data"
        where the adapter does not mark fetches and `TrainingFacts.gap_is_data`). For an adapter whose
        phases have explicit ends (a plain loop's `with run.phase(...)`)."""
        clock = self.clock
        if clock is not None and not self.disabled:
            try:
                clock.batch_end(at=at)  # into the gap between batches, without ending the micro-batch's count
            except Exception as exc:
                self.fail("idle", exc)

    def after_optimizer(self) -> None:
        """An optimizer step ended (torch's step post-hook)."""
        clock = self.clock
        if clock is not None and not self.disabled:
            try:
                clock.after_optimizer()
            except Exception as exc:
                self.fail("after_optimizer", exc)

    def batch_end(
        self, loss: Any = None, optimizer_steps: int | None = None, at: float | None = None
    ) -> None:
        """A (micro-)batch ended, with its loss (a tensor, never read here). `optimizer_steps`: the trainer's
        count of optimizer steps so far; the training step closes when it moved since the last step closed
        (a GAN's batch moves it by two and is one step; a micro-batch that only accumulates leaves it).
        None: the step goes on until `end_step`."""
        entered = time.perf_counter() if at is None else at
        clock = self.clock
        if clock is None or self.disabled:
            return
        try:
            if self._flops_batch is not None:  # the first micro-batch: its FLOPs were being counted
                self._record_flops()
            if loss is not None and hasattr(loss, "detach"):
                # An automatic trainer hands over a detached copy; a manual step may return the loss with
                # its graph, which must not be kept alive until the step is resolved.
                clock.batch_end(loss if self._facts.automatic_optimization else loss.detach(), at=entered)
            else:
                clock.batch_end(at=entered)
            if optimizer_steps is not None and optimizer_steps != self.optimizer_steps:
                self._close_step(clock, optimizer_steps)
            elif self._profiler is not None:
                self._profiler.batch_end()
            # The step's bookkeeping (closing it, the noise scale's sampling, waking the writer) is in the
            # gap before the next batch: the next step's own time.
            clock.own_since(entered)
        except Exception as exc:
            self.fail("batch_end", exc)

    def end_step(self, epoch: int | None = None) -> None:
        """The training step ends now, after its last micro-batch's `batch_end` (for an adapter that learns
        of the step's end apart from the batch's). `epoch`: the step's epoch, where it changed."""
        entered = time.perf_counter()
        clock = self.clock
        if clock is None or self.disabled:
            return
        try:
            if epoch is not None:
                self.epoch = int(epoch)
            self._close_step(clock, self.optimizer_steps + 1)
            clock.own_since(entered)
        except Exception as exc:
            self.fail("end_step", exc)

    def _close_step(self, clock: StepClock, optimizer_steps: int) -> None:
        self.optimizer_steps = optimizer_steps
        if clock.loss is not None and not self._facts.automatic_optimization and clock.micro_batches > 1:
            # Only an automatic trainer divides each micro-batch loss by the accumulation count.
            clock.loss = clock.loss / clock.micro_batches
        step = self.steps_done
        self.steps_done += 1
        if self._samples_done is not None:
            samples = clock.samples
            self._samples_done = None if samples is None else self._samples_done + samples
        if self._on_cuda and (step % PEAK_MEMORY_EVERY_STEPS == 0 or self._peak_mem_bytes is None):
            self._peak_mem_bytes = dev.peak_memory_bytes(self._device)
        clock.close_step(
            step,
            self.epoch,
            peak_mem_bytes=self._peak_mem_bytes,
            comm=self.comm.take() if self.comm is not None else None,
        )
        if self._noise is not None:
            self._noise.step_ends()
        if self._facts.sync_events is not None:
            self._record_sync_events()
        if self._profiler is not None:
            self._profiler.step_end(step)
        # Records are built and written on the drainer's thread (which also wakes every flush_every_s).
        pending = clock.pending
        flush_every = self.recording.flush_every_steps
        if pending >= flush_every and self._drainer is not None:
            self._drainer.wake()
            if pending >= 2 * flush_every:
                # The writer thread let a whole interval pass unwritten: write here rather than let a kill
                # lose more than about two intervals.
                self._drainer.run_now()

    def _record_flops(self) -> None:
        flops = self._flops.stop()
        samples, tokens, step = self._flops_batch or (None, None, None)
        self._flops_batch = None
        if flops and self._writer is not None:
            self._writer.add_event("flops", flops=flops, samples=samples, tokens=tokens, step=step)

    _MARKS: ClassVar[dict[str, str]] = {
        "batch_start": "batch_start",
        "forward": "batch_start",
        "backward": "before_backward",
        "after_backward": "after_backward",
        "optimizer": "before_optimizer",
        "after_optimizer": "after_optimizer",
        "idle": "idle",
        "batch_end": "batch_end",
        "end_step": "end_step",
        "data": "fetch_start",
        "data_end": "fetch_end",
        "sync": "sync_start",
        "sync_end": "sync_end",
    }

    def mark(self, phase: str) -> None:
        """The same marks by name, for an adapter that forwards its trainer's events by name: ``"forward"``
        (a micro-batch starts), ``"backward"``, ``"after_backward"``, ``"optimizer"``, ``"after_optimizer"``,
        ``"idle"``, ``"batch_end"`` (the micro-batch ends), ``"end_step"``, ``"data"`` / ``"data_end"``,
        ``"sync"`` / ``"sync_end"``. A per-micro-batch adapter calls the methods themselves (one call less)."""
        try:
            name = self._MARKS[phase]
        except KeyError:
            raise ValueError(f"unknown mark {phase!r}: one of {', '.join(self._MARKS)}") from None
        getattr(self, name)()

    # -- resolved steps (the drainer's thread) -------------------------------------------------------

    def _on_step_resolved(self, record: RecordedStep) -> None:
        if self._writer is not None:
            self._writer.add_step(record)
        if self._headline is not None:
            self._headline.add(record)

    def take_headline_metrics(self) -> list[Metrics]:
        """The headline figures due since the last call, (step, {name: value}) each, for the trainer's
        loggers (call on the training thread, where `headline_queue` is not empty; rank 0 only has any;
        `TrainingFacts.log_every_steps`)."""
        queue, taken = self.headline_queue, []
        while queue:
            taken.append(queue.popleft())
        return taken

    # -- failure -----------------------------------------------------------------------------------

    def fail(self, where: str, exc: BaseException) -> None:
        """tuneup's own failure in `where`: warn once, stop recording, close the record; training goes on."""
        if not self.disabled:
            self._disable(f"{where} failed with {type(exc).__name__}: {exc}")

    def _disable(self, reason: str) -> None:
        self.disabled = True
        warn_once(f"disabled:{id(self)}", f"{reason}; tuneup stops recording, training goes on")
        with contextlib.suppress(Exception):
            self.close("tuneup_error")

    def _drainer_failed(self, exc: BaseException) -> None:
        # Runs on the drainer's thread: stop recording, but leave closing the record to the training
        # thread's next call (joining this thread from itself would deadlock).
        self.disabled = True
        warn_once(
            f"disabled:{id(self)}",
            f"writing step records failed with {type(exc).__name__}: {exc}; tuneup stops recording, training goes on",
        )

    # -- the end -----------------------------------------------------------------------------------

    def train_end(self) -> None:
        """The training loop ended (before `close`): the job timeline's end of training."""
        self.fit_times["train_end_unix"] = time.time()

    def exception(self, exc: BaseException) -> None:
        """The training raised `exc`: recorded (redacted, cut) before the adapter closes the record."""
        if self._writer is not None and not self._closed:
            # Redacted before it is cut, so that a cut cannot split a secret past the redaction.
            self._writer.add_event(
                "exception", type=type(exc).__name__, message=redact_value("", str(exc))[:500]
            )

    def close(self, status: str, stop_reason: str | None = None, **info: Any) -> None:
        """Close the record (the first call wins): the last steps written, the sampler, the probe and the
        profiler stopped, the rank's info closed with `status` (one of STATUSES), `stop_reason` (why the
        training stopped: the adapter's reading, or None where it cannot tell) and `info`'s fields."""
        if self._closed or self._writer is None:
            return
        self._closed = True
        writer = self._writer
        self._flops.stop()  # a micro-batch that raised while being counted: leave the dispatch mode
        remove_marks, self._remove_marks = self._remove_marks, None
        if remove_marks is not None:
            remove_marks()
        if self._profiler is not None:
            self._profiler.close()
            self._profiler = None
        try:
            if self._drainer is not None:
                self._drainer.stop()
            if self.clock is not None and not self.disabled:
                self.clock.drain(force=True)
            if not self.disabled:
                self._drain_metrics(force=True)
        finally:
            self._close_record(writer, status, stop_reason, info)

    def _close_record(
        self, writer: RankWriter, status: str, stop_reason: str | None, info: dict[str, Any]
    ) -> None:
        summary_of = self._facts.sync_summary
        if summary_of is not None:
            with contextlib.suppress(Exception):
                self._record_sync_events()
                summary = summary_of()
                if summary:
                    writer.add_event("sync_summary", **summary)
        if self._noise is not None:
            self._noise.close()  # FSDP2's seam out of torch, even if the event below fails
            # Which steps took the norms, and what they cost (the automatic choice's inputs).
            with contextlib.suppress(Exception):
                writer.add_event("noise_scale_sampling", **self._noise.sampling.summary())
        if self.comm is not None:
            self.comm.uninstall()
            self._record_ddp_logging(writer)
        if self._sampler is not None:
            self._sampler.stop()
        data_timing = "fetch" if self.clock is not None and self.clock.fetch_marks_seen else "gap"
        times = {k: round(v, 3) for k, v in self.fit_times.items()}
        writer.close(
            status=status,
            data_timing=data_timing,
            stop_reason=stop_reason,
            steps_at_end=self.steps_done,
            optimizer_steps_at_end=self.optimizer_steps,
            **times,
            **info,
        )
        if self._mirror is not None:
            self._mirror.close()  # the last upload, bounded
        if self.rank == 0 and status != "completed" and self.run_dir is not None:
            print_closing_line(self.run_dir, self._url)  # no finish() may follow an exception

    def end(self, exc: BaseException | None = None, stop_reason: str | None = None, **info: Any) -> None:
        """The whole end for a trainer whose loop just ended, once: training's end, the exception that
        ended it recorded where there was one, the record closed (completed with `stop_reason`, the
        adapter's reading or None; a KeyboardInterrupt as the user's stop; any other exception as one),
        then `finish`. For adapters whose trainer has no teardown of its own after the loop (a plain loop,
        Fabric, the Hugging Face Trainer)."""
        if self._closed or self._writer is None:
            return
        self.train_end()
        if exc is None:
            self.close("completed", stop_reason=stop_reason, **info)
        else:
            self.exception(exc)
            interrupted = isinstance(exc, KeyboardInterrupt)
            self.close(
                "interrupted" if interrupted else "exception",
                stop_reason=STOP_USER_INTERRUPT if interrupted else "exception",
                **info,
            )
        self.finish(was_closed=exc is None)

    def _record_ddp_logging(self, writer: RankWriter) -> None:
        model = self._facts.ddp_model
        logging_data = getattr(model, "_get_ddp_logging_data", None)
        if logging_data is None:
            return
        try:
            data = logging_data()
        except Exception:
            return
        writer.add_event("ddp_logging", **{k: data[k] for k in _DDP_LOGGING_KEYS if k in data})

    def finish(self, was_closed: bool = True) -> None:
        """After `close`, when the trainer's own teardown is done: the fit's end for the job timeline, the
        last upload, and (rank 0) the line that says where the record went. `was_closed`: the record was
        closed before the teardown began (else the teardown closed it, and it says nothing)."""
        if self._writer is None or not self._writer.closed:
            return
        # The fit's teardown (the trainer's strategy teardown) follows the end of training: its end is the
        # fit's, which the job timeline needs.
        self._writer.amend_info(fit_end_unix=round(time.time(), 3))
        if self._mirror is not None:
            bounded(self._mirror.sync, MARKER_TIMEOUT_S, default=False)
        if was_closed and self.rank == 0 and self.run_dir is not None:
            print_closing_line(self.run_dir, self._url)


_ALL_TIMED = TrainingFacts().phases_timed


def _checked_target(owner: str, target: Target | str | None) -> Target | None:
    """The run's target, read now: a target that cannot be read raises before any training starts."""
    if target is None or isinstance(target, Target):
        return target
    try:
        return parse_target(target)
    except TargetError as exc:
        raise ValueError(f"{owner}(target=...): {exc}") from None


def _duration(seconds: float) -> str:
    """`seconds` as a person reads it: 42.0 s, 12.5 min, 3.20 h."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"
