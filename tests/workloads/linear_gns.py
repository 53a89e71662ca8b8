"""A linear regression that never moves (learning rate 0), for the gradient noise scale's ground truth.

    python tests/workloads/linear_gns.py --out RUN_DIR --truth TRUTH.json [--devices 2] [--accumulate 2]
        [--loss-scale 1024] [--max-steps N] [--noise-scale-every K] [--strategy ddp|fsdp2]

`--strategy fsdp2` (with --devices 2 or more) shards the model with `fully_shard` under Lightning's
ModelParallelStrategy: FSDP2 on CPU over gloo. `--strategy hsdp` (an even --devices of 4 or more) does the
same on a 2-D mesh: 2 replicas, each sharded over half the ranks.

With the parameters fixed, every step's gradient is an unbiased sample of the same distribution, and the
true B_simple = tr(Σ)/|G|² follows from per-example gradients over the whole dataset, computed here by
brute force (torch.func: one gradient per example) and written to --truth by rank 0.

`--loss-scale S` trains through Lightning's real fp16 GradScaler path (the loss scaled by S in backward,
the gradients unscaled before the optimizer step) without autocast, so that the arithmetic stays float32
and only the scaling differs from a run without it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FEATURES = 8
EXAMPLES = 8192
NOISE = 0.5  # the targets' noise, against a weight error of about 1: B_simple of about 9


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    # ±1 features keep per-example gradients light-tailed: fewer steps give a stable estimate.
    x = torch.randint(0, 2, (EXAMPLES, FEATURES), generator=g).float() * 2 - 1
    w_offset = torch.randn(FEATURES, generator=g) / FEATURES**0.5
    noise = NOISE * torch.randn(EXAMPLES, generator=g)
    return TensorDataset(x, (x @ w_offset + noise).unsqueeze(1))


def make_module(L: Any, fsdp2: bool = False, hsdp: bool = False) -> Any:
    class LinearRegression(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(FEATURES, 1)
            with torch.no_grad():  # the model starts at zero; the targets carry the weight error
                self.net.weight.zero_()
                self.net.bias.zero_()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_model(self) -> None:
            if fsdp2:
                from torch.distributed.fsdp import fully_shard

                mesh = self.device_mesh["data_parallel"]
                if hsdp:
                    from torch.distributed.device_mesh import init_device_mesh

                    ranks = mesh.size()
                    mesh = init_device_mesh("cpu", (2, ranks // 2), mesh_dim_names=("replicate", "shard"))
                fully_shard(self.net, mesh=mesh)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    return LinearRegression()


def true_noise_scale(module: Any, data: TensorDataset) -> dict[str, float]:
    """tr(Σ)/|G|² over the whole dataset, from one gradient per example."""
    from torch.func import functional_call, grad, vmap

    net = module.net.double()
    params = {k: v.detach() for k, v in net.named_parameters()}

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(functional_call(net, p, (x.unsqueeze(0),)), y.unsqueeze(0))

    x, y = data.tensors
    per_example = vmap(grad(loss), in_dims=(None, 0, 0))(params, x.double(), y.double())
    flat = torch.cat([g.reshape(len(x), -1) for g in per_example.values()], dim=1)
    mean = flat.mean(0)
    trace_sigma = ((flat - mean) ** 2).sum(1).mean().item()
    grad_sq = (mean @ mean).item()
    return {"b_simple": trace_sigma / grad_sq, "grad_sq": grad_sq, "trace_sigma": trace_sigma}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--truth", required=True)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=1000)
    p.add_argument("--loss-scale", type=float, default=0.0)
    p.add_argument("--namespace", default="lightning", choices=["lightning", "pytorch_lightning"])
    p.add_argument(
        "--strategy", default="ddp", choices=["ddp", "fsdp2", "hsdp"], help="with --devices 2 or more"
    )
    # TuneupCallback(noise_scale_every=...): None (automatic) unless given.
    p.add_argument("--noise-scale-every", type=int, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    import importlib

    L = importlib.import_module("lightning.pytorch" if args.namespace == "lightning" else "pytorch_lightning")
    from tuneup import TuneupCallback

    plugins = []
    if args.loss_scale:

        class ScaledNoAutocast(L.plugins.MixedPrecision):
            @contextlib.contextmanager
            def forward_context(self) -> Generator[None, None, None]:
                yield  # the scaler's path without fp16 arithmetic

        scaler = torch.amp.GradScaler("cpu", init_scale=args.loss_scale, growth_interval=10**9)
        plugins.append(ScaledNoAutocast("16-mixed", "cpu", scaler=scaler))
    fsdp2 = args.strategy in ("fsdp2", "hsdp") and args.devices > 1
    module = make_module(L, fsdp2=fsdp2, hsdp=args.strategy == "hsdp")
    data = dataset()
    strategy: Any = "ddp" if args.devices > 1 else "auto"
    if fsdp2:
        strategy = L.strategies.ModelParallelStrategy(data_parallel_size=args.devices, tensor_parallel_size=1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy,
        max_steps=args.max_steps,
        accumulate_grad_batches=args.accumulate,
        callbacks=[
            TuneupCallback(
                dirpath=args.out,
                telemetry_interval_s=1.0,
                count_flops=False,
                detail_steps=args.max_steps,
                noise_scale_every=args.noise_scale_every,
            )
        ],
        plugins=plugins or None,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(Path(args.out).parent),
    )
    loader = DataLoader(
        data, batch_size=args.batch_size, shuffle=True, generator=torch.Generator().manual_seed(2)
    )
    trainer.fit(module, loader)
    if trainer.global_rank == 0:
        # At learning rate 0 the trained model is the one it started as: a fresh (unsharded) copy of it.
        Path(args.truth).write_text(json.dumps(true_noise_scale(make_module(L), data)))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # a gloo group alive at exit can abort (DESIGN.md)


if __name__ == "__main__":
    main()
