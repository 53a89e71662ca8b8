"""Everything a report says about a run, computed once from the loaded run: `analyze_run(run)`.

The result is a `RunAnalysis` (tuneup/analyze/model.py). Each section is computed by the module that
answers its question, from typed inputs; this module only decides the order and assembles them.
"""

from __future__ import annotations

import dataclasses
import time

from tuneup._version import __version__
from tuneup.analyze.badput import badput_ledger
from tuneup.analyze.communication import communication_section
from tuneup.analyze.contention import cpu_contention
from tuneup.analyze.convergence import convergence_findings, convergence_section
from tuneup.analyze.cost import cost_section
from tuneup.analyze.data_loading import data_loading
from tuneup.analyze.findings import findings
from tuneup.analyze.interruptions import interruptions_section
from tuneup.analyze.memory_kinds import memory_section
from tuneup.analyze.model import REPORT_SCHEMA_VERSION, Environment, RunAnalysis
from tuneup.analyze.noise_scale import noise_scale_section
from tuneup.analyze.operators import operators_section
from tuneup.analyze.rank_spread import ranks_section
from tuneup.analyze.ranks import find_straggler, rank_profile
from tuneup.analyze.record_events import event_findings
from tuneup.analyze.run_info import no_steady_state, run_info, run_span, warmup
from tuneup.analyze.slow_periods import slow_periods
from tuneup.analyze.steady import warmup_steps
from tuneup.analyze.sync_strategy import sync_strategy_section
from tuneup.analyze.telemetry import run_telemetry
from tuneup.analyze.telemetry_section import telemetry
from tuneup.analyze.throughput import phases_not_timed, step_time, throughput
from tuneup.analyze.timeline import timeline
from tuneup.analyze.timeseries import timeseries
from tuneup.cost.options import CostOptions, cost_inputs
from tuneup.record.schema import Run
from tuneup.target import Target


def _environment(run: Run) -> Environment:
    m = run.manifest
    return Environment(
        versions=m.versions,
        host=m.environment.get("host"),
        git=m.environment.get("git"),
        seeds=m.environment.get("seeds"),
        env=m.environment.get("env") or {},
        gpus=m.gpus,
        trainer=m.trainer,
        dataloader=m.dataloader,
    )


def analyze_run(
    run: Run, cost: CostOptions | None = None, segments: list[Run] | None = None, target: Target | None = None
) -> RunAnalysis:
    """The run's analysis; `cost` adds or replaces the price (`tuneup report --instance ...`); `target` (a
    quality target, `val_acc>=0.9`) replaces the one the callback recorded. Raises the catalog's or the
    pricing's ValueError for a bad `cost`.

    With `segments` (every segment of a resumed or restarted run, `run` being the last), the figures are
    the last segment's, and the interruptions section covers them all.
    """
    inputs, cost_warnings = cost_inputs(run, cost)
    warm = {r: warmup_steps([s.wall_ms for s in rec.steps]) for r, rec in run.ranks.items()}
    # Too short a run (fast_dev_run, a handful of steps) has no steady state: no figure is quoted from it.
    steady = (
        {}
        if no_steady_state(run, warm)
        else {r: rec.steps[warm[r] :] for r, rec in run.ranks.items() if rec.steps[warm[r] :]}
    )
    profiles = [rank_profile(r, steps) for r, steps in sorted(steady.items())]
    straggler = find_straggler(profiles)
    t0, t_end = run_span(run)
    fit_timeline = timeline(run)

    info = run_info(run, t0, t_end)
    warm_up = warmup(run, warm, max((steps[0].step for steps in steady.values()), default=None))
    rates = throughput(steady)
    steps = step_time(steady, profiles)
    steps = dataclasses.replace(
        steps, slow_periods=slow_periods(steady), phases_not_timed=phases_not_timed(run)
    )
    ranks = ranks_section(profiles, straggler, run.rank_hosts)
    loading = data_loading(run, steady, steps.median_ms)
    gpu_peaks = [s.peak_mem_bytes for steps in steady.values() for s in steps if s.peak_mem_bytes]
    sampled = run_telemetry(run, t0)
    tel = telemetry(sampled, max(gpu_peaks) if gpu_peaks else None)
    tel = dataclasses.replace(
        tel, cpu_contention=cpu_contention(sampled, run.rank_hosts, info.hardware.cpu_count)
    )
    comm = communication_section(run, steady)
    per_device_hour = inputs.price.usd_per_device_hour if inputs.price is not None else None
    warnings = list(run.warnings) + cost_warnings
    if segments and len(segments) > 1:
        warnings.append(
            f"this run has {len(segments)} segments (resumed or restarted); the figures are of the last one, "
            f"{run.path}, and the interruptions section covers them all"
        )
    money = cost_section(run, inputs, info, rates, tel, fit_timeline)
    convergence = convergence_section(run, info, rates, money, target)
    all_segments = segments or [run]
    restarts = interruptions_section(all_segments, per_device_hour)
    first_timeline = fit_timeline if len(all_segments) == 1 else timeline(all_segments[0])
    ledger = badput_ledger(
        all_segments,
        restarts,
        per_device_hour,
        before_fit_s=first_timeline.before_fit_s if first_timeline else None,
        validation_useful=bool(cost and cost.validation_useful),
    )
    return RunAnalysis(
        report_schema_version=REPORT_SCHEMA_VERSION,
        generated_unix=round(time.time(), 3),
        tuneup_version=__version__,
        run=info,
        warmup=warm_up,
        throughput=rates,
        step_time=steps,
        timeseries=timeseries(run, t0),
        ranks=ranks,
        data_loader=loading,
        telemetry=tel,
        environment=_environment(run),
        communication=comm,
        cost=money,
        findings=event_findings(run)
        + findings(info, warm_up, steps, loading, tel, comm, ranks.straggler)
        + convergence_findings(convergence),
        warnings=warnings,
        interruptions=restarts,
        timeline=fit_timeline,
        operators=operators_section(run, {k: p.ms for k, p in steps.phases.items()}, steps.mean_ms),
        noise_scale=noise_scale_section(run, steady),
        sync_strategy=sync_strategy_section(run, steady),
        memory=memory_section(run),
        convergence=convergence,
        badput=ledger,
    )
