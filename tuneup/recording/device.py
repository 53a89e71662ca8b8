"""What the session reads from the device the model is on: the step clock's timer, the device's bus id,
its peak memory, the total gradient norm, and a torch.compile'd model. torch is imported inside the
functions that need it, so that the session's modules import without it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tuneup._log import warn_once
from tuneup.collect.step_clock import CudaEventTimer, HostTimer


def on_cuda(device: Any) -> bool:
    return getattr(device, "type", None) == "cuda"


def make_timer(timing: str, device: Any, owner: str) -> HostTimer | CudaEventTimer:
    """CUDA events on a GPU (or when asked for), the host clock otherwise."""
    cuda = on_cuda(device)
    if timing == "cuda_event" or (timing == "auto" and cuda):
        if not cuda:
            raise ValueError(f"{owner}(timing='cuda_event') needs the model on a CUDA device")
        return CudaEventTimer(device)
    return HostTimer()


def cuda_thread_init(device: Any) -> Callable[[], None] | None:
    """For the drainer's thread on a GPU: the rank's device, so reading a loss copies from the right one."""
    if not on_cuda(device):
        return None

    def init() -> None:
        import torch

        torch.cuda.set_device(device)

    return init


def cuda_bus_id(device: Any) -> str | None:
    if not on_cuda(device):
        return None
    try:
        import torch

        props = torch.cuda.get_device_properties(device)
        return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0".upper()
    except Exception:
        return None


def peak_memory_bytes(device: Any) -> int | None:
    if not on_cuda(device):
        return None
    import torch

    # A host-side counter of the caching allocator: reading it does not synchronize the device.
    return int(torch.cuda.max_memory_allocated(device))


def total_grad_norm(parameters: Iterable[Any]) -> Any:
    """The gradients' total 2-norm as a device tensor (read later with the step's timings, never
    synchronized here), or None without gradients or with sharded ones."""
    import torch

    grads = []
    for p in parameters:
        g = p.grad
        if g is None:
            continue
        if hasattr(g, "to_local"):
            # A sharded (DTensor) gradient: the global norm would need a collective, which tuneup never adds.
            warn_once("grad-norm-sharded", "gradient norm is not recorded for sharded (FSDP) gradients")
            return None
        grads.append(g.detach())
    if not grads:
        return None
    norms = torch._foreach_norm(grads, 2.0)  # one fused pass
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]), 2.0)


def is_compiled(module: Any) -> bool:
    """Whether any submodule is torch.compile'd (a dispatch mode around it could make it recompile or fail
    inside the user's step, where tuneup cannot catch it for them)."""
    try:
        return any(
            hasattr(m, "_orig_mod") or getattr(m, "_compiled_call_impl", None) is not None
            for m in module.modules()
        )
    except Exception:
        return True  # cannot tell: the safe answer
