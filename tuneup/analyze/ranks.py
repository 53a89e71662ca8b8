"""Ranks side by side: which rank holds the others back, by how much, and in which phase.

In data-parallel training every rank waits for the slowest at each gradient synchronization, so all
ranks end up with the same step time and a straggler cannot be seen in it. It shows in the phases
where a rank works alone (data loading, forward, optimizer under DDP): the straggler spends longer
there, and the other ranks spend that difference waiting inside the phases that hold a collective
(backward, where DDP's all-reduce completes, and the gap between batches).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tuneup._stats import quantile
from tuneup.record.schema import PHASES, StepRecord

LOCAL_PHASES = ("data_ms", "forward_ms", "optimizer_ms")
WAIT_PHASES = ("backward_ms", "sync_ms", "other_ms")
# A straggler must cost at least this share of the step, and this many milliseconds, to be flagged:
# below that, rank-to-rank jitter on a shared machine would be reported as a straggler.
MIN_SHARE_OF_STEP = 0.10
MIN_EXCESS_MS = 1.0


@dataclass(slots=True)
class RankProfile:
    rank: int
    steps: int
    median_step_ms: float
    p95_step_ms: float
    phase_median_ms: dict[str, float]


@dataclass(slots=True)
class Straggler:
    rank: int
    phase: str  # e.g. "forward_ms"
    excess_ms: float  # how much longer its own work takes than the other ranks' median
    phase_ms: float
    others_phase_ms: float
    step_ms: float
    others_wait_ms: float  # median extra time the other ranks spend in waiting phases
    share_of_step: float

    @property
    def phase_name(self) -> str:
        return self.phase.removesuffix("_ms")

    def sentence(self) -> str:
        return (
            f"rank {self.rank} is a straggler: its {self.phase_name} takes {self.phase_ms:.1f} ms per step "
            f"against {self.others_phase_ms:.1f} ms on the other ranks (+{self.excess_ms:.1f} ms, "
            f"{self.share_of_step:.0%} of the {self.step_ms:.1f} ms step); the other ranks spend "
            f"{self.others_wait_ms:.1f} ms more per step waiting for it in backward and between batches "
            "(sync, other)"
        )


def rank_profile(rank: int, steady: list[StepRecord]) -> RankProfile:
    walls = sorted(s.wall_ms for s in steady)
    return RankProfile(
        rank=rank,
        steps=len(steady),
        median_step_ms=statistics.median(walls),
        p95_step_ms=quantile(walls, 0.95),
        phase_median_ms={p: statistics.median(getattr(s, p) for s in steady) for p in PHASES},
    )


def find_straggler(profiles: list[RankProfile]) -> Straggler | None:
    """The rank whose own (non-waiting) work exceeds the others' by a share of the step, if any."""
    if len(profiles) < 2:
        return None
    local = {p.rank: sum(p.phase_median_ms[ph] for ph in LOCAL_PHASES) for p in profiles}
    best: tuple[float, RankProfile] | None = None
    for prof in profiles:
        others = statistics.median(local[q.rank] for q in profiles if q.rank != prof.rank)
        excess = local[prof.rank] - others
        if best is None or excess > best[0]:
            best = (excess, prof)
    assert best is not None
    excess, slow = best
    step_ms = statistics.median(p.median_step_ms for p in profiles)
    if excess < MIN_EXCESS_MS or step_ms <= 0 or excess / step_ms < MIN_SHARE_OF_STEP:
        return None
    others = [p for p in profiles if p.rank != slow.rank]

    def others_median(phase: str) -> float:
        return statistics.median(p.phase_median_ms[phase] for p in others)

    phase = max(LOCAL_PHASES, key=lambda ph: slow.phase_median_ms[ph] - others_median(ph))
    own_wait = sum(slow.phase_median_ms[ph] for ph in WAIT_PHASES)
    others_wait = statistics.median(sum(p.phase_median_ms[ph] for ph in WAIT_PHASES) for p in others)
    return Straggler(
        rank=slow.rank,
        phase=phase,
        excess_ms=excess,
        phase_ms=slow.phase_median_ms[phase],
        others_phase_ms=others_median(phase),
        step_ms=step_ms,
        others_wait_ms=others_wait - own_wait,
        share_of_step=excess / step_ms,
    )
