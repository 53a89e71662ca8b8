"""A small workload for `tuneup tune`: an MLP on synthetic data whose knobs matter, in both namespaces.

- The datamodule has `batch_size` and `num_workers` attributes (Lightning's conventions), so a trial's
  settings reach the DataLoader.
- `item_cost_us` busy-waits in `__getitem__`: loading is CPU work that worker processes take off the
  training loop, as decoding images is.
- `hidden` sets the gradient's size: under DDP the all-reduce grows with it.
- Under ModelParallelStrategy, `configure_model` shards the MLP with FSDP2 (`fully_shard` per Linear).

`make_gan` is a two-optimizer loop (manual optimization, as Lightning's GAN example): Lightning's
global_step, which max_steps counts, moves by two per batch.

Faults for the tuner's tests, by environment variable (the trial's name, "NN-...", is in TUNEUP_TRIAL):
    TUNE_FAIL_TRIAL=NN, TUNE_FAIL_RANK=R   raise in training_step on rank R in trial number NN, at step 3
    TUNE_HANG_TRIAL=NN, TUNE_HANG_RANK=R   sleep for an hour instead
    TUNE_OOM_BATCH=B                          raise torch.OutOfMemoryError for batch sizes >= B
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset


class SyntheticData(Dataset):
    def __init__(self, n: int, features: int, item_cost_us: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, features, generator=g)
        self.y = self.x[:, :1].clone()
        self.item_cost_s = item_cost_us / 1e6

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        if self.item_cost_s:
            end = time.perf_counter() + self.item_cost_s
            while time.perf_counter() < end:
                pass
        return self.x[i], self.y[i]


def _trial_name() -> str:
    text = os.environ.get("TUNEUP_TRIAL")
    return str(json.loads(text).get("trial", "")) if text else ""


def _inject_faults(rank: int, batch_size: int, step: int) -> None:
    trial = _trial_name()
    oom = os.environ.get("TUNE_OOM_BATCH")
    if oom and batch_size >= int(oom):
        raise torch.OutOfMemoryError(f"injected: batch {batch_size} does not fit")
    if step != 3 or not trial:
        return
    number = trial.split("-", 1)[0]
    if os.environ.get("TUNE_FAIL_TRIAL") == number and int(os.environ.get("TUNE_FAIL_RANK", "0")) == rank:
        raise RuntimeError(f"injected failure on rank {rank} in trial {trial}")
    if os.environ.get("TUNE_HANG_TRIAL") == number and int(os.environ.get("TUNE_HANG_RANK", "0")) == rank:
        time.sleep(3600)


def make_classes(L: Any) -> tuple[type, type]:
    """(LightningModule, LightningDataModule) classes of the namespace `L`."""

    class TuneMLP(L.LightningModule):
        def __init__(self, features: int = 32, hidden: int = 256, lr: float = 0.01) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(features, hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(hidden, hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(hidden, 1),
            )

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            _inject_faults(self.global_rank, len(x), self.global_step)
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_model(self) -> None:
            # Under ModelParallelStrategy (the mesh is set): FSDP2, each Linear a unit, the net the root.
            mesh = getattr(self, "device_mesh", None)
            if mesh is None:
                return
            from torch.distributed.fsdp import fully_shard

            for layer in self.net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh["data_parallel"])
            fully_shard(self.net, mesh=mesh["data_parallel"])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    class TuneData(L.LightningDataModule):
        def __init__(
            self, batch_size: int = 16, num_workers: int = 0, features: int = 32, item_cost_us: float = 0.0
        ) -> None:
            super().__init__()
            self.batch_size = batch_size
            self.num_workers = num_workers
            self.features = features
            self.item_cost_us = item_cost_us

        def _loader(self, n: int) -> DataLoader:
            return DataLoader(
                SyntheticData(n, self.features, self.item_cost_us),
                batch_size=self.batch_size,
                num_workers=self.num_workers,
                persistent_workers=self.num_workers > 0,
                shuffle=False,
            )

        def train_dataloader(self) -> DataLoader:
            return self._loader(65536)

        def val_dataloader(self) -> DataLoader:
            return self._loader(256)

    return TuneMLP, TuneData


def make_gan(L: Any, features: int = 16) -> Any:
    """A LightningModule of the namespace `L` that steps a discriminator and a generator every batch."""

    class TinyGAN(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.generator = torch.nn.Linear(features, features)
            self.discriminator = torch.nn.Linear(features, 1)

        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, _ = batch
            opt_d, opt_g = self.optimizers()
            for opt, loss in (
                (
                    opt_d,
                    lambda: (
                        self.discriminator(x).mean() - self.discriminator(self.generator(x).detach()).mean()
                    ),
                ),
                (opt_g, lambda: self.discriminator(self.generator(x)).mean()),
            ):
                opt.zero_grad()
                self.manual_backward(loss())
                opt.step()

        def configure_optimizers(self) -> Any:
            return (
                torch.optim.SGD(self.discriminator.parameters(), lr=0.01),
                torch.optim.SGD(self.generator.parameters(), lr=0.01),
            )

    return TinyGAN()
