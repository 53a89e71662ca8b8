"""FSDP2's exposed communication per phase (tuneup/collect/comm.py, fsdp_waits.py): what the training thread
waited for the forward's all-gathers, the backward's re-gathers and the gradients' reduce-scatters.

The timed test injects a delay into every all-gather and reduce-scatter call of a real 2-rank FSDP2 run on
CPU (tiny.py `--slow-gather-ms`, `--slow-scatter-ms`) from one step on, and finds each in its own phase's
wait, against the same run's steps before it (the control: one run, one start-up, the same host load). The others are cheap: the step record's fields, and DDP's record left as it was.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuneup.collect.comm import CommProbe, PendingCollective, resolve_collectives
from tuneup.collect.fsdp_waits import install_fsdp_waits
from tuneup.record import RankWriter, RecordingPolicy, load_run, write_manifest
from tuneup.record.schema import FSDP_WAIT_FIELDS, StepRecord
from tuneup.report import analyze

from conftest import run_workload

WARMUP_STEPS = 4  # the first steps build FSDP's buffers and Lightning's loop: left out of the medians
SLOW_FROM_STEP = 12  # steps 4-11: the control; 12-23: every gather and scatter delayed
STEPS = 24
GATHER_MS = 25.0
SCATTER_MS = 40.0  # unlike the gathers', so that a reduce-scatter's wait counted as a gather's shows
# The tiny model is two FSDP units (its Linear layers): per step, each gathered in forward, gathered again
# in backward (resharded after forward), and its gradient reduce-scattered (test_comm checks the counts).
UNITS = 2


def _medians(steps: list[StepRecord]) -> dict[str, float]:
    """Each wait field's median per step."""
    assert steps
    return {name: statistics.median(getattr(s, name) for s in steps) for name in FSDP_WAIT_FIELDS}


@pytest.mark.timing
def test_injected_gather_and_scatter_delays_come_back_in_their_phase(tmp_path: Path) -> None:
    run_workload(
        tmp_path / "run",
        *("--devices", "2", "--strategy", "fsdp2", "--max-steps", str(STEPS)),
        *("--slow-gather-ms", str(GATHER_MS), "--slow-scatter-ms", str(SCATTER_MS)),
        *("--slow-from-step", str(SLOW_FROM_STEP)),
    )
    run = load_run(tmp_path / "run")
    steps = [s for rank in (0, 1) for s in run.steps(rank) if s.step >= WARMUP_STEPS]
    for rank in (0, 1):
        kinds = Counter(c.kind for c in run.ranks[rank].collectives if c.step == SLOW_FROM_STEP)
        assert kinds == {"all_gather": 2 * UNITS, "reduce_scatter": UNITS}
    for s in steps:
        # Every wait is in one of the three parts (the run logs nothing across ranks).
        assert s.comm_exposed_ms == pytest.approx(sum(getattr(s, n) for n in FSDP_WAIT_FIELDS), abs=0.01)
    control = _medians([s for s in steps if s.step < SLOW_FROM_STEP])
    slow = _medians([s for s in steps if s.step >= SLOW_FROM_STEP])
    injected = {
        "comm_exposed_forward_gather_ms": UNITS * GATHER_MS,
        "comm_exposed_backward_gather_ms": UNITS * GATHER_MS,
        "comm_exposed_reduce_ms": UNITS * SCATTER_MS,
    }
    for name, expected in injected.items():
        extra = slow[name] - control[name]
        assert abs(extra - expected) <= max(0.10 * expected, 2.0), (name, extra, expected, control, slow)
    # The analysis fills the exposed time and splits each phase into its waits and its compute.
    comm = analyze(tmp_path / "run").communication
    assert comm is not None and comm.exposed_ms_per_step is not None
    forward, backward = comm.exposed_by_phase
    assert (forward.phase, backward.phase) == ("forward", "backward") and forward.reduces_ms is None
    for phase in (forward, backward):
        assert phase.compute_ms is not None and phase.waited_ms is not None and phase.phase_ms is not None
        assert phase.compute_ms + phase.waited_ms == pytest.approx(phase.phase_ms, abs=0.01)


def test_step_fields_round_trip_and_a_ddp_line_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "run"
    write_manifest(path, {"run_id": "r", "created_unix": 0, "world_size": 1, "num_nodes": 1})
    writer = RankWriter(path, 0, RecordingPolicy())
    writer.open({})
    ddp = StepRecord(0, 0, 1.0, 10.0, 1.0, 3.0, 5.0, 1.0, 0.0, 1, comm_ms=4.0, comm_exposed_ms=1.0)
    fsdp = StepRecord(1, 0, 1.0, 10.0, 1.0, 3.0, 5.0, 1.0, 0.0, 1, comm_ms=4.0, comm_exposed_ms=4.0)
    for name, value in zip(FSDP_WAIT_FIELDS, (1.5, 1.0, 1.5), strict=True):
        setattr(fsdp, name, value)
    writer.add_step(ddp)
    writer.add_step(fsdp)
    writer.close()
    ddp_line, fsdp_line = (
        json.loads(line) for line in (path / "rank-0" / "steps.jsonl").read_text().splitlines()
    )
    # The DDP step's line holds what it held before the FSDP fields existed: none of them.
    assert not set(FSDP_WAIT_FIELDS) & set(ddp_line)
    assert set(FSDP_WAIT_FIELDS) <= set(fsdp_line)
    old, new = load_run(path).steps(0)
    assert all(getattr(old, n) is None for n in FSDP_WAIT_FIELDS) and old.comm_exposed_ms == 1.0
    assert [getattr(new, n) for n in FSDP_WAIT_FIELDS] == [1.5, 1.0, 1.5]
    # A damaged value (negative) is refused like any other step field's.
    bad = {**fsdp_line, "step": 2, FSDP_WAIT_FIELDS[0]: -1.0}
    with open(path / "rank-0" / "steps.jsonl", "a") as f:
        f.write(json.dumps(bad) + "\n")
    assert [s.step for s in load_run(path).steps(0)] == [0, 1]


def _pending(kind: str, source: str, start: float, end: float, **fields: object) -> PendingCollective:
    return PendingCollective(kind, 1024, "float32", None, source, start, 2, end=end, **fields)


def _ms(a: float, b: float) -> float:
    return (b - a) * 1000.0


def test_ddp_summary_is_unchanged_and_fsdp_waits_go_to_their_phase() -> None:
    # DDP: two buckets; exposed is the tail after the last launch, and no FSDP field appears.
    ddp = [
        PendingCollective("all_reduce", 100, "float32", 0, "ddp_hook", 0.000, 2, end=0.004),
        PendingCollective("all_reduce", 100, "float32", 1, "ddp_hook", 0.002, 2, end=0.005),
    ]
    _, summary = resolve_collectives(ddp, _ms, 0.0)
    assert set(summary) == {"comm_ms", "comm_exposed_ms", "comm_bytes", "comm_count"}
    assert summary["comm_exposed_ms"] == pytest.approx(3.0)
    record = StepRecord(0, 0, 1.0, 10.0, 0, 0, 0, 0, 0, 1, **summary)
    assert all(getattr(record, n) is None for n in FSDP_WAIT_FIELDS)
    # FSDP: each wait by its kind and the phase it held up.
    fsdp = [
        _pending("all_gather", "fsdp", 0.000, 0.002, phase="forward", waited_s=0.002),
        _pending("all_gather", "fsdp", 0.010, 0.013, phase="backward", waited_s=0.003),
        _pending("reduce_scatter", "fsdp", 0.014, 0.018, phase="backward", waited_s=0.004),
    ]
    _, summary = resolve_collectives(fsdp, _ms, 0.0)
    assert summary["comm_exposed_ms"] == pytest.approx(9.0)
    assert [summary[n] for n in FSDP_WAIT_FIELDS] == pytest.approx([2.0, 3.0, 4.0])
    # One wait unknown (an asynchronous gather never waited for through the seam): the step's is unknown.
    fsdp[1].waited_s = None
    _, summary = resolve_collectives(fsdp, _ms, 0.0)
    assert summary["comm_exposed_ms"] is None and not set(FSDP_WAIT_FIELDS) & set(summary)


def test_an_asynchronous_gather_counts_from_its_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The FSDP seam times the wait for an asynchronous gather's Work, in the phase of the wait."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as module

    copied: list[object] = []

    def stub(result: object, *args: object, **kwargs: object) -> None:
        copied.append(result)

    monkeypatch.setattr(module, "foreach_all_gather_copy_out", stub)
    probe = CommProbe(on_cuda=False, world_size=2)
    probe.phase_now = lambda: "backward"
    remove = install_fsdp_waits(probe)
    assert remove is not None and probe.awaiting == {}

    class Work:
        def wait(self) -> bool:
            time.sleep(0.02)
            return True

    work = Work()
    record = _pending("all_gather", "fsdp", 0.0, 0.001, phase="forward")
    assert probe.awaiting is not None
    probe.awaiting[id(work)] = record
    result = SimpleNamespace(all_gather_work=work)
    module.foreach_all_gather_copy_out(result, [], None)
    assert copied == [result]  # FSDP's own copy-out still runs
    assert record.phase == "backward"  # the phase the wait held up, not the launch's
    assert record.waited_s is not None and 0.015 <= record.waited_s < 1.0
    remove()
    assert module.foreach_all_gather_copy_out is stub
