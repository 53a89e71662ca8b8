"""The metrics the training logs (val_loss, val_acc, the training loss at the logging interval), recorded at
no extra synchronization.

An adapter hands the session the values where its trainer has already reduced them (Lightning's
validation end and logging interval, the Hugging Face Trainer's logs, a loop's own call). On the training
thread `LoggedMetrics.take` never reads a device tensor's value: it stacks a read's scalar tensors (one
stack per device and dtype), starts one copy of each stack to the host without blocking (into pinned
memory, which the copy allocates) and records a CUDA event after it. The drainer's thread
(`LoggedMetrics.drain`) reads a read's values once its events have completed (a query, never a wait), and
hands them to the writer, whose bound decides what is kept (tuneup.record.writer.MetricBound). On the CPU
the stack is the host copy; its values are read on the drainer's thread as well (the same path).

A metric that is not one number (a vector, a string, a complex number) is skipped: it is no scalar metric.
So is a sharded tensor (a DTensor), whose whole value could take a collective to read.
"""

from __future__ import annotations

import numbers
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tuneup.record.schema import MetricRecord
from tuneup.target import Target

# Names that are the trainer's axes, not metrics (Lightning's loggers take "step" as the x-axis and add
# "epoch"; the Hugging Face Trainer logs "epoch" with every line), and tuneup's own figures, which it
# hands the trainer's loggers itself.
AXIS_NAMES = frozenset({"step", "epoch", "global_step"})
OWN_PREFIX = "tuneup/"


@dataclass(slots=True)
class _Read:
    """One read of the trainer's metrics: the plain numbers, and the tensors on their way to the host."""

    source: str
    step: int
    epoch: int | None
    samples: int | None
    t: float
    numbers: list[tuple[str, float]]
    # (names, a 1-d tensor of their values): on the host, or copying to it until `events` complete.
    stacks: list[tuple[list[str], Any]] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)


def _scalar(value: Any) -> float | None:
    """A host number's value (a Python or numpy scalar, a 0-d numpy array); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "size", None) == 1 and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        item = value.item()
        return float(item) if isinstance(item, numbers.Real) and not isinstance(item, bool) else None
    return None


class LoggedMetrics:
    """The metric reads of one rank's run, from the training thread (`take`) to the writer (`drain`).

    `keep(record)`: the writer's `add_metric` (True where its bound kept the value). `target`: the run's
    quality target, where one was given; `on_reached(record)` is called once, for the first kept value that
    meets it (on the thread that drains).
    """

    def __init__(
        self,
        keep: Callable[[MetricRecord], bool],
        target: Target | None = None,
        on_reached: Callable[[MetricRecord], None] | None = None,
    ) -> None:
        self._keep = keep
        self._target = target
        self._on_reached = on_reached
        self.target_reached = False
        self._reads: deque[_Read] = deque()

    @property
    def pending(self) -> int:
        return len(self._reads)

    # -- the training thread ---------------------------------------------------------------------------

    def take(
        self,
        values: Mapping[str, Any],
        source: str,
        step: int,
        epoch: int | None = None,
        samples: int | None = None,
    ) -> None:
        """Take one read of `values` (name -> a number or a scalar tensor, on any device), at `step`.
        Reads no device tensor's value: copies start here, values are read by `drain`. `source` is one of
        METRIC_SOURCES (the session checks it before it calls)."""
        read = _Read(source, int(step), epoch, samples, time.time(), [])
        groups: dict[tuple[Any, Any], tuple[list[str], list[Any]]] = {}
        for name, value in values.items():
            if type(name) is not str or name in AXIS_NAMES or name.startswith(OWN_PREFIX):
                continue
            if hasattr(value, "detach") and hasattr(value, "numel"):
                # numel and dtype are host-side properties of the tensor: no device access. A sharded
                # (DTensor) value is skipped: reading it whole could take a collective.
                dtype = value.dtype
                if dtype.is_complex or value.numel() != 1 or hasattr(value, "to_local"):
                    continue
                names, tensors = groups.setdefault((value.device, dtype), ([], []))
                names.append(name)
                tensors.append(value.reshape(()) if value.dim() else value)
                continue
            number = _scalar(value)
            if number is not None:
                read.numbers.append((name, number))
        if groups:
            self._start_copies(read, groups)
        if read.numbers or read.stacks:
            self._reads.append(read)

    @staticmethod
    def _start_copies(read: _Read, groups: dict[tuple[Any, Any], tuple[list[str], list[Any]]]) -> None:
        import torch

        for (device, _), (names, tensors) in groups.items():
            # One stack (a new tensor: a value changed in place later is not the value read now) and one
            # copy per device and dtype, however many metrics.
            stacked = torch.stack(tensors).detach()  # one detach: the few values' graph is dropped with it
            if device.type == "cuda":
                # Into pinned host memory, without blocking; the event says when the copy has landed.
                host = stacked.to("cpu", non_blocking=True)
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(device))
                read.events.append(event)
                read.stacks.append((names, host))
            else:
                # The CPU: `stacked` is the host copy. Another device (MPS, XLA): read on the drainer's
                # thread, as the step clock reads the loss there.
                read.stacks.append((names, stacked))

    # -- the drainer's thread --------------------------------------------------------------------------

    def drain(self, force: bool = False) -> None:
        """Write every read whose copies have landed, in order; `force` (the record closes): wait for them."""
        reads = self._reads
        while reads:
            read = reads[0]
            if read.events:
                if force:
                    for event in read.events:
                        event.synchronize()
                elif not all(event.query() for event in read.events):
                    return  # the next drain, a few seconds later
            reads.popleft()
            self._write(read)

    def _write(self, read: _Read) -> None:
        values = list(read.numbers)
        for names, stacked in read.stacks:
            values.extend(zip(names, (float(v) for v in stacked.tolist()), strict=True))
        target = self._target
        for name, value in values:
            record = MetricRecord(
                name=name,
                value=value,
                step=read.step,
                t=read.t,
                source=read.source,
                epoch=read.epoch,
                samples=read.samples,
            )
            kept = self._keep(record)
            if (
                kept
                and target is not None
                and not self.target_reached
                and name == target.metric
                and target.reached(value)
            ):
                self.target_reached = True
                if self._on_reached is not None:
                    self._on_reached(record)
