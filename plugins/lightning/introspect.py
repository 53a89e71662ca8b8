"""What a Lightning trainer is configured to do (plain JSON-ready dicts for the run manifest), and the state
of it the callback reads (steps done, the device, the fp16 loss scale).

Every field is read defensively: attributes differ between Lightning 2.1 and 2.6 and between the two
namespaces, and a field that cannot be read is recorded as None rather than stopping the run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from tuneup.record.schema import STOP_USER_INTERRUPT
from tuneup.recording.describe import compiled_modules, loader_summary, model_summary, plain_value
from tuneup.recording.device import is_compiled
from tuneup.recording.facts import TrainingFacts

# Read here, defined with the other trainers' in tuneup.recording.describe.
__all__ = [
    "compiled_modules",
    "dataloader_config",
    "exception_stop_reason",
    "loss_scale",
    "max_time_s",
    "model_summary",
    "on_cuda",
    "stop_reason",
    "trainer_config",
    "training_facts",
    "training_steps_done",
]


def trainer_config(trainer: Any) -> dict[str, Any]:
    strategy = getattr(trainer, "strategy", None)
    accelerator = getattr(trainer, "accelerator", None)
    config: dict[str, Any] = {
        "namespace": type(trainer).__module__.split(".trainer")[0],
        "strategy": type(strategy).__name__ if strategy is not None else None,
        # How the ranks were started: "popen" (ddp: the script run again per rank), "spawn" or "fork"
        # (ddp_spawn, ddp_fork: workers of the launching process); None for one process.
        "start_method": plain_value(strategy, "_start_method"),
        "accelerator": type(accelerator).__name__ if accelerator is not None else None,
        "precision": plain_value(trainer, "precision"),
        "accumulate_grad_batches": plain_value(trainer, "accumulate_grad_batches"),
        "devices": plain_value(trainer, "num_devices"),
        "num_nodes": plain_value(trainer, "num_nodes"),
        "world_size": plain_value(trainer, "world_size"),
        "max_steps": plain_value(trainer, "max_steps"),
        "max_epochs": plain_value(trainer, "max_epochs"),
        "min_steps": plain_value(trainer, "min_steps"),
        "min_epochs": plain_value(trainer, "min_epochs"),
        "limit_train_batches": plain_value(trainer, "limit_train_batches"),
        "val_check_interval": plain_value(trainer, "val_check_interval"),
        "check_val_every_n_epoch": plain_value(trainer, "check_val_every_n_epoch"),
        "gradient_clip_val": plain_value(trainer, "gradient_clip_val"),
        "gradient_clip_algorithm": plain_value(trainer, "gradient_clip_algorithm"),
        "log_every_n_steps": plain_value(trainer, "log_every_n_steps"),
        "global_step_at_start": plain_value(trainer, "global_step"),
        "fast_dev_run": plain_value(trainer, "fast_dev_run"),
        "num_sanity_val_steps": plain_value(trainer, "num_sanity_val_steps"),
        "max_time_s": max_time_s(trainer),
    }
    try:
        config["optimizers"] = len(trainer.optimizers)
    except Exception:
        config["optimizers"] = None
    try:
        config["device_ids"] = [int(i) for i in trainer.device_ids]
    except Exception:
        config["device_ids"] = None
    try:
        config["estimated_stepping_batches"] = int(trainer.estimated_stepping_batches)
    except Exception:
        # Infinite or unknown (an iterable dataset without a length and no max_steps).
        config["estimated_stepping_batches"] = None
    try:
        config["callbacks"] = [type(cb).__name__ for cb in trainer.callbacks]
    except Exception:
        config["callbacks"] = None
    return config


def max_time_s(trainer: Any) -> float | None:
    """`Trainer(max_time=...)` in seconds: Lightning implements it as a `Timer` callback."""
    for cb in getattr(trainer, "callbacks", None) or []:
        if type(cb).__name__ == "Timer":
            duration = getattr(cb, "_duration", None)
            if isinstance(duration, (int, float)):
                return float(duration)
    return None


def stop_reason(trainer: Any) -> str:
    """Why the fit loop ended, as far as the trainer's state tells (called at on_train_end)."""
    try:
        if getattr(trainer, "fast_dev_run", False):
            return "fast_dev_run"
        max_steps = getattr(trainer, "max_steps", -1)
        if isinstance(max_steps, int) and max_steps >= 0 and trainer.global_step >= max_steps:
            return "max_steps"
        for cb in trainer.callbacks:
            name = type(cb).__name__
            if name == "Timer" and getattr(cb, "_duration", None) is not None:
                remaining = cb.time_remaining()
                if remaining is not None and remaining <= 0:
                    return "max_time"
            if name == "EarlyStopping" and getattr(cb, "stopped_epoch", 0):
                return "early_stopping"
        if getattr(trainer, "received_sigterm", False):
            return "sigterm"
        if getattr(trainer, "should_stop", False):
            return "should_stop"
        max_epochs = getattr(trainer, "max_epochs", None)
        if isinstance(max_epochs, int) and max_epochs >= 0 and trainer.current_epoch >= max_epochs:
            return "max_epochs"
    except Exception:
        return "unknown"
    return "end_of_data"


def exception_stop_reason(trainer: Any, exception: BaseException) -> str:
    """Why the fit ended, given the exception Lightning's `on_exception` received. A user's Ctrl-C is a
    decision to stop, not an interruption to plan checkpoints for; a SIGTERM (a preemption, a scheduler's
    time limit) or a crash is."""
    if isinstance(exception, KeyboardInterrupt):
        return STOP_USER_INTERRUPT
    # Lightning raises SIGTERMException (a SystemExit) at the next step after its SIGTERM handler ran.
    if type(exception).__name__ == "SIGTERMException" or getattr(trainer, "received_sigterm", False):
        return "sigterm"
    return "exception"


def _first_dataloader(obj: Any, depth: int = 0) -> Any:
    if obj is None or depth > 3:
        return None
    if hasattr(obj, "batch_size") and hasattr(obj, "num_workers"):
        return obj
    # Lightning's CombinedLoader keeps the user's structure in `.iterables`.
    if hasattr(obj, "iterables"):
        return _first_dataloader(obj.iterables, depth + 1)
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else []
    for value in values:
        found = _first_dataloader(value, depth + 1)
        if found is not None:
            return found
    return None


def dataloader_config(trainer: Any) -> dict[str, Any]:
    try:
        loader = _first_dataloader(trainer.train_dataloader)
    except Exception:
        loader = None
    return loader_summary(loader)


def training_steps_done(trainer: Any, automatic: bool) -> int:
    """Training steps (batches that stepped the optimizers) done before this fit, restored from a
    checkpoint when resuming. With automatic optimization one optimizer steps once per step: global_step.
    Manual optimization may step several: Lightning's own count of batches that stepped (kept for its
    loggers, restored from checkpoints; read again at the first batch, once its loop has settled it)."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    done = getattr(loop, "_batches_that_stepped", None)
    if automatic or not isinstance(done, int):
        return int(trainer.global_step)
    return int(done)


def on_cuda(trainer: Any) -> bool:
    return getattr(getattr(trainer.strategy, "root_device", None), "type", None) == "cuda"


def loss_scale(trainer: Any, optimizer: Any) -> tuple[Any, bool]:
    """(the fp16 GradScaler's scale in this step's backward, whether the gradients are unscaled already);
    (None, False) without a scaler. The scale is a copy of the scaler's tensor, read later: `get_scale()`
    would synchronize the device, and `update()` changes the scaler's own tensor in place after this."""
    scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
    if scaler is None or not getattr(scaler, "_enabled", True):
        return None, False
    scale = getattr(scaler, "_scale", None)
    if scale is None:
        return None, False
    optimizer = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer wraps the scaler's key
    state = getattr(scaler, "_per_optimizer_states", {}).get(id(optimizer)) or {}
    stage = state.get("stage")
    unscaled = getattr(stage, "name", None) == "UNSCALED"
    return (scale.detach().clone() if hasattr(scale, "detach") else float(scale)), unscaled


def training_facts(
    trainer: Any,
    pl_module: Any,
    *,
    automatic_optimization: bool,
    log_to_trainer: bool,
    tune_trial: dict[str, Any] | None,
    install_marks: Callable[[], Callable[[], None] | None],
) -> TrainingFacts:
    """What the recording session is told at `on_train_start`: the trainer's state, the manifest's sections,
    and how to read the loss scale, the accumulation and the strategy's events later."""
    strategy = trainer.strategy
    return TrainingFacts(
        device=getattr(pl_module, "device", None),
        local_rank=int(getattr(trainer, "local_rank", 0)),
        node_rank=int(getattr(trainer, "node_rank", 0)),
        num_nodes=int(getattr(trainer, "num_nodes", 1) or 1),
        ranks_per_node=int(getattr(trainer, "num_devices", 1)),
        steps_done=training_steps_done(trainer, automatic_optimization),
        optimizer_steps_done=int(trainer.global_step),
        epoch=int(trainer.current_epoch),
        automatic_optimization=automatic_optimization,
        # Read when needed: a GradientAccumulationScheduler changes it during the fit.
        accumulation=lambda: int(getattr(trainer, "accumulate_grad_batches", 1) or 1),
        parameters=pl_module.parameters,
        loss_scale=functools.partial(loss_scale, trainer),
        ddp_model=getattr(strategy, "model", None),
        compiled=is_compiled(pl_module),
        checkpoint=str(trainer.ckpt_path) if getattr(trainer, "ckpt_path", None) else None,
        trainer=trainer_config(trainer),
        dataloader=dataloader_config(trainer),
        model=model_summary(pl_module),
        tune_trial=tune_trial,
        log_every_steps=int(getattr(trainer, "log_every_n_steps", 50) or 50) if log_to_trainer else None,
        # TuneupDDPStrategy's events (its start, checks, fallbacks), recorded as they happen.
        sync_events=getattr(strategy, "tuneup_sync_events", None),
        sync_summary=getattr(strategy, "tuneup_sync_summary", None),
        install_marks=install_marks,
        trainer_name="lightning",
    )
