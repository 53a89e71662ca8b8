"""`tuneup tune`'s parts without training: the stop rule, the space, the objective, the search (on a synthetic
workload and on recorded grids, replayed), the script's overrides and the supervisor (on small processes)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tuneup.advise.observe import Observation
from tuneup.tune.objective import Objective, ObjectiveError
from tuneup.tune.protocol import StopRule, TrialSpec, TrialSpecError, measured_enough, relative_half_width
from tuneup.tune.runner import Limits, run_supervised
from tuneup.tune.script import ScriptError, cli_script, detect_kind, parse_printed_config, read_cli_config
from tuneup.tune.search import Search, excluded
from tuneup.tune.space import Config, SearchSpace, SpaceError
from tuneup.tune.state import FAILED, INFEASIBLE, OK, Trial, TuneState, load_state, save_state


def knobs(b: int, a: int, w: int, hook: str, precision: str = "32-true") -> Config:
    """A configuration by its knobs' values (Config itself takes keywords only)."""
    return Config(batch_size=b, accumulate_grad_batches=a, num_workers=w, comm_hook=hook, precision=precision)


GRIDS = Path(__file__).parent / "data" / "tune_grids"
ORACLE = Path(__file__).parents[1] / "benchmarks" / "tune_oracle.py"

# -- the stop rule ---------------------------------------------------------------------------------------


def test_half_width_of_constant_steps_is_zero_and_of_noisy_steps_is_wide() -> None:
    assert relative_half_width([10.0] * 30) == 0.0
    assert relative_half_width([10.0] * 14) is None  # fewer than 5 blocks of 3
    noisy = [10.0 if i % 2 else 14.0 for i in range(30)]
    # Blocks of 3 alternate 34/38 ms sums: means 11.33 and 12.67; the interval is a few percent wide.
    width = relative_half_width(noisy)
    assert width is not None and 0.02 < width < 0.10


def test_stop_rule_waits_for_min_steps_and_precision() -> None:
    rule = StopRule(max_steps=200, warmup_steps=5, min_steps=20, precision=0.02)
    assert not measured_enough(rule, [10.0] * 19)
    assert measured_enough(rule, [10.0] * 20)
    drifting = [10.0 + i for i in range(40)]  # a step time that never settles
    assert not measured_enough(rule, drifting)


def test_trial_spec_round_trips_and_bad_specs_name_the_problem() -> None:
    spec = TrialSpec(
        trial="03-b32", settings={"batch_size": 32}, stop=StopRule(max_steps=50), status_dir="/x"
    )
    again = TrialSpec.from_json(spec.to_env())
    assert again == spec
    with pytest.raises(TrialSpecError, match="not JSON"):
        TrialSpec.from_json("{")
    with pytest.raises(TrialSpecError, match="precision"):
        TrialSpec.from_json(json.dumps({"trial": "x", "stop": {"precision": 2}}))


# -- the space -------------------------------------------------------------------------------------------


def test_space_enumerates_combinations_and_keeps_the_global_batch_when_asked() -> None:
    base = knobs(16, 1, 0, "allreduce")
    space = SearchSpace(batch_size=(16, 32), accumulate_grad_batches=(1, 2), num_workers=(0, 1))
    assert len(space.configs(base)) == 8
    assert space.tuned() == ("batch_size", "accumulate_grad_batches", "num_workers")
    kept = SearchSpace(batch_size=(8, 16, 32), accumulate_grad_batches=(1, 2), keep_global_batch=True)
    assert {(c.batch_size, c.accumulate_grad_batches) for c in kept.configs(base)} == {(16, 1), (8, 2)}
    # The current value is always a candidate.
    assert 16 in SearchSpace(batch_size=(32, 64)).with_baseline(base).batch_size
    with pytest.raises(SpaceError, match="--comm-hook"):
        SearchSpace(comm_hook=("zip",))
    with pytest.raises(SpaceError, match="--batch-size"):
        SearchSpace(batch_size=(0,))


# -- the objective ---------------------------------------------------------------------------------------


def test_objectives_rank_by_a_rate_and_show_their_figure() -> None:
    kw = {"usd_per_hour": 2.0, "b_noise": 100.0, "b_reference": 100.0}
    assert Objective("throughput").rate(1000.0, 100, **kw) == 1000.0
    assert Objective("throughput-per-dollar").rate(1000.0, 100, **kw) == pytest.approx(1000 * 3600 / 2)
    # Goodput at a global batch of 300 against a reference of 100 with B_noise 100: efficiency 200/400.
    assert Objective("goodput").rate(1000.0, 300, **kw) == pytest.approx(500.0)
    time_obj = Objective("time", target_samples=3.6e6)
    assert time_obj.figure(time_obj.rate(1000.0, 100, **kw)) == pytest.approx(1.0)  # hours
    steps = Objective("cost", target_steps=3600)
    # 10 steps/s -> 360 s -> 0.1 h at $2/h = $0.20
    assert steps.figure(steps.rate(1000.0, 100, **kw)) == pytest.approx(0.2)
    assert (
        Objective("throughput-per-dollar").rate(1000.0, 100, usd_per_hour=None, b_noise=None, b_reference=1)
        is None
    )
    with pytest.raises(ObjectiveError, match="needs one target"):
        Objective("time")


# -- the search on a synthetic workload ------------------------------------------------------------------


def _truth(c: Config) -> dict[str, float]:
    """A 2-rank workload: compute 1 + 0.2 ms/sample, loading 0.15 ms/sample without a worker (0.02 with one,
    which also slows compute 10%), 6 ms of exposed all-reduce a step (4 with fp16), 1 ms optimizer."""
    b, s = c.batch_size or 1, c.accumulate_grad_batches or 1
    slower = 1.1 if c.num_workers else 1.0
    compute = (1.0 + 0.2 * b) * slower
    data = (0.02 if c.num_workers else 0.15) * b
    comm = 4.0 if c.comm_hook == "fp16" else 6.0
    return {"compute": compute, "data": data, "comm": comm, "step": s * (compute + data) + comm + 1.0}


def _trial(c: Config, index: int, role: str = "search") -> Trial:
    t = _truth(c)
    s = c.accumulate_grad_batches or 1
    compute = t["compute"] * s
    obs = Observation(
        run_id=f"t{index}", batch_size=c.batch_size or 1, accumulation=s, world_size=2, num_nodes=1,
        precision="32-true", on_gpu=False, gpu_name=None, step_mean_ms=t["step"], step_median_ms=t["step"],
        data_ms=t["data"] * s, forward_ms=compute / 3, backward_ms=compute * 2 / 3 + t["comm"],
        optimizer_ms=1.0, sync_ms=0.0, other_ms=0.0, comm_ms=t["comm"], exposed_ms=t["comm"],
        comm_bytes=4e6, bucket_bytes=(4_000_000,), fits=(), backend="gloo", samples_per_s=None,
        tokens_per_sample=None, flops_per_sample=None, mfu=None, peak_tflops_per_device=None,
        usd_per_hour=1.0, devices_priced=1, parameters=1_000_000, gpu_peak_allocated_bytes=None,
        gpu_mem_total_bytes=None, cpu_count=8, ranks_per_node=2, num_workers=c.num_workers,
        pin_memory=False, persistent_workers=False,
    )  # fmt: skip
    samples = 2 * (c.batch_size or 1) * s * 1000.0 / t["step"]
    return Trial(
        index=index, name=f"{index:02d}", config=c, role=role, step_ms=t["step"], samples_per_s=samples,
        usd_per_hour=1.0, objective=samples, observation=obs,
    )  # fmt: skip


SPACE = SearchSpace(
    batch_size=(8, 16, 32, 64),
    accumulate_grad_batches=(1, 2, 4),
    num_workers=(0, 1),
    comm_hook=("allreduce", "fp16"),
)


def test_search_finds_the_synthetic_best_in_a_third_of_the_trials() -> None:
    base = knobs(16, 1, 0, "allreduce")
    configs = SPACE.configs(base)
    best = max(configs, key=lambda c: _trial(c, 0).samples_per_s or 0)
    search = Search(SPACE, base, Objective("throughput"), world_size=2)
    trials = [_trial(base, 0, "baseline")]
    while len(trials) < len(configs) // 3:
        decision = search.decide(trials)
        if decision.candidate is None:
            break
        trials.append(_trial(decision.candidate.config, len(trials)))
    found = search.best(trials)
    assert found is not None
    truth_best = _trial(best, 0).samples_per_s or 0
    assert (found.samples_per_s or 0) >= 0.95 * truth_best, [t.config.label() for t in trials]
    assert len(trials) <= len(configs) // 3


def test_search_predictions_improve_as_trials_arrive() -> None:
    """After the baseline and a trial at another batch, accumulation and workers, the model predicts an
    unseen configuration of those levels within 10%."""
    base = knobs(16, 1, 0, "allreduce")
    trials = [_trial(base, 0, "baseline"), _trial(knobs(64, 2, 1, "allreduce"), 1)]
    search = Search(SPACE, base, Objective("throughput"), world_size=2)
    target = knobs(32, 2, 1, "allreduce")
    predicted = search.model(trials).predict(target)
    assert predicted.value == pytest.approx(_truth(target)["step"], rel=0.10)
    assert predicted.low <= _truth(target)["step"] <= predicted.high


def test_out_of_memory_rules_out_larger_batches_and_dropped_knobs_their_values() -> None:
    base = knobs(16, 1, 0, "allreduce")
    oom = Trial(index=1, name="01", config=knobs(64, 1, 0, "allreduce"), role="search", status=INFEASIBLE)
    assert excluded(knobs(64, 2, 1, "allreduce"), [oom], base, ()) is not None
    assert excluded(knobs(32, 2, 1, "allreduce"), [oom], base, ()) is None
    assert excluded(knobs(32, 1, 1, "allreduce"), [], base, ("num_workers",)) is not None
    assert excluded(knobs(32, 1, 0, "allreduce"), [], base, ("num_workers",)) is None


def test_search_stops_when_nothing_left_could_gain_enough() -> None:
    base = knobs(16, 1, 0, "allreduce")
    tiny = SearchSpace(batch_size=(16,), num_workers=(0, 1))
    search = Search(tiny, base, Objective("throughput"), world_size=2)
    trials = [_trial(base, 0, "baseline"), _trial(knobs(16, 1, 1, "allreduce"), 1)]
    decision = search.decide(trials)
    assert decision.candidate is None and "tried or ruled out" in decision.reason


# -- recorded grids, replayed (benchmarks/tune_oracle.py) ------------------------------------------------


def _oracle() -> object:
    spec = importlib.util.spec_from_file_location("tune_oracle", ORACLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("grid", sorted(p.name for p in GRIDS.glob("*.json")))
def test_recorded_grid_replay_reaches_095_of_the_best_in_a_third_of_the_trials(grid: str) -> None:
    oracle = _oracle()
    _, rows, space = oracle.load_grid(GRIDS / grid)  # type: ignore[attr-defined]
    assert len(rows) >= 12
    scores = []
    for seed in range(10):
        score, used, _, _ = oracle.replay_one(rows, space, seed, 1 / 3)  # type: ignore[attr-defined]
        assert used <= len(rows) // 3
        scores.append(score)
    assert sum(s >= 0.95 for s in scores) >= 8, scores


def test_grids_were_recorded() -> None:
    assert len(list(GRIDS.glob("*.json"))) >= 2


# -- the script ------------------------------------------------------------------------------------------


def test_lightningcli_overrides_come_from_the_resolved_config(tmp_path: Path) -> None:
    config = {
        "trainer": {"accumulate_grad_batches": 1, "precision": None, "callbacks": None},
        "model": {"lr": 0.1},
        "data": {"class_path": "x.Data", "init_args": {"batch_size": 16}},
    }
    script = cli_script(["python", "main.py", "fit"], config)
    assert script.overrides["batch_size"] == "data.init_args.batch_size"
    assert "num_workers" not in script.overrides  # the datamodule takes none: the callback applies it
    assert script.add_callback
    base = knobs(16, 1, 0, "allreduce")
    argv, settings = script.trial_argv(knobs(32, 2, 1, "allreduce"), base)
    assert argv[3:] == [
        "--trainer.callbacks+=tuneup.TuneupCallback",
        "--data.init_args.batch_size=32",
        "--trainer.accumulate_grad_batches=2",
    ]
    assert settings == {"num_workers": 1}
    with_callback = cli_script(
        ["m.py"], {**config, "trainer": {"callbacks": [{"class_path": "tuneup.TuneupCallback"}]}}
    )
    assert not with_callback.add_callback


def test_script_kind_is_read_from_the_source(tmp_path: Path) -> None:
    cli = tmp_path / "cli.py"
    cli.write_text("from lightning.pytorch.cli import LightningCLI\nLightningCLI()\n")
    plain = tmp_path / "plain.py"
    plain.write_text("import lightning\n")
    assert detect_kind(["python", str(cli), "fit"]) == "cli"
    assert detect_kind(["python", str(plain)]) == "callback"
    assert detect_kind(["torchrun", "--nproc-per-node=2", str(cli)]) == "cli"


_LOGO = "\n\x1b[0;35m\n                    ####\n##############################################\n#####  ####\n\x1b[0m\n\n"
_CONFIG = "# pytorch_lightning==2.6.6\nseed_everything: 1234\ntrainer:\n  accelerator: cpu\ndata:\n  batch_size: 32\n"


def test_a_lightningcli_config_is_read_after_a_logo_printed_before_it(tmp_path: Path) -> None:
    """Lightning's own examples call cli_lightning_logo() before LightningCLI(...): --print_config prints an
    ASCII logo (with colour codes) and then the YAML. It was refused as 'no LightningCLI configuration', with
    the advice to pass --script-kind callback."""
    script = tmp_path / "cli_example.py"
    script.write_text(
        "# a LightningCLI script\nimport sys\n"
        f"assert sys.argv[-1] == '--print_config'\nprint({_LOGO!r})\nprint({_CONFIG!r})\n"
    )
    config = read_cli_config([sys.executable, str(script)], os.environ)
    assert config["seed_everything"] == 1234
    assert cli_script(["x.py"], config).overrides["batch_size"] == "data.batch_size"
    assert parse_printed_config(_CONFIG) == {
        "seed_everything": 1234,
        "trainer": {"accelerator": "cpu"},
        "data": {"batch_size": 32},
    }
    assert parse_printed_config(_LOGO) is None


def test_a_script_that_prints_no_config_is_told_what_was_missing(tmp_path: Path) -> None:
    script = tmp_path / "not_cli.py"
    script.write_text("print('hello: world')\n")
    with pytest.raises(ScriptError, match="no YAML mapping with a 'trainer' section"):
        read_cli_config([sys.executable, str(script)], os.environ)
    failing = tmp_path / "failing.py"
    failing.write_text("raise SystemExit('unrecognized arguments: --print_config')\n")
    with pytest.raises(ScriptError, match=r"--print_config failed \(exit 1: unrecognized arguments"):
        read_cli_config([sys.executable, str(failing)], os.environ)


# -- the state -------------------------------------------------------------------------------------------


def test_state_round_trips_through_tune_json(tmp_path: Path) -> None:
    state = TuneState(command=["python", "x.py"], script_kind="callback", objective="throughput", space=SPACE)
    state.trials.append(_trial(knobs(16, 1, 0, "allreduce"), 0, "baseline"))
    state.trials.append(
        Trial(index=1, name="01", config=Config(batch_size=64), role="search", status=FAILED, reason="hang")
    )
    save_state(tmp_path, state)
    again = load_state(tmp_path)
    assert again.as_dict() == state.as_dict()
    assert again.trials[0].observation == state.trials[0].observation
    assert again.trials[0].status == OK


# -- the supervisor --------------------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    from pathlib import Path
    status = Path(sys.argv[1]); mode = sys.argv[2]
    # A grandchild in the same session, as a rank or a DataLoader worker would be.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (status / "child.pid").write_text(str(child.pid))
    (status / "heartbeat-rank0").write_text("1")
    if mode == "fail":
        time.sleep(0.5)
        (status / "failed-rank1.json").write_text(json.dumps({"rank": 1, "type": "RuntimeError", "message": "boom",
                                                              "out_of_memory": False}))
        time.sleep(600)
    elif mode == "hang":
        time.sleep(600)
    elif mode == "refuse":
        (status / "applied.json").write_text(json.dumps({"applied": {}, "not_applied": {"batch_size": "no attribute"}}))
        time.sleep(600)
    elif mode == "exit":
        sys.exit(0)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


@pytest.mark.parametrize("mode", ["fail", "hang", "exit", "refuse"])
def test_supervisor_ends_the_whole_tree(tmp_path: Path, mode: str) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    status = tmp_path / "status"
    status.mkdir()
    started = time.monotonic()
    finished = run_supervised(
        [sys.executable, str(script), str(status), mode],
        dict(os.environ),
        status,
        Limits(startup_s=30, stall_s=2.0, trial_s=60, grace_s=1.0, poll_s=0.05),
        settings=("batch_size",),
    )
    took = time.monotonic() - started
    expected = {"fail": "failed on a rank", "hang": "hang", "exit": "exited", "refuse": "not applied"}[mode]
    assert finished.ended == expected, finished
    if mode == "fail":
        assert "rank 1 raised RuntimeError: boom" in (finished.reason or "")
        assert took < 5
    if mode == "hang":
        assert 2.0 <= took < 8
    if mode == "refuse":
        assert finished.not_applied == {"batch_size": "no attribute"} and took < 5
    deadline = time.monotonic() + 5
    child = int((status / "child.pid").read_text())
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the grandchild outlived its trial"


def test_supervisor_reports_a_command_that_cannot_start(tmp_path: Path) -> None:
    finished = run_supervised(["/no/such/program"], dict(os.environ), tmp_path, Limits())
    assert finished.ended == "failed to start" and "/no/such/program" in (finished.reason or "")


def test_tune_refuses_bad_options_with_exit_2(tmp_path: Path) -> None:
    def tune(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tuneup", "tune", *args], capture_output=True, text=True, check=False
        )

    no_cmd = tune("--out", str(tmp_path / "a"))
    assert no_cmd.returncode == 2 and "no command to tune" in no_cmd.stderr
    dollars = tune("--objective", "throughput-per-dollar", "--", "python", "x.py")
    assert dollars.returncode == 2 and "needs a price" in dollars.stderr
    steps = tune("--trial-steps", "20", "--", "python", "x.py")
    assert steps.returncode == 2 and "--trial-steps 20" in steps.stderr
    hook = tune("--comm-hook", "zip", "--out", str(tmp_path / "b"), "--", sys.executable, "-c", "pass")
    assert hook.returncode == 2 and "--comm-hook" in hook.stderr
    resume = tune("--resume", str(tmp_path / "none"))
    assert resume.returncode == 2 and "not a tuning directory" in resume.stderr


def test_the_winner_is_the_simplest_of_the_configurations_measured_as_good_as_the_best() -> None:
    base = knobs(16, 1, 0, "allreduce")
    search = Search(SPACE, base, Objective("throughput"), world_size=2)
    simple, busy = knobs(64, 1, 0, "allreduce"), knobs(64, 2, 1, "fp16")
    trials = [_trial(base, 0, "baseline"), _trial(simple, 1), _trial(busy, 2)]
    trials[0].samples_per_s = 500.0
    trials[1].samples_per_s, trials[2].samples_per_s = 1000.0, 1020.0  # 2% apart: within the tie
    assert search.best(trials) is trials[2]
    assert search.winner(trials) is trials[1]
    trials[2].samples_per_s = 1100.0  # 10% apart: a difference worth its changes
    assert search.winner(trials) is trials[2]


def test_a_trial_left_unfinished_by_a_killed_session_is_kept_aside_not_read(tmp_path: Path) -> None:
    from tuneup.tune.script import Script
    from tuneup.tune.session import Session, TuneOptions

    stale = tmp_path / "trials" / "00-baseline"
    stale.mkdir(parents=True)
    (stale / "failed-rank1.json").write_text(
        json.dumps({"rank": 1, "type": "RuntimeError", "message": "old"})
    )
    state = TuneState(command=[sys.executable, "-c", "pass"], script_kind="callback", objective="throughput")
    session = Session(
        tmp_path,
        state,
        Script((sys.executable, "-c", "pass"), "callback"),
        TuneOptions(Objective("throughput")),
    )
    trial = session.run_trial(None, "baseline")
    assert trial.status == FAILED and "no run was recorded" in (trial.reason or "")  # not the old failure
    kept = [p.name for p in (tmp_path / "trials").iterdir() if ".unfinished-" in p.name]
    assert len(kept) == 1 and (tmp_path / "trials" / kept[0] / "failed-rank1.json").is_file()
    assert load_state(tmp_path).trials[0].status == FAILED  # saved as it ended


def test_confirmation_runs_are_held_to_the_minutes_budget(tmp_path: Path) -> None:
    from tuneup.tune.script import Script
    from tuneup.tune.session import Budget, Session, TuneOptions

    base = knobs(16, 1, 0, "allreduce")
    state = TuneState(command=["x"], script_kind="callback", objective="throughput", space=SPACE)
    state.trials = [_trial(base, 0, "baseline"), _trial(knobs(64, 2, 0, "allreduce"), 1)]
    for t in state.trials:
        t.wall_s = 60.0
    options = TuneOptions(Objective("throughput"), budget=Budget(max_minutes=2.5))
    session = Session(tmp_path, state, Script(("x",), "callback"), options)
    ran: list[Config] = []
    session.run_trial = lambda config, role, predicted=None: ran.append(config)  # type: ignore[assignment, method-assign, misc, return-value]
    result = session.confirm(session.search(), None)
    assert ran == []  # 2 minutes spent and a 1-minute run would pass 2.5
    assert "2.5 minutes" in result["confirmation_cut"]
    assert result["kept_current"] is True and result["verdict"] == "INCONCLUSIVE"


def test_a_trial_is_priced_before_its_objective_is_known() -> None:
    """The per-dollar objective of a trial is computed from the price its own run recorded (a first run of
    `--objective throughput-per-dollar` once failed for want of a price: only scored trials were read)."""
    from tuneup.tune.search import economy_of, rate_of

    base = knobs(16, 1, 0, "allreduce")
    trial = _trial(base, 0, "baseline")
    trial.objective, trial.usd_per_hour = None, 3.6
    economy = economy_of([trial], 2, base)
    assert economy.usd_per_hour == 3.6
    assert rate_of(Objective("throughput-per-dollar"), economy, base, 1000.0) == pytest.approx(1e6)


# -- the confirmation's one figure -----------------------------------------------------------------------


def _confirmed_session(
    tmp_path: Path, objective: Objective, base: list[float], best: list[float]
) -> TuneState:
    """A session whose confirmation measured these rates (samples/s): the first of each side is the trial
    the search ran, the rest the confirmation's reruns."""
    from tuneup.tune.script import Script
    from tuneup.tune.session import Session, TuneOptions

    base_config, best_config = knobs(16, 1, 0, "allreduce"), knobs(64, 1, 0, "allreduce")
    state = TuneState(command=["x"], script_kind="callback", objective=objective.name, space=SPACE)
    state.options.update(
        target_samples=objective.target_samples,
        target_tokens=objective.target_tokens,
        target_steps=objective.target_steps,
    )

    def ran(index: int, config: Config, role: str, rate: float) -> Trial:
        return Trial(index=index, name=f"{index:02d}", config=config, role=role, samples_per_s=rate)

    state.trials = [ran(0, base_config, "baseline", base[0]), ran(1, best_config, "search", best[0])]
    reruns = {id(base_config): iter(base[1:]), id(best_config): iter(best[1:])}
    session = Session(tmp_path, state, Script(("x",), "callback"), TuneOptions(objective, confirm_runs=2))

    def run_trial(config: Config, role: str, predicted: object = None) -> Trial:
        rate = next(reruns[id(base_config) if config == base_config else id(best_config)])
        trial = ran(len(state.trials), config, role, rate)
        state.trials.append(trial)
        session._score(trial)
        return trial

    session.run_trial = run_trial  # type: ignore[assignment, method-assign]
    for t in state.trials:
        session._score(t)
    state.result = session.confirm(session.search(), None)
    return state


@pytest.mark.parametrize("objective", [Objective("throughput"), Objective("time", target_samples=3.6e6)])
def test_the_confirmation_gives_one_figure_with_its_interval_and_its_test(
    tmp_path: Path, objective: Objective
) -> None:
    """The summary once said "measured throughput +3.2% [+1.6%, +16.4%]" (a ratio of medians) and then
    "samples/s 6.8% higher (p = 0.048)" (of geometric means) for one comparison. Here the medians differ
    by +6.0% and the geometric means by +8.1%: one of them, once, under the objective's name."""
    from tuneup.tune.render import format_tune_text

    state = _confirmed_session(tmp_path, objective, [100.0, 101.0, 99.0], [106.0, 105.5, 113.0])
    assert state.result is not None and state.result["verdict"] == "IMPROVEMENT"
    text = format_tune_text(state)
    name = objective.name
    shown = re.search(rf"{name} ([+-]\d+\.\d)% \[([+-]\d+\.\d)%, ([+-]\d+\.\d)%\]", text)
    tested = re.search(rf"verdict: improvement: {name} (\d+\.\d)% (higher|lower) \(p = ", text)
    assert shown and tested, text
    gain, low, high = (float(g) for g in shown.groups())
    assert low <= gain <= high
    assert abs(gain) == float(tested.group(1))
    assert (gain > 0) == (tested.group(2) == "higher") == objective.higher_is_better
    # The geometric means' ratio, in the objective's direction (time: 1/1.081 - 1 = -7.5%).
    assert abs(gain) == pytest.approx(8.1 if objective.higher_is_better else 7.5, abs=0.05)
    assert "samples/s" not in text.split("verdict:")[1].splitlines()[0]  # the objective's name, not a rate's


def test_the_gain_interval_holds_its_point_and_agrees_with_the_test() -> None:
    """For random confirmations: the interval is ordered and holds the gain, and it leaves out no change
    exactly when the one-sided Welch test on logs says p < alpha in the direction the data moved."""
    import random

    from tuneup.compare.stats import welch
    from tuneup.tune.session import GAIN_CONFIDENCE, geometric_gain

    rng = random.Random(7)
    for _ in range(300):
        n_a, n_b = rng.randint(2, 5), rng.randint(2, 5)
        shift, noise = rng.uniform(-0.3, 0.3), rng.uniform(0.001, 0.2)
        base = [1000.0 * math.exp(rng.gauss(0.0, noise)) for _ in range(n_a)]
        cand = [1000.0 * math.exp(shift + rng.gauss(0.0, noise)) for _ in range(n_b)]
        found = geometric_gain(base, cand, GAIN_CONFIDENCE)
        assert found is not None and found[1] is not None and found[2] is not None
        gain, low, high = found
        assert -1.0 < low <= gain <= high
        test = welch([math.log(v) for v in base], [math.log(v) for v in cand])
        p = test.p_b_greater if gain > 0 else test.p_b_less
        if abs(p - (1 - GAIN_CONFIDENCE) / 2) > 1e-6:
            assert (low > 0 or high < 0) == (p < (1 - GAIN_CONFIDENCE) / 2)


def test_trial_steps_means_the_same_in_tune_and_advise_measure() -> None:
    """`advise --help` said 'most optimizer steps a trial runs', `tune --help` 'most training steps' (a batch
    stepping two optimizers counted once): the same trial machinery, two definitions, 2x apart on a GAN."""
    import argparse

    from tuneup.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    helps = {
        name: next(a.help for a in commands[name]._actions if "--trial-steps" in a.option_strings)
        for name in ("tune", "advise")
    }
    defaults_cut = {name: text.split(" (default: ")[0] for name, text in helps.items()}
    assert defaults_cut["tune"] == defaults_cut["advise"]
    assert "a batch stepping two optimizers is one" in defaults_cut["advise"]
