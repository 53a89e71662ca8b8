"""Training loops of every kind Lightning supports, with a known delay injected into each phase.

- "gan": manual optimization, two optimizers, two forwards, backwards and optimizer steps per batch
  (Lightning's own GAN example's shape: the discriminator steps, then the generator).
- "manual": manual optimization, one optimizer.
- "manual_accumulate": manual optimization stepping the optimizer every second batch.
- "automatic": automatic optimization with Trainer(accumulate_grad_batches=2).

Delays: `data_ms` in the collate function (every batch), `forward_ms` in each forward section,
`backward_ms` in each backward pass (an autograd function that sleeps), `optimizer_ms` in each
optimizer step (an SGD that sleeps). Each delay is busy-waited and recorded as it really took, with the time
of its middle (INJECTED, SLEPT_MS; `clear_injected()` before a fit), so that a test can sum the delays that fell
inside each training step's time window.

A control run of the same loop pauses where the delays are, outside the training steps
(`pauses_outside_steps`): on a machine shared with other work, the code that runs after a few milliseconds
of anything else runs several times slower than in a tight loop (its caches are cold: measured on a 2-core
VM, a small forward and backward took 0.6 ms after a 6 ms pause against 0.1 ms back to back, with or
without tuneup). A control without the pauses would not pay that, and the difference, real time of the
loop's own code in the delayed run, would read as a delay that did not come back whole.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

KINDS = ("gan", "manual", "manual_accumulate", "automatic")


@dataclass(frozen=True)
class Delays:
    data_ms: float = 8.0
    forward_ms: float = 6.0
    backward_ms: float = 10.0
    optimizer_ms: float = 5.0


# The ground truth: how long each injected delay really took, per phase (on a busy machine the thread
# can be preempted inside the wait and overrun it).
SLEPT_MS: dict[str, list[float]] = {
    "data": [],
    "forward": [],
    "backward": [],
    "optimizer": [],
    "validation": [],
    "save": [],
}


def calls_per_step(kind: str) -> dict[str, int]:
    """How many injected delays of each phase one training step holds."""
    batches = 2 if kind in ("manual_accumulate", "automatic") else 1
    passes = 2 if kind == "gan" else batches  # forwards and backwards per step
    return {"data": batches, "forward": passes, "backward": passes, "optimizer": 2 if kind == "gan" else 1}


# Every injected delay as it happened: (phase, unix time at its middle, milliseconds), to attribute each to
# the training step whose time window holds it. The middle, not the end: a step's t_end is recorded to the
# millisecond (the writer rounds unix times to 3 decimals), and a delay at the end of a step (the
# optimizer's) ends some microseconds before the step does, so its end could fall after the rounded t_end (a
# test once found only 5 of 15 optimizer delays in their step).
INJECTED: list[tuple[str, float, float]] = []


def injected_in(phase: str, start_unix: float, end_unix: float) -> float:
    """Milliseconds of `phase` delays whose middle fell inside [start_unix, end_unix]."""
    return sum(ms for p, t, ms in INJECTED if p == phase and start_unix <= t <= end_unix)


# Set by `pauses_outside_steps`: called before and after each step phase's delay, which then is a pause
# that belongs to no step (the step clock's excluded time) and is not recorded as injected.
_PAUSE_MARKS: list[tuple[Callable[[], None], Callable[[], None]]] = []
_STEP_PHASES = ("data", "forward", "backward", "optimizer")


@contextmanager
def pauses_outside_steps(start: Callable[[], None], end: Callable[[], None]) -> Iterator[None]:
    """Within it, each step phase's delay runs between `start()` and `end()` (the step clock's exclusion)."""
    _PAUSE_MARKS.append((start, end))
    try:
        yield
    finally:
        _PAUSE_MARKS.remove((start, end))


def clear_injected() -> None:
    INJECTED.clear()
    for slept in SLEPT_MS.values():
        slept.clear()


def _sleep_ms(ms: float, phase: str) -> None:
    # A busy wait, not time.sleep: a core that sleeps wakes up cold (lower clock, cold caches), and the
    # code after the sleep then runs slower, which would be counted against tuneup's accuracy.
    if ms > 0:
        marks = _PAUSE_MARKS[-1] if _PAUSE_MARKS and phase in _STEP_PHASES else None
        if marks is not None:
            marks[0]()
        start = time.perf_counter()
        end = start + ms / 1000.0
        while time.perf_counter() < end:
            pass
        took_ms = (time.perf_counter() - start) * 1000.0
        if marks is not None:
            marks[1]()
            return
        SLEPT_MS[phase].append(took_ms)
        INJECTED.append((phase, time.time() - took_ms / 2000.0, took_ms))


class _SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ms: float) -> torch.Tensor:  # type: ignore[override]
        ctx.ms = ms
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        _sleep_ms(ctx.ms, "backward")
        return grad, None


class SleepySGD(torch.optim.SGD):
    def __init__(self, params: Any, ms: float) -> None:
        super().__init__(params, lr=0.01)
        self.ms = ms

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()  # automatic optimization: forward and backward run in here
        _sleep_ms(self.ms, "optimizer")
        super().step()
        return loss


def make_loader(d: Delays, batches: int = 64, data_ms: float | None = None) -> DataLoader:
    data = TensorDataset(torch.randn(batches * 8, 16))
    delay_ms = d.data_ms if data_ms is None else data_ms

    def collate(items: list[Any]) -> torch.Tensor:
        _sleep_ms(delay_ms, "data")
        return torch.stack([x for (x,) in items])

    return DataLoader(data, batch_size=8, collate_fn=collate)


def make_module(
    namespace: str, kind: str, d: Delays, validation_ms: float = 0.0, save_ms: float = 0.0
) -> Any:
    """The loop of `kind`; `validation_ms` per validation batch, `save_ms` per checkpoint save."""
    L = importlib.import_module("lightning.pytorch" if namespace == "lightning" else "pytorch_lightning")

    class Loop(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = kind == "automatic"
            self.net = torch.nn.Linear(16, 16)
            self.critic = torch.nn.Linear(16, 1)

        def _loss(self, x: torch.Tensor, head: torch.nn.Module) -> torch.Tensor:
            _sleep_ms(d.forward_ms, "forward")
            return _SlowBackward.apply(head(self.net(x)).pow(2).mean(), d.backward_ms)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> Any:
            if kind == "automatic":
                return self._loss(batch, self.critic)
            if kind == "gan":
                opt_d, opt_g = self.optimizers()
                self.toggle_optimizer(opt_d)
                loss_d = self._loss(batch, self.critic)
                self.manual_backward(loss_d)
                opt_d.step()
                opt_d.zero_grad()
                self.untoggle_optimizer(opt_d)
                self.toggle_optimizer(opt_g)
                loss_g = self._loss(batch, torch.nn.Identity())
                self.manual_backward(loss_g)
                opt_g.step()
                opt_g.zero_grad()
                self.untoggle_optimizer(opt_g)
                return None
            opt = self.optimizers()
            loss = self._loss(batch, self.critic)
            self.manual_backward(loss)
            if kind == "manual" or (batch_idx + 1) % 2 == 0:
                opt.step()
                opt.zero_grad()
            return loss.detach()

        def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
            _sleep_ms(validation_ms, "validation")

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            _sleep_ms(save_ms, "save")  # inside trainer.save_checkpoint, as a large state's save is

        def configure_optimizers(self) -> Any:
            if kind == "gan":
                return [
                    SleepySGD(self.critic.parameters(), d.optimizer_ms),
                    SleepySGD(self.net.parameters(), d.optimizer_ms),
                ]
            return SleepySGD(self.parameters(), d.optimizer_ms)

    return Loop()


def make_trainer(
    namespace: str, kind: str, callbacks: list[Any], max_steps: int, root: str, **kw: Any
) -> Any:
    L = importlib.import_module("lightning.pytorch" if namespace == "lightning" else "pytorch_lightning")
    # max_steps counts every optimizer's steps: a GAN stepping two per batch needs twice as many.
    options: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_steps": max_steps * (2 if kind == "gan" else 1),
        "accumulate_grad_batches": 2 if kind == "automatic" else 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "default_root_dir": root,
    }
    return L.Trainer(callbacks=callbacks, **{**options, **kw})
