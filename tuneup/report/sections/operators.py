"""Operators (profiled steps): the drill-down from "backward is 59% of the step" to the operators it runs,
from the steps torch.profiler recorded on request (`TuneupCallback(profile_steps=N)`).

One table of the phases while profiled (beside the same phases with the profiler off), then one table
per phase of its top operators. Without a profile the section says how to make one.
"""

from __future__ import annotations

from collections.abc import Sequence

from tuneup.analyze.model import OperatorProfile, OperatorTime, PhaseOperators, RunAnalysis
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, Paragraph, figures, table
from tuneup.report.format import (
    MISSING,
    figure,
    fraction_percent,
    is_number,
    ms,
    number,
    plural,
    ranks_text,
    sentence,
    text,
)
from tuneup.report.plotting import Plot

ID = "operators"
TITLE = "Operators (profiled steps)"
PLOTS: tuple[Plot, ...] = ()

NOT_PROFILED = (
    "No steps were profiled. To see which operators each phase of the step spends its time in, pass "
    "TuneupCallback(profile_steps=N): torch.profiler then records N steady steps on every rank and "
    "writes their trace beside the run's record."
)
# Operators shown per phase; the rest are summed in one row (report.json keeps the analysis' top list).
SHOWN_PER_PHASE = 10
# Traces named one by one up to this many ranks.
TRACES_NAMED = 4


def _op_ms(value: object) -> str:
    """Operator times are often far below a millisecond: three significant digits there."""
    return f"{figure(value)} ms" if is_number(value) else text(value)


def _calls(value: object) -> str:
    if not is_number(value):
        return text(value)
    return number(round(value)) if abs(value - round(value)) < 1e-9 else number(value, 1)


def _steps_text(steps: list[int]) -> str:
    if not steps:
        return MISSING
    if steps == list(range(steps[0], steps[0] + len(steps))) and len(steps) > 1:
        return f"steps {steps[0]}–{steps[-1]}"
    return ("step " if len(steps) == 1 else "steps ") + ", ".join(str(s) for s in steps)


def _intro(profile: OperatorProfile) -> list[Block]:
    device = (
        " with the CUDA kernels each launched" if profile.device else " (host only: no device was traced)"
    )
    first = (
        f"torch.profiler recorded {plural(len(profile.steps), 'step')} ({_steps_text(profile.steps)}) on "
        f"{ranks_text(profile.ranks)}{device}. The mean profiled step took {ms(profile.step_ms)}"
    )
    if is_number(profile.steady_step_ms):
        first += f", against {ms(profile.steady_step_ms)} for the mean steady step with the profiler off"
    out: list[Block] = [Paragraph(first + ".")]
    out.append(Paragraph(sentence(profile.note), True))
    if profile.traces:
        named = ", ".join(profile.traces[:TRACES_NAMED])
        more = len(profile.traces) - TRACES_NAMED
        if more > 0:
            named += f" and {plural(more, 'more')} (one per profiled rank)"
        out.append(
            Paragraph(
                f"The Chrome trace of these steps, in the run directory: {named}. Open it in Perfetto "
                '(ui.perfetto.dev) or chrome://tracing; the track "tuneup phases" marks each step\'s phases.'
            )
        )
    return out


def _phase_table(profile: OperatorProfile) -> Block:
    device = profile.device is not None
    header = ["Phase", "Profiled", "Share of step", "Profiler off", "In operators", "Outside operators"]
    if device:
        header.append("Device")
    header.append("Top operator")
    rows = []
    for p in profile.phases:
        top = p.operators[0].name if p.operators else "none"
        row = [
            p.phase,
            ms(p.wall_ms_per_step),
            fraction_percent(p.share_of_step),
            ms(p.steady_ms_per_step),
            ms(p.self_cpu_ms_per_step),
            ms(p.outside_operators_ms_per_step),
        ]
        if device:
            row.append(ms(p.device_ms_per_step))
        rows.append((*row, top))
    return table(
        "Phases while profiled: mean per step (host time; \u201coutside operators\u201d is Python and the trainer)",
        header,
        rows,
        range(1, len(header) - 1),
    )


def _spread(op: OperatorTime, ranks: int) -> str:
    """Its self CPU time from the rank with least to the rank with most, and who lists it at all: an
    operator outside a rank's top list has no figure there."""
    listed = f"; {op.ranks} of {ranks} ranks list it" if op.ranks < ranks else ""
    if is_number(op.self_cpu_ms_per_step_min) and is_number(op.self_cpu_ms_per_step_max):
        out = f"{figure(op.self_cpu_ms_per_step_min)}\u2013{_op_ms(op.self_cpu_ms_per_step_max)}"
        return out + (f" (most: rank {op.slowest_rank}{listed})" if op.slowest_rank is not None else "")
    if op.slowest_rank is not None:
        return f"only in rank {op.slowest_rank}'s top list"
    return MISSING


def _operator_table(profile: OperatorProfile, phase: PhaseOperators) -> Block:
    device = profile.device is not None
    spread = len(profile.ranks) > 1
    header = ["Operator", "Calls", "Self CPU", "Share of phase", "Total CPU"]
    if device:
        header += ["Device", "Device share of phase"]
    if spread:
        header.append("Self CPU across ranks")
    rows = []
    shown = phase.operators[:SHOWN_PER_PHASE]
    for op in shown:
        row = [
            op.name,
            _calls(op.calls_per_step),
            _op_ms(op.self_cpu_ms_per_step),
            fraction_percent(op.share_of_phase),
            _op_ms(op.total_cpu_ms_per_step),
        ]
        if device:
            row += [_op_ms(op.device_ms_per_step), fraction_percent(op.device_share_of_phase)]
        if spread:
            row.append(_spread(op, len(profile.ranks)))
        rows.append(tuple(row))
    hidden = phase.operators[SHOWN_PER_PHASE:]
    others = phase.other_operators + len(hidden)
    if others:
        rest_cpu = phase.other_self_cpu_ms_per_step + sum(o.self_cpu_ms_per_step for o in hidden)
        row = [
            f"all {plural(others, 'other operator')}",
            MISSING,
            _op_ms(rest_cpu),
            fraction_percent(rest_cpu / phase.wall_ms_per_step) if phase.wall_ms_per_step > 0 else MISSING,
            MISSING,
        ]
        if device:
            rest_device = None
            if is_number(phase.other_device_ms_per_step):
                rest_device = phase.other_device_ms_per_step + sum(
                    o.device_ms_per_step or 0.0 for o in hidden
                )
            row += [
                _op_ms(rest_device),
                fraction_percent(rest_device / phase.device_ms_per_step)
                if is_number(rest_device)
                and is_number(phase.device_ms_per_step)
                and phase.device_ms_per_step > 0
                else MISSING,
            ]
        if spread:
            row.append(MISSING)
        rows.append(tuple(row))
    order = "device time" if device else "self CPU time"
    return table(
        f"{phase.phase}: top operators by {order}, mean per profiled step",
        header,
        rows,
        range(1, len(header) - (1 if spread else 0)),
    )


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    profile = analysis.operators
    if profile is None:
        return [Paragraph(NOT_PROFILED, True)]
    out = _intro(profile)
    if not profile.phases:
        out.append(Paragraph("The profile holds no phase with time in it.", True))
        return out + figures(ID, plots)
    out.append(_phase_table(profile))
    for phase in profile.phases:
        if phase.operators:
            out.append(_operator_table(profile, phase))
    return out + figures(ID, plots)
