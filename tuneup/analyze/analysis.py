"""Everything a report says about a run, computed once from the loaded run: `analyze_run(run)`.

The result is a plain JSON-ready dict (the report's machine interface, schema in
tuneup/report/report.schema.json); renderers draw from it alone.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from tuneup._stats import quantile
from tuneup._stats import rounded as _r
from tuneup._version import __version__
from tuneup.analyze.communication import communication_section
from tuneup.analyze.findings import (
    DATA_WAIT_SHARE,
    EXPOSED_COMM_SHARE,
    GPU_MEMORY_FULL_SHARE,
    LONG_WARMUP_SHARE,
    LOW_GPU_UTIL_PERCENT,
    OTHER_SHARE,
    SERIOUS_THROTTLES,
    Finding,
)
from tuneup.analyze.interruptions import interruptions_section
from tuneup.analyze.ranks import RankProfile, Straggler, find_straggler, rank_profile
from tuneup.analyze.steady import warmup_steps
from tuneup.analyze.telemetry import RunTelemetry, Series, run_telemetry
from tuneup.cost.figures import CostOptions, cost_inputs, cost_section
from tuneup.record.schema import PHASES, Run, StepRecord

REPORT_SCHEMA_VERSION = 1
# A step whose data wait exceeds both of these is a data-loader stall.
STALL_FACTOR_OF_MEDIAN = 3.0
STALL_SHARE_OF_STEP = 0.25


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        k: round(quantile(ordered, q), 3)
        for k, q in (
            ("min", 0),
            ("p5", 0.05),
            ("p25", 0.25),
            ("p50", 0.5),
            ("p75", 0.75),
            ("p95", 0.95),
            ("max", 1.0),
        )
    }


MAX_SERIES_POINTS = 1000


def _series_dict(series: Series) -> dict[str, list[float]]:
    """A series for the report, averaged into at most MAX_SERIES_POINTS buckets (a day at 1 Hz is 86,400)."""
    t, v = series.t_s, series.values
    if len(v) > MAX_SERIES_POINTS:
        size = -(-len(v) // MAX_SERIES_POINTS)
        t = [sum(t[i : i + size]) / len(t[i : i + size]) for i in range(0, len(t), size)]
        v = [sum(v[i : i + size]) / len(v[i : i + size]) for i in range(0, len(v), size)]
    return {"t_s": [round(x, 3) for x in t], "values": [round(x, 3) for x in v]}


def _run_section(run: Run, steady: dict[int, list[StepRecord]], t0: float, t_end: float) -> dict[str, Any]:
    m = run.manifest
    t = m.trainer
    host = m.environment.get("host") or {}
    gpus = (m.gpus or {}).get("gpus") or []
    batch = m.dataloader.get("batch_size")
    accumulate = t.get("accumulate_grad_batches") or 1
    statuses = {
        str(r): rec.info.raw.get("status") or ("not closed" if not rec.info.closed else "closed")
        for r, rec in sorted(run.ranks.items())
    }
    return {
        "run_id": m.run_id,
        "path": str(run.path),
        "world_size": m.world_size,
        "num_nodes": m.num_nodes,
        "ranks_present": sorted(run.ranks),
        "missing_ranks": run.missing_ranks,
        "hosts": {str(r): h for r, h in run.rank_hosts.items()},
        "namespace": t.get("namespace"),
        "strategy": t.get("strategy"),
        "accelerator": t.get("accelerator"),
        "precision": t.get("precision"),
        "accumulate_grad_batches": accumulate,
        "batch_size_per_rank": batch,
        "global_batch_size": batch * accumulate * m.world_size if isinstance(batch, int) else None,
        "max_steps": t.get("max_steps"),
        "max_epochs": t.get("max_epochs"),
        "model_class": m.model.get("class"),
        "parameters": m.model.get("parameters"),
        "trainable_parameters": m.model.get("trainable_parameters"),
        "hardware": {
            "cpu_model": host.get("cpu_model"),
            "cpu_count": host.get("cpu_count_logical"),
            "ram_total_bytes": host.get("ram_total_bytes"),
            "gpu_names": sorted({str(g.get("name")) for g in gpus if isinstance(g, dict)}),
            "gpus_per_node": len(gpus),
            "driver_version": (m.gpus or {}).get("driver_version"),
        },
        "start_unix": _r(t0),
        "end_unix": _r(t_end),
        "duration_s": _r(t_end - t0),
        "steps_recorded": max((len(rec.steps) for rec in run.ranks.values()), default=0),
        "last_step": max((rec.steps[-1].step for rec in run.ranks.values() if rec.steps), default=None),
        "status": statuses,
        "data_timing": sorted(
            {
                str(rec.info.raw.get("data_timing"))
                for rec in run.ranks.values()
                if rec.info.raw.get("data_timing")
            }
        ),
        "timing": sorted({rec.info.timing for rec in run.ranks.values() if rec.info.timing}),
    }


def _throughput(steady: dict[int, list[StepRecord]]) -> dict[str, Any]:
    per_rank = []
    for rank, steps in sorted(steady.items()):
        total_s = sum(s.wall_ms for s in steps) / 1000.0
        samples = [s.samples for s in steps]
        tokens = [s.tokens for s in steps]
        per_rank.append(
            {
                "rank": rank,
                "samples_per_s": _r(sum(samples) / total_s) if total_s and None not in samples else None,  # type: ignore[arg-type]
                "tokens_per_s": _r(sum(tokens) / total_s) if total_s and None not in tokens else None,  # type: ignore[arg-type]
                "steps_per_s": _r(len(steps) / total_s) if total_s else None,
            }
        )

    def total(key: str) -> float | None:
        values = [r[key] for r in per_rank]
        return _r(sum(values)) if values and None not in values else None

    steps_rates = [r["steps_per_s"] for r in per_rank if r["steps_per_s"] is not None]
    return {
        "samples_per_s": total("samples_per_s"),
        "tokens_per_s": total("tokens_per_s"),
        # Ranks step together: the job's rate is its slowest rank's.
        "steps_per_s": _r(min(steps_rates)) if steps_rates else None,
        "per_rank": per_rank,
    }


def _step_time(steady: dict[int, list[StepRecord]], profiles: list[RankProfile]) -> dict[str, Any]:
    all_steps = [s for steps in steady.values() for s in steps]
    if not all_steps:
        return {"median_ms": None, "mean_ms": None, "p95_ms": None, "phases": {}, "per_rank": []}
    mean_wall = statistics.fmean(s.wall_ms for s in all_steps)
    phases = {}
    for p in PHASES:
        ms = statistics.fmean(getattr(s, p) for s in all_steps)
        phases[p.removesuffix("_ms")] = {"ms": _r(ms), "share": _r(ms / mean_wall if mean_wall else 0.0, 4)}
    walls = [s.wall_ms for s in all_steps]
    return {
        "median_ms": _r(statistics.median(walls)),
        "mean_ms": _r(mean_wall),
        "p95_ms": _quantiles(walls)["p95"],
        "phases": phases,
        "per_rank": [
            {
                "rank": p.rank,
                "steps": p.steps,
                "median_ms": _r(p.median_step_ms),
                "p95_ms": _r(p.p95_step_ms),
                "phase_median_ms": {k.removesuffix("_ms"): _r(v) for k, v in p.phase_median_ms.items()},
                "phase_mean_ms": {
                    k.removesuffix("_ms"): _r(statistics.fmean(getattr(s, k) for s in steady[p.rank]))
                    for k in PHASES
                },
                "distribution_ms": _quantiles([s.wall_ms for s in steady[p.rank]]),
            }
            for p in profiles
        ],
    }


def _timeseries(run: Run, t0: float) -> dict[str, Any]:
    """Step time, throughput and loss over the run: every step where all were kept, else window means."""
    all_kept = all(rec.info.steps_seen in (None, len(rec.steps)) for rec in run.ranks.values())
    per_rank: dict[str, dict[str, list[Any]]] = {}
    throughput: dict[int, list[float]] = {}
    token_rate: dict[int, list[float]] = {}
    loss: dict[int, float] = {}
    for rank, rec in sorted(run.ranks.items()):
        points: list[tuple[int, float, float, int | None, int | None, float | None]] = []
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
        per_rank[str(rank)] = {
            "step": [p[0] for p in points],
            "t_s": [round(p[1] - t0, 3) for p in points],
            "step_time_ms": [round(p[2], 3) for p in points],
        }
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
    return {
        "source": "steps" if all_kept else "windows",
        "per_rank": per_rank,
        "throughput": {
            "step": steps,
            "samples_per_s": [round(sum(throughput[k]), 3) for k in steps],
            "tokens_per_s": [
                round(sum(token_rate[k]), 3) if len(token_rate.get(k, [])) == n_ranks else None for k in steps
            ],
        },
        "loss": {
            "rank": min(run.ranks) if run.ranks else None,
            "step": sorted(loss),
            "values": [round(loss[k], 6) for k in sorted(loss)],
        },
    }


def _data_loader(
    run: Run, steady: dict[int, list[StepRecord]], step_median_ms: float | None
) -> dict[str, Any]:
    stalls = []
    data_all = [s.data_ms for steps in steady.values() for s in steps]
    median_data = statistics.median(data_all) if data_all else 0.0
    threshold = max(STALL_FACTOR_OF_MEDIAN * median_data, STALL_SHARE_OF_STEP * (step_median_ms or 0.0))
    for rank, steps in sorted(steady.items()):
        for s in steps:
            if s.data_ms > threshold and not s.checkpoint:
                stalls.append(
                    {"rank": rank, "step": s.step, "data_ms": _r(s.data_ms), "wall_ms": _r(s.wall_ms)}
                )
    stalls.sort(key=lambda x: -x["data_ms"])
    dl = run.manifest.dataloader
    return {
        "median_data_ms": _r(median_data),
        "stall_threshold_ms": _r(threshold),
        "stall_count": len(stalls),
        "stall_total_ms": _r(sum(x["data_ms"] for x in stalls)),
        "worst_stalls": stalls[:10],
        "num_workers": dl.get("num_workers"),
        "pin_memory": dl.get("pin_memory"),
        "persistent_workers": dl.get("persistent_workers"),
        "batch_size": dl.get("batch_size"),
    }


def _telemetry_section(tel: RunTelemetry) -> dict[str, Any]:
    return {
        "samples": tel.samples,
        "gpus": [
            {
                "host": g.host,
                "index": g.index,
                "bus_id": g.bus_id,
                "lost": g.lost,
                "util_percent_mean": _r(g.util_percent.mean(), 1),
                "util_percent_max": _r(g.util_percent.max(), 1),
                "mem_used_bytes_max": _int(g.mem_used_bytes.max()),
                "mem_total_bytes": _int(g.mem_total_bytes),
                "power_w_mean": _r(g.power_w.mean(), 1),
                "power_w_max": _r(g.power_w.max(), 1),
                "energy_j": _r(g.energy_j, 1),
                "energy_span_s": _r(g.energy_span_s, 3),
                "energy_source": g.energy_source,
                "temp_c_max": g.temp_c.max(),
                "sm_clock_mhz_mean": _r(g.sm_clock_mhz.mean(), 0),
                "throttle_reasons": sorted(g.throttle),
                "series": {
                    "util_percent": _series_dict(g.util_percent),
                    "power_w": _series_dict(g.power_w),
                    "mem_used_bytes": _series_dict(g.mem_used_bytes),
                },
            }
            for g in tel.gpus
        ],
        "processes": [
            {
                "rank": p.rank,
                "cpu_percent_mean": _r(p.cpu_percent.mean(), 1),
                "rss_bytes_max": _int(p.rss_bytes.max()),
                "series": {
                    "cpu_percent": _series_dict(p.cpu_percent),
                    "rss_bytes": _series_dict(p.rss_bytes),
                },
            }
            for p in tel.processes
        ],
        "hosts": [
            {
                "host": h.host,
                "cpu_percent_mean": _r(h.cpu_percent.mean(), 1),
                "mem_used_bytes_max": _int(h.mem_used_bytes.max()),
                "mem_total_bytes": _int(h.mem_total_bytes),
                "disk_read_bytes_per_s": _r(h.disk_read_bytes_per_s, 1),
                "disk_write_bytes_per_s": _r(h.disk_write_bytes_per_s, 1),
                "net_bytes_per_s": h.net_bytes_per_s,
                "series": {
                    "cpu_percent": _series_dict(h.cpu_percent),
                    "mem_used_bytes": _series_dict(h.mem_used_bytes),
                    "net_recv_bytes_per_s": _series_dict(h.net_recv_bytes_per_s),
                    "net_sent_bytes_per_s": _series_dict(h.net_sent_bytes_per_s),
                },
            }
            for h in tel.hosts
        ],
    }


def _findings(report: dict[str, Any], straggler: Straggler | None, warmup: dict[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    st = report["step_time"]
    phases = st["phases"]
    step_ms = st["mean_ms"]
    if straggler is not None:
        out.append(
            Finding(
                "straggler",
                "warning",
                f"Rank {straggler.rank} holds the other ranks back in {straggler.phase_name}",
                straggler.sentence(),
            )
        )
    data = phases.get("data")
    if data and data["share"] >= DATA_WAIT_SHARE:
        out.append(
            Finding(
                "data_wait",
                "warning",
                f"Data wait is {data['share']:.0%} of step time",
                f"{data['ms']:.1f} ms of the {step_ms:.1f} ms mean step is spent fetching batches "
                f"(num_workers={report['data_loader']['num_workers']}).",
            )
        )
    dl = report["data_loader"]
    if dl["stall_count"]:
        worst = dl["worst_stalls"][0]
        out.append(
            Finding(
                "data_stalls",
                "info",
                f"{dl['stall_count']} data-loader stall(s)",
                f"Steps whose data wait exceeded {dl['stall_threshold_ms']:.1f} ms; the worst, "
                f"{worst['data_ms']:.1f} ms, at step {worst['step']} on rank {worst['rank']}.",
            )
        )
    other = phases.get("other")
    if other and other["share"] >= OTHER_SHARE:
        out.append(
            Finding(
                "other_time",
                "info",
                f"{other['share']:.0%} of step time is outside data, forward, backward and optimizer",
                f"{other['ms']:.1f} ms per step goes to other callbacks, logging, the trainer's "
                "per-batch work and waiting for other ranks between batches.",
            )
        )
    for gpu in report["telemetry"]["gpus"]:
        name = f"GPU {gpu['index']}" + (f" on {gpu['host']}" if gpu["host"] else "")
        if gpu["util_percent_mean"] is not None and gpu["util_percent_mean"] < LOW_GPU_UTIL_PERCENT:
            out.append(
                Finding(
                    "low_gpu_util",
                    "warning",
                    f"{name} was busy {gpu['util_percent_mean']:.0f}% of the time",
                    f"GPU utilization averaged {gpu['util_percent_mean']:.0f}% "
                    f"(max {gpu['util_percent_max']:.0f}%) over {len(gpu['series']['util_percent']['values'])} samples.",
                )
            )
        if (
            gpu["mem_used_bytes_max"]
            and gpu["mem_total_bytes"]
            and gpu["mem_used_bytes_max"] / gpu["mem_total_bytes"] >= GPU_MEMORY_FULL_SHARE
        ):
            out.append(
                Finding(
                    "gpu_memory_full",
                    "info",
                    f"{name} memory was nearly full",
                    f"Peak {gpu['mem_used_bytes_max'] / 2**30:.1f} GiB of "
                    f"{gpu['mem_total_bytes'] / 2**30:.1f} GiB.",
                )
            )
        serious = sorted(set(gpu["throttle_reasons"]) & SERIOUS_THROTTLES)
        if serious:
            out.append(
                Finding(
                    "gpu_throttled",
                    "warning",
                    f"{name} was throttled",
                    f"Clock throttle reasons seen: {', '.join(serious)}.",
                )
            )
        if gpu["lost"]:
            out.append(
                Finding(
                    "gpu_lost", "warning", f"{name} stopped answering NVML", "NVML reported the GPU lost."
                )
            )
    out.extend(_communication_findings(report.get("communication")))
    if warmup["share"] >= LONG_WARMUP_SHARE and warmup["steps"] > 1:
        out.append(
            Finding(
                "long_warmup",
                "info",
                f"Warm-up took {warmup['steps']} steps",
                f"{warmup['share']:.0%} of the recorded steps were slower than 1.5x the steady step "
                "time and are left out of throughput.",
            )
        )
    if report["run"]["missing_ranks"]:
        missing = report["run"]["missing_ranks"]
        out.append(
            Finding(
                "missing_ranks",
                "warning",
                f"{len(missing)} rank(s) left no record",
                f"Rank(s) {', '.join(map(str, missing))} of {report['run']['world_size']} wrote nothing; "
                "every figure covers the ranks present only.",
            )
        )
    unclosed = [r for r, s in report["run"]["status"].items() if s == "not closed"]
    if unclosed:
        out.append(
            Finding(
                "unclosed_ranks",
                "warning",
                f"{len(unclosed)} rank(s) stopped without closing",
                f"Rank(s) {', '.join(unclosed)} were killed or are still running; "
                "their last flush interval is missing.",
            )
        )
    return out


def _communication_findings(comm: dict[str, Any] | None) -> list[Finding]:
    if not comm:
        return []
    out: list[Finding] = []
    share, exposed_share = comm.get("share_of_step"), comm.get("exposed_share_of_step")
    if exposed_share is not None and exposed_share >= EXPOSED_COMM_SHARE:
        out.append(
            Finding(
                "exposed_communication",
                "warning",
                f"The step waits {exposed_share:.0%} of its time for communication",
                f"{comm['exposed_ms_per_step']:.1f} ms per step of the {comm['comm_ms_per_step']:.1f} ms of "
                f"collectives is not hidden behind backward compute ({share:.0%} of the step is communication)"
                + (
                    f"; most of it is waiting for rank {comm['late_rank']['rank']}, which arrives late."
                    if comm.get("late_rank")
                    else "."
                ),
            )
        )
    link = comm.get("link") or {}
    if link.get("far_below"):
        out.append(
            Finding(
                "slow_link",
                "warning",
                f"Collectives run far below what {link['name']} gives",
                link["summary"],
            )
        )
    late = comm.get("late_rank")
    if late:
        out.append(
            Finding(
                "late_rank",
                "warning",
                f"Rank {late['rank']} arrives late at the collectives",
                late["summary"],
            )
        )
    return out


def analyze_run(
    run: Run, cost: CostOptions | None = None, segments: list[Run] | None = None
) -> dict[str, Any]:
    """The report's content as a JSON-ready dict; `cost` adds or replaces the price (`tuneup report
    --instance ...`). Raises the catalog's or the pricing's ValueError for a bad `cost`.

    With `segments` (every segment of a resumed or restarted run, `run` being the last), the figures are
    the last segment's, and the interruptions section covers them all.
    """
    inputs, cost_warnings = cost_inputs(run, cost)
    warm = {r: warmup_steps([s.wall_ms for s in rec.steps]) for r, rec in run.ranks.items()}
    steady = {r: rec.steps[warm[r] :] for r, rec in run.ranks.items() if rec.steps[warm[r] :]}
    profiles = [rank_profile(r, steps) for r, steps in sorted(steady.items())]
    straggler = find_straggler(profiles)
    starts = [rec.info.start_unix for rec in run.ranks.values() if rec.info.start_unix]
    ends = [rec.steps[-1].t_end for rec in run.ranks.values() if rec.steps]
    t0 = min(starts) if starts else (min(ends) if ends else run.manifest.created_unix)
    t_end = max(ends) if ends else t0
    tel = run_telemetry(run, t0)
    recorded = max((len(rec.steps) for rec in run.ranks.values()), default=0)
    warmup_n = max(warm.values(), default=0)
    warmup = {
        "steps": warmup_n,
        "per_rank": {str(r): n for r, n in sorted(warm.items())},
        "share": round(warmup_n / recorded, 4) if recorded else 0.0,
        # Steady on every rank from here on: the warm-up of the rank that took longest to settle.
        "first_steady_step": max((steps[0].step for steps in steady.values()), default=None),
        "rule": "leading steps until the first step, and the window it starts, within 1.5x the steady step time "
        "(median of the run's second half)",
    }
    step_time = _step_time(steady, profiles)
    report: dict[str, Any] = {
        "report_schema_version": REPORT_SCHEMA_VERSION,
        "generated_unix": round(time.time(), 3),
        "tuneup_version": __version__,
        "run": _run_section(run, steady, t0, t_end),
        "warmup": warmup,
        "throughput": _throughput(steady),
        "step_time": step_time,
        "timeseries": _timeseries(run, t0),
        "ranks": {
            "straggler": None
            if straggler is None
            else {
                "rank": straggler.rank,
                "phase": straggler.phase_name,
                "excess_ms": _r(straggler.excess_ms),
                "phase_ms": _r(straggler.phase_ms),
                "others_phase_ms": _r(straggler.others_phase_ms),
                "others_wait_ms": _r(straggler.others_wait_ms),
                "step_ms": _r(straggler.step_ms),
                "share_of_step": _r(straggler.share_of_step, 4),
                "summary": straggler.sentence(),
            },
        },
        "data_loader": {},
        "telemetry": _telemetry_section(tel),
        "environment": {
            "versions": run.manifest.versions,
            "host": run.manifest.environment.get("host"),
            "git": run.manifest.environment.get("git"),
            "seeds": run.manifest.environment.get("seeds"),
            "env": run.manifest.environment.get("env") or {},
            "gpus": run.manifest.gpus,
            "trainer": run.manifest.trainer,
            "dataloader": run.manifest.dataloader,
        },
        "communication": communication_section(run, steady),
        "cost": None,
        "findings": [],
        "warnings": list(run.warnings) + cost_warnings,
    }
    report["data_loader"] = _data_loader(run, steady, step_time["median_ms"])
    report["cost"] = cost_section(report, run, inputs)
    price = inputs.price
    per_device_hour = price.usd_per_hour / price.devices if price is not None and price.devices else None
    report["interruptions"] = interruptions_section(segments or [run], per_device_hour)
    if segments and len(segments) > 1:
        report["warnings"].append(
            f"this run has {len(segments)} segments (resumed or restarted); the figures are of the last one, "
            f"{run.path}, and the interruptions section covers them all"
        )
    report["findings"] = [f.as_dict() for f in _findings(report, straggler, warmup)]
    return report
