"""How much GPU memory does a batch need? The caching allocator's peak, as a line in the micro-batch:
peak(b) = fixed + per_sample·b, plus DDP's gradient buckets where a one-rank run moves to several GPUs.

Fitted where runs at two or more batch sizes recorded their peak. From one run: the fixed part is 16 bytes
per parameter (fp32 weights, gradients and Adam's two moments), the rest grows with the batch; where the
measured peak is under that (another optimizer, frozen parameters), half of it is taken as fixed, as the
step-time model splits one batch size's compute. The batch advice and the what-if read this one model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuneup.advise.observe import Observation

# Of the GPU's memory, what stays free: the CUDA context and the caching allocator's fragmentation are not
# in the allocator's peak of allocated bytes.
MEMORY_HEADROOM = 0.10
# fp32 weights (4), gradients (4) and Adam's two moments (8): what does not grow with the batch.
STATIC_BYTES_PER_PARAMETER = 16
# DDP's gradient buckets: a gradient-sized copy (gradient_as_bucket_view=False, DDP's default), present
# only where the run itself had one rank.
DDP_BUCKET_BYTES_PER_PARAMETER = 4


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """Peak allocated bytes per GPU at micro-batch b: fixed + per_sample·b (+ DDP's buckets)."""

    fixed_bytes: float
    per_sample_bytes: float
    ddp_bucket_bytes: float  # added where the target has several GPUs and the run had one
    basis: str

    def peak_bytes(self, batch_size: int, world_size: int) -> float:
        ddp = self.ddp_bucket_bytes if world_size > 1 else 0.0
        return self.fixed_bytes + self.per_sample_bytes * batch_size + ddp


def memory_model(observations: Sequence[Observation], base: Observation) -> MemoryModel | None:
    """The memory line of `base`'s workload (None where no run recorded a GPU peak)."""
    if base.gpu_peak_allocated_bytes is None:
        return None
    parameters = base.parameters
    ddp = DDP_BUCKET_BYTES_PER_PARAMETER * parameters if parameters and base.world_size == 1 else 0.0
    points = sorted(
        {(o.batch_size, o.gpu_peak_allocated_bytes) for o in observations if o.gpu_peak_allocated_bytes}
    )
    if len({b for b, _ in points}) >= 2:
        (b0, m0), (b1, m1) = points[0], points[-1]
        slope = max(0.0, (m1 - m0) / (b1 - b0))
        basis = f"peak fitted against the micro-batch from runs at batch {b0} and {b1}"
        return MemoryModel(max(0.0, m0 - slope * b0), slope, ddp, basis)
    peak, batch = base.gpu_peak_allocated_bytes, base.batch_size
    static = STATIC_BYTES_PER_PARAMETER * parameters if parameters else None
    if static is not None and static < peak:
        basis = (
            f"peak = {STATIC_BYTES_PER_PARAMETER} bytes per parameter (fp32 weights, gradients, Adam's moments) "
            "+ activations in proportion to the micro-batch, from the run's measured peak"
        )
        return MemoryModel(static, (peak - static) / batch, ddp, basis)
    basis = (
        f"peak = half fixed, half in proportion to the micro-batch (the run's peak is under "
        f"{STATIC_BYTES_PER_PARAMETER} bytes per parameter)"
    )
    return MemoryModel(peak / 2, peak / 2 / batch, ddp, basis)
