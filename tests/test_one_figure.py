"""One figure, one definition: a 2-rank DDP run gives the same samples/s, step time and $ in the report,
`tuneup show`, `tuneup compare` and (by the same definition, over their interval) the trainer's loggers."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuneup import load_run
from tuneup.compare.compare import format_value
from tuneup.compare.runs import summarize_run
from tuneup.report import analyze, write_report
from tuneup.report.format import ms, number, usd

from conftest import run_workload

pytestmark = pytest.mark.slow


def test_report_show_compare_and_loggers_state_the_same_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, logs = tmp_path / "run", tmp_path / "logs"
    monkeypatch.setenv("TUNEUP_PRICE_PER_HOUR", "2.5")  # the workload inherits it: a priced run
    run_workload(out, "--devices", "2", "--strategy", "ddp", "--max-steps", "24", "--csv-log", str(logs))
    analysis = analyze(out)
    samples_per_s, mean_ms = analysis.throughput.samples_per_s, analysis.step_time.mean_ms
    assert samples_per_s and mean_ms and analysis.cost is not None and analysis.cost.priced

    # report.json holds the analysis's figures, rounded at the edge (3 decimals; money to 9 digits).
    written = write_report(out, tmp_path / "report", "json")
    document = json.loads(written.files[0].read_text())
    assert document["throughput"]["samples_per_s"] == round(samples_per_s, 3)
    assert document["step_time"]["mean_ms"] == round(mean_ms, 3)
    samples_per_usd = analysis.cost.figures.samples_per_usd
    assert samples_per_usd is not None
    assert document["cost"]["figures"]["samples_per_usd"] == float(f"{samples_per_usd:.9g}")

    # `tuneup show` prints them, under the labels the report uses.
    shown = subprocess.run(
        [sys.executable, "-m", "tuneup", "show", str(out)], capture_output=True, text=True, check=True
    ).stdout
    assert f"{number(samples_per_s)} samples/s" in shown
    assert f"mean {ms(mean_ms)}" in shown
    assert usd(analysis.cost.price.usd_per_hour if analysis.cost.price else None) in shown

    # `tuneup compare` compares the same figures, and prints them as `show` does.
    summary = summarize_run(load_run(out))
    assert summary.throughput == samples_per_s and summary.step_time_ms == mean_ms
    assert summary.usd_per_sample == pytest.approx(1 / samples_per_usd)
    assert format_value(summary.throughput, "samples/s") in shown
    assert format_value(summary.step_time_ms, "ms").removesuffix(" ms") in shown

    # The loggers get the same definition over each logging interval: rank 0's samples, times the world
    # size, over the interval's time; the step time is the interval's mean step.
    steps = {s.step: s for s in load_run(out).steps(0)}
    with (logs / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("tuneup/samples_per_s")]
    assert len(rows) >= 4
    previous = -1
    for row in rows:
        step = int(row["step"])
        window = [steps[k] for k in range(previous + 1, step + 1)]
        wall_ms = sum(s.wall_ms for s in window)
        assert float(row["tuneup/samples_per_s"]) == pytest.approx(
            sum(s.samples for s in window) * 2 / (wall_ms / 1000), rel=1e-3
        )
        assert float(row["tuneup/step_time_ms"]) == pytest.approx(wall_ms / len(window), rel=1e-3)
        previous = step
