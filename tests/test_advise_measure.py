"""`tuneup advise --measure`: which trials identify the step-time model (pure), the command line's usage
errors, and the whole path live on 2 gloo ranks: the baseline, a second batch size, then advice from a fitted
(not prior) model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.synthetic import make_run
from tests.test_advise import obs
from tuneup.advise.measure import (
    COMPUTE,
    INTERFERENCE,
    MEASURE_HINT,
    NotMeasured,
    blind_spots,
    blind_to,
    describe_plan,
    measure_hint,
    plan_trials,
)
from tuneup.advise.observe import Observation
from tuneup.cli import build_parser, main
from tuneup.tune.protocol import ENV_SESSION

ROOT = Path(__file__).resolve().parents[1]
PLAIN = ROOT / "tests" / "workloads" / "tune_plain.py"
GIB = 2**30


def ddp(batch: int, world: int = 2, **kw: Any) -> Observation:
    """A multi-rank run with measured collectives (half of them hidden behind backward)."""
    return obs(
        batch, 2.0 + 0.1 * batch, world=world, comm_ms=4.0, exposed_ms=2.0, bucket_bytes=(2**20,), **kw
    )


def planned(plan: Any) -> list[tuple[int, int]]:
    return [(t.world_size, t.batch_size) for t in plan.trials]


# -- which trials ------------------------------------------------------------------------------------


def test_one_batch_size_on_one_rank_is_measured_at_twice_the_batch() -> None:
    plan = plan_trials([obs(16, 3.6)], max_trials=3)
    assert plan.blind == (COMPUTE,)
    assert planned(plan) == [(1, 32)]
    assert plan.left_blind == ()
    assert plan.trials[0].step_ms is not None  # the model's prediction, for the time estimate


def test_multi_rank_without_a_one_rank_run_measures_one_rank_at_two_batch_sizes() -> None:
    plan = plan_trials([ddp(16)], max_trials=3)
    assert plan.blind == (COMPUTE, INTERFERENCE)
    # Two one-rank runs make the one-rank line the model's reference: compute fitted, interference measured.
    assert planned(plan) == [(1, 16), (1, 32)]
    assert plan.left_blind == ()
    # And the model, given such runs, is indeed no longer blind.
    assert blind_to([ddp(16), obs(16, 3.6), obs(32, 5.2)]) == ()


def test_multi_rank_with_one_trial_measures_the_batch_first_and_says_what_is_left() -> None:
    plan = plan_trials([ddp(16)], max_trials=1)
    assert planned(plan) == [(2, 32)]
    assert plan.left_blind == (INTERFERENCE,)
    assert any("within 1 measuring trial(s)" in n for n in plan.notes)


def test_a_command_whose_world_size_is_fixed_gets_a_second_batch_size_and_the_reason() -> None:
    plan = plan_trials([ddp(16)], max_trials=3, one_rank_blocked="the script sets its Trainer's devices")
    assert planned(plan) == [(2, 32)]
    assert plan.left_blind == (INTERFERENCE,)
    assert any("interference cannot be measured here: the script sets" in n for n in plan.notes)
    text = "\n".join(describe_plan(plan, startup_s=20.0, max_steps=200))
    assert "batch 32 per rank on 2 ranks" in text and "s in all" in text and "interference" in text


def test_runs_that_already_cover_both_need_no_trial() -> None:
    assert planned(plan_trials([obs(16, 3.6), obs(32, 5.2)], max_trials=3)) == []
    plan = plan_trials([ddp(16), obs(16, 3.6), obs(32, 5.2)], max_trials=3)
    assert plan.blind == () and planned(plan) == []
    assert "nothing to measure" in describe_plan(plan, 20.0, 200)[0]
    # A multi-rank run with a second batch size but no one-rank run: only interference is left.
    plan = plan_trials([ddp(16), ddp(32)], max_trials=3)
    assert plan.blind == (INTERFERENCE,)
    # The one-rank runs must have as many batch sizes as the two-rank ones to be the reference.
    assert planned(plan) == [(1, 16), (1, 32)]


def test_out_of_memory_at_twice_the_batch_tries_half_and_a_refused_batch_tries_none() -> None:
    oom = NotMeasured(32, 1, out_of_memory=True)
    assert planned(plan_trials([obs(16, 3.6)], max_trials=3, failed=[oom])) == [(1, 8)]
    refused = NotMeasured(32, 1, batch_refused=True)
    plan = plan_trials([obs(16, 3.6)], max_trials=3, failed=[refused])
    assert planned(plan) == [] and plan.left_blind == (COMPUTE,)
    assert any("batch_size" in n for n in plan.notes)
    # Multi-rank: the batch cannot change, the world size still can.
    assert planned(plan_trials([ddp(16)], max_trials=3, failed=[refused])) == [(1, 16)]
    # Batch 1 has no half: nothing is left to try once twice it ran out of memory.
    plan = plan_trials([obs(1, 2.1)], max_trials=3, failed=[NotMeasured(2, 1, out_of_memory=True)])
    assert planned(plan) == [] and any("no second batch size" in n for n in plan.notes)


def test_twice_the_batch_that_cannot_fit_in_gpu_memory_is_not_tried() -> None:
    gpu = dict(on_gpu=True, gpu_mem_total_bytes=40 * GIB)
    roomy = obs(16, 3.6, gpu_peak_allocated_bytes=10 * GIB, **gpu)
    assert planned(plan_trials([roomy], max_trials=3)) == [(1, 32)]
    full = obs(16, 3.6, gpu_peak_allocated_bytes=30 * GIB, **gpu)
    assert planned(plan_trials([full], max_trials=3)) == [(1, 8)]


def test_blind_spots_and_the_hint() -> None:
    from tuneup.advise.step_model import fit_step_model

    assert blind_spots(fit_step_model([ddp(16)]).terms()) == [COMPUTE, INTERFERENCE]
    assert blind_spots(fit_step_model([obs(16, 3.6), obs(32, 5.2)]).terms()) == []
    assert measure_hint() == MEASURE_HINT == "measure it: `tuneup advise --measure RUN -- COMMAND`"
    assert measure_hint(["runs/a"]) == "measure it: `tuneup advise --measure runs/a -- COMMAND`"


# -- the command line --------------------------------------------------------------------------------


def test_the_command_after_dashes_is_never_taken_for_runs() -> None:
    args = build_parser().parse_args(["advise", "--measure", "r1", "--", "python", "x.py", "--format", "md"])
    assert args.runs == ["r1"] and args.training_command == ["python", "x.py", "--format", "md"]
    assert args.format == "text"
    args = build_parser().parse_args(["advise", "r1", "r2", "--format", "md"])
    assert args.runs == ["r1", "r2"] and args.training_command == [] and not args.measure


def test_usage_errors_exit_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (["advise"], "give a run directory"),
        (["advise", "--measure"], "no command to measure"),
        (["advise", "--measure", "--"], "no command to measure"),
        (["advise", "run", "--", "python", "train.py"], "add --measure"),
        (["advise", "run", "--max-trials", "2"], "add --measure"),
        (["advise", "--measure", "--max-trials", "0", "--", "python"], "--max-trials"),
        (["advise", "--measure", "--trial-steps", "10", "--", "python"], "--trial-steps"),
    ]
    for argv, says in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, (argv, err)
    # A command that trains with no TuneupCallback records no run: one line, and where its output is.
    out = tmp_path / "m"
    argv = ["advise", "--measure", "--out", str(out), "--", sys.executable, "-c", "print('trained')"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no run was recorded" in err and "output.log" in err and err.count("\n") == 1
    # --out is a new directory: a second run there is refused before anything runs.
    assert main(argv) == 2
    assert "already holds files" in capsys.readouterr().err


def test_advice_on_a_prior_says_how_to_measure_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run", steps=60)  # one batch size
    assert main(["advise", str(run), "--no-whatif", "--format", "json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    hint = [n for n in notes if measure_hint([str(run)]) in n]
    assert len(hint) == 1 and "how compute grows with the batch" in hint[0], notes


# -- the trials, with the session's trial runner replaced --------------------------------------------


def _run_at_batch(path: Path, batch: int) -> Path:
    """A synthetic one-rank run whose steps count `batch` samples (tests/synthetic.make_run's are 8)."""
    from tests.synthetic import step_record
    from tuneup.record import RankWriter, write_manifest

    write_manifest(path, {"run_id": f"b{batch}", "created_unix": 1.0, "world_size": 1, "num_nodes": 1})
    writer = RankWriter(path, 0)
    writer.open({"host": "node0"})
    for step in range(60):
        # 8 ms: data 1, forward 1.5, backward 2, optimizer 1.5, other 2 (make_run's: 10 ms at batch 8)
        record = {**step_record(step, wall_ms=8.0), "samples": batch, "forward_ms": 1.5, "backward_ms": 2.0}
        writer.add_step({**record, "other_ms": 2.0})
    writer.close(status="completed")
    return path


def test_a_trial_out_of_memory_is_said_and_half_the_batch_measured_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuneup.advise.observe import observe
    from tuneup.report import analyze
    from tuneup.tune.advise_trials import MeasureOptions, measure_for_advice
    from tuneup.tune.session import Session
    from tuneup.tune.space import Config
    from tuneup.tune.state import INFEASIBLE, Trial

    base = make_run(tmp_path / "base", steps=60)  # batch 8 on one rank
    half = _run_at_batch(tmp_path / "half", 4)
    asked: list[int | None] = []

    def run_trial(self: Session, config: Any, role: str, predicted: Any = None) -> Trial:
        asked.append(None if config is None else config.batch_size)
        run = base if config is None else half  # None: the baseline's rerun after the trials
        trial = Trial(
            index=len(self.trials), name=role, config=config or Config(), role=role, run_dir=str(run)
        )
        if config is None:
            trial.step_ms, trial.observation = 10.0, observe(analyze(base))
        elif config.batch_size == 16:
            trial.status, trial.reason = INFEASIBLE, "out of memory: rank 0 raised OutOfMemoryError"
        else:
            trial.step_ms, trial.observation = 6.0, observe(analyze(half))
        self.trials.append(trial)
        return trial

    monkeypatch.setattr(Session, "run_trial", run_trial)
    said: list[str] = []
    measured = measure_for_advice(
        ["python", "train.py"], [(str(base), analyze(base))], MeasureOptions(out=tmp_path / "m"), said.append
    )
    assert asked == [
        16,
        4,
        None,
    ]  # twice the batch, then half once twice ran out of memory; the baseline again
    assert [t.status for t in measured.trials] == ["infeasible", "ok", "ok"]
    assert [a.run.run_id for a in measured.analyses] == ["r1", "b4", "r1"]
    assert any("infeasible: out of memory" in line for line in said)
    assert any(line.startswith("next, instead: batch 4 per rank") for line in said)
    # The model is fitted: nothing left blind; the bracket is said, and the baseline did not move.
    (note,) = measured.notes
    assert note.startswith("the baseline ran before and after the trials (A B ... A)") and "(+0%)" in note


def test_the_trials_are_bracketed_by_a_rerun_of_the_baseline_and_its_drift_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial run in a quiet moment measured 28x the baseline's samples/s: the trials ran one after another
    after the baseline, so a busy host's load moved them against it. The baseline runs again after the
    trials, within --max-trials, and the fit takes both of its runs; how far it moved is said."""
    from tuneup.advise.observe import observe
    from tuneup.report import analyze
    from tuneup.tune.advise_trials import MeasureOptions, measure_for_advice
    from tuneup.tune.session import Session
    from tuneup.tune.space import Config
    from tuneup.tune.state import Trial

    base = make_run(tmp_path / "base", steps=60)  # batch 8, 10 ms a step
    double = _run_at_batch(tmp_path / "double", 16)
    faster = _run_at_batch(tmp_path / "again", 8)  # the baseline again, 8 ms a step: the host sped up
    order: list[int | None] = []

    def run_trial(self: Session, config: Any, role: str, predicted: Any = None) -> Trial:
        order.append(None if config is None else config.batch_size)
        run = faster if config is None else double
        trial = Trial(
            index=len(self.trials), name=role, config=config or Config(), role=role, run_dir=str(run)
        )
        trial.step_ms, trial.observation = 8.0, observe(analyze(run))
        self.trials.append(trial)
        return trial

    monkeypatch.setattr(Session, "run_trial", run_trial)
    said: list[str] = []
    options = MeasureOptions(out=tmp_path / "m", max_trials=2)
    measured = measure_for_advice(["python", "train.py"], [(str(base), analyze(base))], options, said.append)
    assert order == [16, None]  # A (given) B A
    assert [a.run.run_id for a in measured.analyses] == ["r1", "b16", "b8"]
    assert any("the baseline's rerun, A B ... A" in line for line in said)  # said before it ran
    (drift,) = [n for n in measured.notes if n.startswith("the baseline ran before and after")]
    assert "10.0 ms mean step before, 8.0 ms after (-20%)" in drift and "the host's speed moved" in drift
    # With one trial allowed there is no room for the rerun: said, not hidden.
    order.clear()
    one = measure_for_advice(
        ["python", "train.py"], [(str(base), analyze(base))], MeasureOptions(out=tmp_path / "m1", max_trials=1),
        said.append,
    )  # fmt: skip
    assert order == [16] and any("the baseline was not rerun" in n for n in one.notes)


def test_a_trial_on_a_contended_host_against_a_quiet_baseline_is_said() -> None:
    from tuneup.tune.advise_trials import TrialResult, drift_notes
    from tuneup.tune.state import OK

    busy = "other processes took 77% of the CPU of host vm while it ran"

    def result(label: str, contended: str | None) -> TrialResult:
        return TrialResult(label, OK, None, Path("r"), 7.0, 134.8, contended, 64)

    rerun = TrialResult("the baseline, rerun after the trials", OK, None, Path("a"), 60.0, None, None)
    quiet_trial = drift_notes(59.6, busy, [result("batch 64", None)], replace_contended(rerun, busy))
    assert any("batch 64 ran on a quiet host and the baseline on a contended one" in n for n in quiet_trial)
    busy_trial = drift_notes(59.6, None, [result("batch 64", busy)], rerun)
    assert any("batch 64 ran on a contended host and the baseline did not" in n for n in busy_trial)
    alike = drift_notes(59.6, busy, [result("batch 64", busy)], replace_contended(rerun, busy))
    assert not any("contended" in n for n in alike)


def replace_contended(result: Any, contended: str) -> Any:
    import dataclasses

    return dataclasses.replace(result, contended=contended)


def test_one_rank_is_asked_of_a_lightningcli_script_started_directly_only() -> None:
    from tuneup.tune.advise_trials import one_rank_blocked
    from tuneup.tune.script import Script

    two = ddp(16)
    assert one_rank_blocked(Script(("python", "train.py", "fit"), "cli"), two) is None
    assert "LightningCLI" in str(one_rank_blocked(Script(("python", "train.py"), "callback"), two))
    torchrun = Script(("torchrun", "--nproc-per-node=2", "train.py", "fit"), "cli")
    assert "torchrun starts the ranks" in str(one_rank_blocked(torchrun, two))
    assert "several nodes" in str(one_rank_blocked(Script(("python", "t.py"), "cli"), ddp(16, num_nodes=2)))


def test_no_batch_at_least_as_large_as_one_out_of_memory_is_recommended() -> None:
    from tuneup.advise.model import Advice, Change, Range, Recommendation
    from tuneup.advise_cli import _within_memory

    def rec(batch: int) -> Recommendation:
        return Recommendation(
            id=f"b{batch}", title=f"Use a per-rank batch of {batch}", changes=[Change("batch_size", "16", str(batch))],
            objective="samples/s", gain=Range(0.3, 0.1, 0.5), confidence="medium", evidence=["e"], code="c", yaml=None,
        )  # fmt: skip

    advice = Advice(
        runs=["r"], objective="samples/s", min_gain=0.05, model=None, current=None,
        recommendations=[rec(64), rec(24)], considered=[],
    )  # fmt: skip
    assert _within_memory(advice, []) is advice
    kept = _within_memory(advice, [32, None])
    assert [r.id for r in kept.recommendations] == ["b24"]
    assert "batch 32 per rank ran out of memory" in kept.considered[-1].reason


# -- live: 2 gloo ranks ------------------------------------------------------------------------------


def _session_processes() -> list[int]:
    marker = f"{ENV_SESSION}=".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if (
                    marker in (entry / "environ").read_bytes()
                    and (entry / "stat").read_text().split()[2] != "Z"
                ):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_measure_on_two_ranks_runs_a_second_batch_size_and_advises_from_a_fitted_model(
    tmp_path: Path,
) -> None:
    out = tmp_path / "measure"
    proc = subprocess.run(
        [
            sys.executable, "-m", "tuneup", "advise", "--measure", "--out", str(out), "--format", "json",
            "--no-whatif", "--trial-steps", "40", "--warmup-steps", "5", "--min-steps", "20",
            "--stall-timeout", "30",
            "--", sys.executable, str(PLAIN), "--devices", "2", "--hidden", "64", "--batch-size", "16",
        ],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    advice = json.loads(proc.stdout)  # the trials' progress went to stderr: stdout is the document
    model = advice["model"]
    assert model["compute_prior"] is None  # fitted, not AdaptDL's prior
    assert model["batch_sizes"] == [16, 32] and model["world_sizes"] == [2]
    assert len(advice["runs"]) == 3  # the baseline, batch 32, the baseline again (A B A)
    # What it ran was said before it ran, and why interference stays unmeasured (a plain script's devices).
    assert "batch 32 per rank on 2 ranks" in proc.stderr and "s in all" in proc.stderr
    assert any("interference cannot be measured here" in n for n in advice["notes"])
    measured = [n for n in advice["notes"] if n.startswith("measured for this advice")]
    assert len(measured) == 3
    assert any(n.startswith("the baseline ran before and after the trials") for n in advice["notes"])
    # The trials' runs are kept, and `tuneup advise` takes them again.
    state = json.loads((out / "tune.json").read_text())
    runs = [str(out / t["run_dir"]) for t in state["trials"]]
    assert [t["config"].get("batch_size") for t in state["trials"]] == [16, 32, 16]
    assert "tuneup advise " + " ".join(runs) in proc.stderr
    assert main(["advise", *runs, "--no-whatif", "--format", "json"]) == 0
    deadline = time.monotonic() + 10
    while _session_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _session_processes() == [], "a trial's process outlived the measuring"
