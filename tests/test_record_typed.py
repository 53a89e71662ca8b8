"""The record typed on both sides: the step clock builds StepRecords, the writer takes them, the reader gives
the same records back; the phases are one list."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.test_plots import draw, legend_labels, make_report
from tests.test_step_clock import ScriptedTimer, micro_batch
from tuneup.collect import profiler, step_clock
from tuneup.collect.step_clock import StepClock
from tuneup.record import RankWriter, load_run, write_manifest
from tuneup.record.schema import (
    PHASE_NAMES,
    PHASES,
    STEP_TIME_LINES,
    TUNEUP_PHASE,
    CollectiveRecord,
    RecordedStep,
    StepRecord,
)
from tuneup.report import plotting


def test_one_phase_list() -> None:
    assert step_clock.PHASE_NAMES is PHASE_NAMES and profiler.PHASES is PHASE_NAMES
    assert tuple(f"{name}_ms" for name in PHASE_NAMES) == PHASES
    assert plotting.PHASE_ORDER is STEP_TIME_LINES == (*PHASE_NAMES, TUNEUP_PHASE)
    assert set(plotting.PHASE_COLORS) == set(STEP_TIME_LINES)
    assert {f"{name}_ms" for name in PHASE_NAMES} <= {f.name for f in dataclasses.fields(StepRecord)}


def test_the_step_clock_builds_step_records() -> None:
    timer, out = ScriptedTimer(), []
    clock = StepClock(timer, out.append)
    clock.restart()
    micro_batch(clock, timer, data=5, fwd=10, bwd=20, opt=3, between=2, tail=4, loss=0.5)
    clock.close_step(0, 0)
    clock.drain()
    (record,) = out
    assert isinstance(record, StepRecord) and isinstance(record, RecordedStep)
    assert (record.data_ms, record.forward_ms, record.backward_ms, record.optimizer_ms) == (5, 10, 20, 5)
    assert record.wall_ms == 44 and record.loss == 0.5 and record.samples == 4 and record.collectives is None
    # A consumer written for the dict the clock used to hand out reads it the same way.
    assert record["wall_ms"] == 44 and record.get("tokens") is None and record.get("comm_ms", 0) == 0


def _typed_step(step: int) -> RecordedStep:
    return RecordedStep(
        step=step,
        epoch=0,
        t_end=1000.0 + step,
        wall_ms=12.5,
        data_ms=1.0,
        forward_ms=3.0,
        backward_ms=4.0,
        optimizer_ms=1.5,
        other_ms=1.0,
        micro_batches=2,
        samples=8,
        loss=0.25,
        sync_ms=0.5,
        tuneup_ms=1.5,
        comm_ms=2.0,
        comm_exposed_ms=0.5,
        comm_bytes=4096,
        comm_count=1,
        checkpoint=step == 1,
        collectives=[
            CollectiveRecord(
                step=step, kind="all_reduce", bytes=4096, duration_ms=2.0, bucket=0, world_size=2
            )
        ],
    )


def test_a_typed_step_is_written_and_read_back_as_the_same_record(tmp_path: Path) -> None:
    write_manifest(tmp_path, {"run_id": "typed", "created_unix": 1.0, "world_size": 1, "num_nodes": 1})
    writer = RankWriter(tmp_path, 0)
    writer.open({"host": "h"})
    steps = [_typed_step(s) for s in range(3)]
    for step in steps:
        writer.add_step(step)
    writer.add_collective(
        CollectiveRecord(step=-1, kind="broadcast", bytes=8, duration_ms=0.25, source="probe")
    )
    writer.close()
    run = load_run(tmp_path)
    read = run.steps(0)
    assert [type(r) for r in read] == [StepRecord] * 3
    for written, back in zip(steps, read, strict=True):
        assert all(
            getattr(back, f.name) == getattr(written, f.name) for f in dataclasses.fields(StepRecord)
        ), back
    assert [(c.step, c.kind, c.bytes, c.bucket) for c in run.ranks[0].collectives] == [
        (0, "all_reduce", 4096, 0),
        (1, "all_reduce", 4096, 0),
        (2, "all_reduce", 4096, 0),
        (-1, "broadcast", 8, None),
    ]
    # A field that holds nothing is left out of the line: the reader reads it as not measured.
    line = (tmp_path / "rank-0" / "steps.jsonl").read_text().splitlines()[0]
    assert '"tokens"' not in line and '"checkpoint"' not in line and '"collectives"' not in line


def test_a_typed_step_and_the_dict_of_its_fields_make_the_same_record(tmp_path: Path) -> None:
    """Tests and benchmarks still hand the writer dicts; both forms must read back alike."""
    loaded = []
    for form in ("typed", "dict"):
        run_dir = tmp_path / form
        write_manifest(run_dir, {"run_id": form, "created_unix": 1.0, "world_size": 1, "num_nodes": 1})
        writer = RankWriter(run_dir, 0)
        writer.open({})
        for s in range(3):
            step = _typed_step(s)
            if form == "dict":
                fields = {f.name: getattr(step, f.name) for f in dataclasses.fields(StepRecord)}
                collectives = [
                    {k: v for k, v in dataclasses.asdict(c).items() if k != "step"}
                    for c in step.collectives or ()
                ]
                writer.add_step({**fields, "_collectives": collectives})
            else:
                writer.add_step(step)
        writer.close()
        run = load_run(run_dir)
        loaded.append((run.steps(0), run.ranks[0].collectives, run.ranks[0].windows))
    assert loaded[0] == loaded[1]


def test_the_step_breakdown_stacks_the_lines_of_the_table() -> None:
    """tuneup's own time is a line of the step-time table, beside the phases (they tile the step): the
    figure stacks it too, so that each bar ends at the step the table adds up to."""
    report = make_report(ranks=2, steps=6, telemetry_points=2)
    for entry in report["step_time"]["per_rank"]:
        entry["phase_mean_ms"][TUNEUP_PHASE] = 7.0
    drawn = draw("step_breakdown.png", report)
    assert legend_labels(drawn.figure) == [*PHASE_NAMES, "tuneup's own"]
    ax = drawn.figure.axes[0]
    for rank, entry in enumerate(report["step_time"]["per_rank"]):
        stacked = sum(p.get_width() for p in ax.patches if round(p.get_y() + p.get_height() / 2) == rank)
        assert stacked == pytest.approx(sum(entry["phase_mean_ms"].values()))
    # A record that holds tuneup's own time inside the phases (a device timer, an older record): no such line.
    plain = draw("step_breakdown.png", make_report(ranks=2, steps=6, telemetry_points=2))
    assert legend_labels(plain.figure) == list(PHASE_NAMES)
