"""Operator drill-down on request: `torch.profiler` over a few steady training steps, split by phase.

The step clock says "backward is 59% of the step"; this says which operators that is. `StepProfiler`
records N consecutive training steps of one rank with `torch.profiler` (shapes off, stacks off: a small
trace) and writes, beside the rank's record, once, after the N-th step:

    rank-<r>/trace.json      the Chrome trace (Perfetto, chrome://tracing); tuneup's step and phase
                             ranges are on a track of their own, "tuneup phases"
    rank-<r>/operators.json  per phase (the step clock's: data, forward, backward, optimizer, sync, other):
                             the top operators by self time (calls, self and total CPU ms, self device ms
                             where there is a device) and the phase's totals, summed over the profiled steps

The caller drives it from the hooks where it marks the step clock, so the two agree on what "backward"
means (`phase(name)`: the named phase starts now, the one before ends):

    on_train_batch_start       profiler.batch_start(step)       forward starts
    batch fetch start / end    profiler.phase("data") / profiler.phase("other")   (where fetches are seen)
    on_before_backward         profiler.phase("backward")
    on_after_backward          profiler.phase("other")          (clipping before the step counts as other)
    on_before_optimizer_step   profiler.phase("optimizer")
    the trainer's collectives  profiler.phase("sync"), then the phase to return to
    on_train_batch_end         the step is done:   profiler.step_end(step)   (ends the batch too)
                               else (accumulating): profiler.batch_end()
    teardown / exception       profiler.close()

`step` is the number the run record gives the training step (StepRecord.step, the number the step clock
closes it with); a micro-batch's batch_start gets the number of the step it belongs to. `start_step` is
the first step profiled: the profiler starts at step_end(start_step - 1), so the first profiled step's
data wait is in the trace (or at the first batch_start(step >= start_step), where that was missed: a
resumed run, start_step 0), and stops at the step_end of the N-th profiled step. Pick a start_step past
warm-up. Outside that window every call is one comparison; close() writes a window cut short.

Operators are attributed to the phase whose range holds their start time, whatever their thread: on a
GPU, backward runs on autograd's device threads, not inside the training thread's range. A kernel's
device time goes to the operator that launched it (its "External id"), hence to that operator's phase.
Self time is an operator's duration less its direct children's on the same thread.

Stopping, exporting, summarizing and writing happen on the calling thread at the end of the window;
operators.json's `cost_s` says how long each part took. tuneup never breaks the training it watches:
any failure warns once and turns the profiler off for the rest of the run (stopping torch's profiler if
it was on). The caller creates a StepProfiler only when asked (`TuneupCallback(profile_steps=N)`).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tuneup._log import warn_once
from tuneup.record.schema import OPERATORS_FILE, PHASE_NAMES, TRACE_FILE

# The step clock's phases (the run record's one list; operators.json's phase names).
PHASES = PHASE_NAMES
OPERATORS_VERSION = 1
# Operators kept per phase in operators.json: by self CPU time, and where there is a device, also by
# self device time (a kernel that costs the GPU much can cost the host little to launch).
TOP_OPERATORS = 15
# The ranges tuneup puts in the trace: "tuneup/<phase>" and "tuneup/step#<n>".
RANGE_PREFIX = "tuneup/"
STEP_RANGE = RANGE_PREFIX + "step#"
PHASE_TRACK_NAME = "tuneup phases"
# Events of these categories are device work whose duration is device time.
_DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})

OVERHEAD_NOTE = (
    "These steps ran with torch.profiler on, which adds host time to every operator: they ran slower "
    "than the others, most where operators are many and small, so compare shares rather than "
    "milliseconds. The profiler started in the gap before the first profiled step, whose data phase "
    "also holds that start-up."
)


class StepProfiler:
    """Profiles `steps` training steps of one rank from `start_step` on, writing into `rank_dir` (the
    rank's record directory, `rank-<rank>`); see the module's docstring for which method to call at
    which hook. Every method is safe to call in any state and never raises."""

    def __init__(
        self, rank_dir: str | os.PathLike[str], steps: int, start_step: int, rank: int | None = None
    ):
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"start_step must be a non-negative integer, got {start_step!r}")
        self.rank_dir = Path(rank_dir)
        self.steps = steps
        self.start_step = start_step
        self.rank = rank
        self.state = "waiting"  # -> "recording" -> "done"; "disabled" after a failure
        self.profiled_steps: list[int] = []
        self.cost_s: dict[str, float] = {}
        self._prof: Any = None
        self._device: str | None = None
        self._step_range: Any = None
        self._phase_range: Any = None
        self._phase: str | None = None
        self._step: int | None = None
        self._first_step = start_step
        # Once the caller marks fetches itself, the rest of the gap between batches is "other", as in
        # the step clock; until then the whole gap is the data wait.
        self._fetch_marks = False

    # -- the caller's hooks -----------------------------------------------------------------------

    def batch_start(self, step: int) -> None:
        """A micro-batch of training step `step` starts: its forward phase begins."""
        if self.state == "waiting":
            if step < self.start_step:
                return
            self._guard(self._start, step)
        if self.state == "recording":
            self._guard(self._batch_start, step)

    def phase(self, name: str) -> None:
        """Phase `name` (one of PHASES) starts now; the one before ends."""
        if self.state == "recording":
            self._guard(self._switch_marked, name)

    def batch_end(self) -> None:
        """A micro-batch that does not end a training step ends (gradient accumulation): the gap before
        the next one starts (data wait, or "other" once fetches are marked with phase("data") /
        phase("other")). Calling it before step_end as well is harmless."""
        if self.state == "recording":
            self._guard(self._switch, self._gap_phase())

    def step_end(self, step: int) -> None:
        """Training step `step` is done, and with it its last micro-batch (no batch_end needed before it).
        Starts the profiler at the end of step `start_step - 1`; stops it and writes the trace and the
        summary at the end of the last profiled step."""
        if self.state == "waiting":
            if step + 1 >= self.start_step:
                self._guard(self._start, step + 1)
            return
        if self.state == "recording":
            self._guard(self._step_end, step)

    def close(self) -> None:
        """The run ends (or fails): a window cut short is written with the steps it completed."""
        if self.state == "recording":
            self._guard(self._finish if self.profiled_steps else self._abandon)

    # -- inside -----------------------------------------------------------------------------------

    def _guard(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # a profiler must never break the training it watches
            warn_once(
                "profiler",
                f"the step profiler failed ({type(exc).__name__}: {exc}); profiling is off for the rest "
                "of this run, training goes on",
            )
            self._teardown()
            self.state = "disabled"

    def _teardown(self) -> None:
        """Leave torch as it was: ranges closed, the profiler stopped. Best effort, never raises."""
        for attr in ("_phase_range", "_step_range"):
            handle = getattr(self, attr)
            setattr(self, attr, None)
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.__exit__(None, None, None)
        prof, self._prof = self._prof, None
        if prof is not None:
            with contextlib.suppress(Exception):
                prof.stop()

    def _start(self, next_step: int) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if (
            torch.cuda.is_available()
            and torch.cuda.is_initialized()
            and ProfilerActivity.CUDA in torch.profiler.supported_activities()
        ):
            activities.append(ProfilerActivity.CUDA)
            self._device = "cuda"
        t0 = time.perf_counter()
        self._prof = profile(
            activities=activities, record_shapes=False, with_stack=False, profile_memory=False
        )
        self._prof.start()
        self.cost_s["start_s"] = time.perf_counter() - t0
        self.state = "recording"
        self._first_step = next_step
        self._open_step(next_step)

    def _open_step(self, step: int) -> None:
        self._step = step
        self._step_range = self._enter(f"{STEP_RANGE}{step}")
        self._switch(self._gap_phase())

    def _enter(self, name: str) -> Any:
        from torch.autograd.profiler import record_function

        handle = record_function(name)
        handle.__enter__()
        return handle

    def _gap_phase(self) -> str:
        return "other" if self._fetch_marks else "data"

    def _switch_marked(self, name: str) -> None:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}: one of {', '.join(PHASES)}")
        if name == "data":
            self._fetch_marks = True
        self._switch(name)

    def _switch(self, name: str) -> None:
        if name == self._phase and self._phase_range is not None:
            return
        if self._phase_range is not None:
            handle, self._phase_range = self._phase_range, None
            handle.__exit__(None, None, None)
        if self._step_range is None:  # a batch after close of the last step range
            return
        self._phase_range = self._enter(RANGE_PREFIX + name)
        self._phase = name

    def _batch_start(self, step: int) -> None:
        if step >= self._first_step + self.steps:
            # Past the window without its step_end calls: stop rather than record the rest of the run.
            warn_once(
                "profiler-window",
                f"the step profiler saw step {step} start after its window "
                f"({self._first_step}-{self._first_step + self.steps - 1}) without the steps' ends; "
                "it stops here",
            )
            self.close()
            return
        if self._step_range is None:
            self._open_step(step)
        self._step = step
        self._switch("forward")

    def _close_ranges(self) -> None:
        for attr in ("_phase_range", "_step_range"):
            handle = getattr(self, attr)
            setattr(self, attr, None)
            if handle is not None:
                handle.__exit__(None, None, None)
        self._phase = None

    def _step_end(self, step: int) -> None:
        self._close_ranges()
        self.profiled_steps.append(step)
        if len(self.profiled_steps) >= self.steps:
            self._finish()
        else:
            self._open_step(step + 1)

    def _abandon(self) -> None:
        self._teardown()
        self.state = "done"

    def _finish(self) -> None:
        import torch

        cut_short = self._step_range is not None  # close() in the middle of a step: leave it out
        self._close_ranges()
        t0 = time.perf_counter()
        self._prof.stop()
        t1 = time.perf_counter()
        prof, self._prof = self._prof, None
        self.state = "done"
        self.rank_dir.mkdir(parents=True, exist_ok=True)
        raw = self.rank_dir / f".{TRACE_FILE}.{os.getpid()}.kineto"
        try:
            prof.export_chrome_trace(str(raw))
            del prof  # kineto's results can be large: gone before the trace is read back
            t2 = time.perf_counter()
            with open(raw, encoding="utf-8") as f:
                trace = json.load(f)
        finally:
            raw.unlink(missing_ok=True)
        t3 = time.perf_counter()
        summary = summarize_trace(trace, device=self._device, drop_last_step=cut_short)
        t4 = time.perf_counter()
        trace["tuneup"] = {"rank": self.rank, "steps": self.profiled_steps, "summary": OPERATORS_FILE}
        _move_ranges_to_own_track(trace)
        trace_path = self.rank_dir / TRACE_FILE
        _write_atomic(trace_path, trace, indent=None)
        t5 = time.perf_counter()
        self.cost_s.update(
            stop_s=t1 - t0,
            export_s=t2 - t1,
            read_s=t3 - t2,
            summarize_s=t4 - t3,
            write_trace_s=t5 - t4,
            total_s=t5 - t0,  # from the profiler's stop to the trace written (operators.json is small)
        )
        document = {
            "version": OPERATORS_VERSION,
            "rank": self.rank,
            "steps": self.profiled_steps,
            "trace": TRACE_FILE,
            "trace_bytes": trace_path.stat().st_size,
            "device": self._device,
            "torch": str(torch.__version__),
            "top": TOP_OPERATORS,
            **summary,
            "overhead_note": OVERHEAD_NOTE,
            "cost_s": {k: round(v, 6) for k, v in self.cost_s.items()},
        }
        _write_atomic(self.rank_dir / OPERATORS_FILE, document, indent=1)


def _write_atomic(path: Path, obj: Any, indent: int | None) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        # json.dumps, not json.dump: only the one-shot encoder is the C one, 5x faster on a large trace.
        text = json.dumps(obj, indent=indent, separators=(",", ":") if indent is None else None)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.write("\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _move_ranges_to_own_track(trace: dict[str, Any]) -> None:
    """tuneup's step and phase ranges on a track of their own: on the training thread they would overlap
    the trainer's own ranges without nesting (Lightning's optimizer step range opens inside "forward"
    and closes inside "optimizer"), and Perfetto drops slices that overlap that way."""
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return
    tids = [e.get("tid") for e in events if isinstance(e, dict)]
    track = max((t for t in tids if isinstance(t, int) and not isinstance(t, bool)), default=0) + 1
    pids = set()
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X" and str(e.get("name", "")).startswith(RANGE_PREFIX):
            e["tid"] = track
            pids.add(e.get("pid"))
    for pid in sorted(pids, key=str):
        events.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": track, "args": {"name": PHASE_TRACK_NAME}}
        )
        events.append(
            {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": track, "args": {"sort_index": -1}}
        )


# ---------------------------------------------------------------------------------------------------
# The summary: a pure function of the Chrome trace, so it can be tested (and rerun) without torch.


class _Op:
    __slots__ = ("children_us", "device_us", "end", "name", "phase", "tid", "ts")

    def __init__(self, name: str, ts: float, dur: float, tid: Any):
        self.name = name
        self.ts = ts
        self.end = ts + dur
        self.tid = tid
        self.children_us = 0.0
        self.device_us = 0.0
        self.phase: str | None = None


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _phase_index(
    events: Iterable[dict[str, Any]], drop_last_step: bool
) -> tuple[list[float], list[tuple[float, float, str]], float]:
    """tuneup's phase ranges, sorted (their starts apart, for bisecting), and the steps' summed time (ms).
    With `drop_last_step`, the last step range and the phases in it are left out (a step cut short)."""
    ranges = []
    steps = []
    for e in events:
        name = e.get("name")
        if (
            e.get("cat") != "user_annotation"
            or not isinstance(name, str)
            or not name.startswith(RANGE_PREFIX)
        ):
            continue
        ts, dur = _number(e.get("ts")), _number(e.get("dur"))
        if ts is None or dur is None:
            continue
        if name.startswith(STEP_RANGE):
            steps.append((ts, dur))
        elif name[len(RANGE_PREFIX) :] in PHASES:
            ranges.append((ts, ts + dur, name[len(RANGE_PREFIX) :]))
    steps.sort()
    if drop_last_step and steps:
        cutoff = steps.pop()[0]
        ranges = [r for r in ranges if r[0] < cutoff]
    ranges.sort()
    return [r[0] for r in ranges], ranges, sum(dur for _, dur in steps) / 1000.0


def _phase_at(ts: float, starts: list[float], ranges: list[tuple[float, float, str]]) -> str | None:
    """The phase whose range holds `ts`; the short gap between one range's end and the next one's start
    belongs to the first. None before the first range and after the last."""
    i = bisect.bisect_right(starts, ts) - 1
    if i < 0:
        return None
    _, end, phase = ranges[i]
    if ts <= end or i + 1 < len(ranges):
        return phase
    return None


def _self_times(ops: list[_Op]) -> None:
    """Each operator's direct children's time on its own thread (self = duration - children)."""
    by_thread: dict[Any, list[_Op]] = {}
    for op in ops:
        by_thread.setdefault(op.tid, []).append(op)
    for thread_ops in by_thread.values():
        thread_ops.sort(key=lambda o: (o.ts, -o.end))
        stack: list[_Op] = []
        for op in thread_ops:
            while stack and stack[-1].end <= op.ts:
                stack.pop()
            if stack:
                parent = stack[-1]
                parent.children_us += max(0.0, min(op.end, parent.end) - op.ts)
            stack.append(op)


def summarize_trace(
    trace: dict[str, Any], device: str | None = None, top: int = TOP_OPERATORS, drop_last_step: bool = False
) -> dict[str, Any]:
    """operators.json's figures from a Chrome trace that holds tuneup's phase ranges: per phase its host
    time (`wall_ms`, the ranges' summed duration), its operators' summed self CPU time, calls and device
    time, and the `top` operators by self CPU time (and, with a device, by self device time), all summed
    over the trace's steps; `unattributed` is what started outside every phase range. With
    `drop_last_step`, the last step (cut short) counts as outside.

    `device` names the device whose kernels the trace holds (None on a CPU-only run: device figures are
    then None)."""
    events = [e for e in trace.get("traceEvents") or () if isinstance(e, dict) and e.get("ph") == "X"]
    starts, ranges, step_wall_ms = _phase_index(events, drop_last_step)
    ops: list[_Op] = []
    by_external_id: dict[Any, _Op] = {}
    launches: dict[Any, float] = {}  # correlation id -> launch time, for kernels that name no operator
    device_events = []
    for e in events:
        cat = e.get("cat")
        ts, dur = _number(e.get("ts")), _number(e.get("dur"))
        if ts is None or dur is None:
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if cat == "cpu_op":
            op = _Op(str(e.get("name")), ts, max(0.0, dur), (e.get("pid"), e.get("tid")))
            ops.append(op)
            if args.get("External id") is not None:
                by_external_id[args["External id"]] = op
        elif cat in _DEVICE_CATEGORIES:
            device_events.append((args.get("External id"), args.get("correlation"), max(0.0, dur)))
        elif cat in _LAUNCH_CATEGORIES and args.get("correlation") is not None:
            launches[args["correlation"]] = ts
    _self_times(ops)
    for op in ops:
        op.phase = _phase_at(op.ts, starts, ranges)

    has_device = device is not None
    totals = {
        p: {"wall_ms": 0.0, "self_cpu_ms": 0.0, "device_ms": 0.0 if has_device else None, "calls": 0}
        for p in PHASES
    }
    for start, end, phase in ranges:
        totals[phase]["wall_ms"] += (end - start) / 1000.0
    unattributed = {"calls": 0, "self_cpu_ms": 0.0, "device_ms": 0.0 if has_device else None}
    for external_id, correlation, dur in device_events:
        op = by_external_id.get(external_id) if external_id not in (None, 0) else None
        if op is not None:
            op.device_us += dur
            continue
        # No operator to charge (a launch outside any operator): the phase that launched it, if known.
        launched = launches.get(correlation)
        phase = _phase_at(launched, starts, ranges) if launched is not None else None
        where = totals[phase] if phase is not None else unattributed
        if where["device_ms"] is not None:
            where["device_ms"] += dur / 1000.0

    per_phase: dict[str, dict[str, list[float]]] = {
        p: {} for p in PHASES
    }  # name -> [calls, self, total, dev]
    for op in ops:
        self_us = max(0.0, (op.end - op.ts) - op.children_us)
        if op.phase is None:
            unattributed["calls"] += 1
            unattributed["self_cpu_ms"] += self_us / 1000.0
            if unattributed["device_ms"] is not None:
                unattributed["device_ms"] += op.device_us / 1000.0
            continue
        row = per_phase[op.phase].setdefault(op.name, [0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += self_us
        row[2] += op.end - op.ts
        row[3] += op.device_us

    phases: dict[str, Any] = {}
    for phase in PHASES:
        rows = per_phase[phase]
        t = totals[phase]
        t["calls"] = sum(int(r[0]) for r in rows.values())
        t["self_cpu_ms"] += sum(r[1] for r in rows.values()) / 1000.0
        if t["device_ms"] is not None:
            t["device_ms"] += sum(r[3] for r in rows.values()) / 1000.0
        chosen = sorted(rows, key=lambda n: (-rows[n][1], n))[:top]
        if has_device:
            by_device = sorted((n for n in rows if rows[n][3] > 0), key=lambda n: (-rows[n][3], n))[:top]
            chosen += [n for n in by_device if n not in chosen]
        listed = [
            {
                "name": name,
                "calls": int(rows[name][0]),
                "self_cpu_ms": round(rows[name][1] / 1000.0, 6),
                "total_cpu_ms": round(rows[name][2] / 1000.0, 6),
                "self_device_ms": round(rows[name][3] / 1000.0, 6) if has_device else None,
            }
            for name in chosen
        ]
        phases[phase] = {
            "wall_ms": round(t["wall_ms"], 6),
            "self_cpu_ms": round(t["self_cpu_ms"], 6),
            "device_ms": None if t["device_ms"] is None else round(t["device_ms"], 6),
            "calls": t["calls"],
            "operators": len(rows),
            "top": listed,
        }
    return {
        "step_wall_ms": round(step_wall_ms, 6),
        "phases": phases,
        "unattributed": {
            "calls": unattributed["calls"],
            "self_cpu_ms": round(unattributed["self_cpu_ms"], 6),
            "device_ms": None if unattributed["device_ms"] is None else round(unattributed["device_ms"], 6),
        },
    }
