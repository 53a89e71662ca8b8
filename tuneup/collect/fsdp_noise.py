"""The gradient noise scale's two norms under FSDP2 (`fully_shard`), with no collective of tuneup's own.

- Small batch, this rank's local gradient: FSDP2's post-backward hands each unit's unsharded gradients,
  as autograd computed them on this rank (before any pre-divide and before the reduce-scatter), to
  `foreach_reduce`, which `FSDPParamGroup.post_backward` calls by its module-level name (torch 2.13).
  Wrapping that name while a fit runs, the sum over a step's calls of their squared norms is |g_local|².
- Big batch, the gradient averaged over the ranks: after the backward each parameter's `.grad` is a
  DTensor holding this rank's shard of it. The squared norm of this rank's shards is recorded per rank;
  the analysis sums it over the ranks of the same step (tuneup.analyze.noise_scale), so no rank waits for
  another: a scalar all-reduce here would also need every rank to sample the same steps, which the
  automatic sampling, chosen from each rank's own times, does not promise. Under HSDP a shard is held by
  every replica of it: its squared norm is divided by their number, so that the sum over all ranks is
  still |G|² once.

Under gradient accumulation FSDP2 reduces either once per step (`set_requires_gradient_sync(False)` on
the other micro-batches, as Fabric's `no_backward_sync` does: the local gradient then covers the step's
samples) or once per micro-batch (Lightning's Trainer: each reduction is one micro-batch's gradient, its
loss divided by the accumulation count); `LocalGradNorms.take` says how many reductions each unit had.

Parameters that no `fully_shard` manages (plain tensors) are in neither norm: their gradients are not
reduced by FSDP at all. A torch without the seam: `available()` is False and the noise scale is not
measured (said once by the session), never a crash.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tuneup._log import warn_once

# More gradients' norms than this without a step taking them: a step that never ended; they are dropped.
_MAX_NORMS = 1_000_000


def _seam() -> tuple[Any, Callable[..., Any]] | None:
    """(the module whose `foreach_reduce` FSDP2 calls, that function), or None where this torch has none."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group as module

        original = module.foreach_reduce
        names = list(inspect.signature(original).parameters)
    except Exception:
        return None
    if names[:3] != ["fsdp_params", "unsharded_grads", "reduce_scatter_group"] or not {
        "gradient_divide_factor",
        "all_reduce_group",
    } <= set(names):
        return None  # another layout: the arguments read below would be wrong
    return module, original


def available() -> bool:
    """Whether this torch's FSDP2 has the seam the local gradient's norm is taken through."""
    return _seam() is not None


def is_fsdp2(parameters: Iterable[Any]) -> bool:
    """Whether any parameter is a DTensor (what `fully_shard` makes of a module's parameters; FSDP1's flat
    parameters are plain tensors)."""
    return any(hasattr(p, "to_local") and hasattr(p, "device_mesh") for p in parameters)


@dataclass(frozen=True, slots=True)
class LocalNorms:
    """One step's local gradient as FSDP2 reduced it: the sum of its squared norms (a device tensor),
    and how many times each unit was reduced in the step (1, or once per micro-batch)."""

    squared: Any
    reductions: int


class LocalGradNorms:
    """The squared norms of the unsharded gradients FSDP2 hands to its reduce-scatter, on the steps that
    take them (`taking`), with their host time (`take_own_s`: tuneup's own, inside the backward)."""

    def __init__(self) -> None:
        self.taking = False
        # Each gradient's norm (a 0-d float32 device tensor), squared and summed once at the step's end:
        # one foreach call per reduction and nothing else, the rest a few dispatches per step.
        self._norms: list[Any] = []
        self._calls_by_unit: dict[int, int] = {}
        self._unusable: str | None = None  # why this step's norms cannot be used
        self._own_s = 0.0
        self._ranks: int | None = None  # the data-parallel ranks of this step's reductions
        self._remove: Callable[[], None] | None = None
        self._arg_index: dict[str, int] = {}

    def install(self) -> bool:
        """Wrap FSDP2's `foreach_reduce` until `uninstall`; False where this torch has no such seam."""
        seam = _seam()
        if seam is None:
            return False
        module, original = seam
        names = list(inspect.signature(original).parameters)
        self._arg_index = {name: names.index(name) for name in ("gradient_divide_factor", "all_reduce_group")}
        norms = self

        @functools.wraps(original)
        def foreach_reduce(fsdp_params: Any, unsharded_grads: Any, *args: Any, **kwargs: Any) -> Any:
            if norms.taking and unsharded_grads:
                started = time.perf_counter()
                try:
                    norms._add(fsdp_params, unsharded_grads, args, kwargs)
                except Exception as exc:  # a sensor that fails leaves the step unmeasured, never the training
                    norms._unusable = f"{type(exc).__name__}: {exc}"
                    warn_once("fsdp-noise", f"the FSDP2 local gradient norm failed ({norms._unusable})")
                norms._own_s += time.perf_counter() - started
            # The norms are queued before FSDP's copy-in on the same stream: the gradients they read are
            # freed only after it.
            return original(fsdp_params, unsharded_grads, *args, **kwargs)

        module.foreach_reduce = foreach_reduce

        def remove() -> None:
            if module.foreach_reduce is foreach_reduce:
                module.foreach_reduce = original

        self._remove = remove
        return True

    def uninstall(self) -> None:
        remove, self._remove = self._remove, None
        if remove is not None:
            remove()
        self.taking = False

    def _arg(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name in kwargs:
            return kwargs[name]
        index = self._arg_index[name] - 2  # after fsdp_params and unsharded_grads
        return args[index] if index < len(args) else None

    def _add(self, fsdp_params: Any, grads: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import torch

        if len(self._norms) > _MAX_NORMS:
            self.clear()  # no step takes them (a session that stopped mid-step): never a growing list
        reduce_group = args[0] if args else kwargs.get("reduce_scatter_group")
        all_reduce_group = self._arg("all_reduce_group", args, kwargs)
        ranks = (reduce_group.size() if reduce_group is not None else 1) * (
            all_reduce_group.size() if all_reduce_group is not None else 1
        )
        divide = self._arg("gradient_divide_factor", args, kwargs)
        if divide is not None and divide != ranks:
            # The reduced gradient is then the sum over ranks divided by `divide`, not their mean.
            self._unusable = f"a gradient divide factor of {divide} over {ranks} ranks"
        unit = id(fsdp_params[0]) if fsdp_params else 0
        self._calls_by_unit[unit] = self._calls_by_unit.get(unit, 0) + 1
        norms = torch._foreach_norm([g.detach() for g in grads], 2.0, dtype=torch.float32)
        self._norms.extend(norms)
        self._ranks = ranks

    def take_own_s(self) -> float:
        """Host seconds of norms taken since the last call (on the training thread, inside the backward)."""
        taken, self._own_s = self._own_s, 0.0
        return taken

    def clear(self) -> None:
        """Forget the norms taken so far (a step that started and will not use them)."""
        self._norms, self._calls_by_unit, self._unusable, self._ranks = [], {}, None, None

    def take(self, world_size: int) -> LocalNorms | None:
        """The step's local norms, and the state cleared for the next step; None where the step has none or
        they cannot be used (said once): units reduced unequal numbers of times (a partial backward),
        a data-parallel group smaller than the world (tensor parallelism: the ranks of a group share one
        batch), a gradient divide factor of the user's."""
        norms, self._norms = self._norms, []
        calls, self._calls_by_unit = self._calls_by_unit, {}
        unusable, self._unusable = self._unusable, None
        ranks, self._ranks = self._ranks, None
        if not norms:
            return None
        if unusable is None and ranks is not None and ranks != world_size:
            unusable = (
                f"a data-parallel group of {ranks} of {world_size} ranks (tensor or pipeline parallelism)"
            )
        if unusable is None and len(set(calls.values())) != 1:
            unusable = "FSDP units reduced different numbers of times in one step"
        if unusable is not None:
            warn_once(f"fsdp-noise-{unusable}", f"a step's gradient noise scale is left out: {unusable}")
            return None
        import torch

        total = torch.stack(norms).square().sum()
        return LocalNorms(total, next(iter(calls.values())))


def shard_squared_norm(parameters: Iterable[Any]) -> Any:
    """This rank's part of ‖G‖², the averaged gradient's squared norm: the squared norm of its shards of the
    parameters' DTensor gradients, each divided by the number of ranks holding the same shard (HSDP's
    replicas), as a float32 device tensor; None where no gradient is a DTensor. Summed over the ranks, ‖G‖²."""
    import torch

    by_replicas: dict[int, list[Any]] = {}
    replicas_of: dict[tuple[int, Any], int] = {}
    for p in parameters:
        g = p.grad
        if g is None or not hasattr(g, "to_local"):
            continue
        key = (id(g.device_mesh), g.placements)
        replicas = replicas_of.get(key)
        if replicas is None:
            replicas = 1
            for dim, placement in enumerate(g.placements):
                if placement.is_replicate():
                    replicas *= g.device_mesh.size(dim)
            replicas_of[key] = replicas
        # The DTensor's own local tensor: to_local() goes through autograd, a few microseconds a parameter.
        local = getattr(g, "_local_tensor", None)
        local = (g.to_local() if local is None else local).detach()
        if local.numel():  # a rank's shard of a small parameter can be padding only
            by_replicas.setdefault(replicas, []).append(local)
    if not replicas_of:
        return None
    total = None
    for replicas, grads in by_replicas.items():
        part = torch.stack(torch._foreach_norm(grads, 2.0, dtype=torch.float32)).square().sum()
        if replicas > 1:
            part = part / replicas
        total = part if total is None else total + part
    if total is None:  # every shard here is empty: this rank's part is zero
        return torch.zeros((), dtype=torch.float32)
    return total
