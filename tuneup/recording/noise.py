"""The gradient noise scale in a recorded fit: whether and how it is measured (tuneup.collect.grad_noise's
methods), which steps take the two norms, and the step's inputs handed to the step clock.

Three methods, no extra communication, no copy of the gradients:
- DDP (more than one rank, with the comm probe's hook): each bucket's squared norm before and after its
  all-reduce, taken in the hook on the steps that take the norms;
- FSDP2 (more than one rank, parameters sharded by `fully_shard`): the local gradient's norm as FSDP hands
  it to its reduce-scatter (tuneup.collect.fsdp_noise's seam, installed while the fit runs), and this
  rank's shards' part of the averaged gradient's norm before the optimizer step;
- accumulation (one process, gradient accumulation of 2 or more, where the trainer scales each micro-batch's
  loss by 1/k as Lightning's automatic optimization does): the gradient's norm after the first micro-batch
  and before the optimizer step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from tuneup.collect import (
    fsdp_noise,
    grad_noise,  # read at call time: a test may slow it down (test_training_loops)
)
from tuneup.collect.comm import CommProbe
from tuneup.collect.grad_noise import (
    ACCUMULATION_METHOD,
    DDP_METHOD,
    FSDP2_METHOD,
    NoiseSampling,
    PendingNoise,
)
from tuneup.collect.step_clock import StepClock
from tuneup.record.writer import RecordingPolicy

LossScale = Callable[[Any], tuple[Any, bool]]


def choose_method(
    *,
    automatic_optimization: bool,
    world_size: int,
    comm: CommProbe | None,
    accumulation: int | None,
    parameters: Callable[[], Iterable[Any]] | None = None,
) -> tuple[str | None, str | None]:
    """(the method, None), or (None, why it is not measured). `accumulation` None: the trainer does not
    say how it scales each micro-batch's loss, so one process cannot use the accumulation method.
    `parameters`: the model's, to tell FSDP2 (DTensor parameters) from FSDP1 in a sharded run."""
    if not automatic_optimization:
        return None, "manual optimization (tuneup cannot tell which backward makes the step's gradient)"
    if world_size > 1:
        # FSDP2 needs no comm probe: its norms come through tuneup's own seam on FSDP's reduction.
        if parameters is not None and fsdp_noise.is_fsdp2(parameters()):
            if not fsdp_noise.available():
                return None, "this torch's FSDP2 has no foreach_reduce to take the local gradient's norm from"
            return FSDP2_METHOD, None
        if comm is None:
            return None, "profile_communication=False (the norms are taken in the DDP comm hook)"
        if comm.record_all:
            return None, (
                "FSDP1 (Lightning's FSDPStrategy): its flat gradient shards are not measured; FSDP2 "
                "(ModelParallelStrategy with fully_shard) is"
            )
        if not comm.hook_registered:
            return None, "no DDP comm hook could be registered"
        return DDP_METHOD, None
    if accumulation is None:
        return None, "the trainer does not say how it scales each micro-batch's loss under accumulation"
    if accumulation >= 2:
        return ACCUMULATION_METHOD, None
    return None, "one process without gradient accumulation (it needs two batch sizes in each step)"


class NoiseScaleSteps:
    """Per step: whether it takes the norms, the norms themselves (accumulation), and their cost."""

    def __init__(
        self,
        method: str,
        every: int | None,
        *,
        on_cuda: bool,
        comm: CommProbe | None,
        recording: RecordingPolicy,
        world_size: int,
        parameters: Callable[[], Iterable[Any]] | None = None,
        accumulation: Callable[[], int] | None = None,  # None: the trainer does not say
        loss_scale: LossScale | None = None,
    ) -> None:
        if every is None and on_cuda:
            # The host can judge neither side on CUDA: the norms are asynchronous kernels, and the host runs
            # ahead of the step (timed on the host, a 158 ms GPU step let k grow to leave 5 of 25 steps).
            every = 1
        self.method = method
        self.sampling = NoiseSampling(every)
        self.taken = False  # the current step takes the norms
        self._comm = comm if method == DDP_METHOD else None
        self._recording = recording
        self._world_size = world_size
        self._parameters = parameters
        self._accumulation = accumulation
        self._loss_scale = loss_scale
        self._norm_s = 0.0  # host seconds of the current step's norms (the accumulation method)
        self._step_start: float | None = None  # perf_counter at the current step's first micro-batch
        self._steps_seen = 0  # steps closed in this fit: the writer's steps_seen, for its policy
        self._first: tuple[Any, int] | None = None  # the first micro-batch's ‖g‖² and samples
        # FSDP2: the local gradient's norms, taken where FSDP hands it to its reduce-scatter (until close).
        self._local: fsdp_noise.LocalGradNorms | None = None
        if method == FSDP2_METHOD:
            self._local = fsdp_noise.LocalGradNorms()
            if not self._local.install():
                self._local = None  # choose_method checked the seam: only a torch patched since lands here
        if comm is not None:
            comm.noise_scale = False  # until a step that takes the norms (step_starts)
            comm.take_noise_times()

    def step_starts(self, step: int) -> None:
        """At the first micro-batch of a step: whether the step takes the norms. Under DDP the hooks are
        told now, before any backward of the step."""
        # The step's own time, from its first micro-batch to its end: the time between step ends would also
        # hold whatever runs between steps (validation, checkpoints, another fit's turn in a benchmark's
        # lockstep), and a longer step makes the norms look cheaper than they are.
        self._step_start = time.perf_counter()
        policy = self._recording
        kept_every = 1 if self._steps_seen < policy.detail_steps else policy.sample_stride
        self.taken = self.sampling.takes(step, kept_every)
        if self._comm is not None:
            self._comm.noise_scale = self.taken
        if self._local is not None:
            self._local.taking = self.taken
            self._local.clear()  # a step that stopped short of its optimizer step left its norms

    def backward_own_s(self) -> float:
        """At a backward's end: the host seconds its norms took on the training thread (the DDP hook's, or
        FSDP2's local gradient's), tuneup's own time inside the backward."""
        if self._comm is not None:
            return self._comm.take_own_s()
        if self._local is not None:
            taken = self._local.take_own_s()
            self._norm_s += taken
            return taken
        return 0.0

    def close(self) -> None:
        """The fit is over: FSDP2's seam removed."""
        local, self._local = self._local, None
        if local is not None:
            local.uninstall()

    def step_ends(self) -> None:
        """At the step's end: its host time and its norms' for the sampling to choose from."""
        now = time.perf_counter()
        started, self._step_start = self._step_start, None
        self._steps_seen += 1
        norm_s = None
        if self.taken:
            if self._comm is not None:
                times = self._comm.take_noise_times()
                norm_s = sum(times) if times else None
            else:
                norm_s, self._norm_s = self._norm_s, 0.0
        self.sampling.observe(None if started is None else now - started, norm_s)

    def after_first_micro_batch(self, clock: StepClock) -> None:
        """The accumulation method: the gradient after the step's first micro-batch (a device tensor)."""
        assert self._parameters is not None
        started = time.perf_counter()
        sq = grad_noise.grads_squared_norm(self._parameters())
        self._norm_s += time.perf_counter() - started
        self._first = None if sq is None else (sq, clock.samples or 0)

    def before_optimizer(self, clock: StepClock, optimizer: Any) -> None:
        """Before the optimizer step: the step's PendingNoise for the clock (or none for this step)."""
        first, self._first = self._first, None
        clock.noise = None
        accumulate = self._accumulation() if self._accumulation is not None else None
        samples = clock.samples
        # A step short of micro-batches (an epoch's end) has a gradient the trainer scaled by m/k: left out.
        if not samples or (accumulate is not None and clock.micro_batches != accumulate):
            return
        scale, unscaled = self._loss_scale(optimizer) if self._loss_scale is not None else (None, False)
        if self.method == FSDP2_METHOD:
            started = time.perf_counter()
            self._fsdp2_noise(clock, samples, accumulate, scale, unscaled)
            # All of it, not the shard norm alone: summing the step's local norms is the same work.
            self._norm_s += time.perf_counter() - started
        elif self.method == ACCUMULATION_METHOD:
            if first is None or not first[1] or first[1] >= samples or accumulate is None:
                return
            assert self._parameters is not None
            started = time.perf_counter()
            big_sq = grad_noise.grads_squared_norm(self._parameters())
            self._norm_s += time.perf_counter() - started
            if big_sq is None:
                return
            clock.noise = PendingNoise(
                ACCUMULATION_METHOD,
                small_batch=first[1],
                big_batch=samples,
                small_sq=first[0],
                big_sq=big_sq,
                # Each micro-batch's loss is divided by k: the first one's gradient is 1/k of its mean.
                small_factor=float(accumulate * accumulate),
                loss_scale=scale,
                small_scaled=True,
                big_scaled=not unscaled,  # unscaled before this point, unless the optimizer does it
            )
        else:
            clock.noise = PendingNoise(
                self.method,
                small_batch=samples,
                big_batch=samples * self._world_size,
                loss_scale=scale,
            )

    def _fsdp2_noise(
        self, clock: StepClock, samples: int, accumulate: int | None, scale: Any, unscaled: bool
    ) -> None:
        """FSDP2: the step's local norms (one reduction per unit, or one per micro-batch) and this rank's
        shards' part of the averaged gradient's norm."""
        local = self._local.take(self._world_size) if self._local is not None else None
        if local is None or self._parameters is None:
            return
        reductions = local.reductions
        if reductions > 1 and (accumulate != reductions or samples % reductions):
            # Each reduction is one micro-batch's gradient, its loss divided by the accumulation count,
            # only where the trainer says it is that count (Lightning's automatic optimization).
            return
        if reductions == 1 and clock.micro_batches > 1 and accumulate is None:
            return  # one reduction of micro-batches whose losses were scaled in a way tuneup is not told
        shard_sq = fsdp_noise.shard_squared_norm(self._parameters())
        if shard_sq is None:
            return
        clock.noise = PendingNoise(
            FSDP2_METHOD,
            # r reductions of the step's samples, each 1/r of its own mean gradient (the losses divided
            # by the accumulation count k = r): r² times its squared norm, averaged over the r of them.
            small_batch=samples // reductions,
            big_batch=samples * self._world_size,
            small_sq=local.squared,
            big_sq=shard_sq,
            small_factor=float(reductions),
            loss_scale=scale,
            small_scaled=True,
            big_scaled=not unscaled,
        )
