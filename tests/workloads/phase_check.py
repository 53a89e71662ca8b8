"""The check every adapter's accuracy test makes: a delay injected into a phase comes back in that phase.

Per step, what the step's phase took less the delays injected into it within the step's time window (as
they really took: workloads.loops records each) is the loop's own work in that phase; it must match the
same phase of control steps of the same loop, whose delays are pauses outside the steps, within 10% of
the delay or 2 ms.

Each side is summarised by its lower quartile over the steps, not its median. On a shared 2-core machine
a preemption adds ~10 ms to whatever phase it lands in, in a third of the steps or more: the medians of
16 steps of a tiny GPT-2's own forward moved by up to 5 ms between interleaved halves of one run, while
their lower quartiles agreed within 1 ms. Preemptions only ever add time; a phase that is given time that
is not its own (or loses its own) is off in every step, which moves the quartile as much as the median.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from workloads.loops import INJECTED, Delays, pauses_outside_steps


class AlternateControlSteps:
    """Makes every odd step a control step: its delays are pauses outside it (`start()`/`end()`: the
    session's exclusion; workloads.loops.pauses_outside_steps), interleaved with the delayed steps so that
    both see the same load on a shared machine. Call `step_ended()` after each step's optimizer step (the
    next step's fetches come after it, so the whole step switches) and `close()` at the end."""

    def __init__(self, start: Callable[[], Any], end: Callable[[], Any]) -> None:
        self._start, self._end = start, end
        self._pauses: Any = None  # the open pauses_outside_steps while in a control step

    def step_ended(self) -> None:
        if self._pauses is None:
            self._pauses = pauses_outside_steps(self._start, self._end)
            self._pauses.__enter__()
        else:
            self.close()

    def close(self) -> None:
        if self._pauses is not None:
            self._pauses.__exit__(None, None, None)
            self._pauses = None


def low_quartile(values: Iterable[float]) -> float:
    return statistics.quantiles(list(values), n=4)[0]


def phase_own_ms(steps: Sequence[Any], phases: Iterable[str]) -> dict[str, float]:
    """The loop's own time in each phase, in milliseconds, from control steps (no delay in them)."""
    return {p: low_quartile(getattr(s, f"{p}_ms") for s in steps) for p in phases}


def injected_snapshot() -> list[tuple[str, float, float]]:
    """The delays injected so far (workloads.loops.INJECTED), kept apart from later runs' in this process."""
    return list(INJECTED)


# The phases every adapter's loop times, and the delays one optimizer step of `accumulate` micro-batches
# holds: every micro-batch is fetched, runs forward and backward; the optimizer steps once.
STEP_PHASES = ("data", "forward", "backward", "optimizer")


def calls_per_step(accumulate: int) -> dict[str, int]:
    return {"data": accumulate, "forward": accumulate, "backward": accumulate, "optimizer": 1}


def assert_delays_come_back(
    steady: Sequence[Any],
    own_ms: Mapping[str, float],
    calls: Mapping[str, int],
    delays: Delays,
    injected_events: Sequence[tuple[str, float, float]],
) -> dict[str, tuple[float, float, float]]:
    """Per phase in `calls` (delays injected per step): (error in ms, tolerance in ms, the median injected
    ms per step), each error within its tolerance. The error is the delayed steps' phase less their injected
    delays, less the control's (`phase_own_ms`). `injected_events`: the delayed run's (`injected_snapshot()`
    right after it)."""
    errors: dict[str, tuple[float, float, float]] = {}
    for phase, n in calls.items():
        injected = [
            sum(
                ms
                for p, t, ms in injected_events
                if p == phase and s.t_end - s.wall_ms / 1000.0 <= t <= s.t_end
            )
            for s in steady
        ]
        injected_ms = statistics.median(injected)
        # The delays must have landed inside the steps at all, or the check below proves nothing.
        assert injected_ms > 0.9 * n * getattr(delays, f"{phase}_ms"), (phase, injected)
        left_ms = low_quartile(getattr(s, f"{phase}_ms") - i for s, i in zip(steady, injected, strict=True))
        errors[phase] = (left_ms - own_ms[phase], max(0.10 * injected_ms, 2.0), injected_ms)
    for phase, (error_ms, tolerance_ms, injected_ms) in errors.items():
        assert abs(error_ms) <= tolerance_ms, (phase, round(error_ms, 2), tolerance_ms, injected_ms)
    return errors


def assert_alternate_steps_come_back(
    steps: Sequence[Any], accumulate: int, delays: Delays, injected_events: Sequence[tuple[str, float, float]]
) -> dict[str, tuple[float, float, float]]:
    """`assert_delays_come_back` for a run of `AlternateControlSteps`: its odd steps are the control, its
    even steps the delayed ones (pass the steady steps, past the first few)."""
    own = phase_own_ms([s for s in steps if s.step % 2], STEP_PHASES)
    delayed = [s for s in steps if s.step % 2 == 0]
    return assert_delays_come_back(delayed, own, calls_per_step(accumulate), delays, injected_events)
