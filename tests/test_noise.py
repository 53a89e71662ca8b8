"""Noise is not signal: warm-up is a leading transient (not any slow plateau), slow periods are reported and
kept, heavy-tailed phases are labelled with their median and p95, and a host whose CPU other processes
took is named, from a real contended run as well as synthetic ones."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tuneup.analyze.analysis import analyze_run
from tuneup.analyze.model import RunAnalysis, from_json, to_json
from tuneup.analyze.steady import warmup_steps
from tuneup.record import RankWriter, load_run, write_manifest
from tuneup.report.markdown import render_markdown
from tuneup.report.sections import summary
from tuneup.report.terminal import render_terminal

from conftest import run_workload
from synthetic import step_record


def write_run(
    path: Path,
    per_rank: dict[int, list[dict]],
    telemetry: dict[int, list[dict]] | None = None,
    cpu_count: int | None = None,
    hosts: dict[int, str] | None = None,
) -> Path:
    write_manifest(
        path,
        {
            "run_id": "noise",
            "created_unix": 1000.0,
            "world_size": len(per_rank),
            "num_nodes": 1,
            "dataloader": {"batch_size": 8, "num_workers": 0},
            "environment": {"host": {"hostname": "h", "cpu_count_logical": cpu_count}},
        },
    )
    for rank, records in per_rank.items():
        w = RankWriter(path, rank)
        w.open(
            {"host": (hosts or {}).get(rank, "h"), "start_unix": 1000.0, "local_rank": 0 if hosts else rank}
        )
        for rec in records:
            w.add_step(rec)
        for sample in (telemetry or {}).get(rank, []):
            w.add_telemetry(sample)
        w.close(status="completed")
    return path


def timed_steps(walls_ms: list[float], optimizer_ms: list[float] | None = None) -> list[dict]:
    """Step records with these wall times (the extra time in forward), in order, back to back."""
    out, t = [], 1000.0
    for step, wall in enumerate(walls_ms):
        opt = optimizer_ms[step] if optimizer_ms else 1.0
        rec = step_record(step)
        t += wall / 1000.0
        rec.update(
            wall_ms=wall,
            data_ms=1.0,
            forward_ms=wall - 1.0 - 4.0 - opt - 1.0,
            backward_ms=4.0,
            optimizer_ms=opt,
            other_ms=1.0,
            t_end=t,
        )
        out.append(rec)
    return out


def analyze(path: Path) -> RunAnalysis:
    return analyze_run(load_run(path))


# -- warm-up and slow periods -------------------------------------------------------------------------


def test_a_flat_plateau_is_not_warmup_but_a_decaying_lead_is() -> None:
    assert warmup_steps([20.0] * 150 + [10.0] * 150) == 1  # was 150: half the run dropped
    assert (
        warmup_steps([5000.0, 300.0, 100.0] + [20.0] * 150 + [10.0] * 150) == 3
    )  # the transient ahead of it
    # A decaying warm-up longer than a handful of steps is still warm-up, up to where it settles.
    decay = [10.0 + 200.0 * math.exp(-i / 8) for i in range(300)]
    assert 25 <= warmup_steps(decay) <= 35
    # Never more than a quarter of the run, however slowly it decays.
    assert warmup_steps([10.0 + 1000.0 * math.exp(-i / 40) for i in range(400)]) == 100  # settles at 212
    # A slow drift (1.2x over the first hundred steps) is no transient: left in, as a slow period.
    assert warmup_steps([10.0 + max(0, 300 - i) for i in range(400)]) == 1


def test_mid_run_plateau_is_a_slow_period_kept_in_the_figures(tmp_path: Path) -> None:
    walls = [1000.0, 500.0, 200.0] + [100.0] * 200 + [300.0] * 150 + [100.0] * 200
    report = analyze(write_run(tmp_path / "run", {0: timed_steps(walls)}))
    assert report.warmup.steps == 3
    (period,) = report.step_time.slow_periods
    assert (period.first_step, period.last_step, period.steps) == (203, 352, 150)
    assert period.slowdown == pytest.approx(3.0) and period.baseline_ms == pytest.approx(100.0)
    assert period.duration_s == pytest.approx(45.0)
    assert period.share_of_time == pytest.approx(45 / 85)
    # Kept: the throughput is the steady steps' samples over all their time, the plateau included.
    assert report.throughput.samples_per_s == pytest.approx(8 * 550 / 85)
    (finding,) = [f for f in report.findings if f.id == "slow_period"]
    assert (
        finding.title
        == "Slow period: steps 203–352 ran 3.0× the steady step time (150 steps, 53% of the time)"
    )
    md = render_markdown(report, [])
    assert "Slow periods, kept in the figures" in md and "203–352" in md
    assert "1 slow period (150 recorded steps) is kept in them" in summary.steady_state(report)


def test_a_run_that_starts_with_a_long_flat_plateau_is_not_all_warmup(tmp_path: Path) -> None:
    walls = [4000.0] + [200.0] * 150 + [100.0] * 150
    report = analyze(write_run(tmp_path / "run", {0: timed_steps(walls)}))
    assert report.warmup.steps == 1
    (period,) = report.step_time.slow_periods
    assert (period.first_step, period.last_step) == (1, 150)
    assert period.slowdown == pytest.approx(2.0)
    assert "long_warmup" not in {f.id for f in report.findings}
    assert any(f.id == "slow_period" and "steps 1–150" in f.title for f in report.findings)


def test_slow_periods_across_ranks_are_the_jobs_not_one_per_rank(tmp_path: Path) -> None:
    walls = [500.0] + [100.0] * 100 + [250.0] * 40 + [100.0] * 100
    report = analyze(write_run(tmp_path / "run", {0: timed_steps(walls), 1: timed_steps(walls)}))
    (period,) = report.step_time.slow_periods
    assert (period.first_step, period.last_step, period.steps) == (101, 140, 40)


def test_a_steady_run_has_no_slow_period(tmp_path: Path) -> None:
    # Jitter and isolated stalls (every 25th step 5x slower) are not a period.
    walls = [2000.0] + [100.0 + 10 * (i % 3) for i in range(299)]
    walls = [w * 5 if i % 25 == 7 else w for i, w in enumerate(walls)]
    report = analyze(write_run(tmp_path / "run", {0: timed_steps(walls)}))
    assert report.step_time.slow_periods == []
    assert "slow_period" not in {f.id for f in report.findings}


def test_hiccups_of_a_shared_host_are_not_slow_periods(tmp_path: Path) -> None:
    # 8 ms steps with bursts of 40 steps at 5x (a third of a second each): what a busy neighbour does to a
    # millisecond step. Too short to be a phase of the run; the step times are heavy-tailed instead.
    walls = [100.0] + [40.0 if i % 100 < 40 else 8.0 for i in range(900)]
    report = analyze(write_run(tmp_path / "run", {0: timed_steps(walls)}))
    assert report.step_time.slow_periods == []
    assert "heavy_tailed_steps" in {f.id for f in report.findings}
    # The same bursts at a second a step last 40 s each: slow periods, every one.
    slow = analyze(write_run(tmp_path / "slow", {0: timed_steps([w * 125 for w in walls])}))
    assert len(slow.step_time.slow_periods) == 9


# -- heavy tails --------------------------------------------------------------------------------------


def test_heavy_tailed_optimizer_is_labelled_with_median_and_p95(tmp_path: Path) -> None:
    optimizer = [80.0 if s % 10 == 5 else 0.5 for s in range(300)]
    walls = [9.0 + opt for opt in optimizer]
    report = analyze(write_run(tmp_path / "run", {0: timed_steps(walls, optimizer)}))
    opt = report.step_time.phases["optimizer"]
    assert opt.ms == pytest.approx(0.5 * 0.9 + 80 * 0.1, rel=0.02)  # the mean still adds up to the step
    assert opt.median_ms == pytest.approx(0.5) and opt.p95_ms == pytest.approx(80.0)
    assert opt.noisy and report.step_time.noisy
    assert not report.step_time.phases["backward"].noisy  # a constant phase is not labelled
    ids = {f.id for f in report.findings}
    assert {"heavy_tailed_steps", "noisy_phases"} <= ids
    noisy = next(f for f in report.findings if f.id == "noisy_phases")
    assert "optimizer: mean" in noisy.evidence and "median 0.50 ms, p95 80.00 ms" in noisy.evidence
    md = render_markdown(report, [])
    assert "noisy: slow steps pull the mean above the median" in md and "heavy-tailed" in md
    terminal = render_terminal(report)
    line = next(line for line in terminal.splitlines() if line.startswith("    optimizer"))
    assert "noisy: median 0.5" in line and "p95 80" in line  # whatever the digits the terminal prints
    assert "(heavy-tailed: p95" in terminal
    # report.json carries the figures, and one written before they existed still reads back.
    document = to_json(report)
    assert document["step_time"]["phases"]["optimizer"]["median_ms"] == 0.5
    assert from_json(document) == from_json(to_json(from_json(document)))
    for phase in document["step_time"]["phases"].values():
        for key in ("median_ms", "p95_ms", "noisy"):
            del phase[key]
    for key in ("noisy", "slow_periods"):
        del document["step_time"][key]
    del document["telemetry"]["cpu_contention"]
    old = from_json(document)
    assert old.step_time.phases["optimizer"].median_ms is None and not old.step_time.noisy


def test_a_steady_phase_is_not_labelled(tmp_path: Path) -> None:
    walls = [100.0] + [10.0] * 200
    report = analyze(write_run(tmp_path / "run", {0: timed_steps(walls)}))
    assert not report.step_time.noisy and not any(p.noisy for p in report.step_time.phases.values())
    assert not {"heavy_tailed_steps", "noisy_phases"} & {f.id for f in report.findings}
    assert "noisy" not in render_terminal(report)


# -- CPU contention, synthetic ------------------------------------------------------------------------


def cpu_samples(rank: int, n: int, process: float, system: float | None, offset_s: float = 0.0) -> list[dict]:
    out = []
    for i in range(n):
        sample: dict = {"t": 1000.0 + offset_s + 0.5 * i, "process": {"cpu_percent": process}}
        if system is not None:
            sample["system"] = {"cpu_percent": system}
        out.append(sample)
    return out


def test_other_processes_on_a_saturated_host_are_contention(tmp_path: Path) -> None:
    # 4 cores, the host 100% busy; the training's one rank uses one core: others took three quarters.
    steps = timed_steps([10.0] * 40)
    path = write_run(tmp_path / "run", {0: steps}, {0: cpu_samples(0, 20, 100.0, 100.0)}, cpu_count=4)
    report = analyze(path)
    (c,) = report.telemetry.cpu_contention
    assert c.contended and c.cores == 4 and c.samples == 20 and c.ranks == [0]
    assert (c.host_busy_percent_mean, c.training_percent_mean, c.others_percent_mean) == (100.0, 25.0, 75.0)
    finding = next(f for f in report.findings if f.id == "cpu_contention")
    assert "host busy 100%" in finding.evidence and "others 75%" in finding.evidence
    assert "of its 4 cores" in finding.evidence and "(rank 0 with its workers) 25%" in finding.evidence


def test_the_other_ranks_of_a_host_are_the_training_not_other_processes(tmp_path: Path) -> None:
    # 2 ranks on a 2-core host, each a core busy: the host is saturated by the training alone. Rank 1's
    # sampler ticks on its own clock, 0.2 s after rank 0's, and has no system sensor (not local rank 0).
    steps = timed_steps([10.0] * 40)
    telemetry = {0: cpu_samples(0, 20, 100.0, 100.0), 1: cpu_samples(1, 20, 100.0, None, offset_s=0.2)}
    report = analyze(write_run(tmp_path / "run", {0: steps, 1: steps}, telemetry, cpu_count=2))
    (c,) = report.telemetry.cpu_contention
    assert c.ranks == [0, 1] and c.training_percent_mean == 100.0 and c.others_percent_mean == 0.0
    assert not c.contended and "cpu_contention" not in {f.id for f in report.findings}


def test_many_contended_hosts_are_one_finding(tmp_path: Path) -> None:
    # Five hosts of one rank each; four of them were saturated by others.
    steps = timed_steps([10.0] * 40)
    telemetry = {r: cpu_samples(r, 20, 100.0, 100.0 if r else 60.0) for r in range(5)}
    hosts = {r: f"node{r}" for r in range(5)}
    report = analyze(write_run(tmp_path / "run", dict.fromkeys(range(5), steps), telemetry, 4, hosts))
    assert [c.contended for c in report.telemetry.cpu_contention] == [False, True, True, True, True]
    (finding,) = [f for f in report.findings if f.id == "cpu_contention"]
    assert finding.title == "4 of 5 hosts had their CPU taken by other processes"


def test_a_busy_host_with_cores_to_spare_is_not_contention(tmp_path: Path) -> None:
    steps = timed_steps([10.0] * 40)
    path = write_run(tmp_path / "run", {0: steps}, {0: cpu_samples(0, 20, 100.0, 70.0)}, cpu_count=4)
    (c,) = analyze(path).telemetry.cpu_contention
    assert c.others_percent_mean == 45.0 and not c.contended


# -- too little to go on ------------------------------------------------------------------------------


def test_a_run_with_too_few_steps_gets_no_noise_findings(tmp_path: Path) -> None:
    walls = [100.0, 10.0, 50.0, 10.0, 90.0, 10.0]
    optimizer = [1.0, 1.0, 40.0, 1.0, 80.0, 1.0]
    telemetry = {0: cpu_samples(0, 3, 20.0, 100.0)}  # saturated by others, but three samples only
    report = analyze(write_run(tmp_path / "run", {0: timed_steps(walls, optimizer)}, telemetry, cpu_count=2))
    ids = {f.id for f in report.findings}
    assert not ids & {"slow_period", "heavy_tailed_steps", "noisy_phases", "cpu_contention"}, ids
    assert report.step_time.slow_periods == [] and not report.step_time.noisy
    assert not any(p.noisy for p in report.step_time.phases.values())
    assert not any(c.contended for c in report.telemetry.cpu_contention)
    assert report.telemetry.cpu_contention[0].samples == 3
    # Without a core count, no share of the host can be told: nothing is said, rather than a guess.
    bare = analyze(
        write_run(tmp_path / "bare", {0: timed_steps([10.0] * 40)}, {0: cpu_samples(0, 20, 10.0, 100.0)})
    )
    assert bare.telemetry.cpu_contention == []


# -- CPU contention, a real run -----------------------------------------------------------------------

# Long enough for a few seconds of training at the workload's 0.2 s telemetry interval (about 1 ms a step
# on a quiet host, several with a neighbour on every core).
REAL_STEPS = "2000"
# Other work on the host (other test sessions on a shared machine) above this makes the quiet run's premise
# false: it would be contended, rightly flagged, and prove nothing.
QUIET_HOST_PERCENT = 40.0


def _host_cpu_percent(seconds: float) -> float:
    psutil.cpu_percent(None)
    time.sleep(seconds)
    return psutil.cpu_percent(None)


@pytest.mark.slow
def test_a_real_run_beside_a_cpu_burning_neighbour_is_flagged(tmp_path: Path) -> None:
    # The quiet run first: the burners' load would linger in the host's figures for a moment after.
    if _host_cpu_percent(1.0) > QUIET_HOST_PERCENT:
        pytest.skip("this host is busy with other work: a quiet run cannot be had here")
    (tmp_path / "quiet").mkdir()
    run_workload(tmp_path / "quiet" / "run", "--max-steps", REAL_STEPS)
    quiet = analyze(tmp_path / "quiet" / "run")
    (c,) = quiet.telemetry.cpu_contention
    assert c.samples >= 3 and c.training_percent_mean, c  # the training's own CPU was seen
    if c.contended and _host_cpu_percent(1.0) > QUIET_HOST_PERCENT:
        pytest.skip(f"other work started on this host during the quiet run: {c}")
    assert "cpu_contention" not in {f.id for f in quiet.findings}, c

    # A neighbour spinning on every core, started apart from the training (not in its process tree).
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)
    ]
    try:
        (tmp_path / "busy").mkdir()
        run_workload(tmp_path / "busy" / "run", "--max-steps", REAL_STEPS)
    finally:
        for p in burners:
            p.kill()
        for p in burners:
            p.wait()
    busy = analyze(tmp_path / "busy" / "run")
    (c,) = busy.telemetry.cpu_contention
    assert c.contended and c.samples >= 5, c
    assert c.others_percent_mean is not None and c.others_percent_mean >= 25.0, c
    finding = next(f for f in busy.findings if f.id == "cpu_contention")
    assert f"of its {os.cpu_count()} cores" in finding.evidence and "others" in finding.evidence
