"""The workload of the CI-gate trials (benchmarks/ab_trials.py): a compute-bound MLP step on CPU, recorded
with `tuneup.track`, one process or 2-rank DDP under torchrun (gloo), with an optional injected slowdown.

    python benchmarks/ab_workload.py [--steps 80] [--slowdown 0.05]
    torchrun --nproc-per-node 2 benchmarks/ab_workload.py --slowdown 0.05

`--slowdown F` makes each step slower by F of its own time, by default with compute (`--slowdown-by
burn`): after the optimizer, the step multiplies small matrices until F x (the step's time so far) has
passed on `--slowdown-clock`: `wall`; `cpu`, the process's CPU time (all its threads: gloo's and
tuneup's sampler too); `thread`, the main thread's CPU time, the step's own work. The three agree where
a process has a core to itself, and there the wall clock's burn lands where it runs: 5.2-5.5% of the
compute step side by side, 5.0-5.2% of the DDP step one after another with `--pin-rank` (12-04, 5 trials).
Where the 2 ranks of a DDP run share one core (`ab_trials.py --side-by-side`) no injection tried lands
as F on the step: a rank's wall step holds the other rank's work, so the wall clock's 5% measured
+12.8% (one trial); the CPU clock's added 6.6-7.2% of the step in the optimizer phase (7 trials); the
thread clock's 5.4-6.7%, but part of it filled time a rank would have waited for its partner, and the
steps grew by 0-6% (9 trials). `--slowdown-by stall`, a wait the ranks share (a slower collective, a
host sync): right after backward the ranks tell each other when they got there (an all-reduce of the
time) and each sleeps until F x the step's time without the stall (the median of the last 9 steps)
after the later one arrived; what a stall over- or undershoots is owed to the next. Side by side the
steps grew by 3.9-4.7% in 6 of 7 trials and 1.6% in one; one after another (a core a rank), 6.0%
(one trial). A plain sleep on each rank (60cf6e7) added only the overlap of the two ranks' sleeps.
`--pin-rank` puts each rank, and the threads it starts, on one CPU of those it may use (its local
rank's): one after another, the DDP blocks then varied by sd 0.027 where unpinned ones varied by 0.063.
Tried and dropped: fixed work, 5% of the step's FLOPs as more rows of the first layer, which added 6.4%
of the compute step (a small matmul costs more a FLOP) and would add less than 5% to the DDP step, of
whose ~52 ms the two ranks' compute (~15 ms each, as the compute workload's step) is about 30 ms.
benchmarks/README.md has the figures.
The run directory comes from TUNEUP_DIR (as `tuneup bench` sets it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import deque
from collections.abc import Callable

import torch
import torch.distributed as dist

import tuneup

WIDTH = int(os.environ.get("ABW_WIDTH", "768"))
DEPTH = 4
BATCH = int(os.environ.get("ABW_BATCH", "64"))


# The clocks --slowdown can be a fraction of (the module's docstring says what each counts and why).
CLOCKS: dict[str, Callable[[], float]] = {
    "wall": time.perf_counter,
    "cpu": time.process_time,
    "thread": time.thread_time,
}


def burn_s(seconds: float, scratch: torch.Tensor, clock: Callable[[], float]) -> None:
    """Compute (small matmuls) until `seconds` of `clock` have passed."""
    end = clock() + seconds
    while clock() < end:
        torch.mm(scratch, scratch)


class SharedStall:
    """`--slowdown-by stall`: `fraction` of the step's own time (without the stall), waited by every rank
    together after backward."""

    def __init__(self, fraction: float, distributed: bool) -> None:
        self.fraction = fraction
        self.distributed = distributed
        self.recent_s: deque[float] = deque(maxlen=9)  # the last steps' times without their stall
        self.owed_s = 0.0  # what the stalls so far fell short of (negative: overshot)
        self.steps_begun = 0
        self.step_started_s = 0.0  # time.perf_counter at the step's start
        self.stalled_s = 0.0  # the step's stall so far

    def begin_step(self) -> None:
        now = time.perf_counter()
        if self.steps_begun >= 2:  # the first step holds the process's one-time costs
            self.recent_s.append(now - self.step_started_s - self.stalled_s)
        self.steps_begun += 1
        self.step_started_s, self.stalled_s = now, 0.0

    def stall(self) -> None:
        """Wait this step's share from when the last rank arrived. The step's time to now is the
        reference until a whole step has been timed."""
        so_far_s = time.perf_counter() - self.step_started_s
        reference_s = statistics.median(self.recent_s) if self.recent_s else so_far_s
        target_s = self.fraction * reference_s + self.owed_s
        # time.monotonic is the host's one clock (CLOCK_MONOTONIC), so the ranks' readings compare.
        arrived = torch.tensor([time.monotonic()], dtype=torch.float64)
        if self.distributed:
            dist.all_reduce(arrived, op=dist.ReduceOp.MAX)
        last_arrival = float(arrived.item())
        remaining_s = last_arrival + target_s - time.monotonic()
        if remaining_s > 0.0:
            time.sleep(remaining_s)
        self.stalled_s = time.monotonic() - last_arrival
        self.owed_s = target_s - self.stalled_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--slowdown", type=float, default=0.0, help="fraction of each step's time added")
    parser.add_argument(
        "--slowdown-clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="the time --slowdown is a fraction of (the burn's)",
    )
    parser.add_argument(
        "--slowdown-by",
        choices=("burn", "stall"),
        default="burn",
        help="compute after the optimizer, or a wait all ranks take together after backward (wall clock)",
    )
    parser.add_argument(
        "--pin-rank",
        action="store_true",
        help="each rank on its own CPU of those it may use (its local rank's), its threads with it",
    )
    args = parser.parse_args()
    if args.pin_rank:  # before any thread starts: the threads started later (gloo's, tuneup's) inherit it
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(os.environ.get("LOCAL_RANK", "0")) % len(cpus)]})
    if args.slowdown_by == "stall" and args.slowdown_clock != "wall":
        parser.error("--slowdown-by stall is a share of the step's wall time: leave out --slowdown-clock")
    clock = CLOCKS[args.slowdown_clock]
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    stall = (
        SharedStall(args.slowdown, distributed)
        if args.slowdown > 0.0 and args.slowdown_by == "stall"
        else None
    )
    burn = args.slowdown if args.slowdown_by == "burn" else 0.0
    torch.set_num_threads(1)  # one core a process: the 2-rank DDP run fills the 2-core runner
    torch.manual_seed(0)
    if distributed:
        dist.init_process_group("gloo")
    layers: list[torch.nn.Module] = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model: torch.nn.Module = torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 10))
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    # Plain SGD by hand, meant to spare the runs torch._dynamo's import (torch.optim's first step() does
    # it). It does not: tuneup's FLOP count (FlopCounterMode, at the first step) imports it too, 1.2 s at
    # that step and 0.5 s more at exit, as Lightning (at import) and torch.optim would in a real job. Kept
    # so that the trials of every commit ran the same workload.
    parameters = list(model.parameters())
    x, y = torch.randn(BATCH, WIDTH), torch.randint(0, 10, (BATCH,))
    scratch = torch.randn(32, 32)
    # Both sides run the slowdown's matmul once, so that the candidate differs in time only: the first
    # call of a code path can raise the process's peak memory, and 5 of the 11 slowdown trials at d0bafc8
    # flagged peak memory beside the step time.
    torch.mm(scratch, scratch)
    with tuneup.track(batch_size=BATCH, model=model, tags={"workload": "ab-trials"}) as run:
        for _ in range(args.steps):
            started = clock()
            if stall is not None:
                stall.begin_step()
            with run.phase("forward"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            with run.phase("backward"):
                loss.backward()
            with run.phase("optimizer"):
                if stall is not None:
                    stall.stall()
                with torch.no_grad():
                    for p in parameters:
                        p.add_(p.grad, alpha=-0.01)
                        p.grad = None
                if burn > 0.0:
                    burn_s(burn * (clock() - started), scratch, clock)
            run.step(loss=loss)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
