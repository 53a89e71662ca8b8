"""Whether a run sharded its model, and how, in the words the report and the advice use for it.

A sharded run's collectives are not DDP's: FSDP (Lightning's `FSDPStrategy`) and FSDP2 (`fully_shard`,
which Lightning runs as `ModelParallelStrategy`) all-gather each unit's parameters before its forward and
again before its backward, and reduce-scatter its gradients after its backward, so that the collectives run
inside forward and backward at every micro-batch rather than as gradient buckets after backward. What is
said and predicted for DDP (an exact all-reduce per step, buckets, exposed time after backward) does not
hold for them. Read from the strategy's class name alone, which every record has.
"""

from __future__ import annotations

from tuneup.analyze.model import RunInfo

# How a sharded run synchronised, for a sentence that names it.
SHARDED_SYNC = (
    "parameters all-gathered per sharded unit before its forward and its backward, gradients "
    "reduce-scattered after its backward (each rank keeps its shard of the averaged gradient)"
)


def sharding(run: RunInfo) -> str | None:
    """ "FSDP2" (fully_shard, as Lightning's ModelParallelStrategy runs it), "FSDP" (FSDPStrategy, FSDP1),
    or None: a run that did not shard, or one rank (nothing to gather)."""
    if run.world_size <= 1:
        return None
    strategy = (run.strategy or "").lower()
    if "fully_shard" in strategy or "fsdp2" in strategy or "modelparallel" in strategy:
        return "FSDP2"
    if "fsdp" in strategy:
        return "FSDP"
    return None


def sharding_name(kind: str) -> str:
    """The strategy as a user knows it: "FSDP2 (fully_shard)" or "FSDP"."""
    return "FSDP2 (fully_shard)" if kind == "FSDP2" else kind
