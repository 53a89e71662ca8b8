"""A slow rank: what the job would deliver if it ran like the others, and where to look for the cause.

In data-parallel training every rank waits for the slowest at each gradient synchronization, so one slow
rank sets everyone's step. The analysis names it two ways: a straggler (its own work, data, forward or
optimizer, takes `excess_ms` longer than the other ranks' median: tuneup/analyze/ranks.py) and a late
rank (its collectives are short because the others wait inside theirs for it:
tuneup/analyze/communication.py). If it ran like the others, the step would lose that excess:

    new step = step − excess           gain = step / (step − excess) − 1      (samples/s)

with the interval between the rank's excess and the others' measured extra wait (the two estimates of
the same time), widened by the model's own error. This is no knob: the code is a diagnostic (which host,
whether its CPU was taken, what its process was doing), and the confidence is low unless the record
itself shows a cause (CPU contention on its host).
"""

from __future__ import annotations

from tuneup.advise.context import AdviceContext
from tuneup.advise.model import Change, Predicted, Range, Recommendation
from tuneup.advise.outcomes import cost_change, relative_gain
from tuneup.advise.step_model import MODEL_ERROR


def without_ms(current: Predicted, step_ms: float, removed: tuple[float, float, float]) -> Predicted:
    """`current` with (value, least, most) ms taken off a step of `step_ms`."""
    value, least, most = removed

    def factor(ms: float) -> float:
        return max(1e-9, step_ms - ms) / step_ms

    f_mid, f_slow, f_fast = factor(value), factor(least) * (1 + MODEL_ERROR), factor(most) * (1 - MODEL_ERROR)

    def step(r: Range) -> Range:
        return Range(r.value * f_mid, r.value * f_fast, r.value * f_slow)

    def rate(r: Range | None) -> Range | None:
        return None if r is None else Range(r.value / f_mid, r.value / f_slow, r.value / f_fast)

    def money(r: Range | None) -> Range | None:
        return None if r is None else Range(r.value * f_mid, r.value * f_fast, r.value * f_slow)

    return Predicted(
        step_ms=step(current.step_ms),
        mean_step_ms=step(current.mean_step_ms) if current.mean_step_ms is not None else None,
        samples_per_s=rate(current.samples_per_s),  # type: ignore[arg-type]
        usd_per_million_samples=money(current.usd_per_million_samples),
        usd_per_million_tokens=money(current.usd_per_million_tokens),
        goodput_samples_per_s=rate(current.goodput_samples_per_s),
        statistical_efficiency=current.statistical_efficiency,
        breakdown_ms=dict(current.breakdown_ms),
    )


def recommend(ctx: AdviceContext) -> list[Recommendation]:
    a = ctx.analysis
    straggler = a.ranks.straggler
    late = a.communication.late_rank if a.communication is not None else None
    if straggler is None and late is None:
        ctx.skip(
            "slow rank", "no rank holds the others back (no straggler, no late arrival at the collectives)"
        )
        return []
    evidence: list[str] = []
    if straggler is not None and straggler.excess_ms and straggler.step_ms:
        rank, step_ms = straggler.rank, straggler.step_ms
        excess = straggler.excess_ms
        wait = (
            straggler.others_wait_ms if straggler.others_wait_ms and straggler.others_wait_ms > 0 else excess
        )
        removed = (excess, min(excess, wait), max(excess, wait))
        evidence.append(straggler.summary)
        where = straggler.phase.removesuffix("_ms")
    elif late is not None and late.others_comm_ms is not None and late.comm_ms is not None:
        rank, step_ms = late.rank, ctx.observation.step_mean_ms
        excess = late.others_comm_ms - late.comm_ms
        removed = (excess, excess, excess)
        evidence.append(late.summary)
        where = "the work before each collective"
    else:
        ctx.skip("slow rank", "a slow rank was named without the figures to size it")
        return []
    if late is not None and straggler is not None and late.rank == rank:
        evidence.append(late.summary)
    host = a.run.hosts.get(str(rank))
    if host:
        evidence.append(f"rank {rank} runs on host {host}")
    cause = None
    for c in a.telemetry.cpu_contention:
        if rank in c.ranks and c.contended:
            cause = (
                f"its host {c.host or ''} had its CPU taken by other processes for {c.contended_share:.0%} of the run "
                f"(others {c.others_percent_mean or 0:.0f}% of its {c.cores} cores)"
            ).replace("host  had", "host had")
            evidence.append(cause)
    cpu = {p.rank: p.cpu_percent_mean for p in a.telemetry.processes if p.cpu_percent_mean is not None}
    if rank in cpu and len(cpu) > 1:
        others = sorted(v for r, v in cpu.items() if r != rank)
        evidence.append(
            f"rank {rank}'s process tree used {cpu[rank]:.0f}% CPU (100 = one core) against a median of "
            f"{others[len(others) // 2]:.0f}% on the others"
        )
    current = ctx.current
    proposed = without_ms(current, step_ms, removed)
    gain = relative_gain(current, proposed, "samples/s")
    knob = f"rank {rank}"
    if gain.value < ctx.min_gain:
        ctx.skip(knob, f"if it ran like the others the job would gain {gain.value:+.1%}, under the threshold")
        return []
    checks = [
        # Only numbers in the code: host and phase names are recorded data, shown (escaped) in the evidence.
        f"# rank {rank} is slow; on its host (named in the evidence):",
        "uptime; top -b -n 1 | head -20          # other processes on its cores?",
    ]
    if ctx.observation.on_gpu:
        checks.append("nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE   # throttled or slower GPU?")
    if where == "data":
        checks.append(
            "# its data: does its shard hold larger or slower samples (DistributedSampler, a remote mount)?"
        )
    checks.append(
        "# pin each rank to its own cores (torchrun's --local-ranks-filter shows one rank's log; "
        "taskset -cp PID shows its affinity)"
    )
    return [
        Recommendation(
            id="ranks.slow_rank",
            title=f"Find out why rank {rank} is slow",
            changes=[Change(knob, f"+{excess:.1f} ms per step in {where}", "runs like the other ranks")],
            objective="samples/s",
            gain=gain,
            confidence="medium" if cause else "low",
            evidence=evidence,
            code="\n".join(checks),
            yaml=None,
            caveats=[
                "a diagnostic, not a setting: the gain is what the job delivers once the cause is found and "
                "removed" + ("" if cause else "; the record does not show the cause")
            ],
            current=current,
            predicted=proposed,
            cost_change=cost_change(current, proposed),
        )
    ]
