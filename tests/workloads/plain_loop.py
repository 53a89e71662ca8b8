"""A hand-written PyTorch training loop with a known delay in each phase (workloads.loops), recorded by
`tuneup.track`: in-process (`train(...)`), or as a script torchrun starts once per rank (DDP over gloo).

    python -m torch.distributed.run --nproc-per-node 2 tests/workloads/plain_loop.py --out RUN_DIR [--steps 8]

The loop marks its phases the plain way: `run.data(loader)`, `with run.phase(...)`, `run.step(loss=...)`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloads.loops import Delays, SleepySGD, _sleep_ms, _SlowBackward, make_loader, pauses_outside_steps


class Net(torch.nn.Module):
    """Its forward holds the forward delay, and its loss the backward delay (an autograd function)."""

    def __init__(self, delays: Delays) -> None:
        super().__init__()
        self.delays = delays
        self.net = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _sleep_ms(self.delays.forward_ms, "forward")
        return _SlowBackward.apply(self.head(self.net(x)).pow(2).mean(), self.delays.backward_ms)


def train(out: Path | str, steps: int, delays: Delays, control: bool = False, **options: Any) -> Any:
    """Train `steps` steps; returns the closed `TrackedLoop`. Under torch.distributed the model is wrapped in
    DDP. `control`: the delays are pauses outside the steps (workloads.loops.pauses_outside_steps)."""
    import tuneup

    torch.manual_seed(0)
    model: torch.nn.Module = Net(delays)
    if torch.distributed.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = SleepySGD(model.parameters(), delays.optimizer_ms)
    loader = make_loader(delays, batches=steps + 4)
    with tuneup.track(out, batch_size=8, model=model, loader=loader, **options) as run:
        pauses = (
            pauses_outside_steps(run.session.exclude_start, run.session.exclude_end)
            if control
            else contextlib.nullcontext()
        )
        with pauses:
            for x in run.data(loader):
                with run.phase("forward"):
                    loss = model(x)
                with run.phase("backward"):
                    loss.backward()
                with run.phase("optimizer"):
                    optimizer.step()
                    optimizer.zero_grad()
                run.step(loss=loss)
                if run.steps_done == steps:
                    break
    return run


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        torch.distributed.init_process_group("gloo")
    try:
        train(args.out, args.steps, Delays(2.0, 2.0, 2.0, 2.0), telemetry_interval_s=0.5)
    finally:
        if distributed:
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
