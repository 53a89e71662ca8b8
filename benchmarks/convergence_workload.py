"""A small real task whose held-out loss falls to a target within seconds on CPU, for
`benchmarks/goodput_check.py`: one training run per call.

    python benchmarks/convergence_workload.py OUT_DIR --batch 64 [--devices 1|2] [--local-sgd-period H]
        [--target 0.30] [--max-steps 8000] [--seed 0] [--lr 0.2] [--lr-knee 64] [--val-every N]

The task: a noisy teacher-student regression. x ~ N(0, I₁₆); y = teacher(x) + 0.5·ε, the teacher a fixed
random 16-32-1 tanh network scaled to unit variance, ε ~ N(0, 1). The student is a 16-64-64-1 ReLU MLP
trained with mean squared error, so the held-out loss starts near 1.25 and has a floor of 0.25 (the
label noise, which no model removes): the gradient's noise does not vanish near the target, and the
gradient noise scale is meaningful there. Training samples are drawn fresh every step (an endless
stream, one generator per rank), so there are no epochs and no overfitting; the held-out set is 8,192
fixed examples, logged as `val_loss` (sync_dist over ranks) every `--val-every` optimizer steps.

Optimizer: plain SGD (no momentum). The learning rate follows the batch: lr(B) = lr · min(1, B / knee),
linear scaling up to the knee, fixed above it (0.05 at B=16, 0.2 at B>=64 with the defaults). That is
the form of the noise-scale theory's optimal learning rate, ε_max / (1 + B_noise/B), in two straight
pieces; the defaults are the best of a sweep of 0.025-0.3 per batch size (benchmarks/README.md).

One process: the global batch is two micro-batches of B/2 (accumulate_grad_batches=2), which is what
lets TuneupCallback measure the gradient noise scale in one process. Two processes (gloo DDP): B/2 per
rank, no accumulation; `--local-sgd-period H` uses TuneupDDPStrategy's local SGD (exact for its first 48
steps, rounded up to a multiple of H, and validated every multiple of H steps: right after an average). Training stops at the first validation whose val_loss is at or below `--target` (EarlyStopping's
stopping threshold), or at `--max-steps`.

Rank 0 writes OUT_DIR/result.json: the process's start (unix seconds, before torch is imported), the
fit's start and end, the steps done and the learning rate; TuneupCallback writes OUT_DIR/run.
"""

from __future__ import annotations

import time

PROCESS_START_UNIX = time.time()  # before the imports: the startup a user pays is part of the wall time

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FEATURES = 16
TEACHER_HIDDEN = 32
STUDENT_HIDDEN = 64
LABEL_NOISE = 0.5  # the loss floor is its square, 0.25
HELD_OUT = 8192
LR = 0.2
LR_KNEE = 64
WARMUP_STEPS = 48  # local SGD's exact steps first (TuneupDDPStrategy's default is 50), rounded up to k·H


def learning_rate(batch: int, lr: float = LR, knee: int = LR_KNEE) -> float:
    """The learning rate at global batch `batch`: linear scaling up to `knee`, fixed above it."""
    return lr * min(1.0, batch / knee)


class Teacher:
    """The fixed function the student learns; the same in every process (its own seeded generator)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.randn(FEATURES, TEACHER_HIDDEN, generator=g) / FEATURES**0.5
        self.w2 = torch.randn(TEACHER_HIDDEN, 1, generator=g) / TEACHER_HIDDEN**0.5
        probe = torch.randn(20000, FEATURES, generator=g)
        self.scale = float(self._raw(probe).std())

    def _raw(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.w1) @ self.w2

    def sample(self, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, FEATURES, generator=g)
        return x, self._raw(x) / self.scale + LABEL_NOISE * torch.randn(n, 1, generator=g)


class Stream(torch.utils.data.IterableDataset):
    """Fresh micro-batches forever; each rank draws from its own generator (seeded by seed and rank)."""

    def __init__(self, teacher: Teacher, micro_batch: int, seed: int) -> None:
        self.teacher, self.micro_batch, self.seed = teacher, micro_batch, seed

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        dist = torch.distributed
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        g = torch.Generator().manual_seed(1000 * self.seed + rank + 1)
        while True:
            yield self.teacher.sample(self.micro_batch, g)


def make_module(L: Any, lr: float, seed: int) -> Any:
    class Student(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(seed)  # the same initial model at every batch size
            self.net = torch.nn.Sequential(
                torch.nn.Linear(FEATURES, STUDENT_HIDDEN),
                torch.nn.ReLU(),
                torch.nn.Linear(STUDENT_HIDDEN, STUDENT_HIDDEN),
                torch.nn.ReLU(),
                torch.nn.Linear(STUDENT_HIDDEN, 1),
            )

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=lr)

    return Student()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--batch", type=int, required=True, help="global batch (samples per optimizer step)")
    parser.add_argument("--devices", type=int, default=1, choices=(1, 2))
    parser.add_argument("--local-sgd-period", type=int, default=None)
    parser.add_argument("--target", type=float, default=0.30)
    parser.add_argument("--max-steps", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--lr-knee", type=int, default=LR_KNEE)
    parser.add_argument(
        "--val-every", type=int, default=None, help="optimizer steps (default: 1024/B, min 2)"
    )
    args = parser.parse_args()
    if args.batch % 2:
        raise SystemExit(f"--batch {args.batch}: give an even batch (two micro-batches or two ranks of B/2)")

    import lightning.pytorch as L
    from lightning.pytorch.callbacks import EarlyStopping

    from tuneup import TuneupCallback
    from tuneup.plugins.lightning.strategy import TuneupDDPStrategy

    torch.set_num_threads(1)
    teacher = Teacher()
    g_val = torch.Generator().manual_seed(99)
    held_out = [teacher.sample(HELD_OUT, g_val)]  # one batch: the whole held-out set
    accumulate = 2 if args.devices == 1 else 1
    micro_batch = args.batch // 2
    val_every = args.val_every or max(2, 1024 // args.batch)
    period = args.local_sgd_period
    if period:
        # Validate right after a parameter average, so that val_loss is the averaged model's, not the mean of
        # the ranks' drifted ones: averages fall at steps warm-up + k·H, so both are made multiples of H.
        val_every = period * math.ceil(val_every / period)
    lr = learning_rate(args.batch, args.lr, args.lr_knee)
    if args.devices == 1:
        strategy: Any = "auto"
    elif args.local_sgd_period:
        strategy = TuneupDDPStrategy(
            local_sgd_period=period, warmup_steps=period * math.ceil(WARMUP_STEPS / period)
        )
    else:
        strategy = "ddp"
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy,
        max_steps=args.max_steps,
        accumulate_grad_batches=accumulate,
        val_check_interval=val_every * accumulate,  # counted in batches, not optimizer steps
        num_sanity_val_steps=0,
        callbacks=[
            TuneupCallback(dirpath=args.out / "run", noise_scale_every=1, detail_steps=args.max_steps + 1),
            EarlyStopping(
                monitor="val_loss",
                mode="min",
                stopping_threshold=args.target,
                patience=10**9,
                check_on_train_epoch_end=False,
            ),
        ],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=str(args.out),
    )
    loader = torch.utils.data.DataLoader(Stream(teacher, micro_batch, args.seed), batch_size=None)
    model = make_module(L, lr, args.seed)
    fit_start = time.time()
    trainer.fit(model, loader, torch.utils.data.DataLoader(held_out, batch_size=None))
    fit_end = time.time()
    if trainer.global_rank == 0:
        result = {
            "process_start_unix": PROCESS_START_UNIX,
            "fit_start_unix": fit_start,
            "fit_end_unix": fit_end,
            "steps": trainer.global_step,
            "batch": args.batch,
            "devices": args.devices,
            "local_sgd_period": args.local_sgd_period,
            "lr": lr,
            "val_every": val_every,
            "target": args.target,
        }
        (args.out / "result.json").write_text(json.dumps(result, indent=1))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
