"""The step clock: phases of training steps from marks taken at the trainer's hook boundaries.

A step is one training step as Lightning counts them: a batch that stepped the optimizers (with
gradient accumulation, every micro-batch up to and including that batch). Manual optimization may run
several forwards, backwards and optimizer steps in one batch (a GAN steps two optimizers), so the clock
is a small state machine: each mark closes the interval since the previous mark and gives it to a phase.
Every instant between a step's first and last mark belongs to exactly one named phase, so the phases sum
to the step's time by construction:

    data      fetching batches (and copying them to the device), when the trainer reports its fetches;
              the whole gap between batches when it does not
    forward   batch start -> before backward; also after a backward or an optimizer step, up to the next
              backward (the second forward of a GAN step, a second loss)
    backward  before backward -> after backward (with DDP's exposed all-reduce)
    optimizer after the backward that precedes it -> end of the optimizer step (clipping, unscaling,
              optimizer.step); the end is torch's optimizer step post-hook, else the batch end
    sync      the trainer's own collectives between batches (Lightning's per-batch SIGTERM flag
              broadcast, strategy barriers and broadcasts), where a fast rank waits for a slow one
    other     the rest: the trainer's per-batch work after the optimizer step and between batches (other
              callbacks, logging, learning-rate schedulers, progress), and the end of accumulating
              micro-batches after their backward

Intervals the caller excludes (a checkpoint save, validation between batches) belong to no step: the
step's time is the sum of its phases, and the caller accounts for the excluded time in the job timeline.

tuneup's own work inside a step (its hooks' bookkeeping, the gradient noise scale's norms, a trial's stop
rule) is none of these phases: the caller takes the mark at the hook's entry (`at=`) and reports the hook's
time with `own_since`; that time leaves the phase it fell in and is the step's `tuneup_ms`, so that the
phases are the user's and the step's time is the phases plus tuneup's own. Host timer only: on CUDA a
phase is the device's time, which a host-side hook lengthens only where the host is what limits the step.

On the host a mark is a `perf_counter` reading, resolved at once. On CUDA a mark also records an event on
the current stream; elapsed times between events are GPU time (so "data" becomes the time the GPU sat
waiting for the host), and they are read only once the step's last event has completed, a few steps
later: the clock never synchronizes the device on the training thread's critical path.

Per step the hooks only take marks and add up floats; turning closed steps into records (reading the
loss, building the typed StepRecords the writer takes) happens in `drain`, which the caller runs every few
dozen steps. Doing that work in one loop, with warm caches, instead of between the forward and backward
passes of every step, is what keeps the callback's cost within a few percent of a 2 ms step.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuneup.collect._tensor import to_float
from tuneup.record.schema import PHASE_NAMES, CollectiveRecord, RecordedStep

# A slot per phase, in the schema's order (unpacking fails at import if the schema's list changes length).
DATA, FORWARD, BACKWARD, OPTIMIZER, SYNC, OTHER = range(len(PHASE_NAMES))
# States whose phase is decided by the mark that ends them, and the gap between batches, which is data
# unless the trainer reports its fetches (then only the fetches are data and the rest of the gap is other).
_GAP, _AFTER_BACKWARD, _AFTER_OPTIMIZER, _EXCLUDED = 6, 7, 8, 9
_SLOTS = 7  # the six phases and the gap, accumulated per step

# Mark kinds, for resolving the states above.
_M_BATCH_START, _M_BEFORE_BACKWARD, _M_AFTER_BACKWARD, _M_BEFORE_OPTIMIZER = range(4)
_M_AFTER_OPTIMIZER, _M_BATCH_END, _M_OTHER = 4, 5, 6

# (state, the kind of mark that ends it) -> phase; kinds not listed give the state's default below.
_RESOLVED = {
    (_AFTER_BACKWARD, _M_BEFORE_BACKWARD): FORWARD,  # a second loss's forward
    (_AFTER_BACKWARD, _M_BEFORE_OPTIMIZER): OPTIMIZER,  # clipping, unscaling, the closure's return
    (_AFTER_BACKWARD, _M_AFTER_OPTIMIZER): OPTIMIZER,  # a raw torch optimizer step, without Lightning's hook
    (_AFTER_OPTIMIZER, _M_BEFORE_BACKWARD): FORWARD,  # the next model's forward (a GAN's generator)
    (_AFTER_OPTIMIZER, _M_BEFORE_OPTIMIZER): OPTIMIZER,  # optimizers stepping back to back
    (_AFTER_OPTIMIZER, _M_AFTER_OPTIMIZER): OPTIMIZER,  # the same step's end seen twice
}
_DEFAULT = {_AFTER_BACKWARD: OTHER, _AFTER_OPTIMIZER: OTHER}
# The same as a table, _SLOT_OF[state][mark kind] -> the slot the ending interval goes to (None: excluded),
# because `_switch` runs a dozen times a step and a list index costs less than building a key.
_SLOT_OF: tuple[tuple[int | None, ...], ...] = tuple(
    tuple(
        None if state == _EXCLUDED else _RESOLVED.get((state, kind), _DEFAULT.get(state, state))
        for kind in range(_M_OTHER + 1)
    )
    for state in range(_EXCLUDED + 1)
)
# For a listener (the operator profiler), which must name a phase as it starts: an open state's likeliest
# phase (after a backward usually comes the optimizer step; after a step, the next forward).
_STATE_PHASE = {
    **dict(enumerate(PHASE_NAMES)),
    _AFTER_BACKWARD: PHASE_NAMES[OPTIMIZER],
    _AFTER_OPTIMIZER: PHASE_NAMES[FORWARD],
    _EXCLUDED: PHASE_NAMES[OTHER],
}


class HostTimer:
    """Marks are host clock readings; everything is ready at once."""

    kind = "host"
    immediate = True  # marks are plain numbers whose differences are durations at once

    def mark(self) -> Any:
        return time.perf_counter()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return (end - start) * 1000.0

    def ready(self, mark: Any) -> bool:
        return True

    def wait(self, mark: Any) -> None:
        return None

    def release(self, mark: Any) -> None:
        return None


class CudaEventTimer:
    """Marks are CUDA events recorded on the current stream; read them only when they have completed."""

    kind = "cuda_event"
    immediate = False

    def __init__(self, device: Any = None) -> None:
        import torch

        self._torch = torch
        self._device = device
        self._free: list[Any] = []  # recycled events: creating one per mark would cost a driver call each

    def mark(self) -> Any:
        event = self._free.pop() if self._free else self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))

    def ready(self, mark: Any) -> bool:
        return bool(mark.query())

    def wait(self, mark: Any) -> None:
        mark.synchronize()

    def release(self, mark: Any) -> None:
        self._free.append(mark)


Timer = HostTimer | CudaEventTimer


@dataclass(slots=True)
class PendingStep:
    """A closed step whose times (and device tensors such as the loss) may not be readable yet."""

    step: int
    epoch: int
    end_perf_s: float  # host clock at the end of the step, for its unix time
    micro_batches: int
    start: Any
    end: Any
    phase_s: list[float] | None  # host timer: seconds per phase (PHASE_NAMES order, then the gap), known
    intervals: dict[str, list[tuple[Any, Any]]] | None  # deferred timer: marks to read later
    samples: int | None
    tokens: int | None
    loss: Any  # float, or a device tensor read once the step is ready
    grad_norm: Any
    peak_mem_bytes: int | None
    checkpoint: bool
    comm: list[Any] | None = None  # PendingCollective of the step (tuneup.collect.comm)
    noise: Any = None  # PendingNoise of the step (tuneup.collect.grad_noise), where it is measured
    own_s: float | None = None  # host timer: tuneup's own seconds in the step, out of its phases


_PENDING_END = 5  # index of PendingStep.end in the tuples the clock queues


def _set_fields(record: RecordedStep, values: dict[str, Any]) -> None:
    """Fill the step's fields that a collector resolved (comm_*, gns_*: StepRecord's names)."""
    for name, value in values.items():
        setattr(record, name, value)


class StepClock:
    """Collects the marks of the batches of one training step at a time.

    `drain` hands `on_resolved` one RecordedStep per closed step (a StepRecord, with the step's timed
    collectives), in step order.
    Steps wait in memory until then; with a deferred (CUDA) timer, `drain` waits for the device only
    when more than `max_pending` steps are still unreadable.
    """

    def __init__(self, timer: Timer, on_resolved: Callable[[RecordedStep], None], max_pending: int = 4):
        self.timer = timer
        self.on_resolved = on_resolved
        self.max_pending = max_pending
        self._immediate = bool(getattr(timer, "immediate", False))
        # The host timer's marks are perf_counter readings: a hook's own entry reading can be its mark, and
        # its own time can be taken out of the phases (`own_since`). Not so for another timer's marks.
        self._host = type(timer) is HostTimer
        # The host timer's mark is perf_counter itself: one call less per mark.
        self._mark: Callable[[], Any] = time.perf_counter if type(timer) is HostTimer else timer.mark
        self._pending: deque[tuple[Any, ...]] = deque()  # PendingStep fields, in order
        self._unix0 = time.time()
        self._perf0 = time.perf_counter()
        self.fetch_marks_seen = False
        # The open interval: where it started, and the state it is in. None: nothing is being timed
        # (before the first restart).
        self._cursor: Any = None
        self._state = _GAP
        # tuneup's own seconds inside the open interval (`own_since`): taken out of its phase when it closes.
        self._own_open = 0.0
        # States to return to after a sync or an excluded interval, each with the time it had run before it
        # (start and end marks, and tuneup's own seconds in it) where that state's phase is decided by the
        # mark that ends it: the time is held for that phase rather than given to "other" at the suspension.
        self._suspended: list[tuple[int, Any, Any, float]] = []
        self._held: list[tuple[Any, Any]] = []  # deferred timer: held intervals of the open state
        self._last_end: Any = None  # the last batch end: a closed step's end mark
        # Told the phase that starts at every mark but a batch's start and end (which its owner reports
        # with the step's number): `listener(name)`. None costs one comparison per mark.
        self.listener: Callable[[str], None] | None = None
        self._reset_step()

    def _reset_step(self) -> None:
        self._phase_s = [0.0] * _SLOTS  # host timer: seconds per slot
        self._own_s = 0.0  # host timer: tuneup's own seconds in the step (`own_since`)
        self._intervals: list[list[tuple[Any, Any]]] | None = (
            None if self._immediate else [[] for _ in range(_SLOTS)]
        )
        self._step_start: Any = self._cursor
        self.micro_batches = 0
        self.samples: int | None = None
        self.tokens: int | None = None
        self.loss: Any = None
        self.grad_norm: Any = None
        self.noise: Any = None  # the callback's PendingNoise for this step, where it measures one
        self.checkpoint = False

    def _switch(self, ending: int, state: int, at: float | None = None) -> Any:
        """Close the open interval (giving it to the phase its state and `ending` mark resolve to), start
        one in `state`; returns the mark taken. `at`: a host clock reading to use as the mark (the caller's
        hook entry), for the host timer; the deferred timer takes its own."""
        now = at if at is not None and self._host else self._mark()
        cursor = self._cursor
        if cursor is not None:
            slot = _SLOT_OF[self._state][ending]
            if slot is not None:
                if self._intervals is None:
                    own = self._own_open
                    if own:
                        self._own_s += own
                        self._own_open = 0.0
                    self._phase_s[slot] += now - cursor - own
                else:
                    self._intervals[slot].append((cursor, now))
                    if self._held:
                        self._intervals[slot].extend(self._held)
                        self._held.clear()
            else:
                self._own_open = 0.0  # tuneup's work in an excluded interval belongs to no step either
        elif self._step_start is None:
            self._step_start = now
        self._cursor = now
        self._state = state
        if self.listener is not None and ending not in (_M_BATCH_START, _M_BATCH_END):
            self.listener(_STATE_PHASE.get(state) or PHASE_NAMES[OTHER if self.fetch_marks_seen else DATA])
        return now

    @property
    def pending(self) -> int:
        return len(self._pending)

    def phase_now(self) -> str:
        """The phase the open interval is in (for a state the next mark decides, its likeliest one, as a
        listener is told): the phase that a wait on the training thread right now holds up (an FSDP
        all-gather in forward, a re-gather or reduce-scatter in backward). One dict lookup, no mark."""
        return _STATE_PHASE.get(self._state) or PHASE_NAMES[OTHER if self.fetch_marks_seen else DATA]

    def own_since(self, started: float) -> None:
        """tuneup's own work ran from `started` (a host clock reading, at or after the last mark) until now:
        it is the step's `tuneup_ms`, not part of the phase it fell in. Host timer only (see the module)."""
        if self._host and self._cursor is not None:
            self._own_open += time.perf_counter() - started

    def add_own(self, seconds: float) -> None:
        """tuneup's own work, timed by the caller, took `seconds` of the open interval (the DDP hook's norms
        inside a backward, on the training thread). Host timer only."""
        if self._host and self._cursor is not None and seconds > 0:
            self._own_open += seconds

    # -- marks, in hook order ----------------------------------------------------------------------

    def restart(self) -> None:
        """The next gap starts now (epoch start): time before it belongs to no step. A step with batches
        already in it (validation in the middle of gradient accumulation) keeps them."""
        self._cursor = self._mark()
        self._own_open = 0.0
        self._state = _GAP
        self._suspended.clear()
        self._held.clear()
        if not self.micro_batches:
            self._reset_step()

    def fetch_start(self) -> None:
        """The trainer starts fetching a batch (or copying one to the device)."""
        if self._state != _EXCLUDED:  # validation's own fetches belong to no step
            self._switch(_M_OTHER, DATA)

    def fetch_end(self) -> None:
        if self._state == DATA:
            self._switch(_M_OTHER, _GAP)
            self.fetch_marks_seen = True

    def batch_start(
        self, samples: int | None = None, tokens: int | None = None, at: float | None = None
    ) -> None:
        if self._cursor is None:
            self.restart()
        self._switch(_M_BATCH_START, FORWARD, at)
        self.micro_batches += 1
        if samples is not None:
            self.samples = (self.samples or 0) + samples
        if tokens is not None:
            self.tokens = (self.tokens or 0) + tokens

    def before_backward(self, at: float | None = None) -> None:
        if self.micro_batches:
            self._switch(_M_BEFORE_BACKWARD, BACKWARD, at)

    def after_backward(self, at: float | None = None) -> None:
        if self.micro_batches:
            self._switch(_M_AFTER_BACKWARD, _AFTER_BACKWARD, at)

    def before_optimizer(self, at: float | None = None) -> None:
        if self.micro_batches:
            self._switch(_M_BEFORE_OPTIMIZER, OPTIMIZER, at)

    def after_optimizer(self) -> None:
        """An optimizer step ended (torch's step post-hook): what follows is a forward or the batch's end."""
        if self.micro_batches and self._state in (OPTIMIZER, _AFTER_BACKWARD):
            self._switch(_M_AFTER_OPTIMIZER, _AFTER_OPTIMIZER)

    def batch_end(self, loss: Any = None, at: float | None = None) -> None:
        """Mark the end of a batch (a micro-batch under accumulation), and add its loss to the step's."""
        if self._cursor is not None:
            self._last_end = self._switch(_M_BATCH_END, _GAP, at)
        if loss is not None:
            # Lightning hands on_train_batch_end a detached copy: summing it keeps a device tensor, no sync.
            self.loss = loss if self.loss is None else self.loss + loss

    def sync_start(self) -> None:
        """The trainer enters one of its own collectives (a barrier, a broadcast)."""
        self._suspend(SYNC)

    def sync_end(self) -> None:
        self._resume(SYNC)

    def exclude_start(self) -> None:
        """Time from now until `exclude_end` belongs to no step (a checkpoint save, validation)."""
        self._suspend(_EXCLUDED)

    def exclude_end(self) -> None:
        self._resume(_EXCLUDED)

    def _suspend(self, state: int) -> None:
        if self._cursor is None or (self._state == _EXCLUDED and state != _EXCLUDED):
            return  # a collective inside an excluded interval (a save's barrier) is excluded with it
        if self._state in (_AFTER_BACKWARD, _AFTER_OPTIMIZER):
            # Not resolved yet (a GAN's second forward, paused by a save or a barrier, is still forward):
            # hold the time so far, and give it with the rest to the phase the ending mark resolves to.
            now = self._mark()
            self._suspended.append((self._state, self._cursor, now, self._own_open))
            self._cursor, self._state, self._own_open = now, state, 0.0
            if self.listener is not None:
                self.listener(_STATE_PHASE[state])
            return
        self._suspended.append((self._state, None, None, 0.0))
        self._switch(_M_OTHER, state)

    def _resume(self, state: int) -> None:
        if self._state == state and self._suspended:
            back, held_start, held_end, held_own = self._suspended.pop()
            now = self._switch(_M_OTHER, back)
            if held_start is None:
                return
            if self._intervals is None:
                self._cursor = now - (held_end - held_start)  # the held time, as if the pause had not been
                self._own_open = held_own
            else:
                self._held.append((held_start, held_end))

    def close_step(
        self, step: int, epoch: int, peak_mem_bytes: int | None = None, comm: list[Any] | None = None
    ) -> None:
        """The training step `step` is done (at its last batch end): keep it for `drain`, start a new one."""
        if self.micro_batches and self._step_start is not None and self._last_end is not None:
            gap_slot = OTHER if self.fetch_marks_seen else DATA
            if self._intervals is None:
                self._phase_s[gap_slot] += self._phase_s[_GAP]
            else:
                self._intervals[gap_slot].extend(self._intervals[_GAP])
            # A plain tuple, made a PendingStep in `drain`: this runs on the training thread every step, and
            # a tuple is one allocation where the dataclass's __init__ is a Python call of 17 stores. The
            # phase list is handed over whole (its gap slot is ignored): `_reset_step` starts a new one.
            self._pending.append(
                (
                    step,
                    epoch,
                    self._last_end if self._immediate else time.perf_counter(),
                    self.micro_batches,
                    self._step_start,
                    self._last_end,
                    self._phase_s if self._immediate else None,
                    {name: self._intervals[i] for i, name in enumerate(PHASE_NAMES)}
                    if self._intervals is not None
                    else None,
                    self.samples,
                    self.tokens,
                    self.loss,
                    self.grad_norm,
                    peak_mem_bytes,
                    self.checkpoint,
                    comm or None,
                    self.noise,
                    self._own_s if self._host else None,
                )
            )
        self._reset_step()
        self._step_start = self._last_end

    # -- resolution --------------------------------------------------------------------------------

    def drain(self, force: bool = False, pause: Callable[[], None] | None = None) -> None:
        """Resolve every closed step whose marks have completed; wait only past `max_pending` steps.
        `pause()` runs after each step (a background caller gives the GIL back there)."""
        while self._pending:
            end = self._pending[0][_PENDING_END]
            if not self.timer.ready(end):
                if not force and len(self._pending) <= self.max_pending:
                    return
                self.timer.wait(end)
            self.on_resolved(self._resolve(PendingStep(*self._pending.popleft())))
            if pause is not None:
                pause()

    def _resolve(self, p: PendingStep) -> RecordedStep:
        timer = self.timer
        if p.phase_s is not None:
            phases_ms = [p.phase_s[i] * 1000.0 for i in range(len(PHASE_NAMES))]
        else:
            assert p.intervals is not None
            phases_ms = [sum(timer.elapsed_ms(a, b) for a, b in p.intervals[name]) for name in PHASE_NAMES]
            self._release(p)
        data, forward, backward, optimizer, sync, other = phases_ms
        loss, grad_norm = p.loss, p.grad_norm
        own_ms = p.own_s * 1000.0 if p.own_s else 0.0
        # Raw floats: the writer rounds the few records it encodes; rounding every step here is wasted.
        record = RecordedStep(
            step=p.step,
            epoch=p.epoch,
            t_end=self._unix0 + (p.end_perf_s - self._perf0),
            # The phases and tuneup's own time tile the step, less any interval the caller excluded (a
            # checkpoint save).
            wall_ms=data + forward + backward + optimizer + sync + other + own_ms,
            data_ms=data,
            forward_ms=forward,
            backward_ms=backward,
            optimizer_ms=optimizer,
            sync_ms=sync,
            other_ms=other,
            micro_batches=p.micro_batches,
            samples=p.samples,
            tokens=p.tokens,
            loss=loss if loss is None or isinstance(loss, float) else to_float(loss),
            grad_norm=grad_norm if grad_norm is None or isinstance(grad_norm, float) else to_float(grad_norm),
            peak_mem_bytes=p.peak_mem_bytes,
            checkpoint=bool(p.checkpoint),
            tuneup_ms=own_ms if p.own_s is not None else None,
        )
        comm_sq = None
        if p.comm:
            from tuneup.collect.comm import resolve_collectives

            collectives, summary = resolve_collectives(p.comm, self._elapsed_safely, p.start)
            comm_sq = summary.pop("_gns_sq", None)
            _set_fields(record, summary)
            record.collectives = [CollectiveRecord(step=p.step, **c) for c in collectives]
        if p.noise is not None:
            from tuneup.collect.grad_noise import noise_record

            _set_fields(record, noise_record(p.noise, comm_sq))
        return record

    def _elapsed_safely(self, start: Any, end: Any) -> float:
        # A collective's end mark is recorded by another stream's callback; by the time its step is read
        # it has completed, and if not, it is in the past: waiting for it costs nothing on the step.
        try:
            return self.timer.elapsed_ms(start, end)
        except RuntimeError:
            self.timer.wait(end)
            return self.timer.elapsed_ms(start, end)

    def _release(self, p: PendingStep) -> None:
        # Adjacent intervals share marks, and a step's end mark is the next step's start: recycle each mark
        # once, and the end mark only when it comes round as the start of the step after.
        assert p.intervals is not None
        seen: set[int] = {id(p.end), id(self._last_end), id(self._step_start), id(self._cursor)}
        for mark in [p.start] + [m for pairs in p.intervals.values() for pair in pairs for m in pair]:
            if id(mark) not in seen:
                seen.add(id(mark))
                self.timer.release(mark)
