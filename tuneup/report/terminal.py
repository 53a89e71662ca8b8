"""The run in a terminal: `render_terminal(analysis)` is what `tuneup show RUN_DIR` prints.

A dozen lines a person reads while the job still runs: what ran, the headline rates and where the step
goes, how the ranks compare, communication, hardware and cost, then findings and warnings. It reads the
typed analysis only, so its figures are the report's figures with the report's labels: throughput is the
steady-state mean (THROUGHPUT_STATISTIC), and the step time says which statistic each number is.
"""

from __future__ import annotations

from tuneup.analyze.model import (
    PROCESS_MEMORY_NAMES,
    Communication,
    Cost,
    Ranks,
    RankStep,
    RunAnalysis,
    StepTime,
    Telemetry,
)
from tuneup.report.format import (
    aligned_table,
    duration,
    fraction_percent,
    is_number,
    large,
    ms,
    number,
    recorded_steps,
    usd,
    usd_rate,
)

# Up to this many ranks (or GPUs) the terminal names each one; beyond, it prints how they spread and the
# extremes, as the report does: a line per rank of a 1,024-rank job is read by nobody.
LIST_EACH_UP_TO = 8


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _count(n: int) -> str:
    return f"{n / 1e9:,.2f} B" if n >= 1e9 else f"{n / 1e6:,.2f} M" if n >= 1e6 else f"{n:,}"


def _rate(value: float | None, unit: str) -> str | None:
    # The report's number format, so that `tuneup show`, the report and compare print the same figure.
    return None if value is None else f"{number(value)} {unit}"


def _ms(value: float | None) -> str:
    return "?" if value is None else ms(value)


def render_terminal(analysis: RunAnalysis) -> str:
    """The headline figures, findings and warnings of a run, as plain text lines (no trailing newline)."""
    lines = _run_lines(analysis) + _timeline_lines(analysis)
    st = analysis.step_time
    if analysis.warmup.no_steady_state:
        lines.append(f"  no steady state: {analysis.warmup.no_steady_state}; no figures quoted")
    elif not st.per_rank:
        lines.append("  no steps recorded")
    else:
        run = analysis.run
        kept = recorded_steps(run.steps_recorded, run.steps_seen, run.detail_steps, run.sample_every)
        lines.append(f"  steps recorded {kept} per rank (first {analysis.warmup.steps} left out as warm-up)")
        lines.append("")
        lines.extend(_speed_lines(analysis))
        lines.extend(_rank_lines(st, analysis.ranks))
    lines.extend(_communication_lines(analysis.communication))
    lines.extend(_hardware_lines(analysis.telemetry))
    lines.extend(_cost_lines(analysis.cost))
    lines.extend(_badput_lines(analysis))
    lines.extend(_convergence_lines(analysis))
    if not analysis.warmup.no_steady_state and st.per_rank:
        from tuneup.report.advice import advice_for, advice_text

        lines.append("")
        lines.append("  recommendations (tuneup advise RUN_DIR for the code and evidence):")
        lines.extend(f"    {line}" for line in advice_text(advice_for(analysis), limit=3))
    if analysis.findings:
        lines.append("")
        lines.append("  findings:")
        lines.extend(f"    - {f.severity}: {f.title}. {f.evidence}" for f in analysis.findings)
    if analysis.warnings:
        lines.append("")
        lines.append("  warnings:")
        lines.extend(f"    - {w}" for w in analysis.warnings)
    return "\n".join(lines)


def _timeline_lines(analysis: RunAnalysis) -> list[str]:
    """How the fit's wall time divides, as the report's first view says it."""
    from tuneup.report.sections.timeline import compile_line, part_label, stop_reason_text

    tl = analysis.timeline
    if tl is None or not is_number(tl.fit_wall_s):
        return []
    parts = sorted((p for p in tl.parts if p.seconds > 0), key=lambda p: -p.seconds)
    split = ", ".join(f"{part_label(p.name, tl).lower()} {fraction_percent(p.share)}" for p in parts)
    line = f"  fit {duration(tl.fit_wall_s)}: {split}"
    why = stop_reason_text(tl)
    if why:
        line += f"; stopped because {why}"
    compiled = compile_line(tl)
    return [line] + ([f"  {compiled}"] if compiled else [])


def _run_lines(analysis: RunAnalysis) -> list[str]:
    run = analysis.run
    # The directory the user pointed at: a resumed run's figures are its last segment's (run.path), but
    # the run is named by its first segment's directory, the one `tuneup show` was given.
    segments = analysis.interruptions.segments if analysis.interruptions is not None else []
    where = segments[0].path if segments else run.path
    hosts = sorted({h for h in run.hosts.values() if h})
    params, batch = run.parameters, run.batch_size_per_rank
    return [
        f"tuneup run {run.run_id}  ({where})",
        f"  world size {run.world_size} on {run.num_nodes} node(s)"
        + (f" ({', '.join(hosts[:4])})" if hosts else "")
        + f"; {run.namespace or '?'} {run.strategy or '?'}, precision {run.precision or '?'}, "
        f"accumulate {run.accumulate_grad_batches}",
        f"  model {run.model_class or '?'}"
        + (f": {_count(params)} parameters" if isinstance(params, int) else "")
        + (f"; batch size {batch} per rank" if batch else ""),
    ]


def _speed_lines(analysis: RunAnalysis) -> list[str]:
    tp, st = analysis.throughput, analysis.step_time
    rates = [
        x
        for x in (
            _rate(tp.samples_per_s, "samples/s"),
            _rate(tp.tokens_per_s, "tokens/s"),
            _rate(tp.steps_per_s, "training steps/s"),
        )
        if x
    ]
    heavy = f" (heavy-tailed: p95 {_ms(st.p95_ms)})" if st.noisy else ""
    lines = [
        f"  throughput (steady-state mean, all ranks): {' | '.join(rates)}",
        f"  step time: mean {_ms(st.mean_ms)}, median {_ms(st.median_ms)}{heavy}; "
        "where it goes, mean over all ranks:",
    ]
    # A noisy phase's mean is pulled above its median by slow steps: the median and p95 go beside it, as in
    # the report.
    lines.extend(
        f"    {name:<10}{phase.ms:>10.2f} ms {phase.share:>7.1%}"
        + (f"  noisy: median {_ms(phase.median_ms)}, p95 {_ms(phase.p95_ms)}" if phase.noisy else "")
        for name, phase in st.phases.items()
    )
    return lines


def _rank_lines(st: StepTime, ranks: Ranks) -> list[str]:
    if len(st.per_rank) <= 1:
        return []
    if len(st.per_rank) <= LIST_EACH_UP_TO or ranks.median_step_ms is None:
        return [
            "  per rank median step: " + ", ".join(f"rank {p.rank} {p.median_ms:.2f} ms" for p in st.per_rank)
        ]
    q = ranks.median_step_ms
    lines = [
        f"  per rank median step, over {len(st.per_rank):,} ranks: min {q.min:.2f} ms, p5 {q.p5:.2f} ms, "
        f"median {q.p50:.2f} ms, p95 {q.p95:.2f} ms, max {q.max:.2f} ms"
    ]

    def named(steps: list[RankStep]) -> str:
        return ", ".join(
            f"rank {s.rank}" + (f" ({s.host})" if s.host else "") + f" {s.median_ms:.2f} ms" for s in steps
        )

    if ranks.slowest:
        lines.append(f"    slowest: {named(ranks.slowest)}")
    if ranks.fastest:
        lines.append(f"    fastest: {named(ranks.fastest)}")
    return lines


def _communication_lines(comm: Communication | None) -> list[str]:
    if comm is None or comm.comm_ms_per_step is None:
        return []
    line = f"  communication: {comm.comm_ms_per_step:,.2f} ms of collectives per step"
    if comm.share_of_step is not None:
        line += f" ({comm.share_of_step:.1%} of the step)"
    if comm.exposed_ms_per_step is not None:
        line += f", {comm.exposed_ms_per_step:,.2f} ms of it waited for"
    return [line]


def _hardware_lines(telemetry: Telemetry) -> list[str]:
    parts = []
    cpu = [p.cpu_percent_mean for p in telemetry.processes if p.cpu_percent_mean is not None]
    memory = [p for p in telemetry.processes if p.memory_bytes_max is not None]
    if cpu:
        parts.append(f"process CPU {sum(cpu) / len(cpu):.0f}% per rank (100% = one core)")
    if memory:
        # The report's figure and measure: the rank's high-water mark, PSS (workers' shared pages once) or RSS.
        peak = max(memory, key=lambda p: p.memory_bytes_max or 0)
        measures = {p.memory_measure for p in memory}
        name = PROCESS_MEMORY_NAMES.get(peak.memory_measure, peak.memory_measure.upper())
        label = f"peak {name}" if len(measures) == 1 else "peak memory"
        parts.append(f"{label} {_mib(peak.memory_bytes_max)}")
    gpus = [g for g in telemetry.gpus if g.util_percent_mean is not None]
    if len(gpus) <= LIST_EACH_UP_TO:
        parts.extend(f"GPU {g.index} utilization {g.util_percent_mean:.0f}%" for g in gpus)
    else:
        low = min(gpus, key=lambda g: g.util_percent_mean or 0.0)
        mean = sum(g.util_percent_mean or 0.0 for g in gpus) / len(gpus)
        parts.append(
            f"GPU utilization {mean:.0f}% mean over {len(gpus):,} GPUs, lowest {low.util_percent_mean:.0f}% "
            f"(GPU {low.index}" + (f" on {low.host})" if low.host else ")")
        )
    return ["  hardware: " + ", ".join(parts)] if parts else []


def _cost_lines(cost: Cost | None) -> list[str]:
    if cost is None or not cost.priced or cost.price is None:
        return []
    money, mfu = cost.figures, cost.flops.mfu
    parts = [f"{usd_rate(cost.price.usd_per_hour, 'h')} ({cost.price.source})"]
    if is_number(money.usd_per_million_tokens):
        parts.append(f"{usd(money.usd_per_million_tokens)} per 1M tokens")
    elif is_number(money.samples_per_usd):
        parts.append(f"{large(money.samples_per_usd)} samples per $")
    if is_number(mfu):
        parts.append(f"MFU {fraction_percent(mfu)}")
    return ["  cost: " + "; ".join(parts)]


def _badput_lines(analysis: RunAnalysis) -> list[str]:
    """The ledger's sentence, then each category with time, share and dollars (the report's table)."""
    from tuneup.report.sections.badput import label, ledger_line, shown

    b = analysis.badput
    if b is None:
        return []
    rows = [
        (
            label(c.name),
            duration(c.seconds),
            fraction_percent(c.share),
            usd(c.usd) if is_number(c.usd) else "",
            "useful" if c.useful else "badput",
        )
        for c in shown(b)
    ]
    table = aligned_table(("ledger", "time", "share", "cost", "counted as"), rows, (1, 2, 3), indent="    ")
    return ["", f"  {ledger_line(b)}", *table]


def _convergence_lines(analysis: RunAnalysis) -> list[str]:
    """The target, then each logged metric's best, when, and what the run spent since (the report's figures)."""
    from tuneup.report.sections.convergence import metric_line, target_line

    conv = analysis.convergence
    if conv is None or (not conv.metrics and conv.target is None):
        return []
    lines = [""]
    if conv.target is not None:
        lines.append(f"  target: {target_line(conv.target)}")
    if conv.metrics:
        lines.append("  metrics logged (best, when, since the best):")
        lines.extend(f"    {metric_line(c)}" for c in conv.metrics)
    if conv.loss_spread is not None and conv.loss_spread.drifting:
        lines.append("  the ranks' training losses drift apart (see findings)")
    if conv.grad_norm is not None:
        gn = conv.grad_norm
        spikes = f", {len(gn.spike_steps)} spike(s)" if gn.spike_steps else ""
        lines.append(
            f"  gradient norm ({gn.source}): median {gn.median:.4g} over {len(gn.step):,} steps{spikes}"
        )
    return lines
