"""What the model and the data loader are, as plain JSON-ready dicts for the run manifest. Any trainer's:
these read torch modules and loaders, never a trainer.

Every field is read defensively: a field that cannot be read is recorded as None rather than stopping the
run."""

from __future__ import annotations

import sys
from typing import Any


def plain_value(obj: Any, name: str) -> Any:
    """`obj.name` as a JSON scalar (other values as their text); None where it cannot be read."""
    try:
        value = getattr(obj, name)
    except Exception:
        return None
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def model_summary(module: Any) -> dict[str, Any]:
    total = trainable = 0
    try:
        for p in module.parameters():
            # Sharded parameters (FSDP2 DTensors) report their global size, as the model is counted whole.
            n = int(p.numel())
            total += n
            if p.requires_grad:
                trainable += n
    except Exception:
        return {"class": type(module).__name__, "parameters": None, "trainable_parameters": None}
    return {
        "class": type(module).__name__,
        "module": type(module).__module__,
        "parameters": total,
        "trainable_parameters": trainable,
        "automatic_optimization": plain_value(module, "automatic_optimization"),
        "compiled": compiled_modules(module),
        "fsdp": fsdp_summary(module),
    }


def _dtype(value: Any) -> str | None:
    return str(value).removeprefix("torch.") if value is not None else None


def _one(values: set[Any]) -> Any:
    """The value all units share; "mixed" where they differ; None where none said."""
    values.discard(None)
    return next(iter(values)) if len(values) == 1 else ("mixed" if values else None)


def fsdp_units(module: Any) -> list[Any]:
    """The modules FSDP2's `fully_shard` wrapped in `module` (each an `FSDPModule`), in `modules()` order (the
    root first); [] without FSDP2, or where the modules cannot be listed."""
    if "torch.distributed.fsdp" not in sys.modules:
        # No FSDP2 unit can exist before its package is imported (`fully_shard` lives in it); importing it
        # only to look took 1.0 s of each recorded run's start on CPU, a quarter of a short CI run.
        return []
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return []
    try:
        return [m for m in module.modules() if isinstance(m, FSDPModule)]
    except Exception:
        return []


def fsdp_summary(module: Any) -> dict[str, Any] | None:
    """How FSDP2 (`fully_shard`) wrapped `module`, read once the strategy has wrapped it: the units, whether
    they reshard after forward (the root's own is left out: FSDP2 keeps the root's parameters gathered), the
    mixed-precision policy's dtypes and the offload policy; None where no module is an FSDP2 unit. Read from
    FSDP2's unit state (torch 2.13's `FSDPParamGroup`); a field another torch lays out differently is None."""
    units = fsdp_units(module)
    if not units:
        return None
    reshard: set[Any] = set()
    param_dtype: set[Any] = set()
    reduce_dtype: set[Any] = set()
    offload: set[Any] = set()
    for i, unit in enumerate(units):
        try:
            group = unit._get_fsdp_state()._fsdp_param_group
        except Exception:
            continue
        if group is None:  # a unit without parameters of its own
            continue
        if i > 0 or len(units) == 1:
            reshard.add(bool(group.post_forward_mesh_info is not None))
        mp = getattr(group, "mp_policy", None)
        param_dtype.add(_dtype(getattr(mp, "param_dtype", None)))
        reduce_dtype.add(_dtype(getattr(mp, "reduce_dtype", None)))
        policy = getattr(group, "offload_policy", None)
        offload.add(
            "cpu" if type(policy).__name__ == "CPUOffloadPolicy" else "none" if policy is not None else None
        )
    return {
        "kind": "FSDP2",
        "units": len(units),
        "reshard_after_forward": _one(reshard),
        "param_dtype": _one(param_dtype),
        "reduce_dtype": _one(reduce_dtype),
        "offload": _one(offload),
    }


def compiled_modules(module: Any) -> list[str] | None:
    """The modules `torch.compile` wraps, by name ("" for the module itself), seen at setup; None where
    they cannot be listed. Compilation runs at each graph's first call (the first training step, or a
    sanity check's first validation step), so the report can say whose time it is."""
    try:
        found = []
        # Lightning's `trainer.fit(torch.compile(model))` unwraps the module and keeps the compile context.
        if getattr(module, "_compiler_ctx", None):
            found.append("")
        for name, sub in module.named_modules():
            # `torch.compile(submodule)` wraps it in an OptimizedModule; `module.compile()` compiles in place.
            wrapped = type(sub).__name__ == "OptimizedModule" or getattr(sub, "_compiled_call_impl", None)
            if wrapped and name not in found:
                found.append(name)
        return found
    except Exception:
        return None


def loader_summary(loader: Any) -> dict[str, Any]:
    """A training DataLoader's settings ({"found": False} without one)."""
    if loader is None:
        return {"found": False}
    batch_size = plain_value(loader, "batch_size")
    if batch_size is None:
        batch_size = plain_value(getattr(loader, "batch_sampler", None), "batch_size")
    try:
        dataset_len: int | None = len(loader.dataset)
    except Exception:
        dataset_len = None
    return {
        "found": True,
        "class": type(loader).__name__,
        "batch_size": batch_size,
        "num_workers": plain_value(loader, "num_workers"),
        "pin_memory": plain_value(loader, "pin_memory"),
        "persistent_workers": plain_value(loader, "persistent_workers"),
        "prefetch_factor": plain_value(loader, "prefetch_factor"),
        "drop_last": plain_value(loader, "drop_last"),
        "sampler": type(getattr(loader, "sampler", None)).__name__,
        "dataset": type(getattr(loader, "dataset", None)).__name__,
        "dataset_len": dataset_len,
    }
