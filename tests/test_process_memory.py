"""A rank's process-tree memory: PSS, not RSS summed over processes that share pages.

Forked dataloader workers share the rank's pages; RSS summed over the tree counts each shared page once
per process (a user saw 8 GiB for a host whose memory peaked at 2 GiB). The sensor reads the tree's PSS,
the analysis takes the peak from it (from RSS for records made before), and the report, the comparison
and report.json say which measure the figure is.
"""

from __future__ import annotations

import collections
import logging
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tuneup import load_run
from tuneup.analyze.analysis import analyze_run
from tuneup.analyze.model import PROCESS_MEMORY_LABELS, RunAnalysis, from_json, to_json
from tuneup.collect import host
from tuneup.collect.host import MEMORY_READ_MAX_SHARE, ProcessTreeSensor
from tuneup.compare.runs import summarize_run
from tuneup.record import RankWriter, write_manifest
from tuneup.report.blocks import Paragraph, Table
from tuneup.report.sections import hardware
from tuneup.report.terminal import render_terminal

from synthetic import step_record

MIB = 2**20
BUFFER_BYTES = 200 * MIB
FORKED_CHILDREN = 3
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
PROCESSES_TITLE = "Training processes (each rank with its children)"

# A parent that writes every page of a buffer, then forks children that sleep without touching it: the
# buffer's pages stay shared by all four processes, as a rank's are with its forked dataloader workers.
FORKED_TREE = f"""
import os, sys, time
buffer = bytearray({BUFFER_BYTES})
buffer[::4096] = b"\\x01" * len(range(0, len(buffer), 4096))
for _ in range({FORKED_CHILDREN}):
    if os.fork() == 0:
        time.sleep(120)
        os._exit(0)
print("ready", flush=True)
time.sleep(120)
"""


def shared_memory_measure(pid: int) -> str | None:
    """ "pss" or "uss" where this platform lets the process's be read, else None."""
    try:
        full = psutil.Process(pid).memory_full_info()
    except psutil.Error:
        return None
    return "pss" if hasattr(full, "pss") else "uss" if hasattr(full, "uss") else None


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tuneup" and r.levelno == logging.WARNING]


def kill_tree(parent: subprocess.Popen) -> None:
    try:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
    except psutil.NoSuchProcess:
        pass
    parent.kill()
    parent.wait()


# ---- the sensor on a real process tree ---------------------------------------------------------------


def test_forked_children_sharing_a_buffer_count_it_once() -> None:
    parent = subprocess.Popen([sys.executable, "-c", FORKED_TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
        measure = shared_memory_measure(parent.pid)
        if measure is None:
            pytest.skip("this platform lets neither PSS nor USS of a process be read")
        sample = ProcessTreeSensor(pid=parent.pid).sample()
        assert sample is not None and sample["num_processes"] == 1 + FORKED_CHILDREN

        assert sample["memory_measure"] == measure
        tree_bytes = sample[f"{measure}_bytes"]
        # The RSS sum counts the shared buffer once per process: the defect, kept for continuity.
        assert sample["rss_bytes"] > 3 * BUFFER_BYTES
        # PSS counts it once (USS, where there is no PSS, not at all: a lower bound).
        assert tree_bytes < 1.6 * BUFFER_BYTES, (tree_bytes / MIB, sample["rss_bytes"] / MIB)
        if measure == "pss":
            assert tree_bytes > 0.9 * BUFFER_BYTES
    finally:
        kill_tree(parent)


def test_pss_is_read_on_the_first_tick_then_as_often_as_its_cost_allows(monkeypatch) -> None:
    clock_s = [100.0]
    monkeypatch.setattr(host, "monotonic", lambda: clock_s[0])
    real_read = psutil.Process.memory_full_info
    reads: list[int] = []

    def read_taking_20_ms(process: psutil.Process):
        reads.append(process.pid)
        clock_s[0] += 0.020
        return real_read(process)

    monkeypatch.setattr(psutil.Process, "memory_full_info", read_taking_20_ms)
    sleeper = subprocess.Popen(SLEEPER)
    try:
        measure = shared_memory_measure(sleeper.pid)
        if measure is None:
            pytest.skip("this platform lets neither PSS nor USS of a process be read")
        reads.clear()
        sensor = ProcessTreeSensor(pid=sleeper.pid)
        first = sensor.sample()
        assert first is not None and first[f"{measure}_bytes"] > 0 and first["memory_measure"] == measure
        # 20 ms of reading at MEMORY_READ_MAX_SHARE buys the next read 2 s later; ticks before go without.
        wait_s = 0.020 / MEMORY_READ_MAX_SHARE
        clock_s[0] += wait_s - 0.5
        between = sensor.sample()
        assert between is not None and f"{measure}_bytes" not in between
        assert between["memory_measure"] == measure and between["rss_bytes"] > 0
        clock_s[0] += 0.6
        again = sensor.sample()
        assert again is not None and f"{measure}_bytes" in again
        assert reads == [sleeper.pid, sleeper.pid]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_unreadable_pss_falls_back_to_rss_warns_once_and_stops_trying(monkeypatch, caplog) -> None:
    reads: list[int] = []

    def denied(process: psutil.Process):
        reads.append(process.pid)
        raise psutil.AccessDenied(process.pid)

    monkeypatch.setattr(psutil.Process, "memory_full_info", denied)
    sensor = ProcessTreeSensor()
    samples = [sensor.sample() for _ in range(3)]

    for sample in samples:
        assert sample is not None and sample["memory_measure"] == "rss" and sample["rss_bytes"] > 0
        assert "pss_bytes" not in sample and "uss_bytes" not in sample
    assert len(reads) == 1  # a permission does not come back: not asked again
    (warning,) = warnings_of(caplog)
    assert "AccessDenied" in warning and "RSS summed over processes" in warning


def test_a_platform_without_pss_or_uss_falls_back_to_rss(monkeypatch, caplog) -> None:
    basic = collections.namedtuple("pmem", "rss vms")
    monkeypatch.setattr(psutil.Process, "memory_full_info", lambda process: basic(10 * MIB, 20 * MIB))
    sample = ProcessTreeSensor().sample()
    assert sample is not None and sample["memory_measure"] == "rss" and "pss_bytes" not in sample
    (warning,) = warnings_of(caplog)
    assert "neither PSS nor USS" in warning


def test_a_platform_with_uss_only_records_uss(monkeypatch, caplog) -> None:
    # macOS and Windows: psutil gives USS (private pages) and no PSS.
    full = collections.namedtuple("pfullmem", "rss vms uss")
    monkeypatch.setattr(psutil.Process, "memory_full_info", lambda process: full(10 * MIB, 20 * MIB, 3 * MIB))
    sleeper = subprocess.Popen(SLEEPER)
    try:
        sample = ProcessTreeSensor(pid=sleeper.pid).sample()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sample is not None and sample["memory_measure"] == "uss" and sample["uss_bytes"] == 3 * MIB
    assert "pss_bytes" not in sample and not warnings_of(caplog)


def test_a_child_gone_before_its_pss_is_read_is_left_out_without_a_warning(monkeypatch, caplog) -> None:
    spawn_child = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", spawn_child])
    full = collections.namedtuple("pfullmem", "rss vms uss pss")

    def only_the_parent_left(process: psutil.Process):
        if process.pid != parent.pid:
            raise psutil.NoSuchProcess(process.pid)
        return full(10 * MIB, 20 * MIB, 3 * MIB, 7 * MIB)

    try:
        sensor = ProcessTreeSensor(pid=parent.pid, children_every_n=1)
        deadline_s = time.monotonic() + 10
        while sensor.sample()["num_processes"] < 2 and time.monotonic() < deadline_s:
            time.sleep(0.01)
        monkeypatch.setattr(psutil.Process, "memory_full_info", only_the_parent_left)
        sensor._next_memory_read_s = 0.0  # due now, whatever the earlier reads cost
        sample = sensor.sample()
    finally:
        kill_tree(parent)
    assert sample is not None and sample["num_processes"] == 2
    assert sample["memory_measure"] == "pss" and sample["pss_bytes"] == 7 * MIB
    assert not warnings_of(caplog)


# A process that writes every page of a buffer, frees it, then waits: its RSS falls back, its peak does not.
ALLOCATE_AND_FREE = f"""
import time
buffer = bytearray({BUFFER_BYTES})
buffer[::4096] = b"\\x01" * len(range(0, len(buffer), 4096))
del buffer
print("ready", flush=True)
time.sleep(120)
"""


def test_the_high_water_mark_keeps_a_peak_that_no_sample_saw() -> None:
    process = subprocess.Popen([sys.executable, "-c", ALLOCATE_AND_FREE], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        if host.rss_high_water_bytes(process.pid) is None:
            pytest.skip("this platform does not say a process's high-water mark (no /proc)")
        sample = ProcessTreeSensor(pid=process.pid).sample()
    finally:
        kill_tree(process)
    assert sample is not None and sample["num_processes"] == 1
    # The buffer was freed before the first tick: RSS never saw it, the kernel's mark did.
    assert sample["rss_bytes"] < BUFFER_BYTES
    assert sample["rss_peak_bytes"] > sample["rss_bytes"] + 0.9 * BUFFER_BYTES
    assert host.rss_high_water_bytes(process.pid) is None  # gone: no mark, no error


# ---- the analysis, the report and the comparison -------------------------------------------------------

GIB = 2**30


def run_with_telemetry(path: Path, per_rank: list[list[dict]]) -> Path:
    """A run whose ranks recorded the given `process` telemetry samples, one a second."""
    write_manifest(
        path, {"run_id": path.name, "created_unix": 1.0, "world_size": len(per_rank), "num_nodes": 1}
    )
    for rank, samples in enumerate(per_rank):
        writer = RankWriter(path, rank)
        writer.open({"host": "node0"})
        for step in range(20):
            writer.add_step(step_record(step))
        for i, process in enumerate(samples):
            writer.add_telemetry({"t": 1000.0 + i, "process": process})
        writer.close(status="completed")
    return path


def with_pss(rss_gib: float, pss_gib: float | None) -> dict:
    sample = {"cpu_percent": 50.0, "rss_bytes": int(rss_gib * GIB), "memory_measure": "pss"}
    if pss_gib is not None:  # read every few ticks only
        sample["pss_bytes"] = int(pss_gib * GIB)
    return sample


# A rank with 4 forked workers: the RSS sum peaks at 8 GiB, PSS (read on 3 of 5 ticks) at 2 GiB.
NEW_SAMPLES = [
    with_pss(4.0, 1.0),
    with_pss(8.0, None),
    with_pss(7.5, 2.0),
    with_pss(8.0, None),
    with_pss(6.0, 1.5),
]
# A record made before PSS was: RSS only.
OLD_SAMPLES = [{"cpu_percent": 50.0, "rss_bytes": int(gib * GIB)} for gib in (4.0, 8.0, 6.0)]


def hardware_blocks(analysis: RunAnalysis) -> tuple[Table, str]:
    blocks = hardware.blocks(analysis, [])
    (processes,) = [b for b in blocks if isinstance(b, Table) and b.title == PROCESSES_TITLE]
    notes = " ".join(b.text for b in blocks if isinstance(b, Paragraph))
    return processes, notes


@pytest.fixture
def new_run(tmp_path: Path) -> Path:
    return run_with_telemetry(tmp_path / "new", [NEW_SAMPLES])


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    return run_with_telemetry(tmp_path / "old", [OLD_SAMPLES])


def test_analysis_takes_the_peak_from_pss_where_recorded(new_run: Path) -> None:
    (process,) = analyze_run(load_run(new_run)).telemetry.processes
    assert process.memory_measure == "pss" and process.memory_bytes_max == 2 * GIB
    assert process.rss_bytes_max == 8 * GIB  # still there, for continuity


def test_analysis_takes_the_peak_from_rss_for_an_old_record(old_run: Path) -> None:
    (process,) = analyze_run(load_run(old_run)).telemetry.processes
    assert process.memory_measure == "rss" and process.memory_bytes_max == process.rss_bytes_max == 8 * GIB


def test_report_labels_pss_for_a_new_record_and_rss_for_an_old_one(new_run: Path, old_run: Path) -> None:
    table, notes = hardware_blocks(analyze_run(load_run(new_run)))
    assert table.header == ("Rank", "CPU mean", "Peak PSS") and table.rows[0][2] == "2.00 GiB"
    assert PROCESS_MEMORY_LABELS["pss"] in notes and PROCESS_MEMORY_LABELS["rss"] not in notes
    assert PROCESS_MEMORY_LABELS["pss"] == "peak memory (PSS, workers' shared pages counted once)"

    table, notes = hardware_blocks(analyze_run(load_run(old_run)))
    assert table.header == ("Rank", "CPU mean", "Peak RSS") and table.rows[0][2] == "8.00 GiB"
    assert PROCESS_MEMORY_LABELS["rss"] in notes and PROCESS_MEMORY_LABELS["pss"] not in notes
    assert PROCESS_MEMORY_LABELS["rss"] == (
        "peak RSS (sum over processes, shared pages counted per process: an upper bound)"
    )


def test_ranks_of_different_measures_each_say_theirs(tmp_path: Path) -> None:
    analysis = analyze_run(load_run(run_with_telemetry(tmp_path / "mixed", [NEW_SAMPLES, OLD_SAMPLES])))
    table, notes = hardware_blocks(analysis)
    assert table.header[2] == "Peak memory"
    assert [row[2] for row in table.rows] == ["2.00 GiB (PSS)", "8.00 GiB (RSS)"]
    assert PROCESS_MEMORY_LABELS["pss"] in notes and PROCESS_MEMORY_LABELS["rss"] in notes


def test_compare_states_the_peak_and_its_kind(new_run: Path, old_run: Path) -> None:
    new, old = summarize_run(load_run(new_run)), summarize_run(load_run(old_run))
    assert (new.peak_memory_bytes, new.memory_kind) == (2 * GIB, "process PSS")
    # An old run's RSS sum is another measure: compare skips peak memory between the two kinds.
    assert (old.peak_memory_bytes, old.memory_kind) == (8 * GIB, "process RSS")


def test_report_json_keeps_the_measure_and_an_old_one_reads_as_rss(new_run: Path, old_run: Path) -> None:
    document = to_json(analyze_run(load_run(new_run)))
    (entry,) = document["telemetry"]["processes"]
    assert (entry["memory_bytes_max"], entry["memory_measure"]) == (2 * GIB, "pss")
    (process,) = from_json(document).telemetry.processes
    assert (process.memory_bytes_max, process.memory_measure) == (2 * GIB, "pss")

    # A report.json written before the fields existed: its RSS peak is its memory figure.
    document = to_json(analyze_run(load_run(old_run)))
    for entry in document["telemetry"]["processes"]:
        del entry["memory_bytes_max"], entry["memory_measure"]
    (process,) = from_json(document).telemetry.processes
    assert (process.memory_bytes_max, process.memory_measure) == (8 * GIB, "rss")
    table, _ = hardware_blocks(from_json(document))
    assert table.header[2] == "Peak RSS" and table.rows[0][2] == "8.00 GiB"


def alone(rss_gib: float, peak_gib: float, processes: int = 1) -> dict:
    """A sample of a rank alone in its tree (or with `processes` - 1 workers), its mark at `peak_gib`."""
    sample = with_pss(rss_gib, rss_gib)
    sample.update(rss_peak_bytes=int(peak_gib * GIB), num_processes=processes)
    return sample


# PSS read at 1.0, 1.2 and 1.1 GiB; between the reads the rank touched 1.5 GiB, which only its mark kept.
RISING_MARK = [alone(1.0, 1.0), alone(1.2, 1.5), alone(1.1, 1.5)]


def test_a_rank_alone_in_its_tree_takes_its_peak_from_the_high_water_mark(tmp_path: Path) -> None:
    run = load_run(run_with_telemetry(tmp_path / "alone", [RISING_MARK]))
    (process,) = analyze_run(run).telemetry.processes
    assert process.memory_measure == "hwm" and process.memory_bytes_max == int(1.5 * GIB)
    assert summarize_run(run).memory_kind == "process HWM"
    table, notes = hardware_blocks(analyze_run(run))
    assert table.header[2] == "Peak RSS" and table.rows[0][2] == "1.50 GiB"
    assert PROCESS_MEMORY_LABELS["hwm"] in notes and PROCESS_MEMORY_LABELS["rss"] not in notes
    (hardware_line,) = [
        line for line in render_terminal(analyze_run(run)).splitlines() if "hardware:" in line
    ]
    assert hardware_line.endswith("peak RSS 1,536 MiB"), hardware_line


@pytest.mark.parametrize(
    "samples",
    [
        # A forked worker at one tick: its memory is not in the rank's mark.
        [alone(1.0, 1.0), alone(1.2, 1.5, processes=2), alone(1.1, 1.5)],
        # A mark that did not rise was set before the recording (an earlier fit in the process).
        [alone(1.0, 3.0), alone(1.2, 3.0), alone(1.1, 3.0)],
    ],
    ids=["a-worker-joined", "the-mark-came-before"],
)
def test_the_mark_is_not_the_peak_with_a_worker_or_set_before_the_run(tmp_path: Path, samples) -> None:
    (process,) = analyze_run(load_run(run_with_telemetry(tmp_path / "run", [samples]))).telemetry.processes
    assert process.memory_measure == "pss" and process.memory_bytes_max == int(1.2 * GIB)


def test_runs_that_measured_memory_differently_are_not_compared_on_it(tmp_path: Path, new_run: Path) -> None:
    from tuneup.compare.compare import mixed_memory_reason

    marked = summarize_run(load_run(run_with_telemetry(tmp_path / "alone", [RISING_MARK])))
    sampled = summarize_run(load_run(new_run))
    assert mixed_memory_reason([marked, marked]) is None
    assert mixed_memory_reason([marked, sampled]) == (
        "the sides measured different memory (process HWM, process PSS)"
    )
