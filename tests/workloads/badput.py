"""Tiny Lightning fits with known time injected into each category of the badput ledger (tests/test_badput.py).

Each delay is a `time.sleep` in the place whose time the ledger names: the LightningModule's `setup`
(startup), the training loader's collate (data wait), `validation_step` (validation, and the sanity check's
one batch: startup), the checkpoint plugin's save (checkpoint saves), and, in the 2-process script, a rank
that enters and leaves its fit late (the other rank's idle device) and a rank slow in every training step
(the other rank's wait for it). A sleep lasts at least what it asks for, so each injected time is a lower
bound of what lands in its category. The test counts what ran (batches fetched, validations, saves) itself,
never from tuneup's record.

    python tests/workloads/badput.py --out RUN_DIR --devices 2 [--late-start-s 0.6] [--late-end-s 0.4] ...
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, as a script

from workloads.tiny import RandomRegression, make_module

PRICE_PER_HOUR_USD = 3.6  # $0.001 a device-second: dollars are seconds / 1000 per rank


@dataclass(frozen=True)
class Injected:
    """Seconds slept in each place (0: none)."""

    setup_s: float = 0.0  # LightningModule.setup: the fit's setup (startup)
    fetch_s: float = 0.0  # each training batch's collate (num_workers=0: the step waits for it)
    val_batch_s: float = 0.0  # each validation batch, the sanity check's included
    save_s: float = 0.0  # each checkpoint save


@dataclass
class Seen:
    """What the fit did, counted by the test's own hooks: the ground truth the ledger is held to."""

    fetches: int = 0  # training batches collated
    validations: int = 0  # validation runs, the sanity check not counted
    sanity_batches: int = 0
    saves: int = 0
    # Unix times: the fit's entry and exit as seen from outside tuneup's callback (a probe listed before
    # it sees the setup first; one listed after it sees the teardown last).
    fit_entered: list[float] = field(default_factory=list)
    fit_left: list[float] = field(default_factory=list)


class CountingCollate:
    def __init__(self, delay_s: float, seen: Seen) -> None:
        self.delay_s, self.seen = delay_s, seen

    def __call__(self, items: list[Any]) -> Any:
        self.seen.fetches += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        return torch.utils.data.default_collate(items)


class SlowCheckpointIO(TorchCheckpointIO):
    """Lightning's own save, then a wait as long as a slow filesystem's: inside `trainer.save_checkpoint`."""

    def __init__(self, delay_s: float, seen: Seen) -> None:
        super().__init__()
        self.delay_s, self.seen = delay_s, seen

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        time.sleep(self.delay_s)
        self.seen.saves += 1


class Probe(L.Callback):
    """Times the fit's entry (setup) and exit (teardown, or the exception); `counts`: also counts the
    validations and the sanity check's batches (one probe of the two around tuneup's callback does)."""

    def __init__(self, seen: Seen, counts: bool) -> None:
        self.seen, self.counts = seen, counts

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.seen.fit_entered.append(time.time())

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.seen.fit_left.append(time.time())

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.seen.fit_left.append(time.time())

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.counts and not trainer.sanity_checking:
            self.seen.validations += 1

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if self.counts and trainer.sanity_checking:
            self.seen.sanity_batches += 1


def probed(seen: Seen, callback: Any) -> list[Any]:
    """`callback` between two probes: the first sees the fit enter before it, the second leave after it."""
    return [Probe(seen, counts=True), callback, Probe(seen, counts=False)]


class RankDelay(L.Callback):
    """Listed before tuneup's callback: one rank enters its fit `start_s` late and leaves it `end_s` late."""

    def __init__(self, rank: int, start_s: float, end_s: float) -> None:
        self.rank, self.start_s, self.end_s = rank, start_s, end_s

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if trainer.global_rank == self.rank:
            time.sleep(self.start_s)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if trainer.global_rank == self.rank:
            time.sleep(self.end_s)


class CrashAt(L.Callback):
    """Raises at the end of a training batch, as a node failure ends the process."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step >= self.step:
            raise RuntimeError("node lost")


def injected_module(injected: Injected, **kwargs: Any) -> Any:
    """tests/workloads/tiny.py's module, sleeping in `setup` and in each validation batch."""

    class Injecting(make_module("lightning", **kwargs).__class__):
        def setup(self, stage: str) -> None:
            time.sleep(injected.setup_s)

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            time.sleep(injected.val_batch_s)
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

    return Injecting()


def loaders(injected: Injected, seen: Seen) -> tuple[DataLoader, DataLoader]:
    """A training loader of 32 batches of 8 (one epoch outlasts every fit here) and a validation loader."""
    train = DataLoader(
        RandomRegression(256), batch_size=8, collate_fn=CountingCollate(injected.fetch_s, seen)
    )
    return train, DataLoader(RandomRegression(32), batch_size=8)


def trainer(
    root: Path,
    callbacks: list[Any],
    *,
    injected: Injected,
    seen: Seen,
    max_steps: int,
    devices: int = 1,
    val_every_steps: int | None = 8,
    val_batches: int = 2,
    save_every_steps: int | None = 5,
) -> L.Trainer:
    """One fit's trainer: validation every `val_every_steps` batches over `val_batches` batches (and a
    one-batch sanity check), a checkpoint every `save_every_steps` steps, every checkpoint kept; None: no
    validation, no checkpoint."""
    if save_every_steps is not None:
        callbacks = [
            *callbacks,
            L.callbacks.ModelCheckpoint(
                dirpath=root / "checkpoints", every_n_train_steps=save_every_steps, save_top_k=-1
            ),
        ]
    return L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_steps=max_steps,
        val_check_interval=val_every_steps,
        limit_val_batches=val_batches if val_every_steps is not None else 0,
        num_sanity_val_steps=1,
        callbacks=callbacks,
        enable_checkpointing=save_every_steps is not None,
        plugins=[SlowCheckpointIO(injected.save_s, seen)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
    )


def fit_injected(
    root: Path,
    run_dir: Path,
    injected: Injected,
    seen: Seen,
    *,
    max_steps: int,
    crash_at: int | None = None,
    ckpt_path: Path | None = None,
) -> None:
    """One in-process fit of one rank with `injected` delays, recorded at `run_dir` at $3.6 an hour;
    `crash_at`: raises "node lost" once that many steps are done; `ckpt_path`: resumes from it."""
    from tuneup import TuneupCallback

    cb = TuneupCallback(dirpath=run_dir, telemetry_interval_s=0.2, price_per_hour=PRICE_PER_HOUR_USD)
    callbacks = probed(seen, cb) + ([CrashAt(crash_at)] if crash_at is not None else [])
    train, val = loaders(injected, seen)
    fit = trainer(root, callbacks, injected=injected, seen=seen, max_steps=max_steps)
    fit.fit(injected_module(injected), train, val, ckpt_path=str(ckpt_path) if ckpt_path else None)


def main(argv: list[str] | None = None) -> None:
    """The 2-process DDP run: rank 1 enters its fit late, leaves it late, and is slow in every step."""
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=16)
    p.add_argument("--late-start-s", type=float, default=0.0)
    p.add_argument("--late-end-s", type=float, default=0.0)
    p.add_argument("--slow-step-ms", type=float, default=0.0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)

    from tuneup import TuneupCallback

    seen = Seen()
    injected = Injected()
    cb = TuneupCallback(dirpath=args.out, telemetry_interval_s=0.2, price_per_hour=PRICE_PER_HOUR_USD)
    late = RankDelay(1, args.late_start_s, args.late_end_s)
    module = injected_module(injected, slow_step_ms=args.slow_step_ms, slow_rank=1)
    train, val = loaders(injected, seen)
    fit = trainer(
        Path(args.out).parent,
        [late, cb],
        injected=injected,
        seen=seen,
        max_steps=args.max_steps,
        devices=args.devices,
        val_every_steps=None,  # no validation, no save: the ranks' waits alone
        save_every_steps=None,
    )
    fit.fit(module, train, val)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # A gloo group left alive at interpreter exit can abort the process (see DESIGN.md).
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
