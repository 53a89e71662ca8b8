"""One arm of tuneup's own overhead check, for `tuneup bench`: the same ~10 ms/step CPU training with
TuneupCallback (`--with-tuneup`) or without it.

Without the callback nothing would record the run, so that arm carries `StepTimesOnly`: a callback that
reads the clock at each batch end and writes, at the end, a run record with step times only, in tuneup's
format, so `tuneup compare` reads both arms alike. Its cost per step is one clock read and one list append
(about a microsecond): a bias against tuneup, not for it.

    python tests/workloads/overhead_arm.py [--with-tuneup] [--steps 150] [--width 1024]

The run directory comes from $TUNEUP_DIR (`tuneup bench` sets it).
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from tuneup.collect.environment import capture_environment
from tuneup.plugins.lightning.introspect import dataloader_config, model_summary, trainer_config
from tuneup.record import RankWriter, write_manifest
from tuneup.record.schema import new_run_id

BATCH = 64
IN_DIM = 64


class MLP(L.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(IN_DIM, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
            torch.nn.Linear(width, 1),
        )  # fmt: skip

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=1e-4)


class StepTimesOnly(L.Callback):
    """The step times of a run without TuneupCallback, written as a run record when training ends."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.ends: list[float] = []
        self.start_unix = time.time()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.start_unix = time.time()
        self.ends.append(time.perf_counter())

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        self.ends.append(time.perf_counter())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        write_manifest(
            self.run_dir,
            {
                "run_id": new_run_id("bare"),
                "created_unix": self.start_unix,
                "world_size": 1,
                "num_nodes": 1,
                "trainer": trainer_config(trainer),
                "dataloader": dataloader_config(trainer),
                "model": model_summary(pl_module),
                "environment": capture_environment(),  # the host's CPU model: compare checks the hardware
            },
        )
        writer = RankWriter(self.run_dir, 0)
        writer.open({"host": socket.gethostname(), "start_unix": self.start_unix})
        t0 = self.ends[0]
        for step, (a, b) in enumerate(zip(self.ends, self.ends[1:], strict=False)):
            wall_ms = (b - a) * 1000.0
            # Only the whole step is timed here: the phases are not split (all of it counts as "other").
            writer.add_step(
                {"step": step, "epoch": 0, "t_end": self.start_unix + (b - t0), "wall_ms": wall_ms,
                 "samples": BATCH, "micro_batches": 1, "data_ms": 0.0, "forward_ms": 0.0, "backward_ms": 0.0,
                 "optimizer_ms": 0.0, "other_ms": wall_ms}
            )  # fmt: skip
        writer.close(status="completed")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--with-tuneup", action="store_true")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--width", type=int, default=1024, help="MLP width: ~10 ms steps on one core")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    run_dir = Path(os.environ["TUNEUP_DIR"])
    if args.with_tuneup:
        from tuneup import TuneupCallback

        callback: L.Callback = TuneupCallback()  # dirpath from $TUNEUP_DIR
    else:
        callback = StepTimesOnly(run_dir)
    x = torch.randn(BATCH * 16, IN_DIM)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=args.steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
        default_root_dir=str(run_dir.parent),
    )  # fmt: skip
    trainer.fit(MLP(args.width), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH))


if __name__ == "__main__":
    main()
