"""A small FSDP2 training (Lightning's ModelParallelStrategy, `fully_shard` per block) recorded by tuneup, for
the sharded check of benchmarks/gpu_check.py: the mixed-precision policy and activation checkpointing are
options, and the script writes the allocator's own peak beside the record to compare tuneup's memory by kind
with.

    python benchmarks/sharded_workload.py OUT [--accelerator gpu|cpu] [--devices 1] [--steps 30]
                                          [--bf16-params] [--checkpointing] [--width 1024] [--depth 4]
                                          [--strategy fsdp2|fsdp1] [--namespace lightning|pytorch_lightning]

`--strategy fsdp1` is Lightning's FSDPStrategy (FSDP1, each block a unit by its auto-wrap policy), which
Lightning runs on CUDA devices only.
"""

from __future__ import annotations

import argparse
import importlib
import json
import warnings
from pathlib import Path
from typing import Any

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


def make_module(L: Any, width: int, depth: int, bf16_params: bool, checkpointing: bool) -> Any:
    """The LightningModule, of the namespace `L`."""

    class Blocks(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Net(width, depth)

        def configure_model(self) -> None:
            # FSDP2 under ModelParallelStrategy (the mesh is set); FSDPStrategy wraps by its own policy.
            if getattr(self, "device_mesh", None) is not None:
                shard(self.net, self.device_mesh["data_parallel"], bf16_params, checkpointing)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            (x,) = batch
            return self.net(x).float().pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    return Blocks()


def shard(net: Net, mesh: Any, bf16_params: bool, checkpointing: bool) -> None:
    """FSDP2: each block a unit (checkpointed first, where asked), the net the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh}
    if bf16_params:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in net.blocks:
        if checkpointing:
            from torch.distributed._composable import checkpoint

            checkpoint(block)
        fully_shard(block, **kwargs)
    fully_shard(net, **kwargs)


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
    parser.add_argument("--strategy", choices=("fsdp2", "fsdp1"), default="fsdp2")
    parser.add_argument("--namespace", choices=("lightning", "pytorch_lightning"), default="lightning")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    L = importlib.import_module("lightning.pytorch" if args.namespace == "lightning" else "pytorch_lightning")
    model = make_module(L, args.width, args.depth, args.bf16_params, args.checkpointing)
    data = TensorDataset(torch.randn(args.batch_size * 8, args.width))
    callback = TuneupCallback(dirpath=str(args.out / "run"), telemetry_interval_s=0.5)
    if args.strategy == "fsdp2":
        strategy = L.strategies.ModelParallelStrategy(data_parallel_size=args.devices, tensor_parallel_size=1)
    else:
        from torch.distributed.fsdp import MixedPrecision

        mixed = (
            MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if args.bf16_params
            else None
        )
        strategy = L.strategies.FSDPStrategy(
            auto_wrap_policy={torch.nn.Sequential},
            activation_checkpointing_policy={torch.nn.Sequential} if args.checkpointing else None,
            mixed_precision=mixed,
        )
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
