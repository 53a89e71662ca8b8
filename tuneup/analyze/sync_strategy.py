"""What a gradient synchronisation strategy did in a run (TuneupDDPStrategy, tuneup.sync): the bytes it sent
against an exact all-reduce, the error its safeguard measured, when it fell back, and the step time before
and after it started.

The strategy writes its own events (`sync_strategy` at the start, `sync_started`, `sync_check`,
`sync_fallback`, and `sync_summary` at the end). Every rank writes the same ones, so the lowest rank's are
read. Their `step` counts optimizer steps taken while the step records' `step` is 0-based: a strategy that
started at step 20 ran from the record's step 20 (the 21st step) on, and one that fell back at step 50 ran
up to the record's step 49.

Bytes are the step records' (what the timed collectives sent, local SGD's parameter averaging included);
the strategy's own count in its summary checks them. The exact figure is what the exact steps before the
start sent, where there were any, else the strategy's count of DDP's buckets: the same buckets either way.

The time figures compare two stretches of one run, not two runs: the exact warm-up is early training, so
the saving is a measurement of this run, not a prediction, and the notes say so.

Each figure is a mean over the steps of the phase it belongs to. A local SGD step between averages runs no
collective, so its record has no communication figure: where the run's collectives were timed that is zero
communication, not an unknown (`StrategyPhases.sent_nothing`), and a per-step figure of the local phase is
its collective time over all of its steps, not over the one step in H that averaged.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuneup._stats import mean, number
from tuneup.analyze.model import SyncCheck, SyncFallback, SyncStrategy
from tuneup.record.schema import Run, StepRecord

# tuneup.collect.comm.PARAM_AVERAGING: the source of local SGD's averaging collectives (analyze never
# imports the collection side, which imports torch).
PARAM_AVERAGING = "param_avg"

EVENT_KINDS = ("sync_strategy", "sync_started", "sync_check", "sync_fallback", "sync_summary")
# tuneup.sync.controller's name for exact averaging. A fallback to it is final: no check runs after it.
EXACT_MODE = "exact all-reduce"
# The step records and the strategy's own count cover the same steps; past the record's detail steps only
# one step in many is kept, so they may differ a little. Beyond this share they disagree.
COUNT_TOLERANCE = 0.1
# Fewer steady steps than this on either side of the start and the time figures are rough.
FEW_TIMED_STEPS = 10


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ratio(exact: float | None, sent: float | None) -> float | None:
    return exact / sent if exact is not None and sent else None


def _events(run: Run) -> dict[str, list[dict[str, Any]]]:
    """The strategy's events by kind, from the lowest rank that recorded them; {} where none did."""
    for rank in sorted(run.ranks):
        events = run.ranks[rank].events
        if any(e.get("kind") == "sync_strategy" for e in events):
            by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in EVENT_KINDS}
            for e in events:
                if e.get("kind") in by_kind:
                    by_kind[e["kind"]].append(e)
            return by_kind
    return {}


def _checks(events: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> list[SyncCheck]:
    # The events write their floats rounded (an fp16 error of 3e-4 reads 0.0); the summary's history keeps
    # them whole, so its error and loss win where it has the check.
    history = {}
    for entry in summary.get("check_history") or ():
        if isinstance(entry, list) and len(entry) == 3 and _int(entry[0]) is not None:
            history[entry[0]] = (number(entry[1]), number(entry[2]))
    checks = []
    for e in events:
        step = _int(e.get("step"))
        if step is None:
            continue
        error, loss = history.get(step, (number(e.get("error")), number(e.get("loss"))))
        checks.append(SyncCheck(step, error, number(e.get("error_bound")), loss, e.get("breached") is True))
    return checks


def _fallbacks(events: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> list[SyncFallback]:
    # The summary repeats the fallbacks: a record whose events were lost still has them there.
    out = []
    for e in events or summary.get("fallbacks") or ():
        step = _int(e.get("step")) if isinstance(e, Mapping) else None
        if step is None:
            continue
        reasons = e.get("reasons")
        out.append(
            SyncFallback(
                step=step,
                from_mode=str(e.get("from") or "?"),
                to_mode=str(e.get("to") or "?"),
                reasons=[str(r) for r in reasons] if isinstance(reasons, list) else [],
            )
        )
    return out


def _summary_exact_bytes(summary: Mapping[str, Any]) -> float | None:
    """What an exact all-reduce sends per step by the strategy's count: every bucket's bytes, per synced
    backward."""
    exact, iterations = _int(summary.get("exact_bytes")), _int(summary.get("hook_iterations"))
    return exact / iterations if exact is not None and iterations else None


def _counted_bytes_per_step(
    summary: Mapping[str, Any], started_at: int, end_step: int | None, fallbacks: Sequence[SyncFallback]
) -> float | None:
    """The strategy's own count of what its phase sent per step: the summary's totals (hook and averaging)
    less the exact steps before the start and after a fallback to exact. None where the summary cannot tell
    (a fallback to another local SGD period runs the strategy on, at another rate)."""
    steps, sent = _int(summary.get("steps")), _int(summary.get("sent_bytes"))
    averaged = _int(summary.get("param_avg_bytes")) or 0
    exact = _summary_exact_bytes(summary)
    if steps is None or sent is None or exact is None or (fallbacks and fallbacks[0].to_mode != EXACT_MODE):
        return None
    phase_end = steps if end_step is None else end_step
    if phase_end <= started_at:
        return None
    exact_steps = started_at + (steps - phase_end)
    return (sent + averaged - exact * exact_steps) / (phase_end - started_at)


def _in_phase(step: int, started_at: int, end_step: int | None) -> bool:
    """Whether the record's (0-based) step ran under the strategy."""
    return step >= started_at and (end_step is None or step < end_step)


def _local_sgd_period(strategy: Mapping[str, Any]) -> int | None:
    config = strategy.get("config")
    period = _int(config.get("local_sgd_period")) if isinstance(config, Mapping) else None
    return period if period is not None and period > 0 else None


@dataclass(frozen=True, slots=True)
class StrategyPhases:
    """Which of a run's (0-based) steps ran under its TuneupDDPStrategy, and which ran no collective."""

    started_at: int | None  # None: the strategy never started; every step was exact
    end_step: int | None  # the first fallback; None: it ran to the end
    local_sgd_period: int | None  # as configured; None: a compressing strategy
    # Local SGD's steps run from started_at up to here (its fallback to exact; one to a shorter period
    # stays local); None: to the end.
    local_until: int | None
    probed: bool  # the run's collectives were timed: a step that recorded none ran none

    def in_strategy(self, step: int) -> bool:
        return self.started_at is not None and _in_phase(step, self.started_at, self.end_step)

    def local(self, step: int) -> bool:
        """Whether the step was a local SGD step (one that averaged the parameters included)."""
        return (
            self.local_sgd_period is not None
            and self.started_at is not None
            and _in_phase(step, self.started_at, self.local_until)
        )

    def sent_nothing(self, record: StepRecord) -> bool:
        """Whether a step without a communication figure ran no collective (a local SGD step between
        averages), so that its communication is zero rather than unknown."""
        return record.comm_ms is None and self.probed and self.local(record.step)


def strategy_phases(run: Run) -> StrategyPhases | None:
    """The run's strategy phases, or None where it used no TuneupDDPStrategy."""
    events = _events(run)
    return _phases(run, events) if events else None


def _phases(run: Run, events: Mapping[str, Sequence[Mapping[str, Any]]]) -> StrategyPhases:
    summary: Mapping[str, Any] = events["sync_summary"][-1] if events["sync_summary"] else {}
    started = events["sync_started"]
    started_at = _int(started[0].get("step")) if started else _int(summary.get("started_at"))
    fallbacks = _fallbacks(events["sync_fallback"], summary) if started_at is not None else []
    to_exact = next((f.step for f in fallbacks if f.to_mode == EXACT_MODE), None)
    return StrategyPhases(
        started_at=started_at,
        end_step=fallbacks[0].step if fallbacks else None,
        local_sgd_period=_local_sgd_period(events["sync_strategy"][0]),
        local_until=to_exact,
        probed=any(s.comm_bytes is not None for rec in run.ranks.values() for s in rec.steps),
    )


def _averaging_ms(
    run: Run, phases: StrategyPhases, steady: Mapping[int, Sequence[StepRecord]]
) -> float | None:
    """What one local SGD parameter average cost a step: the mean step of the steady local steps that
    averaged over that of the ones that did not (the average's collective, and the copies into and out of
    its flat buffer, on the training thread after the optimizer step). None where either kind is missing."""
    period, started_at = phases.local_sgd_period, phases.started_at
    if period is None or started_at is None:
        return None
    averaged = {
        (rank, c.step)
        for rank, rec in run.ranks.items()
        for c in rec.collectives
        if c.source == PARAM_AVERAGING
    }
    averaging, between = [], []
    for rank, steps in steady.items():
        for s in steps:
            if not phases.local(s.step):
                continue
            # Without timed collectives, the strategy's schedule (one optimizer: every H-th local step).
            did = (rank, s.step) in averaged if phases.probed else (s.step - started_at + 1) % period == 0
            (averaging if did else between).append(s)
    if not averaging or not between:
        return None
    return max(
        0.0, statistics.fmean(s.wall_ms for s in averaging) - statistics.fmean(s.wall_ms for s in between)
    )


def _steps(by_rank: Iterable[Sequence[StepRecord]]) -> list[StepRecord]:
    """Every rank's records in one list: the figures are means over the ranks' steps."""
    return [s for steps in by_rank for s in steps]


def _distinct(records: Iterable[StepRecord]) -> int:
    """How many training steps the records are of (each rank records every step)."""
    return len({s.step for s in records})


# What the safeguard's error is, and how tuneup.sync measures it: (name, meaning).
COMPRESSION_ERROR = (
    "compression error",
    "the relative error of the compressed average of a slice of one DDP bucket against an exact all-reduce "
    "of the same slice at the checked step",
)
DIVERGENCE = (
    "parameter divergence",
    "the ranks' parameter spread around their average at an averaging, relative to how far the average moved "
    "since the previous one",
)


def _error(strategy: Mapping[str, Any]) -> tuple[str, str]:
    config = strategy.get("config")
    local = isinstance(config, Mapping) and config.get("local_sgd_period") is not None
    return DIVERGENCE if local else COMPRESSION_ERROR


def sync_strategy_section(run: Run, steady: dict[int, list[StepRecord]]) -> SyncStrategy | None:
    """The run's synchronisation strategy, or None where it used none (no `sync_strategy` event)."""
    events = _events(run)
    if not events:
        return None
    strategy = events["sync_strategy"][0]
    summary: Mapping[str, Any] = events["sync_summary"][-1] if events["sync_summary"] else {}
    start_step = _int(strategy.get("start_step")) or 0
    phases = _phases(run, events)
    started_at, end_step = phases.started_at, phases.end_step
    fallbacks = _fallbacks(events["sync_fallback"], summary)
    hierarchical = strategy.get("hierarchical") is True
    nodes = _int(strategy.get("nodes")) or 1
    all_steps = _steps(rec.steps for rec in run.ranks.values())

    exact_bytes: float | None = None
    exact_basis = None
    before = [s.comm_bytes for s in all_steps if s.comm_bytes and (started_at is None or s.step < started_at)]
    if before:
        # Every exact step sends every bucket: the median passes over a step whose bytes a probe missed.
        exact_bytes, exact_basis = statistics.median(before), "the exact steps before the strategy started"
    elif (exact_bytes := _summary_exact_bytes(summary)) is not None:
        exact_basis = "the strategy's count of DDP's gradient buckets"

    # A step with no collective recorded sent nothing (a local SGD step), where the probe recorded the
    # run's collectives at all; without it (profile_communication=False) no step has bytes.
    phase = (
        [s for s in all_steps if phases.probed and _in_phase(s.step, started_at, end_step)]
        if started_at is not None
        else []
    )
    sent = mean([s.comm_bytes or 0 for s in phase])
    cross_exact = cross_sent = None
    if hierarchical and nodes > 1:
        # An exact all-reduce spans every rank, so all of its bytes cross nodes.
        cross_exact = exact_bytes
        cross_sent = mean([(s.comm_bytes or 0) - (s.comm_node_bytes or 0) for s in phase])
    counted = (
        _counted_bytes_per_step(summary, started_at, end_step, fallbacks) if started_at is not None else None
    )
    check_bytes = _int(summary.get("check_bytes"))
    phase_steps = (end_step if end_step is not None else _int(summary.get("steps"))) or 0
    phase_sent = sent * (phase_steps - started_at) if sent and started_at is not None else None
    overhead = check_bytes / phase_sent if check_bytes is not None and phase_sent and phase_sent > 0 else None

    timed = _steps(steady.values())
    exact_timed = [s for s in timed if started_at is None or s.step < started_at]
    strategy_timed = [s for s in timed if started_at is not None and _in_phase(s.step, started_at, end_step)]
    exact_step_ms = mean([s.wall_ms for s in exact_timed])
    strategy_step_ms = mean([s.wall_ms for s in strategy_timed])
    saved = (
        exact_step_ms - strategy_step_ms
        if exact_step_ms is not None and strategy_step_ms is not None
        else None
    )

    exact_steps_timed, strategy_steps_timed = _distinct(exact_timed), _distinct(strategy_timed)
    error_name, error_meaning = _error(strategy)
    notes = _notes(
        start_step=start_step,
        started_at=started_at,
        fallbacks=fallbacks,
        exact_bytes=exact_bytes,
        sent=sent,
        counted=counted,
        exact_timed=exact_steps_timed,
        strategy_timed=strategy_steps_timed,
        compression=error_name == COMPRESSION_ERROR[0],
    )
    return SyncStrategy(
        label=str(strategy.get("label") or summary.get("label") or "?"),
        start_step=start_step,
        started_at=started_at,
        end_step=end_step,
        mode_at_end=str(summary["mode_at_end"]) if summary.get("mode_at_end") else None,
        steps=_int(summary.get("steps")),
        hierarchical=hierarchical,
        nodes=nodes,
        ranks_per_node=_int(strategy.get("ranks_per_node")),
        error_name=error_name,
        error_meaning=error_meaning,
        exact_bytes_per_step=exact_bytes,
        exact_basis=exact_basis,
        strategy_steps=_distinct(phase),
        sent_bytes_per_step=sent,
        bytes_ratio=_ratio(exact_bytes, sent),
        cross_node_exact_bytes_per_step=cross_exact,
        cross_node_sent_bytes_per_step=cross_sent,
        cross_node_ratio=_ratio(cross_exact, cross_sent),
        counted_bytes_per_step=counted,
        counted_bytes_ratio=_ratio(exact_bytes, counted),
        check_bytes=check_bytes,
        check_overhead_share=overhead,
        exact_steps_timed=exact_steps_timed,
        strategy_steps_timed=strategy_steps_timed,
        exact_exposed_comm_ms=mean([s.comm_exposed_ms for s in exact_timed if s.comm_exposed_ms is not None]),
        strategy_exposed_comm_ms=mean(
            [
                0.0 if phases.sent_nothing(s) else s.comm_exposed_ms
                for s in strategy_timed
                if s.comm_exposed_ms is not None or phases.sent_nothing(s)
            ]
        ),
        exact_step_ms=exact_step_ms,
        strategy_step_ms=strategy_step_ms,
        time_saved_ms_per_step=saved,
        checks=_checks(events["sync_check"], summary),
        fallbacks=fallbacks,
        notes=notes,
        exact_comm_ms=mean([s.comm_ms for s in exact_timed if s.comm_ms is not None]),
        averaging_ms=_averaging_ms(run, phases, steady),
    )


def _notes(
    *,
    start_step: int,
    started_at: int | None,
    fallbacks: Sequence[SyncFallback],
    exact_bytes: float | None,
    sent: float | None,
    counted: float | None,
    exact_timed: int,
    strategy_timed: int,
    compression: bool,
) -> list[str]:
    if started_at is None:
        return [
            f"The strategy never started: the run ended within its {start_step} exact warm-up steps, so every "
            "step used DDP's exact all-reduce."
        ]
    notes = []
    if fallbacks:
        first = fallbacks[0]
        notes.append(
            f"The safeguard fell back at step {first.step} ({first.from_mode} → {first.to_mode}): the bytes and "
            f"times above are of steps {started_at + 1}–{first.step}, before it."
        )
    if exact_timed and strategy_timed:
        notes.append(
            f"The times compare two stretches of this one run: {exact_timed} steady exact steps before the "
            f"strategy started and {strategy_timed} under it (means over the ranks). The exact ones are "
            "early training, so the difference is what this run measured, not a prediction; a run with "
            "exact all-reduce over the same steps is the like-for-like comparison."
        )
        if min(exact_timed, strategy_timed) < FEW_TIMED_STEPS:
            notes.append("Few steps on one side: the time figures are rough.")
    else:
        notes.append(
            "No time comparison: there were no steady exact steps before the strategy started (the first steps "
            "are slow and left out) or none under it."
        )
    if sent is not None and counted is not None and abs(sent - counted) > COUNT_TOLERANCE * max(counted, 1.0):
        notes.append(
            f"The step records count {sent / counted:.2g}× the bytes the strategy counted for the same steps: "
            "the probe counted collectives the strategy did not make, or missed some. The strategy's "
            "count is exact for what its hook and its averaging sent; the records' figure leads above as the "
            "measured one."
        )
    if compression:
        notes.append(
            "Each check measures a slice of one DDP bucket, the buckets and slices in turn: errors that alternate "
            "from check to check are parts of the gradient differing, not training changing."
        )
    return notes
