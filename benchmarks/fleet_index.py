"""How long `tuneup index` takes: N synthetic runs indexed from scratch, then again with one new run.

    python benchmarks/fleet_index.py [--runs 10000] [--fleet DIR] [--keep]

The runs are benchmarks/fleet_synthetic.py's (made once under --fleet and reused when it already holds
N runs). Prints: the time to index all of them from scratch (every run loaded, analysed and advised on, in
one process per core), the time to index them again after one new run was written (every run's fingerprint
taken, one run read), the index's files and their sizes, and the CPU time per run in this process for a
sample, split into load, analysis, advice and row. The issue's bounds, on the 2-core machine: 2 minutes
from scratch, 5 s for the re-index.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_synthetic import SOURCE, Templates, make_fleet, plan_fleet, write_run

from tuneup.fleet.index import RUNS_FILE, STEPS_FILE, default_workers, read_index, update_index
from tuneup.fleet.scan import scan

SAMPLE_RUNS = 60


def _per_run_cpu_ms(fleet: Path) -> dict[str, float]:
    """CPU ms per run in this process, by stage, over a sample of the fleet (the collector paused, as the
    index's workers run)."""
    from tuneup._gc import cyclic_gc_paused
    from tuneup.analyze.analysis import analyze_run
    from tuneup.fleet.index import _advice
    from tuneup.fleet.row import run_row, step_rows
    from tuneup.record.segments import load_segments

    found = scan(str(fleet))
    sample = found[:: max(1, len(found) // SAMPLE_RUNS)][:SAMPLE_RUNS]
    totals = dict.fromkeys(("load", "analyze", "advise", "row"), 0.0)
    with cyclic_gc_paused():
        for run in sample:
            t0 = time.process_time()
            runs = load_segments(run.key)
            t1 = time.process_time()
            analysis = analyze_run(runs[-1], None, runs)
            t2 = time.process_time()
            advice = _advice(analysis)
            t3 = time.process_time()
            run_row(run.key, run.fingerprint, runs, analysis, advice)
            step_rows(run.key, runs)
            t4 = time.process_time()
            for stage, seconds in zip(totals, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                totals[stage] += seconds
    return {stage: 1e3 * s / len(sample) for stage, s in totals.items()}


def _cpu_s() -> float:
    """CPU seconds of this process and of its ended children (the index's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--fleet", type=Path, default=Path(tempfile.gettempdir()) / "tuneup-fleet-bench")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the synthetic runs and the index")
    args = parser.parse_args(argv)

    fleet = args.fleet / f"runs-{args.runs}"
    if not fleet.exists() or len(scan(str(fleet))) < args.runs:
        shutil.rmtree(fleet, ignore_errors=True)
        started = time.perf_counter()
        make_fleet(fleet, args.runs, seed=0)
        print(f"wrote {args.runs} synthetic runs in {time.perf_counter() - started:.1f} s: {fleet}")
    size_mb = sum(p.stat().st_size for p in fleet.rglob("*") if p.is_file()) / 1e6
    print(f"fleet: {args.runs} runs, {size_mb:.0f} MB")

    index_dir = args.fleet / f"index-{args.runs}"
    shutil.rmtree(index_dir, ignore_errors=True)
    workers = args.workers or default_workers()
    cpu_before = _cpu_s()
    scratch = update_index([str(fleet)], index_dir, workers=workers)
    cpu_ms = 1e3 * (_cpu_s() - cpu_before) / scratch.found
    print(
        f"from scratch: {scratch.found} runs in {scratch.seconds:.1f} s with {workers} workers "
        f"({1e3 * scratch.seconds / scratch.found:.1f} ms a run; {scratch.unreadable} unreadable); CPU "
        f"{cpu_ms:.1f} ms a run (this process and its workers), so {cpu_ms * scratch.found / 1e3 / workers:.0f} s "
        f"on {workers} cores of its own; load average {os.getloadavg()[0]:.1f} after"
    )

    extra = plan_fleet(args.runs + 1, seed=0)[-1]  # one more run, as the next one a team writes
    new_run = write_run(fleet / "new", extra, Templates(SOURCE))
    try:
        again = update_index([str(fleet)], index_dir, workers=workers)
    finally:
        if not args.keep:
            shutil.rmtree(fleet / "new", ignore_errors=True)
    print(
        f"re-index with one new run: {again.found} runs in {again.seconds:.2f} s "
        f"({again.read} read, {again.unchanged} unchanged): {new_run.name}"
    )
    runs, steps = read_index(index_dir)
    for name, table in ((RUNS_FILE, runs), (STEPS_FILE, steps)):
        print(
            f"{name}: {table.num_rows} rows, {table.num_columns} columns, "
            f"{(index_dir / name).stat().st_size / 1e6:.2f} MB"
        )
    cpu = _per_run_cpu_ms(fleet)
    print("CPU per run (ms, one process): " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()))
    if not args.keep:
        shutil.rmtree(index_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
