"""One analysed run as the index keeps it: a row of runs.parquet, and its step-time summary for
steps.parquet.

Every figure is read from the typed analysis (and the advice on it), never computed again here: the
index's dollars, rates and badput are the report's. Only what the analysis does not total is counted from
the record itself: the samples and tokens trained (the window aggregates count every step, where the kept
steps thin out past `detail_steps`), and the step summary, which merges the record's windows.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import statistics
from typing import TYPE_CHECKING, Any, TypeVar

from tuneup.analyze.model import BADPUT_CATEGORIES

if TYPE_CHECKING:
    from tuneup.advise.model import Advice
    from tuneup.analyze.model import RunAnalysis
    from tuneup.record.schema import Run, WindowAggregate

# steps.parquet keeps at most this many windows per run: enough to see where in a run it got slower, few
# enough that 10,000 runs stay a small file.
MAX_STEP_WINDOWS = 32

T = TypeVar("T")


def _utc(unix_s: float | None) -> dt.datetime | None:
    if unix_s is None or not math.isfinite(unix_s):
        return None
    return dt.datetime.fromtimestamp(unix_s, tz=dt.timezone.utc)


def _status(analysis: RunAnalysis) -> str | None:
    """How the run ended: the stop reason (max_steps, max_time, early stopping), else how its ranks'
    records ended (completed where all did, else the first other status, e.g. interrupted)."""
    if analysis.cost is not None and analysis.cost.stop_reason:
        return analysis.cost.stop_reason
    statuses = list(analysis.run.status.values())
    if not statuses:
        return None
    others = [s for s in statuses if s != "completed"]
    return others[0] if others else "completed"


def trained(runs: list[Run]) -> tuple[int | None, int | None]:
    """(samples, tokens) trained by every rank over every segment (redone steps included: they were
    paid for); None where no rank counted them."""
    samples = tokens = 0
    any_samples = any_tokens = False
    for run in runs:
        for rec in run.ranks.values():
            counted = rec.windows if rec.windows else rec.steps
            for item in counted:
                if item.samples is not None:
                    samples += item.samples
                    any_samples = True
                if item.tokens is not None:
                    tokens += item.tokens
                    any_tokens = True
    return (samples if any_samples else None), (tokens if any_tokens else None)


def _per_million(per_usd: float | None) -> float | None:
    return 1e6 / per_usd if per_usd else None


def run_row(
    key: str, fingerprint: str, runs: list[Run], analysis: RunAnalysis, advice: Advice | str | None
) -> dict[str, Any]:
    """runs.parquet's row for one run (tuneup.fleet.index.RUNS_SCHEMA's columns)."""
    info, cost, badput = analysis.run, analysis.cost, analysis.badput
    price = cost.price if cost is not None else None
    figures = cost.figures if cost is not None else None
    samples, tokens = trained(runs)
    git = analysis.environment.git or {}
    duration_s = badput.wall_s if badput is not None else info.duration_s
    usd = badput.usd if badput is not None and badput.usd is not None else None
    if usd is None and figures is not None:
        usd = figures.usd_so_far
    device_hours = badput.device_hours if badput is not None else None
    if device_hours is None and info.duration_s is not None:
        device_hours = info.duration_s * info.world_size / 3600.0
    recommendations = advice.recommendations if advice is not None and not isinstance(advice, str) else []
    top = recommendations[0] if recommendations else None
    row: dict[str, Any] = {
        "run_key": key,
        "run_id": info.run_id,
        "fingerprint": fingerprint,
        "error": None,
        "start": _utc(info.start_unix),
        "end": _utc(info.end_unix),
        "duration_s": duration_s,
        "tags": dict(info.tags),
        "instance": price.instance.key if price is not None and price.instance is not None else None,
        "gpu": ", ".join(info.hardware.gpu_names) if info.hardware.gpu_names else "cpu",
        "world_size": info.world_size,
        "num_nodes": info.num_nodes,
        "strategy": info.strategy,
        "precision": None if info.precision is None else str(info.precision),
        "global_batch_size": info.global_batch_size,
        "accumulate_grad_batches": info.accumulate_grad_batches,
        "git_commit": git.get("commit"),
        "git_dirty": git.get("dirty") if isinstance(git.get("dirty"), bool) else None,
        "status": _status(analysis),
        "usd": usd,
        "usd_per_hour": figures.usd_per_hour if figures is not None else None,
        "device_hours": device_hours,
        "samples": samples,
        "tokens": tokens,
        "samples_per_s": analysis.throughput.samples_per_s,
        "tokens_per_s": analysis.throughput.tokens_per_s,
        "usd_per_million_samples": _per_million(figures.samples_per_usd) if figures is not None else None,
        "usd_per_million_tokens": figures.usd_per_million_tokens if figures is not None else None,
        "mfu": cost.flops.mfu if cost is not None else None,
        "step_median_ms": analysis.step_time.median_ms,
        "step_p95_ms": analysis.step_time.p95_ms,
        "useful_share": badput.useful_share if badput is not None else None,
        "badput_usd": badput.badput_usd if badput is not None else None,
        "top_recommendation": top.title if top is not None else None,
        "top_gain": top.gain.value if top is not None else None,
        "recommendations": len(recommendations),
    }
    categories = {c.name: c for c in badput.categories} if badput is not None else {}
    for name in BADPUT_CATEGORIES:
        category = categories.get(name)
        row[f"{name}_s"] = category.seconds if category is not None else None
        row[f"{name}_usd"] = category.usd if category is not None else None
    return row


def error_row(key: str, fingerprint: str, error: str) -> dict[str, Any]:
    """The row of a run whose record could not be read: its key, fingerprint and why; figures null."""
    return {"run_key": key, "fingerprint": fingerprint, "error": error}


def _merged(items: list[T], groups: int) -> list[list[T]]:
    """`items` (in order) in at most `groups` runs of consecutive items, as even as they divide."""
    n = len(items)
    if n <= groups:
        return [[w] for w in items]
    bounds = [round(i * n / groups) for i in range(groups + 1)]
    return [items[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def step_rows(key: str, runs: list[Run]) -> list[dict[str, Any]]:
    """steps.parquet's rows for one run: its step windows (every rank's, every segment's) merged into at
    most MAX_STEP_WINDOWS spans of steps, each with its median step time (the median of the windows'
    medians, over ranks) and its samples per second (each rank's samples over its span's wall time, summed
    over ranks, as the report's throughput)."""
    by_span: dict[tuple[int, int], list[WindowAggregate]] = {}
    for run in runs:
        for rec in run.ranks.values():
            for w in rec.windows:
                by_span.setdefault((w.first_step, w.last_step), []).append(w)
    if not by_span:
        return []
    spans = sorted(by_span)
    rows = []
    for index, group in enumerate(_merged(spans, MAX_STEP_WINDOWS)):
        windows = [w for span in group for w in by_span[span]]
        medians = [w.stats["wall_ms"]["p50"] for w in windows if "wall_ms" in w.stats]
        rows.append(
            {
                "run_key": key,
                "window": index,
                "first_step": group[0][0],
                "last_step": group[-1][1],
                "step_median_ms": statistics.median(medians) if medians else None,
                "samples_per_s": _samples_per_s(windows),
            }
        )
    return rows


def _samples_per_s(windows: list[WindowAggregate]) -> float | None:
    """Samples per second of training steps over `windows` (one span of steps, every rank's), as the report's
    throughput counts it: the samples over the steps' own time (the windows' mean step x steps), so that a
    validation or a checkpoint save between steps does not read as a slower step. Each span's ranks ran its
    steps side by side: its time is their mean, the group's the spans' sum."""
    per_span: dict[tuple[int, int], list[float]] = {}
    samples, counted = 0, False
    for w in windows:
        wall = w.stats.get("wall_ms")
        if wall is None or "mean" not in wall or "n" not in wall:
            continue
        per_span.setdefault((w.first_step, w.last_step), []).append(wall["mean"] * wall["n"] / 1000.0)
        if w.samples is not None:
            samples += w.samples
            counted = True
    time_s = sum(statistics.fmean(times) for times in per_span.values())
    return samples / time_s if counted and time_s > 0 else None
