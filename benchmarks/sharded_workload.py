"""A small FSDP2 training (Lightning's ModelParallelStrategy, `fully_shard` per block) recorded by tuneup, for
the sharded check of benchmarks/gpu_check.py: the mixed-precision policy and activation checkpointing are
options, and the script writes the allocator's own peak beside the record to compare tuneup's memory by kind
with.

    python benchmarks/sharded_workload.py OUT [--accelerator gpu|cpu] [--devices 1] [--steps 30]
                                          [--bf16-params] [--checkpointing] [--width 1024] [--depth 4]
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from tuneup import TuneupCallback


class Net(torch.nn.Module):
    """Residual MLP blocks and a head: FSDP2 shards each block, and the whole net as the root (whose forward
    the training step calls, so that its pre-forward hook gathers the head too)."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(
                torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
            )
            for _ in range(depth)
        )
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


class Blocks(L.LightningModule):
    def __init__(self, width: int, depth: int, bf16_params: bool, checkpointing: bool) -> None:
        super().__init__()
        self.net = Net(width, depth)
        self.bf16_params = bf16_params
        self.checkpointing = checkpointing

    def configure_model(self) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = self.device_mesh["data_parallel"]
        mp = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if self.bf16_params
            else None
        )
        kwargs: dict[str, Any] = {"mesh": mesh} | ({"mp_policy": mp} if mp is not None else {})
        for block in self.net.blocks:
            if self.checkpointing:
                from torch.distributed._composable import checkpoint

                checkpoint(block)
            fully_shard(block, **kwargs)
        fully_shard(self.net, **kwargs)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        (x,) = batch
        return self.net(x).float().pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--accelerator", default="gpu")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--bf16-params", action="store_true")
    parser.add_argument("--checkpointing", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    model = Blocks(args.width, args.depth, args.bf16_params, args.checkpointing)
    data = TensorDataset(torch.randn(args.batch_size * 8, args.width))
    callback = TuneupCallback(dirpath=str(args.out / "run"), telemetry_interval_s=0.5)
    strategy = L.strategies.ModelParallelStrategy(data_parallel_size=args.devices, tensor_parallel_size=1)
    trainer = L.Trainer(
        accelerator=args.accelerator, devices=args.devices, strategy=strategy, max_steps=args.steps,
        callbacks=[callback], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=str(args.out),
    )  # fmt: skip
    trainer.fit(model, DataLoader(data, batch_size=args.batch_size))
    parameters = sum(p.numel() for p in model.parameters())
    peak = (
        torch.cuda.max_memory_allocated() if torch.cuda.is_available() and args.accelerator == "gpu" else None
    )
    if trainer.global_rank == 0:
        (args.out / "result.json").write_text(
            json.dumps(
                {"parameters": parameters, "max_memory_allocated": peak, "run_dir": str(callback.run_dir)}
            )
        )


if __name__ == "__main__":
    main()
