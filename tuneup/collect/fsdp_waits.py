"""The wait for FSDP2's asynchronous all-gathers: the one FSDP wait that is not inside the collective's call.

On the host FSDP2 runs its collectives synchronously by default: the training thread is blocked in each
`all_gather_single` / `reduce_scatter_tensor` call for the whole of it, and CommProbe's wrapper of the call
times that. With an asynchronous unshard (`FSDPModule.unshard(async_op=True)`, or the unshard's async
option), the gather returns a Work and FSDP waits for it later, first thing in
`foreach_all_gather_copy_out`, which `FSDPParamGroup.wait_for_unshard` calls by its module-level name
(torch 2.13). Wrapping that name while a fit runs, this waits for the Work first, timed, then lets
FSDP's own wait return at once: the time blocked, not the copy-out after it.

A torch whose FSDP2 has no such function leaves the seam out: CommProbe then warns once, at the first
asynchronous gather, and the steps that use one have no exposed time (unknown, never a guess).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Protocol


class WaitListener(Protocol):
    """What this seam needs of the comm probe (tuneup.collect.comm.CommProbe), said here so that the probe,
    which installs the seam, is not imported back: the asynchronous gathers it launched, by their Work's
    id, and the step clock's phase now."""

    awaiting: dict[int, Any] | None
    phase_now: Callable[[], str] | None


def install_fsdp_waits(probe: WaitListener) -> Callable[[], None] | None:
    """Wrap FSDP2's copy-out of a gather, so that `probe` learns how long each asynchronous gather it
    launched was waited for; returns what removes the wrapper, or None where this torch has no seam."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group as module

        original = module.foreach_all_gather_copy_out
    except Exception:  # no FSDP2, or another layout: asynchronous gathers' waits stay unknown
        return None
    probe.awaiting = {}

    @functools.wraps(original)
    def copy_out(all_gather_result: Any, *args: Any, **kwargs: Any) -> Any:
        awaiting = probe.awaiting
        work = getattr(all_gather_result, "all_gather_work", None)
        record = awaiting.pop(id(work), None) if awaiting and work is not None else None
        if record is not None:
            if probe.phase_now is not None:
                record.phase = probe.phase_now()  # the phase the wait holds up, not the launch's
            started = time.perf_counter()
            work.wait()  # FSDP's own wait, next, then returns at once
            record.waited_s = time.perf_counter() - started
        return original(all_gather_result, *args, **kwargs)

    module.foreach_all_gather_copy_out = copy_out

    def remove() -> None:
        if module.foreach_all_gather_copy_out is copy_out:
            module.foreach_all_gather_copy_out = original

    return remove
