"""Overhead of `TuneupCallback` on a CPU Lightning workload, A against B in one process.

    python benchmarks/overhead.py [--repeats 7] [--quick] [--json PATH] [--skip-reference]

Arms:

    lightning   the bare Trainer (baseline)
    tuneup      + TuneupCallback() with default options, writing to a temporary directory
    monitors    + Lightning's ThroughputMonitor and DeviceStatsMonitor, for reference

at two step sizes, about 2 ms and about 10 ms per optimizer step on this machine (an MLP whose width is
calibrated at start). Every arm also carries the same timing callback, so its cost cancels out.

Interleaving: a repeat runs one `Trainer.fit` per arm, each in its own thread, in lockstep: only one fit
runs at a time, and it hands the turn to the next every 10 steps (A, B, C, A, B, C, ... milliseconds
apart; the order rotates every repeat). Why: on a shared machine the CPU's speed drifts by 10-20%
within a second, so whole fits run one after another (even 100-step turns) differ by more than the few
percent in question; 10-step turns put both arms under the same conditions.

Per fit, steady state only (the first 20% of steps, rounded up to whole blocks, are warm-up):
    wall ms/step   median over blocks of 100 steps of the block's mean step time
    paired         median over blocks of (arm's block mean / the baseline's block of the same steps,
                   which ran interleaved with it) - 1
    cpu            CPU time of the training thread per step (the sampler thread is not in it)
    fixed ms       fit() time outside the steps: Trainer construction, setup, first step, teardown
    in-hook        (tuneup arm) time inside tuneup's per-step hooks, and its ratio to the rest of the
                   step: a lower bound on the overhead that the machine's speed barely moves

Reported per step size: medians over repeats, overhead = median_arm / median_baseline - 1, and a 95%
bootstrap interval that resamples whole repeats (pairs, since the arms of one repeat ran side by side).
Goals: tuneup <= 3% at ~2 ms and <= 1% at ~10 ms.
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
SLICE_STEPS = 10
GOALS_PERCENT = {2.0: 3.0, 10.0: 1.0}
BASELINE = "lightning"
TUNEUP = "tuneup"
MONITORS = "monitors"
THROUGHPUT_MONITOR = "throughput"  # Lightning's ThroughputMonitor alone, a reference
# Arms that turn one of tuneup's default options off, to find where its cost is (--arms).
TUNEUP_VARIANTS: dict[str, dict[str, Any]] = {
    "tu-noflops": {"count_flops": False},
    "tu-notelem": {"telemetry_interval_s": 1e6},
    "tu-nolog": {"log_to_trainer": False},
    "tu-bare": {"count_flops": False, "telemetry_interval_s": 1e6, "log_to_trainer": False},
}
EXTRA_ARMS = (THROUGHPUT_MONITOR, *TUNEUP_VARIANTS)


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
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = make_net(width)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

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
    """Lets one of several threads run at a time; `pass_on` gives the turn to the next in order."""

    def __init__(self, order: Sequence[str]) -> None:
        self._cond = threading.Condition()
        self._order = list(order)
        self._turn = 0

    def wait(self, arm: str) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._order[self._turn] == arm)

    def pass_on(self, arm: str) -> None:
        with self._cond:
            self._turn = (self._order.index(arm) + 1) % len(self._order)
            self._cond.notify_all()
        self.wait(arm)

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
    """Clock readings at every batch end, and the hand-over of the turn every SLICE_STEPS steps.

    Last in the callback list, so a step's reading includes every other callback's batch end.
    """

    def __init__(self, arm: str, baton: Baton | None, hook_clock: HookClock | None) -> None:
        self.arm = arm
        self.baton = baton
        self.hook_clock = hook_clock
        self.wall_s: list[float] = []
        self.cpu_s: list[float] = []
        self.hook_s: list[float] = []
        # step index -> (wall, cpu) when this fit got the turn back just before that step
        self.resumed: dict[int, tuple[float, float]] = {}

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self.wall_s.append(time.perf_counter())
        # The training thread's own CPU time: process time would also count the other arms' threads.
        self.cpu_s.append(time.thread_time())
        if self.hook_clock is not None:
            self.hook_s.append(self.hook_clock.total_s)
        done = len(self.wall_s)
        if self.baton is not None and done % SLICE_STEPS == 0 and done < trainer.max_steps:
            self.baton.pass_on(self.arm)
            self.resumed[done] = (time.perf_counter(), time.thread_time())


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


def arm_callbacks(arm: str, run_dir: Path) -> tuple[list[Any], Any]:
    """Callbacks and logger of an arm (the timer is added by the caller)."""
    if arm == BASELINE:
        return [], False
    if arm == TUNEUP:
        return [TuneupCallback(dirpath=run_dir)], False
    if arm in TUNEUP_VARIANTS:
        return [TuneupCallback(dirpath=run_dir, **TUNEUP_VARIANTS[arm])], False
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
) -> FitResult:
    start = time.perf_counter()
    callbacks, logger = arm_callbacks(arm, run_dir)
    hook_clock = HookClock(callbacks[0]) if arm == TUNEUP or arm in TUNEUP_VARIANTS else None
    timer = StepTimer(arm, baton, hook_clock)
    torch.manual_seed(0)
    model = MLP(width)
    loader = DataLoader(PrebuiltBatches(batches, steps), batch_size=None, num_workers=0)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_epochs=1,
        callbacks=[*callbacks, timer],
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(run_dir.parent),
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
    first_block = max(1, math.ceil(warmup_steps / BLOCK_STEPS))
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
    deltas_ms.sort()
    result = FitResult(
        wall_ms_per_step=statistics.median(block_means),
        cpu_ms_per_step=steady_cpu_s * 1000.0 / n,
        median_step_ms=statistics.median(deltas_ms),
        low_step_ms=deltas_ms[n // 5],
        fixed_ms=((wall[0] - start) + (end - wall[-1])) * 1000.0,
        block_means_ms=block_means,
    )
    if hook:
        result.hook_us_per_step = steady_hook_s * 1e6 / n
        result.hook_overhead_percent = 100.0 * steady_hook_s / (steady_wall_s - steady_hook_s)
    return result


def run_repeat(
    order: Sequence[str], size: StepSize, batches: Sequence[Any], tmp: Path, repeat: int
) -> dict[str, FitResult]:
    """One fit per arm, in lockstep threads (see the module docstring)."""
    baton = Baton(order)
    results: dict[str, FitResult] = {}
    errors: list[BaseException] = []
    warmup_steps = int(size.steps * WARMUP_FRACTION)

    def work(arm: str) -> None:
        try:
            baton.wait(arm)
            run_dir = tmp / f"run-{size.target_ms:g}-{arm}-{repeat}"
            results[arm] = fit_once(arm, size.width, size.steps, batches, run_dir, warmup_steps, baton)
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


def compare(base: ArmSummary, arm: ArmSummary) -> dict[str, float]:
    b_wall, a_wall = base.values("wall_ms_per_step"), arm.values("wall_ms_per_step")
    lo, hi = bootstrap_ratio_ci(b_wall, a_wall)
    paired = paired_block_overheads(base, arm)
    return {
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
) -> dict[str, ArmSummary]:
    # One short untimed fit per arm first: imports, first-call caches and allocator growth land there.
    for arm in arms:
        fit_once(arm, size.width, 200, batches, tmp / f"warm-{size.target_ms:g}-{arm}", warmup_steps=100)
    summaries = {arm: ArmSummary() for arm in arms}
    for r in range(repeats):
        order = arms[r % len(arms) :] + arms[: r % len(arms)]
        results = run_repeat(order, size, batches, tmp, r)
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
        f"  {'arm':<10} {'wall ms/step':>12} {'[min, max]':>17} {'overhead':>9} {'95% CI':>16}"
        f" {'paired':>8} {'[min, max]':>16} {'+us/step':>9} {'cpu':>7} {'+fixed ms':>10}",
    ]
    for arm, summary in summaries.items():
        wall = summary.values("wall_ms_per_step")
        spread = f"[{min(wall):.3f}, {max(wall):.3f}]"
        head = f"  {arm:<10} {summary.median('wall_ms_per_step'):>12.3f} {spread:>17}"
        if arm == BASELINE:
            rows.append(f"{head} {'-':>9} {'-':>16} {'-':>8} {'-':>16} {'-':>9} {'-':>7} {'-':>10}")
            continue
        c = compare(base, summary)
        ci = f"[{c['ci95_low_percent']:+.1f}, {c['ci95_high_percent']:+.1f}]"
        paired = f"[{c['paired_min_percent']:+.1f}, {c['paired_max_percent']:+.1f}]"
        rows.append(
            f"{head} {c['overhead_percent']:>+8.2f}% {ci:>16} {c['paired_percent']:>+7.2f}% {paired:>16}"
            f" {c['added_us_per_step']:>+9.0f} {c['cpu_overhead_percent']:>+6.1f}% {c['added_fixed_ms']:>+10.0f}"
        )
    hooks = summaries[TUNEUP]
    us, pct = hooks.values("hook_us_per_step"), hooks.values("hook_overhead_percent")
    rows.append(
        f"  tuneup, time inside its hooks: {statistics.median(us):.1f} us/step "
        f"[{min(us):.1f}, {max(us):.1f}] = {statistics.median(pct):+.2f}% of the rest of the step "
        f"[{min(pct):+.2f}, {max(pct):+.2f}]"
    )
    return rows


def verdict(target_ms: float, c: dict[str, float], tuneup: ArmSummary) -> str:
    goal = GOALS_PERCENT[target_ms]
    hooks = statistics.median(tuneup.values("hook_overhead_percent"))
    if hooks > goal:
        # The in-hook time is a lower bound on the overhead, and far steadier than the A/B difference.
        word = "NOT met (the in-hook time alone is over it)"
    elif c["ci95_high_percent"] <= goal:
        word = "met"
    elif c["ci95_low_percent"] > goal:
        word = "NOT met"
    else:
        word = ("met" if c["overhead_percent"] <= goal else "NOT met") + " (95% interval straddles the goal)"
    return (
        f"tuneup at ~{target_ms:g} ms, goal <= {goal:g}%: {word}; A/B {c['overhead_percent']:+.2f}% "
        f"[{c['ci95_low_percent']:+.1f}, {c['ci95_high_percent']:+.1f}], paired {c['paired_percent']:+.2f}%, "
        f"in-hook {hooks:+.2f}%"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7, help="fits per arm and step size (default 7)")
    p.add_argument("--quick", action="store_true", help="3 repeats and fewer steps: a smoke run")
    p.add_argument("--json", metavar="PATH", help="also write every measurement to PATH as JSON")
    p.add_argument("--skip-reference", action="store_true", help="leave out the Lightning monitors arm")
    p.add_argument(
        "--arms",
        default="",
        help=f"more arms, comma-separated, from: {', '.join(EXTRA_ARMS)} (tu-*: tuneup with one default "
        "option off, to find where its cost is; throughput: ThroughputMonitor alone)",
    )
    p.add_argument("--sizes", default="2,10", help="step sizes in ms to measure, of 2 and 10 (default: both)")
    args = p.parse_args(argv)
    extra = [a for a in args.arms.split(",") if a]
    unknown = [a for a in extra if a not in EXTRA_ARMS]
    if unknown:
        p.error(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(EXTRA_ARMS)}")
    wanted_ms = {float(x) for x in args.sizes.split(",") if x}
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

        arms = [BASELINE, TUNEUP, *extra]
        skipped = None
        if not args.skip_reference:
            skipped = monitors_run_on_cpu(batches, tmp)
            if skipped is None:
                arms.append(MONITORS)
            else:
                log(f"note: ThroughputMonitor/DeviceStatsMonitor do not run on this CPU ({skipped}); skipped")

        results: dict[float, dict[str, ArmSummary]] = {}
        for size in sizes:
            results[size.target_ms] = run_size(size, arms, repeats, batches, tmp, log)

    elapsed = time.perf_counter() - began
    print()
    lines: list[str] = []
    for size in sizes:
        lines += [*format_table(size, results[size.target_ms]), ""]
    for size in sizes:
        arms_of = results[size.target_ms]
        lines.append(verdict(size.target_ms, compare(arms_of[BASELINE], arms_of[TUNEUP]), arms_of[TUNEUP]))
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
