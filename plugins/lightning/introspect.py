"""What a Lightning trainer is configured to do, as plain JSON-ready dicts for the run manifest.

Every field is read defensively: attributes differ between Lightning 2.1 and 2.6 and between the two
namespaces, and a field that cannot be read is recorded as None rather than stopping the run.
"""

from __future__ import annotations

from typing import Any

from tuneup.record.schema import STOP_USER_INTERRUPT


def _get(obj: Any, name: str) -> Any:
    try:
        value = getattr(obj, name)
    except Exception:
        return None
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def trainer_config(trainer: Any) -> dict[str, Any]:
    strategy = getattr(trainer, "strategy", None)
    accelerator = getattr(trainer, "accelerator", None)
    config: dict[str, Any] = {
        "namespace": type(trainer).__module__.split(".trainer")[0],
        "strategy": type(strategy).__name__ if strategy is not None else None,
        # How the ranks were started: "popen" (ddp: the script run again per rank), "spawn" or "fork"
        # (ddp_spawn, ddp_fork: workers of the launching process); None for one process.
        "start_method": _get(strategy, "_start_method"),
        "accelerator": type(accelerator).__name__ if accelerator is not None else None,
        "precision": _get(trainer, "precision"),
        "accumulate_grad_batches": _get(trainer, "accumulate_grad_batches"),
        "devices": _get(trainer, "num_devices"),
        "num_nodes": _get(trainer, "num_nodes"),
        "world_size": _get(trainer, "world_size"),
        "max_steps": _get(trainer, "max_steps"),
        "max_epochs": _get(trainer, "max_epochs"),
        "min_steps": _get(trainer, "min_steps"),
        "min_epochs": _get(trainer, "min_epochs"),
        "limit_train_batches": _get(trainer, "limit_train_batches"),
        "val_check_interval": _get(trainer, "val_check_interval"),
        "check_val_every_n_epoch": _get(trainer, "check_val_every_n_epoch"),
        "gradient_clip_val": _get(trainer, "gradient_clip_val"),
        "gradient_clip_algorithm": _get(trainer, "gradient_clip_algorithm"),
        "log_every_n_steps": _get(trainer, "log_every_n_steps"),
        "global_step_at_start": _get(trainer, "global_step"),
        "fast_dev_run": _get(trainer, "fast_dev_run"),
        "num_sanity_val_steps": _get(trainer, "num_sanity_val_steps"),
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
    if loader is None:
        return {"found": False}
    batch_size = _get(loader, "batch_size")
    if batch_size is None:
        batch_size = _get(getattr(loader, "batch_sampler", None), "batch_size")
    try:
        dataset_len: int | None = len(loader.dataset)
    except Exception:
        dataset_len = None
    return {
        "found": True,
        "class": type(loader).__name__,
        "batch_size": batch_size,
        "num_workers": _get(loader, "num_workers"),
        "pin_memory": _get(loader, "pin_memory"),
        "persistent_workers": _get(loader, "persistent_workers"),
        "prefetch_factor": _get(loader, "prefetch_factor"),
        "drop_last": _get(loader, "drop_last"),
        "sampler": type(getattr(loader, "sampler", None)).__name__,
        "dataset": type(getattr(loader, "dataset", None)).__name__,
        "dataset_len": dataset_len,
    }


def model_summary(pl_module: Any) -> dict[str, Any]:
    total = trainable = 0
    try:
        for p in pl_module.parameters():
            # Sharded parameters (FSDP2 DTensors) report their global size, as the model is counted whole.
            n = int(p.numel())
            total += n
            if p.requires_grad:
                trainable += n
    except Exception:
        return {"class": type(pl_module).__name__, "parameters": None, "trainable_parameters": None}
    return {
        "class": type(pl_module).__name__,
        "module": type(pl_module).__module__,
        "parameters": total,
        "trainable_parameters": trainable,
        "automatic_optimization": _get(pl_module, "automatic_optimization"),
        "compiled": compiled_modules(pl_module),
    }


def compiled_modules(pl_module: Any) -> list[str] | None:
    """The modules `torch.compile` wraps, by name ("" for the LightningModule itself), seen at setup; None
    where they cannot be listed. Compilation runs at each graph's first call (the sanity check's first
    validation step, the first training step), so the report can say whose time it is."""
    try:
        found = []
        # `trainer.fit(torch.compile(model))`: Lightning unwraps the module and keeps the compile context.
        if getattr(pl_module, "_compiler_ctx", None):
            found.append("")
        for name, module in pl_module.named_modules():
            # `torch.compile(submodule)` wraps it in an OptimizedModule; `module.compile()` compiles in place.
            wrapped = type(module).__name__ == "OptimizedModule" or getattr(
                module, "_compiled_call_impl", None
            )
            if wrapped and name not in found:
                found.append(name)
        return found
    except Exception:
        return None
