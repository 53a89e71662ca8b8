"""The plain PyTorch loop adapter (`tuneup.track`) records a hand-written loop as the Lightning callback
records a fit: a delay injected into each phase comes back in that phase, `tuneup report`, `advise` and
`compare` read its runs, and torchrun DDP records one run with every rank."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuneup import load_run
from tuneup.cli import main
from tuneup.plugins.loop import TrackedLoop
from tuneup.report import analyze

from workloads.loops import Delays, clear_injected, injected_in
from workloads.plain_loop import train

STEPS = 16
DELAYS = Delays()
PHASES = ("data", "forward", "backward", "optimizer")
WORKLOAD = Path(__file__).parent / "workloads" / "plain_loop.py"


def _phase_medians(run_dir: Path) -> dict[str, float]:
    steady = load_run(run_dir).steps(0)[2:]
    return {p: statistics.median(getattr(s, f"{p}_ms") for s in steady) for p in PHASES}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A control of the loop (its delays are pauses outside the steps), then the loop with its delays."""
    root = tmp_path_factory.mktemp("plain")
    clear_injected()
    control = train(root / "control", STEPS, DELAYS, control=True, telemetry_interval_s=0.5)
    clear_injected()
    delayed = train(root / "run", STEPS, DELAYS, telemetry_interval_s=0.5)
    from workloads.loops import INJECTED

    return {"control": control.run_dir, "run": delayed.run_dir, "injected": list(INJECTED), "root": root}


def test_injected_delays_come_back_in_their_phase(runs: dict[str, Any]) -> None:
    own = _phase_medians(runs["control"])
    run = load_run(runs["run"])
    steps = run.steps(0)
    assert [s.step for s in steps] == list(range(STEPS))  # consecutive, one per run.step()
    info = run.ranks[0].info.raw
    assert info["adapter"] == "loop" and info["phases_timed"] == list(PHASES)
    assert (
        info["status"] == "completed" and info.get("stop_reason") is None
    )  # a loop does not say why it ended
    steady = steps[2:]
    from workloads import loops

    loops.INJECTED[:] = runs["injected"]
    for phase in PHASES:
        # What the step's phase took, less the delay injected into it in the step's window, is the loop's
        # own work: it matches the control's, within 10% of the delay or 2 ms.
        injected = [injected_in(phase, s.t_end - s.wall_ms / 1000.0, s.t_end) for s in steady]
        assert statistics.median(injected) > 0.9 * getattr(DELAYS, f"{phase}_ms"), (phase, injected)
        left = statistics.median(getattr(s, f"{phase}_ms") - i for s, i in zip(steady, injected, strict=True))
        tolerance = max(0.10 * statistics.median(injected), 2.0)
        assert left == pytest.approx(own[phase], abs=tolerance), (phase, left, own[phase])
    for s in steady:
        assert s.samples == 8 and s.micro_batches == 1 and s.loss is not None
        named = s.data_ms + s.forward_ms + s.backward_ms + s.optimizer_ms + s.sync_ms + s.other_ms
        assert named + (s.tuneup_ms or 0.0) == pytest.approx(s.wall_ms, abs=0.01)
    # Nothing of the injected work is left unnamed: "other" is the loop's bookkeeping between phases.
    assert statistics.median(s.other_ms / s.wall_ms for s in steady) < 0.05


def test_report_advise_and_compare_read_plain_loop_runs(
    runs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    out = runs["root"] / "report"
    assert main(["report", str(runs["run"]), "--out", str(out), "--format", "md,json"]) == 0
    # A loop that left its `with` block normally ended its fit, though it cannot say why (no stop reason):
    # no time "to go" is projected for it.
    timeline = analyze(runs["run"]).timeline
    assert timeline is not None and timeline.ended and timeline.stop_reason is None
    assert (out / "report.md").exists() and (out / "report.json").exists()
    assert main(["advise", str(runs["run"]), "--no-whatif"]) == 0
    # One run a side: the verdict is inconclusive (exit 0), but the comparison is made.
    assert main(["compare", str(runs["control"]), str(runs["run"]), "--metrics", "throughput"]) == 0
    assert "throughput" in capsys.readouterr().out


def test_a_loop_that_marks_nothing_records_its_steps_as_other(tmp_path: Path) -> None:
    import tuneup

    with tuneup.track(tmp_path / "run", telemetry_interval_s=0.5, count_flops=False) as run:
        for _ in range(5):
            run.step()
    rec = load_run(run.run_dir)
    steps = rec.steps(0)
    assert [s.step for s in steps] == list(range(5))
    assert all(s.samples is None for s in steps)  # no batch_size given: unknown, not guessed
    # Opening the step's micro-batch at its end leaves a few microseconds of forward at most.
    assert all(s.data_ms == s.backward_ms == s.optimizer_ms == 0.0 <= s.forward_ms < 0.01 for s in steps)
    assert all(s.other_ms > 0 for s in steps)
    assert rec.ranks[0].info.raw["phases_timed"] == []


def test_an_exception_in_the_loop_closes_the_record_and_reaches_the_caller(tmp_path: Path) -> None:
    import tuneup

    with pytest.raises(RuntimeError, match="boom"), tuneup.track(tmp_path / "run", count_flops=False) as run:
        run.step()
        raise RuntimeError("boom")
    info = load_run(run.run_dir).ranks[0].info.raw
    assert info["status"] == "exception" and info["stop_reason"] == "exception"
    events = [e for e in load_run(run.run_dir).ranks[0].events if e["kind"] == "exception"]
    assert events and events[0]["message"] == "boom"


@pytest.mark.slow
def test_a_torchrun_ddp_loop_is_one_run_with_both_ranks(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(WORKLOAD)]
    proc = subprocess.run(
        [*cmd, "--out", str(out), "--steps", "8"], env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = load_run(out)
    assert sorted(run.ranks) == [0, 1] and run.world_size == 2
    for rank in (0, 1):
        steps = run.steps(rank)
        assert [s.step for s in steps] == list(range(8))
        # The all-reduces were timed in the DDP comm hook the session registered.
        assert all(s.comm_count and s.comm_bytes for s in steps[1:])
    assert any(e["kind"] == "noise_scale" and e["method"] == "ddp" for e in run.ranks[0].events)
    assert main(["report", str(out), "--out", str(tmp_path / "report"), "--format", "json"]) == 0


def _forward_backward_only(out: Path, steps: int, micro_batches: int) -> TrackedLoop:
    """A loop of batches of 4 that marks forward and backward only, `micro_batches` of each a step: the
    closed `TrackedLoop`."""
    import tuneup

    with tuneup.track(out, batch_size=4, telemetry_interval_s=0.5, count_flops=False) as run:
        for _ in range(steps):
            for _ in range(micro_batches):
                with run.phase("forward"):
                    pass
                with run.phase("backward"):
                    pass
            run.step()
    return run


def test_a_loops_accumulation_is_read_from_its_micro_batches(tmp_path: Path) -> None:
    # The loop never says its accumulation; its steps counted two micro-batches each (a forward phase opens
    # one), and that is what the analysis shows, not a default of 1.
    run = _forward_backward_only(tmp_path / "run", steps=6, micro_batches=2)
    a = analyze(run.run_dir)
    assert a.run.accumulate_grad_batches == 2
    assert a.run.global_batch_size == 8


def test_phases_a_loop_never_marked_are_not_timed_in_the_report_and_the_advice(tmp_path: Path) -> None:
    # The loop marks forward and backward only: data and optimizer are not zero, they are unmeasured (in
    # "other"), and neither the report's table nor the data-loading advice reads them as measured.
    from tuneup.advise import AdviceOptions, advise

    run = _forward_backward_only(tmp_path / "run", steps=30, micro_batches=1)
    a = analyze(run.run_dir)
    assert a.step_time.phases_not_timed == ["data", "optimizer", "sync"]
    out = tmp_path / "report"
    assert main(["report", str(run.run_dir), "--out", str(out), "--format", "md"]) == 0
    md = (out / "report.md").read_text()
    assert "| data | not timed |" in md and "did not time data, optimizer and sync" in md
    advice = advise([a], AdviceOptions(whatif=False))
    assert not [r for r in advice.recommendations if r.id == "data_loading.num_workers"]
    assert any("did not time the data phase" in c.reason for c in advice.considered)


def test_recording_a_plain_model_does_not_import_fsdp(tmp_path: Path) -> None:
    # Looking for FSDP2 units once imported torch.distributed.fsdp: 1.0 s of every recorded run's start.
    code = (
        "import sys, torch, tuneup\n"
        "model = torch.nn.Linear(4, 2)\n"
        f"with tuneup.track(dirpath={str(tmp_path / 'run')!r}, batch_size=2, model=model) as run:\n"
        "    model(torch.randn(2, 4)).sum().backward(); run.step()\n"
        "print('fsdp imported' if 'torch.distributed.fsdp' in sys.modules else 'fsdp not imported')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("fsdp not imported")
    assert load_run(tmp_path / "run").manifest.raw["model"]["fsdp"] is None
