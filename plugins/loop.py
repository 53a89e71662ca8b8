"""`tuneup.track`: record a hand-written PyTorch training loop, one process or torchrun DDP.

    with tuneup.track(dirpath="runs/exp1", batch_size=64, model=ddp_model) as run:
        for x, y in run.data(loader):                 # the data phase: each batch's fetch
            with run.phase("forward"):
                loss = loss_fn(ddp_model(x), y)
            with run.phase("backward"):
                loss.backward()
            with run.phase("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            run.step(loss=loss)                       # the training step ends
        run.log_metrics({"val_loss": val_loss})       # metrics the loop computed (optional, any time)

A step is whatever runs between two `run.step()` calls. Gradient accumulation: several forward and
backward phases before one `run.step()` (each forward starts a micro-batch). The loop tells tuneup only
what it marks: a phase it never marks is written as not timed (the rank's `phases_timed`), and the time
outside every marked phase is "other", never guessed to be one of them. Samples per step: `samples=` at
`run.step`, else the `batch_size` given to `track` (per rank), else unknown.

`model`: the model as trained (a DistributedDataParallel model under DDP, for the timed all-reduce and the
gradient noise scale; the plain module otherwise, for its size, the gradient norm and the FLOP count).
Under torchrun the process group must be initialized before `track`: one run records every rank.
Keywords are `TuneupCallback`'s (`telemetry_interval_s=`, `instance=`, `profile_steps=`...; see
tuneup.recording.policies). The record is closed when the `with` block ends, also on an exception.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from tuneup.recording import RecordingSession, TorchRanks, TrainingFacts
from tuneup.recording.describe import loader_summary, model_summary
from tuneup.recording.device import is_compiled
from tuneup.recording.ranks import local_rank_from_env

T = TypeVar("T")
OWNER = "tuneup.track"
PHASES = ("data", "forward", "backward", "optimizer")


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class TrackedLoop:
    """A plain loop's recording (what `tuneup.track` returns); use it as a context manager."""

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        *,
        batch_size: int | None = None,
        model: Any = None,
        loader: Any = None,
        **options: Any,
    ) -> None:
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(f"{OWNER}(batch_size=...) must be a positive integer, got {batch_size!r}")
        self.session = RecordingSession(dirpath, owner=OWNER, **options)
        self.batch_size = batch_size
        self.model = model
        self.loader = loader
        self._timed: set[str] = set()  # the phases the loop marked
        self._micro_batch_open = False  # a micro-batch started and its step has not ended

    @property
    def run_dir(self) -> Path | None:
        """The run directory written (a local spool for a run on object storage)."""
        return self.session.run_dir

    @property
    def steps_done(self) -> int:
        return self.session.steps_done

    # -- the with block ----------------------------------------------------------------------------

    def __enter__(self) -> TrackedLoop:
        session = self.session
        ranks = TorchRanks()
        device = _model_device(self.model)
        session.prepare(ranks, os.getcwd(), on_cuda=getattr(device, "type", None) == "cuda")
        model = self.model
        local_world = _int_env("LOCAL_WORLD_SIZE", 1)
        facts = TrainingFacts(
            device=device,
            local_rank=local_rank_from_env(),
            node_rank=_int_env("GROUP_RANK", 0),
            num_nodes=max(1, ranks.world_size // max(1, local_world)),
            ranks_per_node=local_world,
            # The loop hands one loss per step, detached here; how it scales micro-batch losses is unknown.
            automatic_optimization=True,
            accumulation=None,
            parameters=model.parameters if model is not None else None,
            ddp_model=model if hasattr(model, "register_comm_hook") else None,
            compiled=model is not None and is_compiled(model),
            trainer={"adapter": "loop", "world_size": ranks.world_size, "devices": local_world},
            dataloader=self._loader_facts(),
            model=model_summary(getattr(model, "module", model)) if model is not None else {},
            trainer_name="loop",
            # Only what the loop marks is data: the rest of the time between steps is "other".
            gap_is_data=False,
        )
        session.start(facts)
        return self

    def _loader_facts(self) -> dict[str, Any]:
        """The loader's summary; its batch size, where the loader does not say it, is the one given to
        `track` (the loop's own word, per rank), so the report and the advice know the batch."""
        summary = dict(loader_summary(self.loader) or {})
        if summary.get("batch_size") is None and self.batch_size is not None:
            summary["batch_size"] = self.batch_size
        return summary

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(exc)

    def close(self, exc: BaseException | None = None) -> None:
        """Close the record (the `with` block does): `exc`, the exception that ended the loop, if any."""
        session = self.session
        if session.closed or session.run_dir is None:
            return
        # The phases the loop marked: the others are not timed (their time is in "other"), not zero. A loop
        # does not say why it ended (its data ran out, a step budget, a decision of its own): no stop reason.
        session.end(exc, phases_timed=sorted(self._timed, key=PHASES.index))

    # -- marks -------------------------------------------------------------------------------------

    def data(self, batches: Iterable[T]) -> Iterator[T]:
        """`batches`, each fetch timed as the data phase."""
        iterator = iter(batches)
        session = self.session
        self._timed.add("data")
        while True:
            session.fetch_start()
            try:
                batch = next(iterator)
            except StopIteration:
                session.fetch_end()
                return
            session.fetch_end()
            yield batch

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase `name`: "data", "forward", "backward" or "optimizer"."""
        self.begin(name)
        try:
            yield
        finally:
            self.end(name)

    def begin(self, name: str) -> None:
        """Phase `name` starts (`phase` as two calls, for a loop that cannot use a with block)."""
        if name not in PHASES:
            raise ValueError(f"{OWNER}: unknown phase {name!r}: one of {', '.join(PHASES)}")
        session = self.session
        self._timed.add(name)
        if name == "data":
            session.fetch_start()
            return
        if name == "forward":
            if self._micro_batch_open:  # the next micro-batch of an accumulating step: the last one ended
                session.batch_end()
            session.batch_start(self.batch_size, None)
            self._micro_batch_open = True
            return
        if not self._micro_batch_open:  # a step whose forward is not marked: its micro-batch starts here
            session.batch_start(self.batch_size, None)
            self._micro_batch_open = True
        if name == "backward":
            session.before_backward()
        else:
            session.before_optimizer()

    def end(self, name: str) -> None:
        """Phase `name` ends: what follows, up to the next phase, is "other"."""
        session = self.session
        if name == "data":
            session.fetch_end()
            return
        if name == "backward":
            session.after_backward()  # the DDP hook's gradient norms in this backward are tuneup's time
        session.idle()

    def step(self, loss: Any = None, samples: int | None = None, tokens: int | None = None) -> None:
        """The training step ends: its loss (a tensor, read later off the training thread), its samples on
        this rank (default: `batch_size` per micro-batch, else unknown) and tokens (default: unknown)."""
        session, clock = self.session, self.session.clock
        if clock is None or session.disabled:
            return
        entered: float | None = time.perf_counter()
        if not self._micro_batch_open:
            # A step with no phase marked: its micro-batch opens and goes idle at once, so that all of the
            # step is "other" (with this call's bookkeeping: its micro-batch holds nothing to take it from).
            session.batch_start(self.batch_size, None, at=entered)
            session.idle()
            entered = None
        self._micro_batch_open = False
        if samples is not None:
            clock.samples = int(samples)
        if tokens is not None:
            clock.tokens = int(tokens)
        if loss is not None and hasattr(loss, "detach"):
            loss = loss.detach()
        session.batch_end(loss, at=entered)  # from its entry, this call's bookkeeping is tuneup's own
        session.end_step()

    def event(self, kind: str, **fields: Any) -> None:
        """An event of the loop's own in the record (JSON-ready fields)."""
        self.session.event(kind, **fields)

    def log_metrics(
        self, values: Mapping[str, Any], step: int | None = None, epoch: int | None = None
    ) -> None:
        """Record metrics the loop computed (name -> a number or a scalar tensor, on any device: a tensor
        is read later, off the training thread, without blocking), at `step` (default: the steps done,
        `run.step()` calls so far) and `epoch` (default: unknown). With `track(target="val_loss<=2.1")` the
        first value that meets the target is recorded as reached."""
        self.session.log_metrics(values, "log", step, epoch)


def track(
    dirpath: str | os.PathLike[str] | None = None,
    *,
    batch_size: int | None = None,
    model: Any = None,
    loader: Any = None,
    **options: Any,
) -> TrackedLoop:
    """Record a plain PyTorch training loop: ``with tuneup.track(...) as run:`` (see the module)."""
    return TrackedLoop(dirpath, batch_size=batch_size, model=model, loader=loader, **options)


def _model_device(model: Any) -> Any:
    if model is None:
        return None
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return None
