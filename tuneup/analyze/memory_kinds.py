"""Memory by kind: what each rank's parameters, gradients and optimizer state held, sharded and whole, and
on a GPU what its peak held beyond them, from the `memory_kinds` event each rank records once
(tuneup/recording/memory_kinds.py)."""

from __future__ import annotations

from typing import Any

from tuneup.analyze.model import MemoryByKind, RankMemory
from tuneup.record.schema import Run

EVENT = "memory_kinds"
_COUNTS = ("parameters_bytes", "parameters_unsharded_bytes", "sharded_parameters", "optimizer_state_bytes")
_OPTIONAL = ("gradients_bytes", "peak_allocated_bytes", "other_at_peak_bytes")


def _count(value: Any) -> int | None:
    """A byte count from the record: a non-negative int (a float that is one is taken), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != int(value):
        return None
    return int(value)


def _rank_memory(rank: int, event: dict[str, Any]) -> RankMemory | None:
    counts = [_count(event.get(k)) for k in _COUNTS]
    if any(c is None for c in counts):
        return None  # a damaged event: the rank's kinds are unknown, not zero
    held, whole, sharded, state = (int(c or 0) for c in counts)
    grads, peak, other = (_count(event.get(k)) for k in _OPTIONAL)
    step = _count(event.get("step"))
    return RankMemory(rank, step, held, whole, sharded, grads, state, peak, other)


def _held(m: RankMemory) -> int:
    return m.parameters_bytes + (m.gradients_bytes or 0) + m.optimizer_state_bytes


def memory_section(run: Run) -> MemoryByKind | None:
    """The ranks' memory by kind; None where no rank recorded it (a run shorter than two optimizer steps,
    or recorded before tuneup read it)."""
    rows: list[RankMemory] = []
    for rank in sorted(run.ranks):
        events = [e for e in run.ranks[rank].events if e.get("kind") == EVENT]
        if events and (row := _rank_memory(rank, events[-1])) is not None:
            rows.append(row)
    if not rows:
        return None
    fullest = max(rows, key=lambda m: (m.peak_allocated_bytes or 0, _held(m)))
    notes: list[str] = []
    if len(rows) < len(run.ranks):
        missing = sorted(set(run.ranks) - {m.rank for m in rows})
        notes.append(f"rank(s) {', '.join(map(str, missing[:8]))} recorded no memory by kind")
    if fullest.gradients_bytes is None:
        notes.append("no gradient existed when memory was read: their size is unknown, not zero")
    if fullest.peak_allocated_bytes is None:
        notes.append(
            "on CPU no allocator keeps a peak: activations and gathered parameters are not measured, only "
            "the parameters, gradients and optimizer state held"
        )
    return MemoryByKind(
        sharded=any(m.sharded_parameters > 0 for m in rows),
        ranks=rows,
        rank=fullest.rank,
        parameters_bytes=fullest.parameters_bytes,
        parameters_unsharded_bytes=fullest.parameters_unsharded_bytes,
        gradients_bytes=fullest.gradients_bytes,
        optimizer_state_bytes=fullest.optimizer_state_bytes,
        held_bytes=_held(fullest),
        peak_allocated_bytes=fullest.peak_allocated_bytes,
        other_at_peak_bytes=fullest.other_at_peak_bytes,
        notes=notes,
    )
