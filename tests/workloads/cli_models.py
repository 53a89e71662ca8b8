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


class _Tiny:
    """The body both namespaces' models share; each class below adds only its LightningModule base."""

    net: torch.nn.Module

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.net.parameters(), lr=0.01)


class LModel(_Tiny, L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)


class LData(L.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        return _loader()


class PLModel(_Tiny, PL.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)


class PLData(PL.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        return _loader()
