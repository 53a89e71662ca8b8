"""The DDP comm hook of `tuneup.sync`: one hook carries every mode, so that the strategy can start
compressing after its warm-up and fall back to an exact all-reduce mid-run (a DDP model takes one hook).

Modes (`HookState.mode`, switched only by the controller, between optimizer steps, alike on every rank):
- "exact": the bucket averaged by an all-reduce (DDP's default, as `allreduce_hook` does it);
- "fp16" / "bf16": averaged in 16 bits and cast back (half the bytes);
- "powersgd": averaged as low-rank factors (`tuneup.sync.powersgd`);
- "local": no gradient leaves the node (local SGD): averaged among the node's ranks (hierarchical), or not
  at all.

At a checked step the hook also averages a slice of one bucket exactly (a collective the probe does not
count as the training's: the strategy reports it as the check's cost) and stores the relative error of
what the mode gave for that slice against it. Buckets and slices take turns from check to check.

No annotations on the hook: DDP compares them with `Future[Tensor]`, and this package's modules use
postponed (string) annotations elsewhere.
"""

import math
from typing import Any

from tuneup.collect.comm import collectives_as
from tuneup.sync.powersgd import PowerSGD

COMPRESSED_MODES = ("fp16", "bf16", "powersgd")  # the modes a check compares with an exact average
LOSSY_MODES = ("powersgd", "local")
# The check averages a slice of one bucket exactly: a 16th of it, or this many elements if more.
CHECK_SLICES = 16
CHECK_MIN_ELEMENTS = 16_384


class HookState:
    """What the hook needs and what it measured; read and switched by `tuneup.sync.controller`."""

    def __init__(
        self,
        mode: str,
        group: Any,
        world_size: int,
        powersgd: PowerSGD | None = None,
        node_group: Any = None,
        node_size: int = 1,
    ) -> None:
        self.mode = mode
        self.group = group
        self.world_size = world_size
        self.powersgd = powersgd
        self.node_group = node_group
        self.node_size = node_size
        self.iteration = 0  # backward passes that synchronised (the last bucket's hook counts them)
        self.num_buckets = 0
        # The check: set before a backward, answered by it.
        self.check_next = False
        self.check_error: float | None = None
        self.checks_made = 0  # the buckets, then each bucket's slices, take turns by it
        # Bytes, since the start: what an exact all-reduce of the same buckets would have sent, what the
        # modes sent, and what the checks' exact all-reduces sent.
        self.exact_bytes = 0
        self.sent_bytes = 0
        self.check_bytes = 0
        # A test seam: a function applied to the mode's result (fault injection); None in real use.
        self.fault: Any = None

    @property
    def lossy(self) -> bool:
        """Whether the hook's result is other than the exact average (read by the probe's noise scale)."""
        return self.mode in LOSSY_MODES

    @property
    def silent(self) -> bool:
        """Whether the hook sends nothing at all (a local step with no node to average in): read by the
        probe, which then records no collective rather than guess one."""
        return self.mode == "local" and (self.node_group is None or self.node_size <= 1)

    def all_reduce(self, tensor: Any) -> None:
        """Sum `tensor` over the model's group, in place, through torch.distributed (the probe counts it);
        returns when it is done."""
        import torch.distributed as dist

        dist.all_reduce(tensor, group=self.group)

    @property
    def check_bucket(self) -> int:
        """The bucket the next check takes (each in turn; bucket 0 until the first backward counted them)."""
        return self.checks_made % max(1, self.num_buckets)

    def check_window(self, numel: int) -> slice:
        """The part of a bucket the next check averages exactly: one of CHECK_SLICES slices of it (at least
        CHECK_MIN_ELEMENTS), the slices in turn. A whole bucket would cost the check as much as an exact
        step, which is many compressed steps' worth (PowerSGD sends ~1/15 of it)."""
        length = max(CHECK_MIN_ELEMENTS, -(-numel // CHECK_SLICES))
        slices = -(-numel // length)
        # This bucket's own turn: with the buckets alternating, every slice of each comes round.
        start = (self.checks_made // max(1, self.num_buckets) % slices) * length
        return slice(start, min(numel, start + length))

    def exact_average(self, flat: Any, divisor: int | None = None) -> Any:
        """`flat` averaged exactly, for the check: straight to the process group, uncounted."""
        exact = flat.div(self.world_size if divisor is None else divisor)
        self.group.allreduce([exact]).wait()
        self.check_bytes += exact.numel() * exact.element_size()
        return exact


def relative_error(approx: Any, exact: Any) -> float:
    import torch

    denominator = float(torch.linalg.vector_norm(exact.float()))
    error = float(torch.linalg.vector_norm(approx.float() - exact.float()))
    if denominator == 0.0:
        return 0.0 if error == 0.0 else math.inf
    return error / denominator


def _done(value: Any) -> Any:
    import torch

    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


def sync_hook(state, bucket):  # type: ignore[no-untyped-def]
    """DDP comm hook: the bucket's average as `state.mode` makes it (see the module's doc)."""
    buf = bucket.buffer()
    index = int(bucket.index())
    mode = state.mode
    if bucket.is_last():
        state.num_buckets = max(state.num_buckets, index + 1)
        state.iteration += 1
    state.exact_bytes += buf.numel() * buf.element_size()
    checked = state.check_next and index == state.check_bucket and mode in COMPRESSED_MODES
    window = state.check_window(buf.numel()) if checked else slice(0, 0)
    if mode == "powersgd":
        buf.div_(state.world_size)
        # Checked against the exact average of the compressor's own input: with error feedback that is
        # the gradient plus what earlier steps left out, which the compressed average stands for.
        exact_of = (lambda compensated: state.exact_average(compensated[window], 1)) if checked else None
        exact = state.powersgd.reduce(index, bucket, buf, state.all_reduce, exact_of)
        state.sent_bytes += state.powersgd.sent_numel(index, bucket) * buf.element_size()
        return _done(_finish(state, buf, exact, window))
    if mode == "local":
        if state.silent:
            return _done(buf)  # a local step: this rank's own gradient
        import torch.distributed as dist

        buf.div_(state.node_size)
        with collectives_as(scope="node"):
            fut = dist.all_reduce(buf, group=state.node_group, async_op=True).get_future()
        state.sent_bytes += buf.numel() * buf.element_size()
        return fut.then(lambda f: f.value()[0])
    import torch
    import torch.distributed as dist

    exact = state.exact_average(buf[window]) if checked else None
    if mode in ("fp16", "bf16"):
        wire = buf.div_(state.world_size).to(torch.float16 if mode == "fp16" else torch.bfloat16)
    else:
        wire = buf.div_(state.world_size)
    fut = dist.all_reduce(wire, group=state.group, async_op=True).get_future()
    state.sent_bytes += wire.numel() * wire.element_size()

    def averaged(f):  # type: ignore[no-untyped-def]
        value = f.value()[0]
        if value is not buf:
            buf.copy_(value)
        return _finish(state, buf, exact, window)

    return fut.then(averaged)


def _finish(state: HookState, averaged: Any, exact: Any, window: slice) -> Any:
    if state.fault is not None and state.mode != "exact":
        state.fault(averaged)
    if exact is not None:
        state.check_error = relative_error(averaged[window], exact)
        state.check_next = False
        state.checks_made += 1
    return averaged
