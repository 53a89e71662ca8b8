"""Which operators each phase of the step spends its time in: the profiled steps' operators.json (written
by tuneup.collect.profiler when the run asked for it), combined over ranks.

Every figure is per profiled step, the mean over the ranks that profiled. An operator is listed where
any rank's top list for the phase holds it; its mean is over the ranks that list it (`ranks` says how
many), and with more than one rank its spread over them shows a rank that spends longer in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuneup._stats import number
from tuneup.analyze.model import OperatorProfile, OperatorTime, PhaseOperators
from tuneup.record.schema import PHASES, Run, rank_dir_name

# The step clock's phases, in its order, as operators.json names them.
PHASE_ORDER = tuple(name.removesuffix("_ms") for name in PHASES)
# Operators listed per phase.
TOP_OPERATORS = 15

DEFAULT_NOTE = (
    "These steps ran with torch.profiler on, which adds host time to every operator: they ran slower "
    "than the others, so compare shares rather than milliseconds."
)


def _non_negative(value: Any) -> float | None:
    figure = number(value)
    return figure if figure is not None and figure >= 0 else None


@dataclass(slots=True)
class _RankOperator:
    calls: float
    self_cpu_ms: float
    total_cpu_ms: float
    device_ms: float | None


@dataclass(slots=True)
class _RankPhase:
    wall_ms: float
    self_cpu_ms: float
    device_ms: float | None
    calls: float
    operators: int
    top: dict[str, _RankOperator] = field(default_factory=dict)


@dataclass(slots=True)
class _RankProfile:
    rank: int
    steps: list[int]
    step_wall_ms: float | None
    device: str | None
    phases: dict[str, _RankPhase]
    trace: str | None
    note: str | None
    write_s: float | None


def _rank_profile(rank: int, doc: Mapping[str, Any]) -> _RankProfile | None:
    """One rank's operators.json, read defensively: a damaged entry is left out, never raised on."""
    steps = [s for s in doc.get("steps") or () if isinstance(s, int) and not isinstance(s, bool)]
    if not steps:
        return None
    device = doc.get("device") if isinstance(doc.get("device"), str) else None
    phases: dict[str, _RankPhase] = {}
    for name, raw in (doc.get("phases") or {}).items():
        if not isinstance(name, str) or not isinstance(raw, dict):
            continue
        wall = _non_negative(raw.get("wall_ms"))
        self_cpu = _non_negative(raw.get("self_cpu_ms"))
        if wall is None or self_cpu is None:
            continue
        top: dict[str, _RankOperator] = {}
        for op in raw.get("top") or ():
            if not isinstance(op, dict) or not isinstance(op.get("name"), str):
                continue
            values = [_non_negative(op.get(k)) for k in ("calls", "self_cpu_ms", "total_cpu_ms")]
            if any(v is None for v in values):
                continue
            calls, self_ms, total_ms = values
            prior = top.get(op["name"])
            if prior is not None:  # the same name twice: a writer's slip; add them up
                calls, self_ms, total_ms = (
                    calls + prior.calls,
                    self_ms + prior.self_cpu_ms,
                    total_ms + prior.total_cpu_ms,
                )
            top[op["name"]] = _RankOperator(
                calls, self_ms, total_ms, _non_negative(op.get("self_device_ms")) if device else None
            )
        operators = raw.get("operators")
        phases[name] = _RankPhase(
            wall,
            self_cpu,
            _non_negative(raw.get("device_ms")) if device else None,
            _non_negative(raw.get("calls")) or 0.0,
            operators if isinstance(operators, int) and not isinstance(operators, bool) else len(top),
            top,
        )
    trace = doc.get("trace")
    cost = doc.get("cost_s") if isinstance(doc.get("cost_s"), dict) else {}
    return _RankProfile(
        rank=rank,
        steps=steps,
        step_wall_ms=_non_negative(doc.get("step_wall_ms")),
        device=device,
        phases=phases,
        # A plain file name in the rank's directory; anything else is not a path the report should show.
        trace=trace if isinstance(trace, str) and trace and "/" not in trace and "\\" not in trace else None,
        note=doc.get("overhead_note") if isinstance(doc.get("overhead_note"), str) else None,
        write_s=_non_negative(cost.get("total_s")),
    )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(part: float | None, whole: float | None) -> float | None:
    if part is None or whole is None or whole <= 0:
        return None
    return part / whole


def _operator(
    name: str,
    per_rank: list[tuple[int, int, _RankOperator]],
    phase_wall: float,
    phase_device: float | None,
    ranks: int,
) -> OperatorTime:
    """`per_rank`: (rank, profiled steps, the rank's figures) for the ranks that list it."""
    self_ms = [op.self_cpu_ms / n for _, n, op in per_rank]
    device = [op.device_ms / n for _, n, op in per_rank if op.device_ms is not None]
    self_mean = sum(self_ms) / len(self_ms)
    device_mean = _mean(device)
    # The spread over the ranks that list it (two or more); with one, which rank that is.
    spread = len(per_rank) > 1
    slowest = max(range(len(per_rank)), key=lambda i: (self_ms[i], -per_rank[i][0]))
    return OperatorTime(
        name=name,
        ranks=len(per_rank),
        calls_per_step=sum(op.calls / n for _, n, op in per_rank) / len(per_rank),
        self_cpu_ms_per_step=self_mean,
        total_cpu_ms_per_step=sum(op.total_cpu_ms / n for _, n, op in per_rank) / len(per_rank),
        share_of_phase=_ratio(self_mean, phase_wall),
        device_ms_per_step=device_mean,
        device_share_of_phase=_ratio(device_mean, phase_device),
        self_cpu_ms_per_step_min=min(self_ms) if spread else None,
        self_cpu_ms_per_step_max=max(self_ms) if spread else None,
        slowest_rank=per_rank[slowest][0] if ranks > 1 else None,
    )


def _phase(
    name: str, profiles: list[_RankProfile], step_ms: float | None, steady_ms: float | None, top: int
) -> PhaseOperators | None:
    present = [(p, p.phases[name]) for p in profiles if name in p.phases]
    if not present:
        return None
    wall = sum(ph.wall_ms / len(p.steps) for p, ph in present) / len(present)
    self_cpu = sum(ph.self_cpu_ms / len(p.steps) for p, ph in present) / len(present)
    devices = [ph.device_ms / len(p.steps) for p, ph in present if ph.device_ms is not None]
    device = _mean(devices)
    calls = sum(ph.calls / len(p.steps) for p, ph in present) / len(present)
    if wall <= 0 and self_cpu <= 0 and not device:
        return None
    by_name: dict[str, list[tuple[int, int, _RankOperator]]] = {}
    for p, ph in present:
        for op_name, op in ph.top.items():
            by_name.setdefault(op_name, []).append((p.rank, len(p.steps), op))
    listed = [_operator(n, rows, wall, device, len(present)) for n, rows in by_name.items()]
    if device is not None:
        listed.sort(key=lambda o: (-(o.device_ms_per_step or 0.0), -o.self_cpu_ms_per_step, o.name))
    else:
        listed.sort(key=lambda o: (-o.self_cpu_ms_per_step, o.name))
    shown = listed[:top]
    distinct = max(ph.operators for _, ph in present)
    return PhaseOperators(
        phase=name,
        wall_ms_per_step=wall,
        share_of_step=_ratio(wall, step_ms),
        steady_ms_per_step=steady_ms,
        self_cpu_ms_per_step=self_cpu,
        outside_operators_ms_per_step=max(0.0, wall - self_cpu),
        device_ms_per_step=device,
        calls_per_step=calls,
        operators=shown,
        other_operators=max(0, distinct - len(shown)),
        other_self_cpu_ms_per_step=max(0.0, self_cpu - sum(o.self_cpu_ms_per_step for o in shown)),
        other_device_ms_per_step=(
            max(0.0, device - sum(o.device_ms_per_step or 0.0 for o in shown)) if device is not None else None
        ),
    )


def operators_section(
    run: Run,
    steady_phase_ms: Mapping[str, float] | None = None,
    steady_step_ms: float | None = None,
    top: int = TOP_OPERATORS,
) -> OperatorProfile | None:
    """The profiled steps' operators, phase by phase; None where no rank profiled. `steady_phase_ms`
    (phase -> mean ms, the step-time section's) and `steady_step_ms` put the profiler-off step beside
    the profiled one, so the profiler's own cost shows."""
    profiles = [
        profile
        for rank, rec in sorted(run.ranks.items())
        if rec.operators is not None and (profile := _rank_profile(rank, rec.operators)) is not None
    ]
    if not profiles:
        return None
    step_walls = [
        p.step_wall_ms / len(p.steps)
        if p.step_wall_ms
        else sum(ph.wall_ms for ph in p.phases.values()) / len(p.steps)
        for p in profiles
    ]
    step_ms = _mean([w for w in step_walls if w > 0])
    names = [n for n in PHASE_ORDER if any(n in p.phases for p in profiles)]
    names += sorted({n for p in profiles for n in p.phases} - set(names))
    steady = steady_phase_ms or {}
    phases = [
        ph for n in names if (ph := _phase(n, profiles, step_ms, number(steady.get(n)), top)) is not None
    ]
    writes = [p.write_s for p in profiles if p.write_s is not None]
    return OperatorProfile(
        ranks=[p.rank for p in profiles],
        steps=profiles[0].steps,
        device=next((p.device for p in profiles if p.device), None),
        step_ms=step_ms,
        steady_step_ms=number(steady_step_ms),
        phases=phases,
        traces=[f"{rank_dir_name(p.rank)}/{p.trace}" for p in profiles if p.trace],
        note=profiles[0].note or DEFAULT_NOTE,
        write_s=max(writes) if writes else None,
    )
