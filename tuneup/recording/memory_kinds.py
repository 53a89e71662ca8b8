"""What a rank's memory holds, by kind: parameters (this rank's shards, and what they are unsharded),
gradients, optimizer state, and on a GPU the peak and what the peak held beyond those three.

Read once, just before the second optimizer step: the gradients of that step exist, and so does the
optimizer's state (Adam creates its moments at the first step). A sharded parameter (FSDP2's `DTensor`) counts
its local shard as this rank's memory and its global size as what an all-gather materializes, so that a
change of sharding (DDP, FSDP, HSDP), of optimizer or of batch can be predicted from the kinds.

Counted from the tensors themselves, not through an allocator hook: nothing runs at the other steps, and a
CPU run gets every kind but the peak (the CPU allocator keeps no peak). torch is imported inside the
functions, so that the session's modules import without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tuneup.recording import device as dev


def _local(tensor: Any) -> Any:
    """The part of `tensor` this rank holds: a DTensor's local shard, any other tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _bytes(tensor: Any) -> int:
    return int(tensor.numel()) * int(tensor.element_size())


def _held_bytes(tensor: Any, storages: set[int]) -> int:
    """What `tensor` (a parameter, gradient or state) holds on this rank: a DTensor's local shard with the
    padding FSDP2 allocates beside it (the shard is a view of a storage padded to equal shards), each storage
    counted once; any other tensor, its own elements."""
    local = _local(tensor)
    if local is tensor:
        return _bytes(tensor)
    try:
        storage = local.untyped_storage()
        key = storage.data_ptr()
        if key in storages:
            return 0
        storages.add(key)
        return max(int(storage.nbytes()), _bytes(local))
    except Exception:  # a tensor without storage (meta, a subclass): its elements
        return _bytes(local)


def _state_tensors(optimizers: Iterable[Any]) -> Iterable[Any]:
    import torch

    for optimizer in optimizers:
        for state in getattr(optimizer, "state", {}).values():
            for value in state.values() if isinstance(state, dict) else ():
                if isinstance(value, torch.Tensor):
                    yield value


def memory_by_kind(
    parameters: Iterable[Any], optimizers: Iterable[Any], device: Any = None
) -> dict[str, Any]:
    """This rank's memory by kind, in bytes (each key a kind; None where it cannot be told).

    - ``parameters_bytes``: the parameters this rank holds (its shards, under FSDP);
    - ``parameters_unsharded_bytes``: the same parameters whole (equal to the above without sharding);
    - ``sharded_parameters``: how many of the parameters are sharded (DTensors);
    - ``gradients_bytes``: the gradients held (sharded like their parameters); None where none exists;
    - ``optimizer_state_bytes``: every tensor in the optimizers' state (each counted once);
    - ``peak_allocated_bytes`` (GPU): the caching allocator's peak so far, the fit's first step included;
    - ``other_at_peak_bytes`` (GPU): the peak less the three kinds above: activations, gathered
      (unsharded) parameters, communication buffers and temporaries, which a peak does not tell apart.
    """
    held = unsharded = grads = 0
    sharded = 0
    any_grad = False
    seen: set[int] = set()
    storages: set[int] = set()
    for p in parameters:
        if id(p) in seen:  # tied weights are one tensor
            continue
        seen.add(id(p))
        if _local(p) is not p:
            sharded += 1
        held += _held_bytes(p, storages)
        unsharded += _bytes(p)  # a DTensor's numel() is its global one
        if p.grad is not None:
            any_grad = True
            grads += _held_bytes(p.grad, storages)
    state = 0
    counted: set[int] = set()
    for tensor in _state_tensors(optimizers):
        if id(tensor) in counted:
            continue
        counted.add(id(tensor))
        state += _held_bytes(tensor, storages)
    kinds: dict[str, Any] = {
        "parameters_bytes": held,
        "parameters_unsharded_bytes": unsharded,
        "sharded_parameters": sharded,
        "gradients_bytes": grads if any_grad else None,
        "optimizer_state_bytes": state,
    }
    peak = dev.peak_memory_bytes(device)
    if peak is not None:
        kinds["peak_allocated_bytes"] = peak
        kinds["other_at_peak_bytes"] = max(0, peak - held - (grads if any_grad else 0) - state)
    return kinds
