"""Sharded runs (FSDP2): which sharding change costs the step less, predicted from what the run measured.

- `reshard_after_forward=False`: each unit keeps its gathered parameters from its forward to its backward, so
  the backward's re-gathers go, for the memory of the whole model's parameters held at once. Predicted from the
  run's per-phase waits (tuneup/collect/comm.py, FSDP on the host): the step saves at most what it waited for
  the re-gathers plus their copy-out into the unsharded parameters, a pass of the same work the forward's
  gathers do inside the forward phase (so at most the forward's time beside its waits); at least half of the
  wait, since the ranks' arrival skew the re-gathers absorbed moves to the next collective (the reduce-
  scatters). Measured on the accuracy benchmark's mlp-fsdp2 workload (benchmarks/README.md).
- DDP instead of FSDP2, where every rank can hold the whole model, its gradients and optimizer state: not
  predicted (the sharded run measures neither DDP's all-reduce nor its compute without FSDP's copies, and on
  gloo FSDP's gathers cost several times what one bucketed all-reduce of the same bytes does): said, with the
  memory that would be needed, as a change to measure.

FSDP1 (Lightning's FSDPStrategy) records no per-phase waits (GPU only in Lightning): its knobs are not advised.
"""

from __future__ import annotations

from tuneup.advise.context import AdviceContext
from tuneup.advise.model import Change, Range, Recommendation
from tuneup.advise.outcomes import outcome
from tuneup.advise.step_model import StepPrediction
from tuneup.analyze.model import PhaseWait

# The knob's share of the step below which it is not worth a recommendation (as the other rules' threshold).
MATERIAL_SHARE = 0.05
# The wait that is surely saved: the rest of it may be the ranks' arrival skew, which moves to the next
# collective rather than going away.
SURE_SHARE_OF_WAIT = 0.5


def _phase(waits: list[PhaseWait], name: str) -> PhaseWait | None:
    return next((w for w in waits if w.phase == name), None)


def recommend(ctx: AdviceContext) -> list[Recommendation]:
    o = ctx.observation
    if o.sharding is None:
        return []
    if o.sharding != "FSDP2":
        ctx.skip(
            "sharding", f"{o.sharding}: its waits per phase are not recorded, so no sharding knob is advised"
        )
        return []
    out: list[Recommendation] = []
    rec = _keep_gathered(ctx)
    if rec is not None:
        out.append(rec)
    _ddp_instead(ctx)
    return out


def _keep_gathered(ctx: AdviceContext) -> Recommendation | None:
    knob = "reshard_after_forward"
    comm = ctx.analysis.communication
    waits = comm.exposed_by_phase if comm is not None else []
    forward, backward = _phase(waits, "forward"), _phase(waits, "backward")
    if forward is None or backward is None or backward.gathers_ms is None:
        ctx.skip(
            knob,
            "the run did not record what its phases waited for the gathers (a GPU run, or an older tuneup)",
        )
        return None
    regather = backward.gathers_ms
    if regather <= 0.0:
        ctx.skip(
            knob,
            "the backward waited for no re-gather: the units already keep their parameters (or one unit)",
        )
        return None
    mean = ctx.model.predict(ctx.setting).mean_ms
    step_ms = mean.value
    forward_work = forward.compute_ms or 0.0
    # Saved per step: the wait at least half, at most all of it plus a copy-out pass like the forward's.
    low, high = SURE_SHARE_OF_WAIT * regather, regather + forward_work
    point = regather + 0.5 * forward_work
    if high / step_ms < MATERIAL_SHARE:
        ctx.skip(
            knob,
            f"the re-gathers cost the step at most {high:.1f} ms ({high / step_ms:.1%}), under {MATERIAL_SHARE:.0%}",
        )
        return None
    err = ctx.model.base_error
    new = Range(
        max(mean.value - point, 1e-3),
        max((mean.value - high) / (1 + err), 1e-3),
        (mean.value - low) * (1 + err),
    )
    proposed = outcome(ctx.setting, StepPrediction(new, new, {"saved_regather_ms": point}), ctx.economics)
    memory = ctx.analysis.memory
    extra = (
        f"up to {(memory.parameters_unsharded_bytes - memory.parameters_bytes) / 2**20:.1f} MiB more per rank "
        "(every unit's gathered parameters held from its forward to its backward)"
        if memory is not None
        else "more memory per rank: every unit's gathered parameters held from its forward to its backward"
    )
    evidence = [
        f"the backward waited {regather:.1f} ms per step for its re-gathers (all-gathers after the forward's "
        f"reshard), of the {step_ms:.1f} ms mean step; the forward waited {forward.gathers_ms or 0:.1f} ms for its "
        f"gathers and spent {forward_work:.1f} ms beside them",
        f"predicted saving {low:.1f} to {high:.1f} ms per step: at least half the wait (the ranks' arrival skew "
        "may move to the reduce-scatters), at most the wait and a copy-out pass like the forward's",
    ]
    return ctx.recommendation(
        id="sharding.reshard_after_forward",
        title="Keep gathered parameters from forward to backward (FSDP2 reshard_after_forward=False)",
        changes=[Change(knob, "True", "False")],
        proposed=proposed,
        evidence=evidence,
        code=_reshard_code(),
        caveats=[f"costs {extra}; where memory is short, keep it on for the largest units only"],
        confidence="low",
    )


def _reshard_code() -> tuple[str, str | None]:
    python = (
        "from torch.distributed.fsdp import fully_shard\n\n"
        "# in your LightningModule's configure_model, for each block and the root:\n"
        'fully_shard(block, mesh=self.device_mesh["data_parallel"], reshard_after_forward=False)'
    )
    return python, None


def _ddp_instead(ctx: AdviceContext) -> None:
    memory = ctx.analysis.memory
    o = ctx.observation
    if memory is None or o.world_size <= 1:
        return
    whole = memory.parameters_unsharded_bytes
    state_whole = memory.optimizer_state_bytes * o.world_size  # each rank would hold all of it
    grads_whole = whole  # in the parameters' dtype
    need = whole + grads_whole + state_whole
    ctx.skip(
        "DDP instead of FSDP2",
        f"not predicted: each rank would hold the whole model, its gradients and optimizer state, about "
        f"{need / 2**20:.1f} MiB (held now: {memory.held_bytes / 2**20:.1f} MiB), and DDP's all-reduce and "
        "compute without FSDP's copies are not measured by a sharded run; where that memory fits with room, "
        "run once with strategy='ddp' and compare the runs with `tuneup compare`",
    )
