"""Step time, throughput and loss over the run: every step where all were kept, else window means."""

from __future__ import annotations

import math

from tuneup.analyze.model import LossSeries, RankSeries, ThroughputSeries, TimeSeries
from tuneup.record.schema import Run

# Per-rank step-time series, all ranks together, keep at most this many points (each rank at least
# MIN_RANK_POINTS): 2 ranks keep every step, 1,024 ranks keep a readable curve each, not 27 MB of JSON.
MAX_RANK_SERIES_POINTS = 200_000
MIN_RANK_POINTS = 100

_Point = tuple[int, float, float, "float | None", "float | None", "float | None"]


def _thin(points: list[_Point], limit: int) -> list[_Point]:
    """At most `limit` points: consecutive points averaged in equal groups, each keeping its last step."""
    if len(points) <= limit:
        return points
    size = -(-len(points) // limit)
    out = []
    for i in range(0, len(points), size):
        group = points[i : i + size]
        out.append((group[-1][0], group[-1][1], sum(p[2] for p in group) / len(group), None, None, None))
    return out


def timeseries(run: Run, t0: float) -> TimeSeries:
    all_kept = all(rec.info.steps_seen in (None, len(rec.steps)) for rec in run.ranks.values())
    per_rank: dict[str, RankSeries] = {}
    throughput: dict[int, list[float]] = {}
    token_rate: dict[int, list[float]] = {}
    loss: dict[int, float] = {}
    rank_limit = max(MIN_RANK_POINTS, MAX_RANK_SERIES_POINTS // max(1, len(run.ranks)))
    for rank, rec in sorted(run.ranks.items()):
        points: list[_Point] = []
        if all_kept or not rec.windows:
            for s in rec.steps:
                points.append((s.step, s.t_end, s.wall_ms, s.samples, s.tokens, s.loss))
        else:
            for w in rec.windows:
                wall = w.stats.get("wall_ms", {}).get("mean")
                if wall is None or not w.count:
                    continue
                loss_mean = w.stats.get("loss", {}).get("mean")
                samples = None if w.samples is None else w.samples / w.count
                tokens = None if w.tokens is None else w.tokens / w.count
                points.append((w.last_step, w.t_end, wall, samples, tokens, loss_mean))
        shown = _thin(points, rank_limit)
        per_rank[str(rank)] = RankSeries(
            step=[p[0] for p in shown],
            t_s=[p[1] - t0 for p in shown],
            step_time_ms=[p[2] for p in shown],
        )
        for step, _, wall, samples, tokens, step_loss in points:
            # A step too short to divide by (a damaged record) has no rate, as one of no time has none.
            if wall > 0 and samples is not None and math.isfinite(rate := samples / wall * 1000.0):
                throughput.setdefault(step, []).append(rate)
            if wall > 0 and tokens is not None and math.isfinite(rate := tokens / wall * 1000.0):
                token_rate.setdefault(step, []).append(rate)
            if rank == min(run.ranks) and step_loss is not None:
                loss[step] = step_loss
    n_ranks = len(run.ranks)
    steps = sorted(k for k, v in throughput.items() if len(v) == n_ranks)
    return TimeSeries(
        source="steps" if all_kept else "windows",
        per_rank=per_rank,
        throughput=ThroughputSeries(
            step=steps,
            samples_per_s=[sum(throughput[k]) for k in steps],
            tokens_per_s=[
                sum(token_rate[k]) if len(token_rate.get(k, [])) == n_ranks else None for k in steps
            ],
        ),
        loss=LossSeries(
            rank=min(run.ranks) if run.ranks else None,
            step=sorted(loss),
            values=[loss[k] for k in sorted(loss)],
        ),
    )
