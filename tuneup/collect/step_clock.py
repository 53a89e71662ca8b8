"""The step clock: phases of optimizer steps from marks taken at the trainer's hook boundaries.

A step is one optimizer step, made of one or more micro-batches. Per micro-batch the trainer calls, in
order: batch start, before backward, after backward, (last micro-batch only) before optimizer step,
batch end. The intervals between those marks tile the timeline:

    data      time spent fetching batches (and copying them to the device) between the previous batch
              end (or a reset) and this batch start, when the trainer reports its fetches; the whole
              gap when it does not
    forward   batch start -> before backward                   training_step (and zero_grad)
    backward  before backward -> after backward               backward, with DDP's exposed all-reduce
    optimizer before optimizer step -> batch end               clipping, optimizer.step
    other     whatever is left: the rest of the gap between batches (other callbacks, the trainer's own
              per-batch work and collectives), after backward -> batch end on accumulating micro-batches

On the host a mark is a `perf_counter` reading, resolved at once. On CUDA a mark also records an event on
the current stream; elapsed times between events are GPU time (so "data" becomes the time the GPU sat
waiting for the host), and they are read only once the step's last event has completed, a few steps
later: the clock never synchronizes the device on the training thread's critical path.

Per step the hooks only take marks and add up floats; turning closed steps into records (reading the
loss, building dicts) happens in `drain`, which the caller runs every few dozen steps. Doing that work in
one loop, with warm caches, instead of between the forward and backward passes of every step, is what
keeps the callback's cost within a few percent of a 2 ms step.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PHASE_NAMES = ("data", "forward", "backward", "optimizer")


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
    phase_s: list[float] | None  # host timer: seconds per phase (PHASE_NAMES order), already known
    intervals: dict[str, list[tuple[Any, Any]]] | None  # deferred timer: marks to read later
    samples: int | None
    tokens: int | None
    loss: Any  # float, or a device tensor read once the step is ready
    grad_norm: Any
    peak_mem_bytes: int | None
    checkpoint: bool
    comm: list[Any] | None = None  # PendingCollective of the step (tuneup.collect.comm)


def _to_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None


class StepClock:
    """Collects the marks of the micro-batches of one optimizer step at a time.

    `drain` hands `on_resolved` one dict per closed step, in step order, with the StepRecord fields.
    Steps wait in memory until then; with a deferred (CUDA) timer, `drain` waits for the device only
    when more than `max_pending` steps are still unreadable.
    """

    def __init__(self, timer: Timer, on_resolved: Callable[[dict[str, Any]], None], max_pending: int = 4):
        self.timer = timer
        self.on_resolved = on_resolved
        self.max_pending = max_pending
        self._immediate = bool(getattr(timer, "immediate", False))
        self._pending: deque[PendingStep] = deque()
        self._last_end: Any = None
        self._unix0 = time.time()
        self._perf0 = time.perf_counter()
        self._fetch_start: Any = None
        self._gap_fetch_s = 0.0
        self._gap_fetches: list[tuple[Any, Any]] = []
        self.fetch_marks_seen = False
        self._reset_step()

    def _reset_step(self) -> None:
        self._phase_s = [0.0, 0.0, 0.0, 0.0]  # data, forward, backward, optimizer (host timer)
        self._intervals: dict[str, list[tuple[Any, Any]]] | None = (
            None if self._immediate else {p: [] for p in PHASE_NAMES}
        )
        self._step_start: Any = None
        self._micro_start: Any = None
        self._before_backward: Any = None
        self._before_optimizer: Any = None
        self.micro_batches = 0
        self.samples: int | None = None
        self.tokens: int | None = None
        self.loss: Any = None
        self.grad_norm: Any = None
        self.checkpoint = False

    def _add(self, phase: int, start: Any, end: Any) -> None:
        if self._intervals is None:
            self._phase_s[phase] += end - start
        else:
            self._intervals[PHASE_NAMES[phase]].append((start, end))

    @property
    def pending(self) -> int:
        return len(self._pending)

    # -- marks, in hook order ----------------------------------------------------------------------

    def restart(self) -> None:
        """The next data interval starts now (epoch start, end of validation): time before is not a step's."""
        self._last_end = self.timer.mark()
        self._gap_fetches = []
        self._gap_fetch_s = 0.0
        self._fetch_start = None

    def fetch_start(self) -> None:
        """The trainer starts fetching a batch (or copying one to the device)."""
        self._fetch_start = self.timer.mark()

    def fetch_end(self) -> None:
        if self._fetch_start is not None:
            now = self.timer.mark()
            if self._immediate:
                self._gap_fetch_s += now - self._fetch_start
            else:
                self._gap_fetches.append((self._fetch_start, now))
            self._fetch_start = None
            self.fetch_marks_seen = True

    def batch_start(self, samples: int | None = None, tokens: int | None = None) -> None:
        now = self.timer.mark()
        if self._last_end is None:
            self._last_end = now
        if self._step_start is None:
            self._step_start = self._last_end
        if not self.fetch_marks_seen:
            self._add(0, self._last_end, now)
        elif self._intervals is None:
            self._phase_s[0] += self._gap_fetch_s
            self._gap_fetch_s = 0.0
        else:
            self._intervals["data"].extend(self._gap_fetches)
            self._gap_fetches = []
        self._micro_start = now
        self.micro_batches += 1
        if samples is not None:
            self.samples = (self.samples or 0) + samples
        if tokens is not None:
            self.tokens = (self.tokens or 0) + tokens

    def before_backward(self) -> None:
        if self._micro_start is None:
            return
        now = self.timer.mark()
        self._add(1, self._micro_start, now)
        self._micro_start = None  # a second backward in one micro-batch (manual optimization) adds no forward
        self._before_backward = now

    def after_backward(self) -> None:
        if self._before_backward is None:
            return
        self._add(2, self._before_backward, self.timer.mark())
        self._before_backward = None

    def before_optimizer(self) -> None:
        if self.micro_batches:
            self._before_optimizer = self.timer.mark()

    def batch_end(self) -> None:
        """Mark the end of a micro-batch."""
        now = self.timer.mark()
        if self._before_optimizer is not None:
            self._add(3, self._before_optimizer, now)
            self._before_optimizer = None
        self._micro_start = None
        self._last_end = now

    def add_loss(self, loss: Any) -> None:
        # Lightning hands on_train_batch_end a detached copy: summing it keeps a device tensor, no sync.
        if loss is not None:
            self.loss = loss if self.loss is None else self.loss + loss

    def close_step(
        self, step: int, epoch: int, peak_mem_bytes: int | None = None, comm: list[Any] | None = None
    ) -> None:
        """The optimizer step `step` is done: keep it for `drain` and start a new one."""
        if self.micro_batches and self._step_start is not None:
            self._pending.append(
                PendingStep(
                    step,
                    epoch,
                    self._last_end if self._immediate else time.perf_counter(),
                    self.micro_batches,
                    self._step_start,
                    self._last_end,
                    self._phase_s if self._immediate else None,
                    self._intervals,
                    self.samples,
                    self.tokens,
                    self.loss,
                    self.grad_norm,
                    peak_mem_bytes,
                    self.checkpoint,
                    comm or None,
                )
            )
        self._reset_step()

    # -- resolution --------------------------------------------------------------------------------

    def drain(self, force: bool = False) -> None:
        """Resolve every closed step whose marks have completed; wait only past `max_pending` steps."""
        while self._pending:
            oldest = self._pending[0]
            if not self.timer.ready(oldest.end):
                if not force and len(self._pending) <= self.max_pending:
                    return
                self.timer.wait(oldest.end)
            self._pending.popleft()
            self.on_resolved(self._resolve(oldest))

    def _resolve(self, p: PendingStep) -> dict[str, Any]:
        timer = self.timer
        wall_ms = timer.elapsed_ms(p.start, p.end)
        if p.phase_s is not None:
            data, forward, backward, optimizer = (x * 1000.0 for x in p.phase_s)
        else:
            assert p.intervals is not None
            data, forward, backward, optimizer = (
                sum(timer.elapsed_ms(a, b) for a, b in p.intervals[name]) for name in PHASE_NAMES
            )
            self._release(p)
        loss, grad_norm = p.loss, p.grad_norm
        # Raw floats: the writer rounds the few records it encodes; rounding every step here is wasted.
        record = {
            "step": p.step,
            "epoch": p.epoch,
            "t_end": self._unix0 + (p.end_perf_s - self._perf0),
            "wall_ms": wall_ms,
            "data_ms": data,
            "forward_ms": forward,
            "backward_ms": backward,
            "optimizer_ms": optimizer,
            "other_ms": max(0.0, wall_ms - data - forward - backward - optimizer),
            "micro_batches": p.micro_batches,
            "samples": p.samples,
            "tokens": p.tokens,
            "loss": loss if loss is None or isinstance(loss, float) else _to_float(loss),
            "grad_norm": grad_norm
            if grad_norm is None or isinstance(grad_norm, float)
            else _to_float(grad_norm),
            "peak_mem_bytes": p.peak_mem_bytes,
        }
        if p.checkpoint:
            record["checkpoint"] = True
        if p.comm:
            from tuneup.collect.comm import resolve_collectives

            collectives, summary = resolve_collectives(p.comm, self._elapsed_safely, p.start)
            record.update(summary)
            record["_collectives"] = collectives
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
        seen: set[int] = {id(p.end), id(self._last_end), id(self._step_start)}
        for mark in [p.start] + [m for pairs in p.intervals.values() for pair in pairs for m in pair]:
            if id(mark) not in seen:
                seen.add(id(mark))
                self.timer.release(mark)
