"""The workloads of benchmarks/advise_accuracy.py: one parametrised worker script, as different from each other
as users' scripts are (data-, compute-, loop- and communication-bound; 1 and 2 gloo ranks; both Lightning
namespaces; a LightningCLI script, plain scripts, a two-optimizer manual loop).

    python benchmarks/accuracy_workloads.py --workload NAME --run-dir DIR --steps N [--batch B] ...
    python benchmarks/accuracy_workloads.py --workload cli --run-dir DIR --steps N -- [LightningCLI args]

Every knob `tuneup advise` can name has an argument here (batch size, accumulation, DataLoader workers and
flags, torch threads, precision, tuneup's DDP strategy with the printed arguments), so that the benchmark
applies a recommendation through the workload's own arguments, as a user would edit their script. The `cli`
workload is a LightningCLI script: the benchmark hands it the recommendation's YAML as a `--config` file.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Workload:
    """One workload and its baseline settings (what the user's script has before any advice)."""

    description: str
    model: str  # "mlp", "cnn", "embed", "transformer", "gan"
    namespace: str = "lightning"  # or "pytorch_lightning"
    devices: int = 1
    batch: int = 32
    accum: int = 1
    workers: int = 0
    threads: int = 1
    precision: str = "32-true"
    steps: int = 80
    width: int = 256
    depth: int = 2
    # The cost of one sample in the Dataset: CPU work (augmentation passes over a 3x32x32 image) or a wait
    # (storage-like), and a wait per batch in the collate function (costly decoding).
    aug_passes: int = 0
    item_ms: float = 0.0
    collate_ms: float = 0.0
    vocab: int = 1000
    local_sgd: int = 0  # already running TuneupDDPStrategy(local_sgd_period=...)
    # "fsdp2": sharded with fully_shard (each Linear a unit) under ModelParallelStrategy; "" : DDP (or one rank)
    sharding: str = ""
    cli: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


WORKLOADS: dict[str, Workload] = {
    "cnn-aug": Workload(
        "CNN, CPU-heavy augmentation in __getitem__ (crop, flip, blur passes), no workers: data-bound",
        "cnn", batch=8, threads=2, aug_passes=1, steps=60,
    ),
    "cnn-io-pl": Workload(
        "CNN reading from storage (2 ms wait a sample), no workers, pytorch_lightning: data-bound on waits",
        "cnn", namespace="pytorch_lightning", batch=16, item_ms=2.0, steps=60,
    ),
    "embed-ddp": Workload(
        "embedding bag (60k x 64, dense gradient) + MLP head, 2 gloo ranks, batch 16: communication-bound",
        "embed", devices=2, batch=16, vocab=60_000, width=128, steps=60,
    ),
    "mlp-small": Workload(
        "small MLP (width 64), batch 16, one thread: the loop's own time dominates",
        "mlp", batch=16, width=64, steps=400,
    ),
    "mlp-large-pl": Workload(
        "large MLP (3 x 768), batch 64, 2 threads, pytorch_lightning: compute-bound",
        "mlp", namespace="pytorch_lightning", batch=64, threads=2, width=768, depth=3, steps=50,
    ),
    "transformer": Workload(
        "small transformer encoder (2 layers, d 64, 32 tokens), batch 8, 2 threads",
        "transformer", batch=8, threads=2, width=64, steps=200,
    ),
    "well-set": Workload(
        "MLP (width 256) at batch 256, in-memory data, 2 threads: already well set, advice should be silent",
        "mlp", batch=256, threads=2, width=256, steps=200,
    ),
    "cli": Workload(
        "LightningCLI script (DataModule with a costly collate, 3 ms a batch), MLP width 256, batch 16",
        "mlp", batch=16, width=256, collate_ms=3.0, cli=True, steps=200,
    ),
    "gan-manual-pl": Workload(
        "GAN, two optimizers, manual optimization, batch 64, pytorch_lightning",
        "gan", namespace="pytorch_lightning", batch=64, width=256, steps=200,
    ),
    "mlp-ddp-pl": Workload(
        "MLP (2 x 1024), 2 gloo ranks, batch 32, 0.1 ms a sample in the Dataset, pytorch_lightning",
        "mlp", namespace="pytorch_lightning", devices=2, batch=32, width=1024, item_ms=0.1, steps=60,
    ),
    "bf16-cpu": Workload(
        "MLP (2 x 1024) trained in bf16-mixed on a CPU, batch 64, 2 threads",
        "mlp", batch=64, threads=2, width=1024, precision="bf16-mixed", steps=60,
    ),
    "mlp-fsdp2": Workload(
        "MLP (3 x 512) sharded with FSDP2 (fully_shard per Linear), 2 gloo ranks, batch 8: the gathers dominate",
        "mlp", devices=2, batch=8, width=512, depth=3, sharding="fsdp2", steps=80,
    ),
    "local-sgd": Workload(
        "embedding model already on TuneupDDPStrategy(local_sgd_period=4), 2 gloo ranks, batch 16",
        "embed", devices=2, batch=16, vocab=50_000, width=128, local_sgd=4, steps=150,
    ),
}  # fmt: skip

IN_DIM = 128  # features of the MLP's inputs
CLASSES = 10
SEQ = 32  # tokens per sample (transformer, embedding bag)


def _lightning(namespace: str) -> Any:
    return importlib.import_module("lightning.pytorch" if namespace == "lightning" else "pytorch_lightning")


def build(w: Workload, *, threads: int, reshard_after_forward: bool = True) -> tuple[Any, Any, Any]:
    """(LightningModule class, Dataset, collate) for a workload, in its namespace."""
    import torch
    from torch import nn
    from torch.utils.data import Dataset, default_collate

    L = _lightning(w.namespace)
    n = 4096

    class Bag(nn.Module):
        def __init__(self, vocab: int, dim: int) -> None:
            super().__init__()
            self.bag = nn.EmbeddingBag(vocab, dim, mode="mean")  # dense gradient: all-reduced every step

        def forward(self, x: Any) -> Any:
            return self.bag(x)

    class MeanTokens(nn.Module):
        def forward(self, x: Any) -> Any:
            return x.mean(dim=1)

    class Data(Dataset):  # type: ignore[type-arg]
        def __init__(self) -> None:
            g = torch.Generator().manual_seed(0)
            self.y = torch.randint(0, CLASSES, (n,), generator=g)
            if w.model == "cnn":
                self.x = torch.rand(n, 3, 32, 32, generator=g)
                self.kernel = torch.full((3, 1, 3, 3), 1 / 9)
            elif w.model in ("embed", "transformer"):
                self.x = torch.randint(0, w.vocab, (n, SEQ), generator=g)
            else:
                self.x = torch.randn(n, IN_DIM, generator=g)

        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> Any:
            if w.item_ms:
                time.sleep(w.item_ms / 1000.0)
            x = self.x[i]
            if w.aug_passes:
                x = self._augment(x, i)
            return x, self.y[i]

        def _augment(self, x: Any, i: int) -> Any:
            # What torchvision's RandomCrop(32, padding=4), RandomHorizontalFlip and a GaussianBlur do, in
            # plain torch (CPU work in the loader's process, per sample).
            g = torch.Generator().manual_seed(i)
            padded = nn.functional.pad(x, (4, 4, 4, 4), mode="reflect")
            dx, dy = (int(v) for v in torch.randint(0, 9, (2,), generator=g))
            x = padded[:, dy : dy + 32, dx : dx + 32]
            if torch.rand(1, generator=g).item() < 0.5:
                x = x.flip(-1)
            for _ in range(w.aug_passes):
                x = nn.functional.conv2d(x.unsqueeze(0), self.kernel, padding=1, groups=3).squeeze(0)
                x = (x - x.mean()) / (x.std() + 1e-6)
            return x.contiguous()

    def collate(items: list[Any]) -> Any:
        if w.collate_ms:
            time.sleep(w.collate_ms / 1000.0)
        return default_collate(items)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.set_num_threads(threads)
            width = w.width
            if w.model == "cnn":
                self.net = nn.Sequential(
                    nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                    nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, CLASSES),
                )  # fmt: skip
            elif w.model == "embed":
                self.net = nn.Sequential(
                    Bag(w.vocab, 64), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, CLASSES)
                )
            elif w.model == "transformer":
                layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
                self.net = nn.Sequential(
                    nn.Embedding(w.vocab, width), nn.TransformerEncoder(layer, 2), MeanTokens(),
                    nn.Linear(width, CLASSES),
                )  # fmt: skip
            elif w.model == "gan":
                self.automatic_optimization = False
                self.gen = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, IN_DIM))
                self.disc = nn.Sequential(nn.Linear(IN_DIM, width), nn.LeakyReLU(0.2), nn.Linear(width, 1))
            else:
                layers: list[nn.Module] = []
                d = IN_DIM
                for _ in range(w.depth):
                    layers += [nn.Linear(d, width), nn.ReLU()]
                    d = width
                self.net = nn.Sequential(*layers, nn.Linear(d, CLASSES))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            if w.model != "gan":
                return nn.functional.cross_entropy(self.net(x), y)
            opt_g, opt_d = self.optimizers()
            z = torch.randn(x.shape[0], 32)
            fake = self.gen(z)
            bce = nn.functional.binary_cross_entropy_with_logits
            ones, zeros = torch.ones(x.shape[0], 1), torch.zeros(x.shape[0], 1)
            d_loss = bce(self.disc(x), ones) + bce(self.disc(fake.detach()), zeros)
            opt_d.zero_grad()
            self.manual_backward(d_loss)
            opt_d.step()
            g_loss = bce(self.disc(fake), ones)
            opt_g.zero_grad()
            self.manual_backward(g_loss)
            opt_g.step()
            return g_loss

        def configure_model(self) -> None:
            # Under ModelParallelStrategy (its mesh is set): FSDP2, each Linear a unit, the net the root.
            mesh = getattr(self, "device_mesh", None)
            if mesh is None:
                return
            from torch.distributed.fsdp import fully_shard

            for layer in self.net:
                if isinstance(layer, nn.Linear):
                    fully_shard(
                        layer, mesh=mesh["data_parallel"], reshard_after_forward=reshard_after_forward
                    )
            fully_shard(self.net, mesh=mesh["data_parallel"], reshard_after_forward=reshard_after_forward)

        def configure_optimizers(self) -> Any:
            if w.model == "gan":
                return (
                    torch.optim.Adam(self.gen.parameters(), lr=2e-4),
                    torch.optim.Adam(self.disc.parameters(), lr=2e-4),
                )
            return torch.optim.SGD(self.parameters(), lr=1e-2)

    return Module, Data(), collate


def _strategy(w: Workload, kwargs: dict[str, Any], sharding: str) -> Any:
    """FSDP2 (ModelParallelStrategy) for a sharded workload, else tuneup's DDP strategy of the workload's
    namespace with the printed arguments, or plain DDP."""
    if w.devices == 1:
        return "auto"
    if sharding == "fsdp2":
        return _lightning(w.namespace).strategies.ModelParallelStrategy(
            data_parallel_size=w.devices, tensor_parallel_size=1
        )
    if w.local_sgd and "local_sgd_period" not in kwargs:
        kwargs = {"local_sgd_period": w.local_sgd, **kwargs}
    if not kwargs:
        return "ddp"
    from tuneup.plugins import lightning as plugin

    cls = plugin.TuneupDDPStrategy if w.namespace == "lightning" else plugin.PLTuneupDDPStrategy
    return cls(**kwargs)


def run_plain(w: Workload, args: argparse.Namespace) -> None:
    import torch
    from torch.utils.data import DataLoader

    from tuneup import TuneupCallback

    L = _lightning(w.namespace)
    torch.manual_seed(0)
    module_cls, dataset, collate = build(
        w, threads=args.threads, reshard_after_forward=args.reshard_after_forward == "true"
    )
    loader_kw: dict[str, Any] = {
        "batch_size": args.batch, "num_workers": args.workers, "collate_fn": collate, "shuffle": True,
        "drop_last": True, "pin_memory": args.pin_memory,
    }  # fmt: skip
    if args.workers:
        loader_kw["persistent_workers"] = args.persistent_workers
        if args.prefetch:
            loader_kw["prefetch_factor"] = args.prefetch
    strategy_kwargs = eval(f"dict({args.strategy_args})") if args.strategy_args else {}  # the printed code
    trainer = L.Trainer(
        accelerator="cpu", devices=w.devices, strategy=_strategy(w, strategy_kwargs, args.sharding), max_steps=args.steps,
        accumulate_grad_batches=args.accum, precision=args.precision, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[TuneupCallback(dirpath=str(args.run_dir))], default_root_dir=str(args.run_dir.parent),
    )  # fmt: skip
    trainer.fit(module_cls(), DataLoader(dataset, **loader_kw))


def run_cli(w: Workload, args: argparse.Namespace, cli_args: list[str]) -> None:
    """A LightningCLI script: the model's width and threads, the DataModule's loader arguments and the
    Trainer's come from the command line and --config files (the recommendation's YAML)."""
    import torch
    from torch.utils.data import DataLoader

    from tuneup import TuneupCallback

    L = _lightning(w.namespace)
    cli_mod = importlib.import_module(f"{L.__name__}.cli")

    class Net(L.LightningModule):
        def __init__(self, width: int = w.width, threads: int = 1) -> None:
            super().__init__()
            self.inner = build(_replace(w, width=width), threads=threads)[0]()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.inner.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-2)

    class Data(L.LightningDataModule):
        def __init__(
            self,
            batch_size: int = 16,
            num_workers: int = 0,
            persistent_workers: bool = False,
            prefetch_factor: int | None = None,
            pin_memory: bool = False,
        ) -> None:
            super().__init__()
            self.kw = {"batch_size": batch_size, "num_workers": num_workers, "pin_memory": pin_memory}
            if num_workers:
                self.kw["persistent_workers"] = persistent_workers
                self.kw["prefetch_factor"] = prefetch_factor
            self.batch_size = batch_size

        def train_dataloader(self) -> Any:
            _, dataset, collate = build(w, threads=1)
            return DataLoader(dataset, collate_fn=collate, shuffle=True, drop_last=True, **self.kw)

    torch.manual_seed(0)
    cli_mod.LightningCLI(
        Net,
        Data,
        args=["fit", *cli_args],
        trainer_defaults={
            "accelerator": "cpu",
            "devices": w.devices,
            "max_steps": args.steps,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks": [TuneupCallback(dirpath=str(args.run_dir))],
            "default_root_dir": str(args.run_dir.parent),
        },
        save_config_callback=None,
        seed_everything_default=0,
    )


def _replace(w: Workload, **changes: Any) -> Workload:
    from dataclasses import replace

    return replace(w, **changes)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    cli_args: list[str] = []
    if "--" in argv:
        cli_args = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True, choices=list(WORKLOADS))
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--accum", type=int, default=None)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--prefetch", type=int, default=0)
    p.add_argument("--persistent-workers", action="store_true")
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--precision", default=None)
    p.add_argument("--strategy-args", default="", help="TuneupDDPStrategy's arguments, as printed")
    p.add_argument("--sharding", default=None, help="fsdp2, or ddp: the workload's own by default")
    p.add_argument("--reshard-after-forward", choices=("true", "false"), default="true")
    args = p.parse_args(argv)
    w = WORKLOADS[args.workload]
    if args.sharding is None:
        args.sharding = w.sharding
    for name in ("steps", "batch", "accum", "workers", "threads", "precision"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(w, name))
    import torch

    torch.set_num_threads(args.threads)
    try:
        if w.cli:
            run_cli(w, args, cli_args)
        else:
            run_plain(w, args)
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # a gloo group alive at exit can abort (DESIGN.md)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
