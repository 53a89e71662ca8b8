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
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PHASE_NAMES = ("data", "forward", "backward", "optimizer")


class HostTimer:
    """Marks are host clock readings; everything is ready at once."""

    kind = "host"

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
    t_end: float
    micro_batches: int
    start: Any
    end: Any
    intervals: dict[str, list[tuple[Any, Any]]]
    samples: int | None = None
    tokens: int | None = None
    loss: Any = None  # float, or a device tensor read once the step is ready
    grad_norm: Any = None
    peak_mem_bytes: int | None = None
    checkpoint: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _to_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None


class StepClock:
    """Collects the marks of the micro-batches of one optimizer step at a time.

    `on_resolved` receives one dict per step, in step order, with the StepRecord fields.
    """

    def __init__(self, timer: Timer, on_resolved: Callable[[dict[str, Any]], None], max_lag_steps: int = 4):
        self.timer = timer
        self.on_resolved = on_resolved
        self.max_lag_steps = max_lag_steps
        self._pending: deque[PendingStep] = deque()
        self._last_end: Any = None
        self._gap_fetches: list[tuple[Any, Any]] = []
        self._fetch_start: Any = None
        self.fetch_marks_seen = False
        self._reset_step()

    def _reset_step(self) -> None:
        self._intervals: dict[str, list[tuple[Any, Any]]] = {p: [] for p in PHASE_NAMES}
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

    @property
    def in_step(self) -> bool:
        return self.micro_batches > 0

    # -- marks, in hook order ----------------------------------------------------------------------

    def restart(self) -> None:
        """The next data interval starts now (epoch start, end of validation): time before is not a step's."""
        self._last_end = self.timer.mark()
        self._gap_fetches = []
        self._fetch_start = None

    def fetch_start(self) -> None:
        """The trainer starts fetching a batch (or copying one to the device)."""
        self._fetch_start = self.timer.mark()

    def fetch_end(self) -> None:
        if self._fetch_start is not None:
            self._gap_fetches.append((self._fetch_start, self.timer.mark()))
            self._fetch_start = None
            self.fetch_marks_seen = True

    def batch_start(self, samples: int | None = None, tokens: int | None = None) -> None:
        now = self.timer.mark()
        if self._last_end is None:
            self._last_end = now
        if self._step_start is None:
            self._step_start = self._last_end
        if self.fetch_marks_seen:
            self._intervals["data"].extend(self._gap_fetches)
        else:
            self._intervals["data"].append((self._last_end, now))
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
        self._intervals["forward"].append((self._micro_start, now))
        self._micro_start = None  # a second backward in one micro-batch (manual optimization) adds no forward
        self._before_backward = now

    def after_backward(self) -> None:
        if self._before_backward is None:
            return
        now = self.timer.mark()
        self._intervals["backward"].append((self._before_backward, now))
        self._before_backward = None

    def before_optimizer(self) -> None:
        if self.micro_batches:
            self._before_optimizer = self.timer.mark()

    def batch_end(self) -> Any:
        """Mark the end of a micro-batch; returns the mark, so the caller may close the step on it."""
        now = self.timer.mark()
        if self._before_optimizer is not None:
            self._intervals["optimizer"].append((self._before_optimizer, now))
            self._before_optimizer = None
        self._micro_start = None
        self._last_end = now
        return now

    def add_loss(self, loss: Any) -> None:
        if loss is None:
            return
        detached = loss.detach() if hasattr(loss, "detach") else loss
        self.loss = detached if self.loss is None else self.loss + detached

    def close_step(self, step: int, epoch: int, **fields: Any) -> None:
        """The optimizer step `step` is done; queue it for resolution and start a new one."""
        if not self.micro_batches or self._step_start is None:
            self._reset_step()
            return
        pending = PendingStep(
            step=step,
            epoch=epoch,
            t_end=time.time(),
            micro_batches=self.micro_batches,
            start=self._step_start,
            end=self._last_end,
            intervals=self._intervals,
            samples=self.samples,
            tokens=self.tokens,
            loss=self.loss,
            grad_norm=self.grad_norm,
            checkpoint=self.checkpoint,
            **fields,
        )
        self._pending.append(pending)
        self._reset_step()
        self.drain()

    # -- resolution --------------------------------------------------------------------------------

    def drain(self, force: bool = False) -> None:
        """Resolve every pending step whose marks have completed; wait only for steps `max_lag_steps` old."""
        while self._pending:
            oldest = self._pending[0]
            if not self.timer.ready(oldest.end):
                if not force and len(self._pending) <= self.max_lag_steps:
                    return
                self.timer.wait(oldest.end)
            self._pending.popleft()
            self.on_resolved(self._resolve(oldest))

    def _resolve(self, p: PendingStep) -> dict[str, Any]:
        timer = self.timer
        wall_ms = timer.elapsed_ms(p.start, p.end)
        phase_ms = {name: sum(timer.elapsed_ms(a, b) for a, b in p.intervals[name]) for name in PHASE_NAMES}
        other_ms = max(0.0, wall_ms - sum(phase_ms.values()))
        record = {
            "step": p.step,
            "epoch": p.epoch,
            "t_end": round(p.t_end, 3),
            "wall_ms": round(wall_ms, 3),
            "data_ms": round(phase_ms["data"], 3),
            "forward_ms": round(phase_ms["forward"], 3),
            "backward_ms": round(phase_ms["backward"], 3),
            "optimizer_ms": round(phase_ms["optimizer"], 3),
            "other_ms": round(other_ms, 3),
            "micro_batches": p.micro_batches,
            "samples": p.samples,
            "tokens": p.tokens,
            "loss": _round_sig(_to_float(p.loss)),
            "grad_norm": _round_sig(_to_float(p.grad_norm)),
            "peak_mem_bytes": p.peak_mem_bytes,
        }
        if p.checkpoint:
            record["checkpoint"] = True
        record.update(p.extra)
        self._release(p)
        return record

    def _release(self, p: PendingStep) -> None:
        # Adjacent intervals share marks, and a step's end mark is the next step's start: recycle each mark
        # once, and the end mark only when it comes round as the start of the step after.
        seen: set[int] = {id(p.end), id(self._last_end), id(self._step_start)}
        for mark in [p.start] + [m for pairs in p.intervals.values() for pair in pairs for m in pair]:
            if id(mark) not in seen:
                seen.add(id(mark))
                self.timer.release(mark)


def _round_sig(value: float | None, digits: int = 7) -> float | None:
    if value is None:
        return None
    return float(f"{value:.{digits}g}")
