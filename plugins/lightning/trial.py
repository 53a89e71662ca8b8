"""A `tuneup tune` trial inside the training process: apply the trial's settings the Lightning way, stop once
the step time is measured well enough, and tell the tuner how the trial goes (tuneup.tune.protocol).

Settings, applied in the callback's `setup` (after the datamodule's setup, before the strategy wraps the
model and before any dataloader is built) unless said otherwise:
- batch_size: a `batch_size` attribute of the LightningModule, its hparams, or its datamodule, set with
  Lightning's `lightning_setattr` (BatchSizeFinder's convention); the dataloaders are built later.
- accumulate_grad_batches: the Trainer's attribute, which its fit loop reads at every batch (as
  GradientAccumulationScheduler sets it).
- comm_hook: on CUDA, the DDP strategy's `_ddp_comm_hook`, which Lightning registers when it wraps the
  model; off CUDA (where Lightning drops it) registered by the callback at on_train_start.
- bucket_cap_mb: the DDP strategy's keyword arguments for DistributedDataParallel, read when it wraps the
  model (after the callbacks' setup).
- num_workers: a `num_workers` attribute where the module or datamodule has one; else the training
  DataLoader's own attribute at on_train_start, before its first iterator is made.
- precision is not applied here: the Trainer builds its precision plugin when it is constructed. Tune it
  through a LightningCLI override.
Whatever is not applied is written to applied.json with the reason, and the tuner drops that knob.

The run is recorded where the trial says (`TrialSpec.run_dir`, see `trial_run_dir`), over a `dirpath` the
script gives the callback.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tuneup._log import info_once, warn_once
from tuneup.tune.protocol import (
    APPLIED_FILE,
    HEARTBEAT_S,
    TrialSpec,
    TrialSpecError,
    failure_file,
    heartbeat_file,
    measured_enough,
    spec_from_environment,
)


def trial_run_dir(dirpath: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The run directory a `tuneup tune` trial records to, or None outside a trial. It wins over the
    script's `dirpath` (said once when they differ): the tuner reads every trial's run from the trial's own
    directory, and a fixed dirpath would put them all in one place the tuner never looks."""
    try:
        spec = spec_from_environment(environ)
    except TrialSpecError:
        return None  # the callback says what is wrong with it when the trial starts
    if spec is None or not spec.run_dir:
        return None
    if dirpath is not None and os.path.abspath(dirpath) != os.path.abspath(spec.run_dir):
        info_once(
            "trial-run-dir",
            f"tuneup tune trial {spec.trial}: recording in {spec.run_dir}, not in dirpath={dirpath} "
            "(each trial is recorded in its own directory, where the tuner reads it)",
        )
    return spec.run_dir


def _parsing(trainer: Any) -> Any:
    namespace = type(trainer).__module__.split(".trainer")[0]
    return importlib.import_module(f"{namespace}.utilities.parsing")


def _comm_hook(name: str) -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return {
        "allreduce": default_hooks.allreduce_hook,
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
    }[name]


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OutOfMemoryError (CUDA, MPS, XPU), or a host allocation failure."""
    if isinstance(exc, MemoryError):
        return True
    with contextlib.suppress(Exception):
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    return "out of memory" in str(exc).lower()[:300]


class TrialControl:
    """One fit's trial: its settings, its stop rule and its answers to the tuner."""

    def __init__(self, spec: TrialSpec, rank: int) -> None:
        self.spec = spec
        self.rank = rank
        self.status_dir = Path(spec.status_dir) if spec.status_dir else None
        self.applied: dict[str, Any] = {}
        self.not_applied: dict[str, str] = {}
        self._hook: str | None = None  # registered at on_train_start (off CUDA)
        self._workers_on_loader: int | None = None
        self._steps = 0
        self._seen_global_step = -1
        self._last_step_end: float | None = None
        self._steady_ms: list[float] = []
        self._last_beat = 0.0

    # -- settings --------------------------------------------------------------------------------------

    def apply_at_setup(self, trainer: Any, pl_module: Any, on_cuda: bool) -> None:
        appliers = {
            "batch_size": lambda v: self._set_batch_size(trainer, pl_module, int(v)),
            "accumulate_grad_batches": lambda v: self._set_accumulation(trainer, pl_module, int(v)),
            "comm_hook": lambda v: self._apply_comm_hook(trainer, str(v), on_cuda),
            "num_workers": lambda v: self._set_workers(trainer, pl_module, int(v)),
            "bucket_cap_mb": lambda v: self._set_bucket_cap(trainer, int(v)),
            "precision": lambda v: self._refuse_precision(),
        }
        for knob, value in self.spec.settings.items():
            apply = appliers.get(knob)
            if apply is None:
                self.not_applied[knob] = "not a knob this version of tuneup applies"
                continue
            try:
                apply(value)
            except Exception as exc:
                self.not_applied[knob] = f"applying it failed: {type(exc).__name__}: {exc}"
        if self.spec.skip_validation:
            # A trial measures training steps; validation and the sanity check only lengthen it.
            trainer.limit_val_batches = 0
            trainer.num_sanity_val_steps = 0

    def _set_attribute(self, trainer: Any, pl_module: Any, name: str, value: int) -> bool:
        parsing = _parsing(trainer)
        if not parsing.lightning_hasattr(pl_module, name):
            return False
        parsing.lightning_setattr(pl_module, name, value)
        self.applied[name] = value
        return True

    def _set_batch_size(self, trainer: Any, pl_module: Any, value: int) -> None:
        if not self._set_attribute(trainer, pl_module, "batch_size", value):
            self.not_applied["batch_size"] = (
                "neither the LightningModule, its hparams nor its datamodule has a `batch_size` attribute "
                "(Lightning's convention, as BatchSizeFinder uses): give the one that builds the DataLoader "
                "`self.batch_size` and use it there"
            )

    def _set_accumulation(self, trainer: Any, pl_module: Any, value: int) -> None:
        if not getattr(pl_module, "automatic_optimization", True):
            self.not_applied["accumulate_grad_batches"] = (
                "the module optimizes manually (automatic_optimization = False): Lightning's accumulation does "
                "not apply; accumulate in training_step yourself"
            )
            return
        if any(type(c).__name__ == "GradientAccumulationScheduler" for c in trainer.callbacks):
            self.not_applied["accumulate_grad_batches"] = "a GradientAccumulationScheduler sets it"
            return
        trainer.accumulate_grad_batches = value
        self.applied["accumulate_grad_batches"] = value

    def _set_workers(self, trainer: Any, pl_module: Any, value: int) -> None:
        if not self._set_attribute(trainer, pl_module, "num_workers", value):
            self._workers_on_loader = value  # on the DataLoader itself, once it exists

    def _refuse_precision(self) -> None:
        self.not_applied["precision"] = (
            "the Trainer fixes its precision when it is constructed: tune precision with a LightningCLI "
            "script (--trainer.precision) or pass it to the Trainer yourself"
        )

    def _set_bucket_cap(self, trainer: Any, value: int) -> None:
        strategy = trainer.strategy
        kwargs = getattr(strategy, "_ddp_kwargs", None)
        if int(trainer.world_size) <= 1 or not isinstance(kwargs, dict):
            self.not_applied["bucket_cap_mb"] = (
                f"{type(strategy).__name__} on {trainer.world_size} process(es) wraps no DistributedDataParallel"
            )
            return
        kwargs["bucket_cap_mb"] = value  # DDP reads it when the strategy wraps the model, after this hook
        self.applied["bucket_cap_mb"] = value

    def _apply_comm_hook(self, trainer: Any, name: str, on_cuda: bool) -> None:
        strategy = trainer.strategy
        if int(trainer.world_size) <= 1:
            self.not_applied["comm_hook"] = "one process: there is no gradient communication to compress"
            return
        if not hasattr(strategy, "_ddp_comm_hook"):
            self.not_applied["comm_hook"] = f"{type(strategy).__name__} is not a DDP strategy"
            return
        if name == "bf16" and not on_cuda:
            self.not_applied["comm_hook"] = "bf16 compression needs NCCL: gloo cannot all-reduce bf16"
            return
        if getattr(strategy, "_ddp_comm_hook", None) is not None:
            self.not_applied["comm_hook"] = "the script already passes a ddp_comm_hook (one hook per model)"
            return
        if on_cuda:
            strategy._ddp_comm_hook = _comm_hook(name)  # Lightning registers it when it wraps the model
        else:
            self._hook = name
        self.applied["comm_hook"] = name

    def apply_at_train_start(self, trainer: Any) -> None:
        """The knobs that need the wrapped model or the built DataLoader."""
        self._seen_global_step = int(trainer.global_step)
        if self._hook is not None:
            ddp_model = getattr(trainer.strategy, "model", None)
            try:
                # Through DDP's register_comm_hook, which tuneup's CommProbe (when installed) wraps and times.
                ddp_model.register_comm_hook(None, _comm_hook(self._hook))
            except Exception as exc:
                self.applied.pop("comm_hook", None)
                self.not_applied["comm_hook"] = f"registering it failed: {type(exc).__name__}: {exc}"
            self._hook = None
        if self._workers_on_loader is not None:
            loaders = _train_dataloaders(trainer)
            if loaders:
                for loader in loaders:
                    loader.num_workers = self._workers_on_loader
                    if self._workers_on_loader > 0 and getattr(loader, "prefetch_factor", 2) is None:
                        loader.prefetch_factor = 2  # DataLoader's own default for workers; None was for 0
                self.applied["num_workers"] = self._workers_on_loader
            else:
                self.not_applied["num_workers"] = "no training DataLoader was found to set it on"
            self._workers_on_loader = None
        if self.rank == 0:
            self._write_applied()

    @property
    def hook_pending(self) -> bool:
        return self._hook is not None

    def _write_applied(self) -> None:
        if self.status_dir is None:
            return
        document = {"applied": self.applied, "not_applied": self.not_applied}
        with contextlib.suppress(OSError):
            path = self.status_dir / APPLIED_FILE
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(document, indent=1))
            os.replace(tmp, path)

    # -- stopping --------------------------------------------------------------------------------------

    def batch_ended(self, trainer: Any) -> None:
        """After every batch; an optimizer step ended where the global step moved. Count it, beat the heart,
        and stop the fit once the trial has measured enough. Every rank reaches the same step count, so all
        take part in the one collective of a check."""
        global_step = int(trainer.global_step)
        if global_step == self._seen_global_step:
            return  # still accumulating
        self._seen_global_step = global_step
        now = time.perf_counter()
        self._steps += 1
        rule = self.spec.stop
        if self._last_step_end is not None and self._steps > rule.warmup_steps:
            self._steady_ms.append((now - self._last_step_end) * 1000.0)
        self._last_step_end = now
        if now - self._last_beat >= HEARTBEAT_S:
            self._last_beat = now
            self.beat()
        if self._steps >= rule.max_steps:
            trainer.should_stop = True  # the same step on every rank: no collective needed
        elif self._steps % rule.check_every == 0 and self._steps > rule.warmup_steps:
            enough = measured_enough(rule, self._steady_ms)
            if trainer.strategy.reduce_boolean_decision(enough, all=True):
                trainer.should_stop = True

    def manifest(self) -> dict[str, Any]:
        """For the run's manifest: which trial this run is, and what it applied."""
        return {
            "trial": self.spec.trial,
            "settings": dict(self.spec.settings),
            "applied": dict(self.applied),
            "not_applied": dict(self.not_applied),
            "stop": asdict(self.spec.stop),
        }

    def beat(self) -> None:
        if self.status_dir is None:
            return
        try:
            heartbeat_file(self.status_dir, self.rank).write_text(str(self._steps))
        except OSError as exc:
            warn_once("trial-heartbeat", f"cannot write the trial's heartbeat ({exc})")

    def failed(self, exc: BaseException) -> None:
        if self.status_dir is None:
            return
        document = {
            "rank": self.rank,
            "type": type(exc).__name__,
            "message": str(exc)[:500],
            "out_of_memory": is_out_of_memory(exc),
            "steps": self._steps,
        }
        with contextlib.suppress(OSError):
            failure_file(self.status_dir, self.rank).write_text(json.dumps(document))


def _train_dataloaders(trainer: Any) -> list[Any]:
    loaders = getattr(trainer, "train_dataloader", None)
    found: list[Any] = []

    def walk(obj: Any, depth: int = 0) -> None:
        if depth > 3 or obj is None:
            return
        if hasattr(obj, "num_workers") and hasattr(obj, "dataset"):
            found.append(obj)
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v, depth + 1)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v, depth + 1)
        elif hasattr(obj, "iterables"):  # Lightning's CombinedLoader
            walk(obj.iterables, depth + 1)

    walk(loaders)
    return found
