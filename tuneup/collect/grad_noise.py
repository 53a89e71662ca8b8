"""The two gradient norms per step that the gradient noise scale is estimated from (McCandlish et al. 2018,
appendix A.1): the squared norm of a gradient over a small batch and of one over a big batch, in the units
of the loss (the mixed-precision loss scale divided out).

Three ways to get them without communicating anything or copying a gradient:

- DDP: each bucket's local gradient (this rank's samples) before the all-reduce, and the averaged one
  after it (tuneup.collect.comm sums the buckets' squared norms per step); small batch = this rank's
  samples in the step, big batch = that times the world size.
- FSDP2 (`fully_shard`): the unsharded local gradient FSDP hands to its reduce-scatter, and this rank's
  shard of the averaged one after it, whose squared norms the analysis sums over the ranks
  (tuneup.collect.fsdp_noise); the batch sizes as for DDP.
- One process with gradient accumulation: the gradient after the first micro-batch's backward, and the
  accumulated one before the optimizer step. Lightning divides each micro-batch's loss by the
  accumulation count k, so the first micro-batch's gradient is 1/k of its own mean gradient: its squared
  norm is multiplied by k².

Norms are device tensors until the step is resolved on the writer's thread (`noise_record`): nothing
here synchronizes the device on the training thread.

The norms are memory-bandwidth bound (measured on a 2-core CPU at 2 x 37 us a step for 83k parameters,
2 x 141 us for 1.1M: up to 3% of a 10 ms step), so they cannot get much cheaper per call; `NoiseSampling`
takes them on one step in k instead, k chosen so that they cost at most `NOISE_BUDGET` of the step.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from tuneup.collect._tensor import to_float

DDP_METHOD = "ddp"
ACCUMULATION_METHOD = "accumulation"
FSDP2_METHOD = "fsdp2"  # its big-batch norm is each rank's shards' part: summed over the ranks

# The share of the step's time the norms may take when the sampling is automatic (issue 14 asks for at
# most 1% of a 10 ms step; half of it leaves room for the rest of the noise scale's work).
NOISE_BUDGET = 0.005
# The automatic sampling never takes fewer than one step in this many (the estimate needs steps).
MAX_NOISE_EVERY = 256
# Recent sampled steps' norm times, and recent step times, whose medians the automatic choice uses:
# medians, so that a slow step (a validation, a checkpoint, a GC pause) or a cold first norm moves nothing.
_NORM_WINDOW = 9
_STEP_WINDOW = 33


def choose_every(
    norm_s: float, step_s: float, budget: float = NOISE_BUDGET, max_every: int = MAX_NOISE_EVERY
) -> int:
    """The smallest power of two k (at most `max_every`) with norm_s / (k * step_s) <= budget: norms that
    take `norm_s` seconds on a sampled step cost at most `budget` of steps of `step_s` seconds. 1 where
    either time is unknown (not positive).

    A power of two, so that ranks choosing from their own times sample nested sets of steps (step % k == 0),
    and a rank whose choice moves by a factor of two keeps the steps it sampled before."""
    if not (norm_s > 0 and step_s > 0):
        return 1
    needed = norm_s / (budget * step_s)
    every = 1
    while every < needed and every < max_every:
        every *= 2
    return every


class NoiseSampling:
    """Which optimizer steps take the two norms: those with step % every == 0.

    `every` given: always that. None (automatic): every step at first; then, after each sampled step,
    `choose_every` from the median host time of the recent sampled steps' norms and the median host time
    of the recent steps, at most doubling at a time: the first steps (warm-up, cold caches, the first call
    of a kernel) are slow, and a choice made from them alone must not put the next sample past the steady
    steps. The times are the host's: on CUDA the norms are asynchronous kernels whose launch takes a few
    microseconds, so the choice is every step there unless the host is what limits the step.
    """

    def __init__(self, every: int | None = None, budget: float = NOISE_BUDGET) -> None:
        self.auto = every is None
        self.every = 1 if every is None else int(every)
        self.budget = budget
        self.norm_s: deque[float] = deque(maxlen=_NORM_WINDOW)
        self.step_s: deque[float] = deque(maxlen=_STEP_WINDOW)

    def takes(self, step: int, kept_every: int = 1) -> bool:
        """Whether step `step` takes the norms. `kept_every` > 1: the record keeps one step in that many
        (past `RecordingPolicy.detail_steps`), and norms on the others would be thrown away: only kept
        steps are taken then, one in ceil(every / kept_every) of them."""
        if kept_every <= 1:
            return step % self.every == 0
        if step % kept_every:
            return False
        return (step // kept_every) % -(-self.every // kept_every) == 0

    def observe(self, step_s: float | None, norm_s: float | None) -> None:
        """A step ended: its host time (None: unknown), and the host time of its norms where it took them.
        Automatic sampling chooses `every` again after each sampled step."""
        if step_s is not None and step_s > 0:
            self.step_s.append(step_s)
        if norm_s is None or not norm_s > 0:
            return
        self.norm_s.append(norm_s)
        if self.auto and self.step_s:
            chosen = choose_every(_median(self.norm_s), _median(self.step_s), self.budget)
            self.every = min(chosen, 2 * self.every)

    def summary(self) -> dict[str, Any]:
        """For the record: the sampling at the end, and the medians it was chosen from (milliseconds)."""
        norm = _median(self.norm_s) if self.norm_s else None
        step = _median(self.step_s) if self.step_s else None
        return {
            "every": self.every,
            "automatic": self.auto,
            "norm_ms": None if norm is None else norm * 1000.0,
            "step_ms": None if step is None else step * 1000.0,
            "budget": self.budget,
        }


def _median(values: deque[float]) -> float:
    # The upper median: a sort of a few dozen floats, on the training thread once per sampled step.
    return sorted(values)[len(values) // 2]


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

    `small_sq` and `big_sq` are None for DDP, whose norms come with the step's collectives; for FSDP2,
    `big_sq` is this rank's shards' part of the big-batch norm. `loss_scale`
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


def noise_record(pending: PendingNoise, comm_sq: tuple[Any, Any] | None) -> dict[str, Any]:
    """The step record's gns_* fields, or {} when the step gives no finite estimate (an fp16 overflow,
    a bucket whose norms are missing)."""
    if pending.method == DDP_METHOD:
        if comm_sq is None:
            return {}
        small, big = to_float(comm_sq[0]), to_float(comm_sq[1])
    else:
        small, big = to_float(pending.small_sq), to_float(pending.big_sq)
    scale = to_float(pending.loss_scale)
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
