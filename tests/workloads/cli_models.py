"""Module-level models and data modules for LightningCLI tests, one pair per Lightning namespace."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as L
import pytorch_lightning as PL
import torch
from torch.utils.data import DataLoader, TensorDataset


def _loader() -> DataLoader:
    x = torch.randn(64, 4)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def _step(module: Any, batch: Any) -> Any:
    x, y = batch
    return torch.nn.functional.mse_loss(module.net(x), y)


class LModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return _step(self, batch)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class LData(L.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        return _loader()


class PLModel(PL.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return _step(self, batch)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class PLData(PL.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        return _loader()
