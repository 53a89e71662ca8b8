"""The two gradient norms per step that the gradient noise scale is estimated from (McCandlish et al. 2018,
appendix A.1): the squared norm of a gradient over a small batch and of one over a big batch, in the units
of the loss (the mixed-precision loss scale divided out).

Two ways to get them without communicating anything or copying a gradient:

- DDP: each bucket's local gradient (this rank's samples) before the all-reduce, and the averaged one
  after it (tuneup.collect.comm sums the buckets' squared norms per step); small batch = this rank's
  samples in the step, big batch = that times the world size.
- One process with gradient accumulation: the gradient after the first micro-batch's backward, and the
  accumulated one before the optimizer step. Lightning divides each micro-batch's loss by the
  accumulation count k, so the first micro-batch's gradient is 1/k of its own mean gradient: its squared
  norm is multiplied by k².

Norms are device tensors until the step is resolved on the writer's thread (`noise_record`): nothing
here synchronizes the device on the training thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DDP_METHOD = "ddp"
ACCUMULATION_METHOD = "accumulation"


def squared_norm(tensor: Any) -> Any:
    """‖tensor‖², as a float32 device tensor (a 16-bit bucket would overflow squaring in its own dtype)."""
    import torch

    return torch.linalg.vector_norm(tensor.detach(), dtype=torch.float32).square()


def grads_squared_norm(parameters: Any) -> Any:
    """‖∇‖² over the parameters' gradients, as a device tensor: one fused pass, no copy. None when no
    gradient is there, or when one is sharded (its global norm would need a collective)."""
    import torch

    grads = []
    for p in parameters:
        g = p.grad
        if g is None:
            continue
        if hasattr(g, "to_local"):
            return None
        grads.append(g.detach())
    if not grads:
        return None
    norms = torch._foreach_norm(grads, 2.0)
    return torch.stack([n.float() for n in norms]).square().sum()


@dataclass(slots=True)
class PendingNoise:
    """One step's inputs to the noise scale, still as device tensors where they came from the device.

    `small_sq` and `big_sq` are None for DDP, whose norms come with the step's collectives. `loss_scale`
    is the GradScaler's scale during the step's backward (a tensor copy: the scaler updates its own in
    place), or None without one; `small_scaled` / `big_scaled` say whether that norm was taken before the
    gradients were unscaled. `small_factor` multiplies the small norm (k² for the first micro-batch).
    """

    method: str
    small_batch: int
    big_batch: int
    small_sq: Any = None
    big_sq: Any = None
    small_factor: float = 1.0
    loss_scale: Any = None
    small_scaled: bool = True
    big_scaled: bool = True


def _value(x: Any) -> float | None:
    if x is None:
        return None
    try:
        return float(x.item() if hasattr(x, "item") else x)
    except (TypeError, ValueError, RuntimeError):
        return None


def noise_record(pending: PendingNoise, comm_sq: tuple[Any, Any] | None) -> dict[str, Any]:
    """The step record's gns_* fields, or {} when the step gives no finite estimate (an fp16 overflow,
    a bucket whose norms are missing)."""
    if pending.method == DDP_METHOD:
        if comm_sq is None:
            return {}
        small, big = _value(comm_sq[0]), _value(comm_sq[1])
    else:
        small, big = _value(pending.small_sq), _value(pending.big_sq)
    scale = _value(pending.loss_scale)
    if small is None or big is None or (pending.loss_scale is not None and not scale):
        return {}
    small *= pending.small_factor
    if scale is not None:
        if pending.small_scaled:
            small /= scale * scale
        if pending.big_scaled:
            big /= scale * scale
    if not (math.isfinite(small) and math.isfinite(big)):
        return {}
    return {
        "gns_small_sq": small,
        "gns_big_sq": big,
        "gns_small_batch": pending.small_batch,
        "gns_big_batch": pending.big_batch,
    }


def sum_squares(values: list[Any]) -> Any:
    """The sum of per-bucket squared norms: one device tensor (one read later), or a float on the host."""
    if not values:
        return None
    if all(isinstance(v, (int, float)) for v in values):
        return float(sum(values))
    import torch

    return torch.stack([v.reshape(()).to(values[0].device) for v in values]).double().sum()
