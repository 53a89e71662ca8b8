"""Timing the collectives of each training step: DDP's gradient buckets and FSDP's gathers and scatters.

DDP issues its all-reduces from C++, so wrapping `torch.distributed.all_reduce` alone sees none of them;
a DDP communication hook sees every bucket. `CommProbe.install()` therefore does two things while a fit
runs, and `uninstall()` undoes both:

- it wraps `DistributedDataParallel.register_comm_hook`, so that whichever hook is registered (Lightning's
  on CUDA, the user's own, tuneup's default on CPU) runs inside a timing wrapper that returns the same
  future value, unchanged;
- it wraps the Python collectives that hooks and FSDP call (`all_reduce`, `all_gather_single`,
  `reduce_scatter_single`, `all_gather_into_tensor`, `reduce_scatter_tensor`): inside a DDP hook to count
  the bytes the hook really sends (half for fp16 compression, PowerSGD's factors), and, for FSDP, to time
  each gather and scatter.

A collective's start is marked when it is launched and its end when its future completes. On CUDA both
marks are events (a `Future.then` callback may run before the kernels finish; an event recorded on the
callback's stream completes with the collective), read with the step, later, like the step's own marks.

FSDP's exposed time, on the host: FSDP waits for each gather and scatter on the training thread, so what
the step waited for is the training thread's time blocked in them (a synchronous collective's whole call;
an asynchronous gather's wait, timed by tuneup.collect.fsdp_waits), each given to the phase it held up
(the step clock's, `phase_now`). On CUDA the host's wait says nothing of the device's: left unknown.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tuneup._log import warn_once
from tuneup.collect.grad_noise import squared_norm, sum_squares
from tuneup.record.schema import FSDP_WAIT_FIELDS

# torch.distributed function -> collective kind, and the argument (position, name) holding the tensor
# whose size nccl-tests counts: the gathered output of a gather, the input of a scatter.
_COLLECTIVES: dict[str, tuple[str, int, str]] = {
    "all_reduce": ("all_reduce", 0, "tensor"),
    "all_gather_single": ("all_gather", 0, "output_tensor"),
    "all_gather_into_tensor": ("all_gather", 0, "output_tensor"),
    "reduce_scatter_single": ("reduce_scatter", 1, "input"),
    "reduce_scatter_tensor": ("reduce_scatter", 1, "input"),
}


@dataclass(slots=True)
class PendingCollective:
    kind: str
    bytes: int
    dtype: str | None
    bucket: int | None
    source: str
    start: Any
    world_size: int
    end: Any = None  # set when the collective completes (from another thread)
    # The gradient noise scale's inputs (tuneup.collect.grad_noise), DDP buckets only: the bucket's
    # squared norm before the all-reduce (this rank's gradient) and after it (the average), as tensors.
    local_sq: Any = None
    reduced_sq: Any = None
    # Which ranks it spanned, where a synchronisation strategy said (tuneup.sync): "node" (the ranks of one
    # node), "cross_node" (one rank per node); None: the model's whole process group.
    scope: str | None = None
    # FSDP on the host: the step clock's phase the training thread was in when it waited for it, and the
    # host seconds it was blocked (None: not known, e.g. an asynchronous gather whose wait was not timed).
    phase: str | None = None
    waited_s: float | None = None


# Collectives issued outside any DDP hook that are still the training's gradient synchronisation (local
# SGD's parameter averaging, from the optimizer step), and the scope of a hook's collectives: set by the
# code issuing them (`tuneup.sync`), per thread, and read by any installed probe.
_CONTEXT = threading.local()
PARAM_AVERAGING = "param_avg"  # the source of local SGD's averaging collectives


@contextlib.contextmanager
def collectives_as(source: str | None = None, scope: str | None = None) -> Iterator[None]:
    """Collectives issued inside are recorded as `source` (when not inside a DDP hook, which has its own
    record) and spanning `scope` ("node" or "cross_node"), by an installed `CommProbe`; no cost without one."""
    saved = (getattr(_CONTEXT, "source", None), getattr(_CONTEXT, "scope", None))
    _CONTEXT.source, _CONTEXT.scope = source or saved[0], scope or saved[1]
    try:
        yield
    finally:
        _CONTEXT.source, _CONTEXT.scope = saved


def _tensor_bytes(tensor: Any) -> int:
    try:
        return int(tensor.numel()) * int(tensor.element_size())
    except Exception:
        return 0


class CommProbe:
    """Collects the collectives of the current step; the step clock takes them when the step closes."""

    def __init__(self, on_cuda: bool, world_size: int) -> None:
        self.on_cuda = on_cuda
        self.world_size = world_size
        self.record_all = False  # FSDP: every collective is the training's; DDP: only those inside hooks
        self._lock = threading.Lock()
        self._current: list[PendingCollective] = []
        self._local = threading.local()
        self._saved: dict[str, Any] = {}
        self._saved_register: Any = None
        self.hook_registered = False
        self.hooks_wrapped = 0
        self.process_group: Any = None  # the DDP model's, once the default hook is registered
        # Take each bucket's squared norm before and after its all-reduce (the gradient noise scale). The
        # callback sets it before each step's backward: off on the steps its sampling leaves out, where the
        # hooks compute no norm at all.
        self.noise_scale = False
        # Host seconds each of those norms took (appended from the autograd and communication threads;
        # the callback takes them once the step is over), for the noise scale's sampling.
        self.noise_times: list[float] = []
        # Of those, the seconds spent on the training thread (a CPU backward runs the comm hook there): time
        # the step's backward held that is tuneup's own (`take_own_s`). Norms on other threads (a
        # communication thread's callbacks) overlap the step rather than lengthen it one for one.
        self.training_thread = threading.get_ident()
        self._own_s = 0.0
        self.hook_name: str | None = None  # the DDP comm hook in use, as registered
        # FSDP on the host (`install` decides): time the training thread's waits for each collective.
        self.times_waits = False
        # The phase the training thread is in now (the step clock's `phase_now`, set by the session).
        self.phase_now: Callable[[], str] | None = None
        # Asynchronous FSDP gathers launched and not waited for yet, by id of their Work: the FSDP seam
        # (tuneup.collect.fsdp_waits) times their wait; None where it could not be installed.
        self.awaiting: dict[int, PendingCollective] | None = None
        self._remove_fsdp_seam: Callable[[], None] | None = None

    # -- marks ---------------------------------------------------------------------------------------

    def mark(self) -> Any:
        if not self.on_cuda:
            return time.perf_counter()
        import torch

        # A fresh event each time: marks come from the autograd and communication threads too, and the
        # step clock's recycled events belong to the training thread.
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def take_own_s(self) -> float:
        """Seconds of norms taken on the training thread since the last call."""
        taken, self._own_s = self._own_s, 0.0
        return taken

    def _norm_took(self, seconds: float) -> None:
        self.noise_times.append(seconds)
        if threading.get_ident() == self.training_thread:
            self._own_s += seconds

    def take_noise_times(self) -> list[float]:
        """The host seconds of the norms taken since the last call (the step that just closed)."""
        taken, self.noise_times = self.noise_times, []
        return taken

    def take(self) -> list[PendingCollective]:
        """The collectives launched since the last call (the step that just closed)."""
        with self._lock:
            taken, self._current = self._current, []
        if self.awaiting:
            self.awaiting.clear()  # a gather never waited for in its step: that step's exposed time is unknown
        return taken

    def _add(self, record: PendingCollective) -> None:
        with self._lock:
            self._current.append(record)

    def _finish(self, record: PendingCollective) -> Callable[[Any], Any]:
        def done(fut: Any) -> Any:
            record.end = self.mark()
            return fut.value()

        return done

    def _finish_with_norm(self, record: PendingCollective) -> Callable[[Any], Any]:
        def done(fut: Any) -> Any:
            record.end = self.mark()
            value = fut.value()
            # The averaged bucket, as the hook hands it back to DDP (a tensor).
            _reduced_squared_norm(self, record, value[0] if isinstance(value, list) else value)
            return value

        return done

    # -- DDP hooks -----------------------------------------------------------------------------------

    def wrap_hook(self, hook: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """`hook`, timed per bucket; the future it returns carries the same value."""
        probe = self

        @functools.wraps(hook)
        def timed_hook(state: Any, bucket: Any) -> Any:
            # Before the hook: hooks divide and reduce the bucket in place. Before the collective's start
            # mark too: the norm is tuneup's own time, not the collective's.
            local_sq = _local_squared_norm(probe, bucket) if probe.noise_scale else None
            start = probe.mark()
            sent: list[tuple[str, int, str, str | None, int]] = []  # kind, bytes, dtype, scope, ranks
            probe._local.sent = sent
            try:
                fut = hook(state, bucket)
            finally:
                probe._local.sent = None
            if not sent and getattr(state, "silent", False):
                return fut  # the hook sent nothing (a local SGD step): no collective to record
            buffer = bucket.buffer()
            scope, ranks = None, probe.world_size
            if sent:  # what the hook put on the wire: compressed, factored, or as it came
                kind, dtype, scope, ranks = sent[0][0], sent[0][2], sent[0][3], sent[0][4]
                nbytes = sum(s[1] for s in sent)
            else:  # a hook that communicates by other means: the bucket's own size is the best guess
                kind, nbytes, dtype = (
                    "all_reduce",
                    _tensor_bytes(buffer),
                    str(buffer.dtype).removeprefix("torch."),
                )
            record = PendingCollective(
                kind, nbytes, dtype, int(bucket.index()), "ddp_hook", start, ranks, scope=scope
            )
            probe._add(record)
            if getattr(state, "lossy", False):
                # The hook's result is not the exact average (PowerSGD, local steps): the noise scale's
                # "after" norm would be the approximation's, so this step has none.
                local_sq = None
            if local_sq is None:
                return fut.then(probe._finish(record))
            record.local_sq = local_sq
            return fut.then(probe._finish_with_norm(record))

        return timed_hook

    def register_default_hook(self, ddp_model: Any) -> None:
        """On CPU nobody registers a hook (Lightning ignores `ddp_comm_hook` off CUDA): register DDP's
        default all-reduce, timed (`timed_allreduce_hook`). The result is DDP's default: gradients averaged
        over the model's process group."""
        import torch.distributed as dist

        self.process_group = getattr(ddp_model, "process_group", None) or dist.group.WORLD
        register = self._saved_register or type(ddp_model).register_comm_hook
        register(ddp_model, self, timed_allreduce_hook)
        self.hook_registered = True
        self.hook_name = "timed_allreduce_hook"

    # -- install / uninstall -------------------------------------------------------------------------

    def install(self) -> None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        for name in _COLLECTIVES:
            original = getattr(dist, name, None)
            if original is not None and name not in self._saved:
                self._saved[name] = original
                setattr(dist, name, self._wrap_collective(name, original))
        if self.record_all and not self.on_cuda and self._remove_fsdp_seam is None:
            from tuneup.collect.fsdp_waits import install_fsdp_waits

            self.times_waits = True
            self._remove_fsdp_seam = install_fsdp_waits(self)
        if self._saved_register is None:
            self._saved_register = DistributedDataParallel.register_comm_hook
            probe = self
            original_register = self._saved_register

            @functools.wraps(original_register)
            def register_comm_hook(ddp_self: Any, state: Any, hook: Callable[..., Any]) -> Any:
                result = original_register(ddp_self, state, probe.wrap_hook(hook))
                probe.hook_registered = True
                probe.hook_name = str(getattr(hook, "__qualname__", None) or hook)[:200]
                probe.hooks_wrapped += 1
                return result

            DistributedDataParallel.register_comm_hook = register_comm_hook  # type: ignore[method-assign]

    def uninstall(self) -> None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        for name, original in self._saved.items():
            setattr(dist, name, original)
        self._saved.clear()
        if self._remove_fsdp_seam is not None:
            self._remove_fsdp_seam()
            self._remove_fsdp_seam = None
        self.awaiting = None
        if self._saved_register is not None:
            DistributedDataParallel.register_comm_hook = self._saved_register  # type: ignore[method-assign]
            self._saved_register = None

    def _wrap_collective(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        kind, size_pos, size_name = _COLLECTIVES[name]
        probe = self

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            sent = getattr(probe._local, "sent", None)
            outside = getattr(_CONTEXT, "source", None)
            if sent is None and not probe.record_all and outside is None:
                return original(*args, **kwargs)
            try:
                tensor = args[size_pos] if len(args) > size_pos else kwargs.get(size_name)
                nbytes = _tensor_bytes(tensor) if tensor is not None else 0
                dtype = str(tensor.dtype).removeprefix("torch.") if tensor is not None else None
            except Exception:
                nbytes, dtype = 0, None
            scope = getattr(_CONTEXT, "scope", None)
            group = kwargs.get("group")
            ranks = probe.world_size
            if group is not None:
                with contextlib.suppress(Exception):  # a group object without size(): count the world
                    ranks = int(group.size())
            if sent is not None:
                # Inside a DDP hook: the hook's own timing covers it; only count what it sends.
                sent.append((kind, nbytes, dtype or "", scope, ranks))
                return original(*args, **kwargs)
            record = PendingCollective(
                kind, nbytes, dtype, None, outside or "fsdp", probe.mark(), ranks, scope=scope
            )
            # FSDP on the host, on the training thread: the step waits for it (module docstring).
            waits = probe.times_waits and outside is None and threading.get_ident() == probe.training_thread
            if waits and probe.phase_now is not None:
                record.phase = probe.phase_now()
            work = original(*args, **kwargs)
            probe._add(record)
            if kwargs.get("async_op") and work is not None:
                try:
                    work.get_future().then(probe._finish(record))
                except Exception as exc:  # a backend without futures: time to the launch only
                    warn_once("comm-future", f"cannot time async {name} ({exc}); its duration is left out")
                if waits:
                    if probe.awaiting is not None:
                        probe.awaiting[id(work)] = record
                    else:
                        warn_once(
                            "fsdp-async-wait",
                            f"cannot time the wait for FSDP's asynchronous {name} in this torch version; "
                            "the exposed communication of the steps that use one is unknown",
                        )
            else:
                record.end = probe.mark()
                if waits:
                    record.waited_s = record.end - record.start
            return work

        return collective


def _local_squared_norm(probe: CommProbe, bucket: Any) -> Any:
    started = time.perf_counter()
    try:
        return squared_norm(bucket.buffer())
    except Exception as exc:  # never the training's problem: this step just has no noise scale
        warn_once("gns-before", f"cannot take a gradient bucket's norm ({exc}); no noise scale")
        return None
    finally:
        probe._norm_took(time.perf_counter() - started)


def _reduced_squared_norm(probe: CommProbe, record: PendingCollective, averaged: Any) -> None:
    started = time.perf_counter()
    try:
        record.reduced_sq = squared_norm(averaged)
    except Exception as exc:  # never the training's problem: this step just has no noise scale
        warn_once("gns-after", f"cannot take a reduced bucket's norm ({exc}); no noise scale")
    probe._norm_took(time.perf_counter() - started)


# No annotations: DDP checks a hook's annotations, and `from __future__ import annotations` makes them strings.
def timed_allreduce_hook(probe, bucket):  # type: ignore[no-untyped-def]
    """torch's `allreduce_hook`, timed by `probe` (the hook's state), in one piece.

    Why not `probe.wrap_hook(allreduce_hook)`: every Python call and `Future.then` callback per bucket takes
    the GIL on the autograd or communication thread. Wrapped, a bucket costs the wrapper, `dist.all_reduce`'s
    Python layer and two callbacks (the hook's and the wrapper's end mark); this hook makes one call to the
    process group and one callback that ends the record and hands the bucket back.
    """
    # This rank's gradient, before the division below changes the bucket in place; before the start mark,
    # as tuneup's own time, not the collective's.
    local_sq = _local_squared_norm(probe, bucket) if probe.noise_scale else None
    start = probe.mark()
    group = probe.process_group
    tensor = bucket.buffer()
    # Divide first, as allreduce_hook does, so that 16-bit gradients cannot overflow in the sum. (Without
    # any hook DDP folds this division into its copy into the bucket: the one pass a hook adds.)
    tensor.div_(group.size())
    fut = group.allreduce([tensor]).get_future()
    record = PendingCollective(
        "all_reduce",
        tensor.numel() * tensor.element_size(),
        str(tensor.dtype).removeprefix("torch."),
        bucket.index(),
        "ddp_hook",
        start,
        probe.world_size,
    )
    probe._add(record)

    def done(fut):  # type: ignore[no-untyped-def]
        record.end = probe.mark()
        return fut.value()[0]

    if local_sq is None:
        return fut.then(done)
    record.local_sq = local_sq

    def done_with_norm(fut):  # type: ignore[no-untyped-def]
        record.end = probe.mark()
        averaged = fut.value()[0]
        _reduced_squared_norm(probe, record, averaged)
        return averaged

    return fut.then(done_with_norm)


# What an FSDP step waited for, by the step record's field: (the collectives' kinds, the phase they held up).
# FSDP2 reduce-scatters each unit's gradient in backward (the root's, and an HSDP all-reduce, in its final
# callback, still inside backward).
_FSDP_WAIT_PARTS: dict[str, tuple[tuple[str, ...], str]] = dict(
    zip(
        FSDP_WAIT_FIELDS,
        (
            (("all_gather",), "forward"),
            (("all_gather",), "backward"),
            (("reduce_scatter", "all_reduce"), "backward"),
        ),
        strict=True,
    )
)


def _fsdp_waits_ms(fsdp: list[PendingCollective]) -> dict[str, float] | None:
    """The step's exposed FSDP time (`comm_exposed_ms`: every wait) and its parts (_FSDP_WAIT_PARTS), in
    ms; None where no collective's wait was timed or one's is unknown (then the step's is unknown too)."""
    waits = [p.waited_s for p in fsdp]
    if not waits or None in waits:
        return None
    out = {"comm_exposed_ms": sum(waits) * 1000.0}  # type: ignore[arg-type]
    for name, (kinds, phase) in _FSDP_WAIT_PARTS.items():
        out[name] = sum(p.waited_s for p in fsdp if p.kind in kinds and p.phase == phase) * 1000.0  # type: ignore[misc]
    return out


def resolve_collectives(
    pending: list[PendingCollective], elapsed_ms: Callable[[Any, Any], float], step_start: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-collective records and the step's summary (comm_ms, comm_exposed_ms, comm_bytes, comm_count).

    Exposed time is what the step still waited for after the last gradient bucket was handed over (the
    end of backward compute): the tail of the last collective to finish, counted from the last launch.
    FSDP on the host: the training thread's waits for its collectives, with their parts per phase
    (_FSDP_WAIT_PARTS).
    """
    done = [p for p in pending if p.end is not None]
    records = []
    for p in done:
        record = {
            "kind": p.kind,
            "bytes": p.bytes,
            "dtype": p.dtype,
            "bucket": p.bucket,
            "duration_ms": max(0.0, elapsed_ms(p.start, p.end)),
            "start_ms": elapsed_ms(step_start, p.start) if step_start is not None else None,
            "source": p.source,
            "world_size": p.world_size,
        }
        if p.scope is not None:
            record["scope"] = p.scope
        records.append(record)
    summary: dict[str, Any] = {}
    if done:
        hooks = [p for p in done if p.source == "ddp_hook"]
        exposed = None
        if hooks:
            last_launch = hooks[-1].start
            exposed = max(0.0, max(elapsed_ms(last_launch, p.end) for p in hooks))
        # Local SGD's parameter averaging runs from the optimizer step, on the training thread: the step
        # waits for all of it.
        averaging = [
            r["duration_ms"] for p, r in zip(done, records, strict=True) if p.source == PARAM_AVERAGING
        ]
        if averaging:
            exposed = (exposed or 0.0) + sum(averaging)
        fsdp_waits = None if hooks else _fsdp_waits_ms([p for p in pending if p.source == "fsdp"])
        if fsdp_waits is not None:
            exposed = (exposed or 0.0) + fsdp_waits.pop("comm_exposed_ms")
        summary = {
            "comm_ms": sum(r["duration_ms"] for r in records),
            "comm_exposed_ms": exposed,
            "comm_bytes": sum(p.bytes for p in done),
            "comm_count": len(done),
        }
        if fsdp_waits is not None:
            summary.update(fsdp_waits)
        if any(p.scope is not None for p in done):
            summary["comm_node_bytes"] = sum(p.bytes for p in done if p.scope == "node")
        # The noise scale's two norms, only when every bucket of the step has both (a bucket left out
        # would bias them); summed as tensors, read once by the caller.
        if hooks and len(hooks) == len([p for p in pending if p.source == "ddp_hook"]):
            local = [p.local_sq for p in hooks]
            reduced = [p.reduced_sq for p in hooks]
            if None not in local and None not in reduced:
                try:
                    summary["_gns_sq"] = (sum_squares(local), sum_squares(reduced))
                except Exception as exc:
                    warn_once("gns-sum", f"cannot add up the buckets' norms ({exc}); no noise scale")
    return records, summary
