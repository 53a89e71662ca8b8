"""A Lightning Fabric training loop with a known delay in each phase (workloads.loops), recorded by tuneup's
Fabric adapter: in-process (`train(...)`), or as a script that Fabric's DDP launcher starts again per rank.

    python tests/workloads/fabric_loop.py --out RUN_DIR [--devices 2] [--steps 8] [--accumulate 2]

The loop is Fabric's own idiom, with the one line tuneup asks for (`instrument(fabric, ...)`):
`fabric.setup`, `fabric.setup_dataloaders`, `fabric.no_backward_sync` while accumulating,
`fabric.backward`, `optimizer.step()`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloads.loops import Delays, SleepySGD, _sleep_ms, make_loader
from workloads.phase_check import AlternateControlSteps
from workloads.plain_loop import Net  # the plain loop's model, its forward and backward delays in it

DEFAULT_DELAYS = Delays()


def train(
    fabric: Any,
    out: Path | str,
    steps: int,
    accumulate: int = 1,
    delays: Delays = DEFAULT_DELAYS,
    alternate_control: bool = False,
    validate_every: int = 0,
    validation_ms: float = 0.0,
    **options: Any,
) -> Any:
    """Train `steps` optimizer steps of `accumulate` micro-batches each; returns the recorder, closed.
    `alternate_control`: every odd step is a control step (workloads.phase_check.AlternateControlSteps).
    `validate_every`: after every that many steps, two validation batches (`validation_ms` each, from a
    second loader Fabric set up) and a checkpoint saved with `fabric.save`."""
    from tuneup.plugins.fabric import instrument

    recorder = instrument(fabric, dirpath=out, **options)
    model = Net(delays)
    optimizer = SleepySGD(model.parameters(), delays.optimizer_ms)
    model, optimizer = fabric.setup(model, optimizer)
    # Enough batches for every rank's steps in one epoch, and a few over.
    loader, val_loader = fabric.setup_dataloaders(
        make_loader(delays, batches=(steps * accumulate + 4) * fabric.world_size),
        make_loader(delays, batches=2 * fabric.world_size, data_ms=0.0),
    )
    control = AlternateControlSteps(recorder.session.exclude_start, recorder.session.exclude_end)
    done = 0
    for i, batch in enumerate(loader):
        stepping = (i + 1) % accumulate == 0
        with fabric.no_backward_sync(model, enabled=not stepping):
            fabric.backward(model(batch))
        if stepping:
            optimizer.step()
            optimizer.zero_grad()
            done += 1
            if alternate_control:
                control.step_ended()
            if validate_every and done % validate_every == 0:
                with torch.no_grad():
                    for val_batch in val_loader:
                        _sleep_ms(validation_ms, "validation")
                        model(val_batch)
                fabric.save(Path(out).parent / "checkpoint.pt", {"model": model})
            if done == steps:
                break
    control.close()
    recorder.close()
    return recorder


def main(argv: list[str] | None = None) -> None:
    from lightning.fabric import Fabric

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    fabric = Fabric(accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto")
    fabric.launch()
    train(fabric, args.out, args.steps, args.accumulate, Delays(2.0, 2.0, 2.0, 2.0), telemetry_interval_s=0.5)


if __name__ == "__main__":
    main()
