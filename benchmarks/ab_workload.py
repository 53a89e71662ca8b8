"""The workload of the CI-gate trials (benchmarks/ab_trials.py): a compute-bound MLP step on CPU, recorded
with `tuneup.track`, one process or 2-rank DDP under torchrun (gloo), with an optional injected slowdown.

    python benchmarks/ab_workload.py [--steps 80] [--slowdown 0.05]
    torchrun --nproc-per-node 2 benchmarks/ab_workload.py --slowdown 0.05

`--slowdown F` makes each step slower by F of its own time, with compute: after the optimizer, the step
multiplies small matrices until F x (the step's time so far) has passed on `--slowdown-clock`: `wall`;
`cpu`, the process's CPU time (all its threads: gloo's and tuneup's sampler too); `thread`, the main
thread's CPU time, the step's own work. The three agree where a process has a core to itself. They part
where the 2 ranks of a DDP run share one core (`ab_trials.py --side-by-side`): a rank's wall step then
holds the other rank's work, and the two ranks' burns take turns, so the wall clock's 5% measured +12.8%
(12-04, one trial); the CPU clock's added 6.6-7.2% of the baseline's step in the optimizer phase (7
trials); the thread clock's added 5.4-6.7% (9 trials), and 5.2% and 5.5% of the compute workload's step.
With the DDP ranks on one core that is not what the step feels: part of the burn fills time a rank
would have waited for its partner, and the steps grew by 0-6% (12-04 night, 8 trials).
Tried and dropped: fixed work, 5% of the step's FLOPs as more rows of the first layer, which added 6.4%
of the compute step (a small matmul costs more a FLOP) and would add less than 5% to the DDP step, of
whose ~52 ms the two ranks' compute (~15 ms each, as the compute workload's step) is about 30 ms.
benchmarks/README.md has the figures.
The run directory comes from TUNEUP_DIR (as `tuneup bench` sets it).
"""

from __future__ import annotations

import argparse
import os
import time
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--slowdown", type=float, default=0.0, help="fraction of each step's time added")
    parser.add_argument(
        "--slowdown-clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="the time --slowdown is a fraction of",
    )
    args = parser.parse_args()
    clock = CLOCKS[args.slowdown_clock]
    torch.set_num_threads(1)  # one core a process: the 2-rank DDP run fills the 2-core runner
    torch.manual_seed(0)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
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
            with run.phase("forward"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            with run.phase("backward"):
                loss.backward()
            with run.phase("optimizer"):
                with torch.no_grad():
                    for p in parameters:
                        p.add_(p.grad, alpha=-0.01)
                        p.grad = None
                if args.slowdown > 0.0:
                    burn_s(args.slowdown * (clock() - started), scratch, clock)
            run.step(loss=loss)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
