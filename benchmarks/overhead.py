"""Overhead of `TuneupCallback` on a CPU Lightning workload, A against B in one process.

    python benchmarks/overhead.py [--repeats 7] [--quick] [--json PATH]
                                  [--arms a,b,...] [--sizes 2,10] [--turn-steps 2] [--accumulate 1]

Arms:

    lightning    the bare Trainer (baseline)
    tuneup       + TuneupCallback() with default options, writing to a temporary directory
    throughput   + Lightning's ThroughputMonitor alone, for reference
    tu-timed     + TuneupCallback() with its per-step hooks wrapped in a clock: the time inside them
                 (kept off the tuneup arm, which the wrapper would slow by a few us a step)
    --log-every N  every arm's model logs its loss (`self.log`) and the Trainer logs every N steps: what
                 recording the logged metrics costs shows in tu-nometrics against tuneup (issue 28)
    --arms adds: monitors (ThroughputMonitor and DeviceStatsMonitor, with a no-op logger), tu-memory
                 (tuneup recording to a memory:// URL: the spool and the upload thread),
                 lightning-aa (the baseline again: the method's noise floor), empty (a Callback with no
                 hooks: what Lightning's dispatch of one more callback costs), tu-* (tuneup with one
                 default option off, to find where its cost is)

at two step sizes, about 2 ms and about 10 ms per optimizer step on this machine (an MLP whose width is
calibrated at start). Every arm also carries the same timing callback, so its cost cancels out.

Interleaving: a repeat runs one `Trainer.fit` per arm, each in its own thread, in lockstep: only one fit
runs at a time, and it hands the turn on every `--turn-steps` steps (2 by default: milliseconds apart).
Every arm runs once per round, in an order shuffled every round. All arms of a repeat train the same
network object (one at a time), so their parameters sit in the same memory. Why each: on a shared machine
the CPU's speed drifts by 10-20% within a second, so turns must be short to share conditions; the first
step of a turn runs in the caches the previous arm left, so no arm may always follow the same one (two
identical arms differed by 1% in a fixed order); and each fit's own copy of the network ran a few
percent faster or slower for the whole fit, whatever the callbacks.

Per fit, steady state only (the first 20% of steps, rounded up to whole blocks of 100, are warm-up):
    overhead       the figure the goals are judged on: per repeat, the trimmed mean (5% off each end)
                   of log(arm's turn / baseline's turn of the same steps), a turn being the mean step
                   time of the steps run back to back; over repeats, the mean, with Student's t 95%
                   interval. Turns of the same index ran within one round, so drift cancels.
    A/B            median over repeats of the median over blocks of 100 steps of the block's mean step
                   time, against the baseline's, with a bootstrap interval (the previous method: wider)
    cpu            CPU time of the training thread per step
    bg cpu us      CPU time of tuneup's own threads (telemetry, record writer) per step of the arm; in
                   lockstep the telemetry thread samples once a second of wall time while the arm runs
                   one turn in several, so this overstates the telemetry share by about the arm count
    fixed ms       fit() time outside the steps: Trainer construction, setup, first step, teardown
    in-hook        (tu-timed arm) time inside tuneup's per-step hooks, and its ratio to the rest of the
                   step: a lower bound on the overhead that the machine's speed barely moves

Goals (issue 13): tuneup <= 2% at ~2 ms and <= 0.5% at ~10 ms, the interval's upper end <= 1.5% there.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning
import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import DeviceStatsMonitor, ThroughputMonitor
from lightning.pytorch.loggers.logger import DummyLogger
from torch.utils.data import DataLoader, Dataset

from tuneup import TuneupCallback

BATCH = 64
IN_DIM = 64
WARMUP_FRACTION = 0.2
# A multiple of both the writer's flush period (50 steps) and its window (100 steps): every block holds
# the same share of tuneup's periodic work, so a median over blocks does not hide it.
BLOCK_STEPS = 100
# Lockstep fits hand the turn on every this many steps (see run_repeat).
TURN_STEPS = 2
# accumulate_grad_batches of every fit (--accumulate): a "step" below is then a micro-batch.
ACCUMULATE = 1
# --log-every: the model logs its loss and the Trainer logs every this many steps (0: nothing logged).
LOG_EVERY_STEPS = 0
# Share of turns dropped at each end of the paired log ratios (pauses of the shared machine).
TRIM_FRACTION = 0.05
GOALS_PERCENT = {2.0: 2.0, 10.0: 0.5}
# ...and the most the 95% interval's upper end may reach for the goal to count as shown (issue 13)
CI_HIGH_GOALS_PERCENT = {2.0: 3.0, 10.0: 1.5}
BASELINE = "lightning"
TUNEUP = "tuneup"
TIMED = "tu-timed"
MONITORS = "monitors"
THROUGHPUT_MONITOR = "throughput"  # Lightning's ThroughputMonitor alone, a reference
# Arms that turn one of tuneup's default options off, to find where its cost is (--arms).
TUNEUP_VARIANTS: dict[str, dict[str, Any]] = {
    "tu-noflops": {"count_flops": False},
    "tu-notelem": {"telemetry_interval_s": 1e6},
    "tu-nolog": {"log_to_trainer": False},
    "tu-bare": {"count_flops": False, "telemetry_interval_s": 1e6, "log_to_trainer": False},
    # The gradient noise scale measures only under DDP or gradient accumulation: in this benchmark's one
    # process without accumulation it computes nothing, and this arm checks that it costs nothing either.
    "tu-nogns": {"noise_scale": False},
}
# tuneup recording to object storage: memory:// (fsspec's in-process store), so the arm measures the
# spool and the upload thread's own cost, not a network's.
UPLOAD = "tu-memory"
AA = "lightning-aa"  # the baseline again, as an arm: an A/A check of the method's noise floor
EMPTY = "empty"  # a Callback with no hooks: what Lightning's dispatch of one more callback costs


def _without_taps(callback: Any) -> None:
    # No trainer taps: no fetch marks (the gap counts as data), no optimizer-end mark, no sync marks.
    callback._install_taps = lambda trainer: None


def _without_metrics(callback: Any) -> None:
    # The logged metrics are not taken: the logger connector's tap and the validation read do nothing.
    callback._session.log_metrics = lambda *args, **kwargs: None


def _without_writing(callback: Any) -> None:
    # The writer thread drops closed steps instead of building and writing records.
    start = callback.on_train_start

    def on_train_start(trainer: Any, pl_module: Any) -> None:
        start(trainer, pl_module)
        clock = callback._clock
        if clock is not None:
            clock.drain = lambda *args, **kwargs: clock._pending.clear()

    callback.on_train_start = on_train_start


# Diagnostic arms: tuneup with one of its parts taken out by patching the instance (private attributes:
# for finding where the cost is, not options a user has).
TUNEUP_PARTS_OFF: dict[str, Callable[[Any], None]] = {
    "tu-notaps": _without_taps,
    "tu-nowrite": _without_writing,
    "tu-nometrics": _without_metrics,
}
EXTRA_ARMS = (MONITORS, AA, EMPTY, UPLOAD, *TUNEUP_VARIANTS, *TUNEUP_PARTS_OFF)


# -- workload ----------------------------------------------------------------------------------------


def make_net(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(IN_DIM, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    )


class MLP(L.LightningModule):
    def __init__(self, width: int, net: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.net = make_net(width) if net is None else net

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if LOG_EVERY_STEPS:
            self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class PrebuiltBatches(Dataset):
    """Whole batches made up front: data loading costs an index, so it cannot blur the comparison."""

    def __init__(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], length: int) -> None:
        self.batches = batches
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batches[i % len(self.batches)]


def make_batches(n: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(BATCH, IN_DIM, generator=g), torch.randn(BATCH, 1, generator=g)) for _ in range(n)]


# -- instruments -------------------------------------------------------------------------------------


class Baton:
    """Lets one of several threads run at a time; `pass_on` gives the turn to the next.

    Every arm runs once per round, and each round's order is shuffled (seeded), with no arm running twice
    in a row. Why: the first step after a hand-over runs with the caches the previous arm left, and the
    previous arm's weight showed: with a fixed cycle, two identical arms differed by over 1% because one
    always followed a heavier arm than the other.
    """

    def __init__(self, order: Sequence[str], seed: int = 0, turn_steps: int = TURN_STEPS) -> None:
        self.turn_steps = turn_steps
        self._cond = threading.Condition()
        self._rng = random.Random(seed)
        self._order = list(order)
        self._turn = 0

    def wait(self, arm: str) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._order[self._turn] == arm)

    def pass_on(self, arm: str) -> None:
        with self._cond:
            self._advance(arm)
            self._cond.notify_all()
        self.wait(arm)

    def _advance(self, arm: str) -> None:
        self._turn = self._order.index(arm) + 1
        if self._turn < len(self._order):
            return
        self._rng.shuffle(self._order)
        if len(self._order) > 1 and self._order[0] == arm:
            k = self._rng.randrange(1, len(self._order))
            self._order[0], self._order[k] = self._order[k], self._order[0]
        self._turn = 0

    def leave(self, arm: str) -> None:
        with self._cond:
            if arm not in self._order:
                return
            current = self._order[self._turn]
            i = self._order.index(arm)
            self._order.remove(arm)
            if self._order:
                self._turn = i % len(self._order) if current == arm else self._order.index(current)
            self._cond.notify_all()


class HookClock:
    """Time spent inside one callback's per-step hooks, by wrapping them on the instance.

    Why: the A/B difference is the whole cost but is a small difference of two noisy numbers. Time
    inside the hooks, against the step time of the same blocks, is a ratio of two things measured
    together, so it barely moves with the machine's speed. It misses what the callback costs outside its
    hooks (Lightning dispatching one more callback, the sampler thread, caches), which only the A/B
    figure sees. The wrapper adds about 1 us per step to the tuneup arm, a bias against tuneup.
    """

    STEP_HOOKS = (
        "on_train_batch_start",
        "on_before_zero_grad",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_train_batch_end",
    )

    def __init__(self, callback: Any) -> None:
        self.total_s = 0.0
        for name in self.STEP_HOOKS:
            # Lightning looks hooks up on the instance at every call, so an instance attribute wins.
            if getattr(type(callback), name) is not getattr(L.Callback, name):
                setattr(callback, name, self._timed(getattr(callback, name)))

    def _timed(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return hook(*args, **kwargs)
            finally:
                self.total_s += time.perf_counter() - start

        return timed


class StepTimer(L.Callback):
    """Clock readings at every batch end, and the hand-over of the turn every `baton.turn_steps` steps.

    Last in the callback list, so a step's reading includes every other callback's batch end.
    """

    def __init__(
        self,
        arm: str,
        baton: Baton | None,
        hook_clock: HookClock | None,
        background: Callable[[], list[threading.Thread]] | None = None,
        warmup_steps: int = 0,
    ) -> None:
        self.arm = arm
        self.baton = baton
        self.hook_clock = hook_clock
        self.background = background
        self.warmup_steps = warmup_steps
        self.wall_s: list[float] = []
        self.cpu_s: list[float] = []
        self.hook_s: list[float] = []
        # step index -> (wall, cpu) when this fit got the turn back just before that step
        self.resumed: dict[int, tuple[float, float]] = {}
        # CPU seconds of the arm's background threads, at the end of the warm-up and at the last step
        self.background_cpu_s: list[float] = []

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self.wall_s.append(time.perf_counter())
        # The training thread's own CPU time: process time would also count the other arms' threads.
        self.cpu_s.append(time.thread_time())
        if self.hook_clock is not None:
            self.hook_s.append(self.hook_clock.total_s)
        done = len(self.wall_s)
        batches = trainer.max_steps * ACCUMULATE  # the fit's batch ends (micro-batches under accumulation)
        if self.background is not None and done in (self.warmup_steps, batches):
            self.background_cpu_s.append(threads_cpu_s(self.background()))
        if self.baton is not None and done % self.baton.turn_steps == 0 and done < batches:
            self.baton.pass_on(self.arm)
            self.resumed[done] = (time.perf_counter(), time.thread_time())


def threads_cpu_s(threads: Sequence[threading.Thread]) -> float:
    """CPU seconds used so far by the given live threads (Linux: each thread's own CPU clock)."""
    total = 0.0
    for thread in threads:
        if thread.ident is None or not thread.is_alive():
            continue
        try:
            total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, AttributeError):  # the thread ended meanwhile; or not Linux
            continue
    return total


def tuneup_threads(callback: Any) -> list[threading.Thread]:
    """tuneup's background threads (telemetry sampler, record writer) of one callback: private
    attributes of its recording session (of the callback itself before issue 26), read by this
    benchmark only."""
    owner = getattr(callback, "_session", callback)
    sampler, drainer = getattr(owner, "_sampler", None), getattr(owner, "_drainer", None)
    found = [getattr(sampler, "_thread", None), getattr(drainer, "_thread", None)]
    return [t for t in found if isinstance(t, threading.Thread)]


# -- one fit -----------------------------------------------------------------------------------------


@dataclass
class FitResult:
    wall_ms_per_step: float
    cpu_ms_per_step: float
    median_step_ms: float
    low_step_ms: float  # 20th percentile of the steady-state step times
    fixed_ms: float
    hook_us_per_step: float | None = None  # time inside tuneup's hooks (tuneup arm only)
    # ...against the rest of the same blocks' step time: the overhead, were the hooks tuneup's only cost
    hook_overhead_percent: float | None = None
    block_means_ms: list[float] = field(default_factory=list)
    # Mean step time of each steady-state turn (turn_steps steps run back to back), by turn index: the
    # same index in every arm of a repeat ran within one round of turns, a fraction of a second apart.
    slice_means_ms: list[float] = field(default_factory=list)
    # CPU time of tuneup's own background threads (telemetry, record writer) per steady-state step
    background_cpu_us_per_step: float | None = None


def arm_callbacks(arm: str, run_dir: Path) -> tuple[list[Any], Any]:
    """Callbacks and logger of an arm (the timer is added by the caller)."""
    if arm in (BASELINE, AA):
        return [], False
    if arm in (TUNEUP, TIMED):
        return [TuneupCallback(dirpath=run_dir)], False
    if arm == UPLOAD:
        return [TuneupCallback(dirpath=f"memory://overhead/{run_dir.name}")], False
    if arm in TUNEUP_VARIANTS:
        return [TuneupCallback(dirpath=run_dir, **TUNEUP_VARIANTS[arm])], False
    if arm in TUNEUP_PARTS_OFF:
        callback = TuneupCallback(dirpath=run_dir)
        TUNEUP_PARTS_OFF[arm](callback)
        return [callback], False
    if arm == EMPTY:
        return [L.Callback()], False
    if arm == THROUGHPUT_MONITOR:
        return [ThroughputMonitor(batch_size_fn=lambda b: b[0].shape[0])], DummyLogger()
    if arm == MONITORS:
        # DeviceStatsMonitor refuses a Trainer without a logger; a logger that drops everything keeps the
        # arm about the monitors themselves, not about a logger's I/O.
        return [
            ThroughputMonitor(batch_size_fn=lambda b: b[0].shape[0]),
            DeviceStatsMonitor(),
        ], DummyLogger()
    raise ValueError(f"unknown arm {arm!r}")


def fit_once(
    arm: str,
    width: int,
    steps: int,
    batches: Sequence[Any],
    run_dir: Path,
    warmup_steps: int,
    baton: Baton | None = None,
    net: torch.nn.Module | None = None,
) -> FitResult:
    start = time.perf_counter()
    callbacks, logger = arm_callbacks(arm, run_dir)
    is_tuneup = arm in (TUNEUP, TIMED) or arm in TUNEUP_VARIANTS or arm in TUNEUP_PARTS_OFF
    hook_clock = HookClock(callbacks[0]) if arm == TIMED else None
    first_block = max(1, math.ceil(warmup_steps / BLOCK_STEPS))
    timer = StepTimer(
        arm,
        baton,
        hook_clock,
        background=(lambda: tuneup_threads(callbacks[0])) if is_tuneup else None,
        warmup_steps=first_block * BLOCK_STEPS,
    )
    torch.manual_seed(0)
    model = MLP(width, net)
    loader = DataLoader(PrebuiltBatches(batches, steps), batch_size=None, num_workers=0)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps // ACCUMULATE,
        accumulate_grad_batches=ACCUMULATE,
        max_epochs=1,
        callbacks=[*callbacks, timer],
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(run_dir.parent),
        log_every_n_steps=LOG_EVERY_STEPS or 50,
    )
    trainer.fit(model, loader)
    end = time.perf_counter()

    wall, cpu, hook = timer.wall_s, timer.cpu_s, timer.hook_s
    if len(wall) != steps:
        raise RuntimeError(f"{arm}: expected {steps} batch ends, timed {len(wall)}")
    # Why a median of block means: the mean over all steps keeps tuneup's periodic work (a flush every 50
    # steps, a window every 100) but also every pause the shared machine inflicts; a per-step median drops
    # the pauses but hides the periodic work too. A block of 100 steps holds the periodic work, and the
    # median across blocks drops the few blocks a pause landed in.
    block_means: list[float] = []
    deltas_ms: list[float] = []
    steady_wall_s = steady_cpu_s = steady_hook_s = 0.0
    for b in range(first_block, steps // BLOCK_STEPS):
        block_s = 0.0
        for i in range(b * BLOCK_STEPS, (b + 1) * BLOCK_STEPS):
            # A step starts at the previous batch end, or where this fit got the turn back.
            wall_0, cpu_0 = timer.resumed.get(i, (wall[i - 1], cpu[i - 1]))
            block_s += wall[i] - wall_0
            deltas_ms.append((wall[i] - wall_0) * 1000.0)
            steady_cpu_s += cpu[i] - cpu_0
            if hook:
                steady_hook_s += hook[i] - hook[i - 1]
        block_means.append(block_s * 1000.0 / BLOCK_STEPS)
        steady_wall_s += block_s
    if not block_means:
        raise ValueError(f"{steps} steps leave no steady-state block of {BLOCK_STEPS} after the warm-up")
    n = len(deltas_ms)
    steady_deltas_ms = list(deltas_ms)
    turn = baton.turn_steps if baton is not None else TURN_STEPS
    slice_means = [statistics.fmean(steady_deltas_ms[j : j + turn]) for j in range(0, n, turn)]
    deltas_ms.sort()
    result = FitResult(
        wall_ms_per_step=statistics.median(block_means),
        cpu_ms_per_step=steady_cpu_s * 1000.0 / n,
        median_step_ms=statistics.median(deltas_ms),
        low_step_ms=deltas_ms[n // 5],
        fixed_ms=((wall[0] - start) + (end - wall[-1])) * 1000.0,
        block_means_ms=block_means,
        slice_means_ms=slice_means,
    )
    if len(timer.background_cpu_s) == 2:
        result.background_cpu_us_per_step = (timer.background_cpu_s[1] - timer.background_cpu_s[0]) * 1e6 / n
    if hook:
        result.hook_us_per_step = steady_hook_s * 1e6 / n
        result.hook_overhead_percent = 100.0 * steady_hook_s / (steady_wall_s - steady_hook_s)
    return result


def run_repeat(
    order: Sequence[str], size: StepSize, batches: Sequence[Any], tmp: Path, repeat: int, turn_steps: int
) -> dict[str, FitResult]:
    """One fit per arm, in lockstep threads (see the module docstring)."""
    baton = Baton(order, seed=repeat, turn_steps=turn_steps)
    results: dict[str, FitResult] = {}
    errors: list[BaseException] = []
    warmup_steps = int(size.steps * WARMUP_FRACTION)
    # Every arm of a repeat trains the same network, its parameters in the same memory (one arm at a
    # time): fits with their own copies differed by a few percent that held for the whole fit, in every
    # arm alike, whatever the callbacks (where each copy's tensors fell in memory), and that offset, not
    # the machine's drift, set the width of the intervals.
    torch.manual_seed(0)
    shared_net = make_net(size.width)

    def work(arm: str) -> None:
        try:
            baton.wait(arm)
            run_dir = tmp / f"run-{size.target_ms:g}-{arm}-{repeat}"
            results[arm] = fit_once(
                arm, size.width, size.steps, batches, run_dir, warmup_steps, baton, net=shared_net
            )
        except BaseException as exc:
            errors.append(exc)
        finally:
            baton.leave(arm)

    # Garbage of the previous repeat would otherwise be collected inside this one's blocks.
    gc.collect()
    threads = [threading.Thread(target=work, args=(arm,), name=f"bench-{arm}", daemon=True) for arm in order]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


# -- calibration -------------------------------------------------------------------------------------


def plain_step_ms(width: int, steps: int = 30) -> float:
    """Time of one optimizer step of the bare model, without Lightning (20th percentile of `steps`)."""
    torch.manual_seed(0)
    net = make_net(width)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x, y = make_batches(1)[0]
    times: list[float] = []
    for i in range(steps + 5):
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        if i >= 5:
            times.append(time.perf_counter() - t0)
    times.sort()
    # A low percentile, not the median: on a shared machine the calibration must not read a slow
    # moment as the model's cost and choose too small a model.
    return times[len(times) // 5] * 1000.0


def width_for(target_ms: float) -> tuple[int, float]:
    """The width (a multiple of 16) whose bare step is closest to `target_ms`, by bisection."""
    lo, hi = 1, 256  # in units of 16
    found: dict[int, float] = {}
    while lo < hi:
        mid = (lo + hi) // 2
        found[mid] = plain_step_ms(16 * mid)
        if found[mid] < target_ms:
            lo = mid + 1
        else:
            hi = mid
    for unit in (lo - 1, lo):
        if unit >= 1 and unit not in found:
            found[unit] = plain_step_ms(16 * unit)
    best = min(found, key=lambda u: abs(found[u] - target_ms))
    return 16 * best, found[best]


def lightning_cost_ms(batches: Sequence[Any], tmp: Path) -> float:
    """What the bare Trainer adds per step to the bare model, measured on a tiny model."""
    result = fit_once(BASELINE, 16, 300, batches, tmp / "calibrate", warmup_steps=100)
    # Both sides at the same low percentile, for the reason given in plain_step_ms.
    return max(0.0, result.low_step_ms - plain_step_ms(16, steps=100))


# -- statistics --------------------------------------------------------------------------------------


def bootstrap_ratio_ci(
    base: Sequence[float], arm: Sequence[float], n: int = 4000, seed: int = 0
) -> tuple[float, float]:
    """95% interval of median(arm)/median(base) - 1, resampling repeat indices (each a pair)."""
    rng = random.Random(seed)
    idx = range(len(base))
    ratios = []
    for _ in range(n):
        pick = [rng.choice(idx) for _ in idx]
        ratios.append(
            statistics.median(arm[i] for i in pick) / statistics.median(base[i] for i in pick) - 1.0
        )
    ratios.sort()
    return ratios[int(0.025 * n)], ratios[int(0.975 * n) - 1]


@dataclass
class ArmSummary:
    runs: list[FitResult] = field(default_factory=list)

    def values(self, name: str) -> list[float]:
        return [getattr(r, name) for r in self.runs]

    def median(self, name: str) -> float:
        return statistics.median(self.values(name))


def paired_block_overheads(base: ArmSummary, arm: ArmSummary) -> list[float]:
    """Per repeat: median over blocks of arm/baseline - 1, each block against its lockstep partner."""
    return [
        statistics.median(a / b - 1.0 for a, b in zip(ra.block_means_ms, rb.block_means_ms, strict=True))
        for ra, rb in zip(arm.runs, base.runs, strict=True)
    ]


def trimmed_mean(values: Sequence[float], cut: float = TRIM_FRACTION) -> float:
    """Mean of `values` without the lowest and highest `cut` share of them."""
    ordered = sorted(values)
    k = int(len(ordered) * cut)
    return statistics.fmean(ordered[k : len(ordered) - k] or ordered)


def turn_log_ratios(base: FitResult, arm: FitResult) -> list[float]:
    """log(arm's turn / the baseline's turn of the same steps), for every steady-state turn of one repeat."""
    return [math.log(a / b) for a, b in zip(arm.slice_means_ms, base.slice_means_ms, strict=True)]


# Two-sided 95% quantiles of Student's t by degrees of freedom (repeats - 1); 1.96 beyond the table.
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
       12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04}  # fmt: skip


def t95(df: int) -> float:
    return T95.get(df) or next((T95[k] for k in sorted(T95) if k >= df), 1.96)


def turn_paired(base: ArmSummary, arm: ArmSummary) -> tuple[float, float, float]:
    """The overhead from turns paired in time, with a 95% interval over repeats.

    Per repeat: the trimmed mean of the log ratios of its turns (a turn of the arm against the
    baseline's turn of the same steps, run a fraction of a second apart, so the machine's drift cancels;
    trimming drops the turns a pause of the machine landed in, on either side alike). Over repeats: their
    mean, with Student's t interval (a bootstrap of 5 to 7 values is too narrow: the A/A arm showed it).
    """
    per_repeat = [trimmed_mean(turn_log_ratios(b, a)) for b, a in zip(base.runs, arm.runs, strict=True)]
    estimate = statistics.fmean(per_repeat)
    half = t95(len(per_repeat) - 1) * statistics.stdev(per_repeat) / math.sqrt(len(per_repeat))
    return math.expm1(estimate), math.expm1(estimate - half), math.expm1(estimate + half)


def compare(base: ArmSummary, arm: ArmSummary) -> dict[str, float]:
    b_wall, a_wall = base.values("wall_ms_per_step"), arm.values("wall_ms_per_step")
    lo, hi = bootstrap_ratio_ci(b_wall, a_wall)
    paired = paired_block_overheads(base, arm)
    turns, turns_lo, turns_hi = turn_paired(base, arm)
    background = [r.background_cpu_us_per_step for r in arm.runs if r.background_cpu_us_per_step is not None]
    return {
        "turns_percent": 100.0 * turns,
        "turns_ci95_low_percent": 100.0 * turns_lo,
        "turns_ci95_high_percent": 100.0 * turns_hi,
        "background_cpu_us_per_step": statistics.median(background) if background else math.nan,
        "overhead_percent": 100.0 * (statistics.median(a_wall) / statistics.median(b_wall) - 1.0),
        "ci95_low_percent": 100.0 * lo,
        "ci95_high_percent": 100.0 * hi,
        "paired_percent": 100.0 * statistics.median(paired),
        "paired_min_percent": 100.0 * min(paired),
        "paired_max_percent": 100.0 * max(paired),
        "added_us_per_step": 1000.0 * (statistics.median(a_wall) - statistics.median(b_wall)),
        "cpu_overhead_percent": 100.0
        * (arm.median("cpu_ms_per_step") / base.median("cpu_ms_per_step") - 1.0),
        "added_cpu_us_per_step": 1000.0 * (arm.median("cpu_ms_per_step") - base.median("cpu_ms_per_step")),
        "added_fixed_ms": arm.median("fixed_ms") - base.median("fixed_ms"),
    }


# -- the benchmark -----------------------------------------------------------------------------------


@dataclass
class StepSize:
    target_ms: float
    steps: int
    width: int = 0
    plain_ms: float = 0.0


def quiet_lightning() -> None:
    # Every fit would print the same banners and PossibleUserWarnings; tuneup's own warnings stay visible.
    # pytorch_lightning too: TuneupCallback imports it, and its import redirects Lightning's rank-zero
    # messages to its own logger.
    for name in (
        "lightning.pytorch",
        "lightning.fabric",
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"lightning\..*")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")


def run_size(
    size: StepSize,
    arms: list[str],
    repeats: int,
    batches: Sequence[Any],
    tmp: Path,
    log: Callable[[str], None],
    turn_steps: int = TURN_STEPS,
) -> dict[str, ArmSummary]:
    # One short untimed fit per arm first: imports, first-call caches and allocator growth land there.
    for arm in arms:
        fit_once(arm, size.width, 200, batches, tmp / f"warm-{size.target_ms:g}-{arm}", warmup_steps=100)
    summaries = {arm: ArmSummary() for arm in arms}
    for r in range(repeats):
        order = arms[r % len(arms) :] + arms[: r % len(arms)]
        results = run_repeat(order, size, batches, tmp, r, turn_steps)
        for arm in arms:
            summaries[arm].runs.append(results[arm])
        line = ", ".join(f"{arm} {results[arm].wall_ms_per_step:.3f}" for arm in order)
        log(f"  ~{size.target_ms:g} ms repeat {r + 1}/{repeats}: {line} ms/step")
    return summaries


def monitors_run_on_cpu(batches: Sequence[Any], tmp: Path) -> str | None:
    """None if the reference monitors run on this CPU machine, else why not."""
    try:
        fit_once(MONITORS, 16, 200, batches, tmp / "monitors-probe", warmup_steps=100)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def format_table(size: StepSize, summaries: dict[str, ArmSummary]) -> list[str]:
    base = summaries[BASELINE]
    first_block = max(1, math.ceil(size.steps * WARMUP_FRACTION / BLOCK_STEPS))
    rows = [
        f"~{size.target_ms:g} ms/step: MLP {IN_DIM}-{size.width}-{size.width}-1, batch {BATCH}, "
        f"{size.steps} steps/fit, {len(base.runs)} repeats, steps {first_block * BLOCK_STEPS}+ timed",
        f"  {'arm':<10} {'wall ms/step':>12} {'overhead':>9} {'95% CI':>14} {'A/B':>8} {'95% CI':>14}"
        f" {'+us/step':>9} {'cpu':>7} {'bg cpu us':>9} {'+fixed ms':>10}",
    ]
    for arm, summary in summaries.items():
        head = f"  {arm:<10} {summary.median('wall_ms_per_step'):>12.3f}"
        if arm == BASELINE:
            rows.append(f"{head} {'-':>9} {'-':>14} {'-':>8} {'-':>14} {'-':>9} {'-':>7} {'-':>9} {'-':>10}")
            continue
        c = compare(base, summary)
        turns_ci = f"[{c['turns_ci95_low_percent']:+.2f}, {c['turns_ci95_high_percent']:+.2f}]"
        ab_ci = f"[{c['ci95_low_percent']:+.1f}, {c['ci95_high_percent']:+.1f}]"
        bg = c["background_cpu_us_per_step"]
        bg_text = "-" if math.isnan(bg) else f"{bg:.1f}"
        rows.append(
            f"{head} {c['turns_percent']:>+8.2f}% {turns_ci:>14} {c['overhead_percent']:>+7.2f}% {ab_ci:>14}"
            f" {c['added_us_per_step']:>+9.0f} {c['cpu_overhead_percent']:>+6.1f}% {bg_text:>9}"
            f" {c['added_fixed_ms']:>+10.0f}"
        )
    hooks = summaries.get(TIMED)
    if hooks is None:
        return rows
    us, pct = hooks.values("hook_us_per_step"), hooks.values("hook_overhead_percent")
    rows.append(
        f"  tuneup, time inside its hooks: {statistics.median(us):.1f} us/step "
        f"[{min(us):.1f}, {max(us):.1f}] = {statistics.median(pct):+.2f}% of the rest of the step "
        f"[{min(pct):+.2f}, {max(pct):+.2f}]"
    )
    return rows


def verdict(target_ms: float, c: dict[str, float], timed: ArmSummary | None) -> str:
    goal, goal_high = GOALS_PERCENT[target_ms], CI_HIGH_GOALS_PERCENT[target_ms]
    hooks = statistics.median(timed.values("hook_overhead_percent")) if timed is not None else math.nan
    estimate, low, high = c["turns_percent"], c["turns_ci95_low_percent"], c["turns_ci95_high_percent"]
    if estimate <= goal and high <= goal_high:
        word = "met"
    elif low > goal:
        word = "NOT met"
    else:
        word = "NOT met (not shown: the interval is too wide or the estimate over the goal)"
    return (
        f"tuneup at ~{target_ms:g} ms, goal <= {goal:g}% with the interval's upper end <= {goal_high:g}%: "
        f"{word}; paired turns {estimate:+.2f}% [{low:+.2f}, {high:+.2f}], A/B {c['overhead_percent']:+.2f}% "
        f"[{c['ci95_low_percent']:+.1f}, {c['ci95_high_percent']:+.1f}], in-hook {hooks:+.2f}%"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7, help="fits per arm and step size (default 7)")
    p.add_argument("--quick", action="store_true", help="3 repeats and fewer steps: a smoke run")
    p.add_argument("--json", metavar="PATH", help="also write every measurement to PATH as JSON")
    p.add_argument(
        "--arms",
        default="",
        help=f"more arms, comma-separated, from: {', '.join(EXTRA_ARMS)} (tu-*: tuneup with one default "
        "option off, to find where its cost is; empty: a Callback with no hooks)",
    )
    p.add_argument(
        "--turn-steps",
        type=int,
        default=TURN_STEPS,
        help=f"steps a fit runs before handing the turn on (default {TURN_STEPS})",
    )
    p.add_argument("--sizes", default="2,10", help="step sizes in ms to measure, of 2 and 10 (default: both)")
    p.add_argument(
        "--accumulate",
        type=int,
        default=1,
        help="accumulate_grad_batches (default 1); with 2 or more, tuneup measures the gradient noise scale, "
        "and the step sizes and figures are per micro-batch",
    )
    p.add_argument(
        "--log-every",
        type=int,
        default=0,
        metavar="N",
        help="the model logs its loss and the Trainer logs every N steps (default 0: nothing logged); with "
        "--arms tu-nometrics, what tuneup's recording of the logged metrics costs",
    )
    args = p.parse_args(argv)
    global ACCUMULATE, LOG_EVERY_STEPS
    if args.log_every < 0:
        p.error("--log-every must be 0 (no logging) or a number of steps")
    LOG_EVERY_STEPS = args.log_every
    if args.accumulate < 1 or BLOCK_STEPS % args.accumulate:
        p.error(f"--accumulate must divide {BLOCK_STEPS}")
    ACCUMULATE = args.accumulate
    extra = [a for a in args.arms.split(",") if a]
    unknown = [a for a in extra if a not in EXTRA_ARMS]
    if unknown:
        p.error(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(EXTRA_ARMS)}")
    wanted_ms = {float(x) for x in args.sizes.split(",") if x}
    if args.turn_steps < 1 or BLOCK_STEPS % args.turn_steps:
        p.error(f"--turn-steps must divide {BLOCK_STEPS}, the block the figures are taken over")
    if args.repeats < 2:
        p.error("--repeats must be at least 2")
    repeats = 3 if args.quick else args.repeats
    sizes = [StepSize(2.0, 500 if args.quick else 1000), StepSize(10.0, 300 if args.quick else 500)]
    sizes = [size for size in sizes if size.target_ms in wanted_ms]
    if not sizes:
        p.error("--sizes must name 2, 10 or both")

    quiet_lightning()
    # One intra-op thread: the second core is left to tuneup's sampler thread and the OS, as on a node
    # where every core has a rank.
    torch.set_num_threads(1)
    began = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - began:6.1f} s] {msg}", flush=True)

    batches = make_batches()
    with tempfile.TemporaryDirectory(prefix="tuneup-bench-") as tmp_name:
        tmp = Path(tmp_name)
        lightning_ms = lightning_cost_ms(batches, tmp)
        log(f"calibration: Lightning adds {lightning_ms:.3f} ms per step to the bare model")
        for size in sizes:
            # The target is the whole Lightning step, so the bare model gets what Lightning leaves of it.
            size.width, size.plain_ms = width_for(max(0.2, size.target_ms - lightning_ms))
            log(
                f"calibration: ~{size.target_ms:g} ms -> MLP {IN_DIM}-{size.width}-{size.width}-1, "
                f"batch {BATCH}: bare step {size.plain_ms:.3f} ms"
            )

        arms = [BASELINE, TUNEUP, THROUGHPUT_MONITOR, TIMED, *extra]
        skipped = None
        if MONITORS in arms:
            skipped = monitors_run_on_cpu(batches, tmp)
            if skipped is not None:
                arms.remove(MONITORS)
                log(f"note: ThroughputMonitor/DeviceStatsMonitor do not run on this CPU ({skipped}); skipped")

        results: dict[float, dict[str, ArmSummary]] = {}
        for size in sizes:
            results[size.target_ms] = run_size(size, arms, repeats, batches, tmp, log, args.turn_steps)

    elapsed = time.perf_counter() - began
    print()
    lines: list[str] = []
    for size in sizes:
        lines += [*format_table(size, results[size.target_ms]), ""]
    for size in sizes:
        arms_of = results[size.target_ms]
        lines.append(verdict(size.target_ms, compare(arms_of[BASELINE], arms_of[TUNEUP]), arms_of.get(TIMED)))
    if MONITORS in arms:
        lines.append(
            "monitors = ThroughputMonitor(batch_size_fn) + DeviceStatsMonitor(), with a no-op logger "
            "(DeviceStatsMonitor needs one); both log every 50 steps"
        )
    lines.append(
        f"total {elapsed:.0f} s on {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"lightning {lightning.__version__}, python {platform.python_version()}"
    )
    print("\n".join(lines))

    if args.json:
        out = {
            "config": {
                "repeats": repeats,
                "quick": args.quick,
                "batch": BATCH,
                "in_dim": IN_DIM,
                "warmup_fraction": WARMUP_FRACTION,
                "block_steps": BLOCK_STEPS,
                "arms": arms,
                "monitors_skipped": skipped,
                "lightning_cost_ms": lightning_ms,
                "turn_steps": args.turn_steps,
            },
            "machine": {
                "cpus": os.cpu_count(),
                "torch": torch.__version__,
                "lightning": lightning.__version__,
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "sizes": [
                {
                    **asdict(size),
                    "arms": {arm: [asdict(r) for r in s.runs] for arm, s in results[size.target_ms].items()},
                    "against_baseline": {
                        arm: compare(results[size.target_ms][BASELINE], s)
                        for arm, s in results[size.target_ms].items()
                        if arm != BASELINE
                    },
                }
                for size in sizes
            ],
            "elapsed_s": elapsed,
        }
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
