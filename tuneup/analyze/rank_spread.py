"""Ranks side by side at any scale: the straggler, how the ranks' median steps spread, the slowest and
fastest ranks, and one row per host. A table of 1,024 ranks is read by nobody; these are."""

from __future__ import annotations

import statistics
from collections import defaultdict

from tuneup._stats import finite
from tuneup.analyze.model import HostRanks, Ranks, RankStep, StragglerInfo
from tuneup.analyze.ranks import RankProfile, Straggler
from tuneup.analyze.throughput import quantiles

# How many of the slowest and of the fastest ranks are named.
EXTREME_RANKS = 5


def straggler_info(straggler: Straggler | None) -> StragglerInfo | None:
    if straggler is None:
        return None
    return StragglerInfo(
        rank=straggler.rank,
        phase=straggler.phase_name,
        excess_ms=finite(straggler.excess_ms),
        phase_ms=finite(straggler.phase_ms),
        others_phase_ms=finite(straggler.others_phase_ms),
        others_wait_ms=finite(straggler.others_wait_ms),
        step_ms=finite(straggler.step_ms),
        share_of_step=finite(straggler.share_of_step),
        summary=straggler.sentence(),
    )


def ranks_section(profiles: list[RankProfile], straggler: Straggler | None, hosts: dict[int, str]) -> Ranks:
    if not profiles:
        return Ranks(straggler=straggler_info(straggler))
    by_median = sorted(profiles, key=lambda p: (p.median_step_ms, p.rank))
    k = min(EXTREME_RANKS, len(profiles) // 2)

    def row(p: RankProfile) -> RankStep:
        return RankStep(rank=p.rank, host=hosts.get(p.rank), median_ms=finite(p.median_step_ms))  # type: ignore[arg-type]

    grouped: dict[str, list[RankProfile]] = defaultdict(list)
    for p in profiles:
        grouped[hosts.get(p.rank) or "unknown host"].append(p)
    per_host = []
    for host, members in sorted(grouped.items()):
        slowest = max(members, key=lambda p: (p.median_step_ms, -p.rank))
        per_host.append(
            HostRanks(
                host=host,
                ranks=len(members),
                median_ms=finite(statistics.median(p.median_step_ms for p in members)),  # type: ignore[arg-type]
                slowest_rank=slowest.rank,
                slowest_median_ms=finite(slowest.median_step_ms),  # type: ignore[arg-type]
                fastest_median_ms=finite(min(p.median_step_ms for p in members)),  # type: ignore[arg-type]
            )
        )
    return Ranks(
        straggler=straggler_info(straggler),
        median_step_ms=quantiles(p.median_step_ms for p in profiles),
        slowest=[row(p) for p in reversed(by_median[len(by_median) - k :])] if k else [],
        fastest=[row(p) for p in by_median[:k]],
        per_host=per_host,
    )
