"""`tuneup compare A B --target ...`: runs ranked by their time and $ to a quality target, beside samples/s;
and `tuneup advise --target`'s statement of the goodput model against the recorded curve."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from test_convergence import write_run

from tuneup.cli import main
from tuneup.compare.to_target import (
    RunToTarget,
    compare_to_target,
    side_figure,
    side_to_target,
)
from tuneup.record.schema import MANIFEST_FILE

USD_PER_HOUR = 36.0

# -- constructed figures ------------------------------------------------------------------------------


def reached(run_id: str, hours: float) -> RunToTarget:
    return RunToTarget(run_id, "reached", "reached", 100.0, hours, hours, hours, hours * USD_PER_HOUR,
                       hours * USD_PER_HOUR, hours * USD_PER_HOUR)  # fmt: skip


def projected(run_id: str, hours: float, low: float, high: float | None) -> RunToTarget:
    return RunToTarget(
        run_id, "projected", "power law in steps: fitted", 300.0, hours, low, high,
        hours * USD_PER_HOUR, low * USD_PER_HOUR, None if high is None else high * USD_PER_HOUR,
    )  # fmt: skip


def plateau(run_id: str) -> RunToTarget:
    return RunToTarget(run_id, "not_projected", "no improvement over the last 5 validations")


def side(name: str, runs: list[RunToTarget], rate: float) -> Any:
    return side_to_target(name, runs, [rate] * len(runs), "samples/s")


def test_projected_faster_although_lower_samples_per_s_says_both_figures() -> None:
    """The issue's sentence: B is faster to the target although its samples/s is lower; A reached it."""
    t = compare_to_target(
        "val_loss<=2.1",
        side("baseline", [reached("a", 0.61)], 1000.0),
        side("candidate", [projected("b", 0.42, 0.38, 0.47)], 880.0),
        min_effect=0.05,
    )
    assert t.faster == "candidate" and t.time_ratio == pytest.approx(0.61 / 0.42)
    assert t.throughput_ratio == pytest.approx(0.88) and t.figures_agree is False
    assert "the candidate reaches it in 0.42 h [0.38 h, 0.47 h] and $15.12" in t.verdict
    assert "the baseline in 0.61 h and $21.96 (reached)" in t.verdict
    assert "1.45x faster to the target although its samples/s is 12% lower" in t.verdict
    assert "samples/s alone would rank the baseline first" in t.verdict
    assert not t.regression  # the candidate is the faster one


def test_slower_to_the_target_fails_only_when_measured_or_apart() -> None:
    """Both reached: a measured slowdown beyond the minimum effect is a regression. A projection whose
    interval overlaps the other figure is reported, not failed; one that lies wholly beyond it fails."""
    base = side("baseline", [reached("a", 0.40)], 1000.0)
    both = compare_to_target(
        "val_loss<=2", base, side("candidate", [reached("b", 0.60)], 1200.0), min_effect=0.05
    )
    assert both.regression and both.faster == "baseline" and both.figures_agree is False
    assert "although its samples/s is 17% lower" in both.verdict
    overlapping = compare_to_target(
        "val_loss<=2", base, side("candidate", [projected("b", 0.60, 0.35, 0.9)], 1000.0), min_effect=0.05
    )
    assert overlapping.faster == "baseline" and not overlapping.regression
    assert "not a regression: a projection's interval overlaps" in overlapping.verdict
    assert "at about the same samples/s" in overlapping.verdict and overlapping.figures_agree is None
    apart = compare_to_target(
        "val_loss<=2", base, side("candidate", [projected("b", 0.60, 0.5, None)], 1000.0), min_effect=0.05
    )
    assert apart.regression  # its interval starts after the baseline's measured time
    within = compare_to_target(
        "val_loss<=2", base, side("candidate", [reached("b", 0.41)], 1000.0), min_effect=0.05
    )
    assert not within.regression and within.faster is None and "about as fast" in within.verdict


def test_neither_reached_nor_projected_gives_no_verdict_on_it() -> None:
    t = compare_to_target(
        "val_acc>=0.99",
        side("baseline", [plateau("a")], 1000.0),
        side("candidate", [RunToTarget("b", "not_projected", "too few values (3) to fit")], 1100.0),
        min_effect=0.05,
    )
    assert t.faster is None and t.time_ratio is None and not t.regression
    assert "neither side reached it nor can be projected" in t.verdict
    assert "no improvement over the last 5 validations" in t.verdict and "too few values (3)" in t.verdict
    assert "the throughput verdict stands" in t.verdict
    one = compare_to_target(
        "val_acc>=0.99", side("baseline", [reached("a", 0.3)], 1.0), side("candidate", [plateau("b")], 1.0),
        min_effect=0.05,
    )  # fmt: skip
    assert one.faster is None and not one.regression and "no ratio" in one.verdict


def test_several_runs_a_side_take_the_median_of_those_that_reached_it() -> None:
    base = side("baseline", [reached("a1", 0.5), reached("a2", 0.7), reached("a3", 0.6)], 100.0)
    cand = side("candidate", [reached("b1", 0.2), plateau("b2"), reached("b3", 0.4)], 90.0)
    assert (base.status, base.reached, base.hours, base.hours_low, base.hours_high) == (
        "reached",
        3,
        0.6,
        0.5,
        0.7,
    )
    assert (cand.reached, cand.hours) == (2, pytest.approx(0.3))
    assert cand.reasons == ("no improvement over the last 5 validations",)
    assert "median of the 2 of 3 runs that reached it" in side_figure(cand)
    t = compare_to_target("val_loss<=1", base, cand, min_effect=0.05)
    assert t.faster == "candidate" and t.time_ratio == pytest.approx(2.0)
    # With none reached, the projections' medians (and of their bounds; open above if any is).
    proj = side("candidate", [projected("b1", 1.0, 0.8, 1.2), projected("b2", 2.0, 1.5, None)], 1.0)
    assert (proj.status, proj.hours, proj.hours_low, proj.hours_high) == ("projected", 1.5, 1.15, None)


# -- the command on written runs ------------------------------------------------------------------------


def written_run(path: Path, run_id: str, rate: float, **extra: Any) -> Path:
    """A run through the real writer (test_convergence.write_run: 2 s steps, 8 samples each), val_loss
    falling as 1 + 4/sqrt(rate x step), priced at USD_PER_HOUR."""
    write_run(path, metrics=lambda _r, s: {"val_loss": 1.0 + 4.0 * (s * rate) ** -0.5}, **extra)
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    manifest.update(run_id=run_id, pricing={"price_per_hour": USD_PER_HOUR})
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))
    return path


def test_the_command_prints_both_figures_writes_json_and_exits_1_when_slower(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both reach val_loss<=1.4 (the fast one at step 100, the slow one at step 200: recorded every 20)."""
    fast = written_run(tmp_path / "fast", "fast", 1.0)
    slow = written_run(tmp_path / "slow", "slow", 0.5)
    out = tmp_path / "c.json"
    md = tmp_path / "c.md"
    code = main(
        [
            "compare",
            str(fast),
            str(slow),
            "--target",
            "val_loss<=1.4",
            "--json",
            str(out),
            "--markdown",
            str(md),
        ]
    )
    text = capsys.readouterr().out
    assert code == 1  # measured on both sides, the candidate 2x slower: it fails like a regression
    assert "to the target val_loss<=1.4:" in text
    assert "the baseline is 2.00x faster to the target" in text
    assert "4.00 samples/s" in text  # the samples/s beside it
    doc = json.loads(out.read_text())
    t = doc["target"]
    assert doc["regression"] is True and t["regression"] is True and t["faster"] == "baseline"
    assert t["baseline"]["status"] == "reached" and t["candidate"]["status"] == "reached"
    # step 100 of 2 s steps after the run's start; dollars at the recorded price
    assert t["baseline"]["hours"] == pytest.approx(200 / 3600)
    assert t["baseline"]["usd"] == pytest.approx(200 / 3600 * USD_PER_HOUR)
    assert t["candidate"]["per_run"][0]["step"] == 200
    assert t["time_ratio"] == pytest.approx(2.0)
    assert "slower to the target" in md.read_text()
    # The other way round, the candidate is faster: exit 0.
    assert main(["compare", str(slow), str(fast), "--target", "val_loss<=1.4"]) == 0
    # Without --target, nothing of it (and no JSON key's value).
    assert main(["compare", str(fast), str(slow), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["target"] is None


def test_a_target_no_run_logged_or_cannot_read_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = written_run(tmp_path / "a", "a", 1.0)
    b = written_run(tmp_path / "b", "b", 0.5)
    assert main(["compare", str(a), str(b), "--target", "val_los<=1.4"]) == 2
    assert "'val_los', which this run did not log; it logged val_loss" in capsys.readouterr().err
    assert main(["compare", str(a), str(b), "--target", "val_loss=1.4"]) == 2
    assert "cannot read the target" in capsys.readouterr().err


# -- two real runs: a bigger batch, more samples/s, more steps to the target -----------------------------


def _real_run(run_dir: Path, namespace: str, batch: int, lr: float) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    from tuneup import TuneupCallback

    from workloads.tiny import lightning_namespace, make_trainer

    L = lightning_namespace(namespace)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 8, generator=g)  # two Gaussian blobs: learnable, not random labels
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 2)

        def training_step(self, b, _i):  # type: ignore[no-untyped-def]
            # A step's compute grows with its batch, as on a real model: a tiny Linear's does not. The fixed
            # part is what a bigger batch amortizes: without it the two runs' samples/s differed by the
            # trainer's own ~1 ms a step, which a sleep's overshoot on a busy host could cancel (the bigger
            # batch came out within 5% of the smaller, twice in CI).
            time.sleep(COMPUTE_S_PER_STEP + len(b[0]) * COMPUTE_S_PER_SAMPLE)
            return torch.nn.functional.cross_entropy(self.net(b[0]), b[1])

        def validation_step(self, b, _i):  # type: ignore[no-untyped-def]
            logits = self.net(b[0])
            self.log("val_loss", torch.nn.functional.cross_entropy(logits, b[1]))
            self.log("val_acc", (logits.argmax(-1) == b[1]).float().mean())

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=lr)

    torch.manual_seed(0)
    data = TensorDataset(x, y)
    trainer = make_trainer(
        namespace,
        [
            TuneupCallback(
                dirpath=run_dir, price_per_hour=USD_PER_HOUR, telemetry_interval_s=0.5, target=TARGET
            )
        ],
        max_steps=STEPS,
        val_check_interval=5,
        limit_val_batches=1,
        num_sanity_val_steps=0,
    )
    trainer.fit(
        Classifier(),
        DataLoader(data, batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(1)),
        DataLoader(data, batch_size=256),
    )


STEPS = 90
TARGET = "val_loss<=0.35"  # at lr 0.2, batch 16 reaches it near step 20; at lr 0.05, batch 128 near step 70
COMPUTE_S_PER_SAMPLE = 0.0002
COMPUTE_S_PER_STEP = 0.004  # batch 16: 7.2 ms a step, batch 128: 29.6 ms, so about 1.9x the samples/s


@pytest.fixture(scope="module", params=["lightning", "pytorch_lightning"])
def real_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(small, big): batch 16 at lr 0.2, and batch 128 at lr 0.05 (its learning rate not scaled up with it)."""
    root = tmp_path_factory.mktemp(f"real-{request.param}")
    small, big = root / "small", root / "big"
    _real_run(small, request.param, batch=16, lr=0.2)
    _real_run(big, request.param, batch=128, lr=0.05)
    return small, big


# The real runs' samples/s decide a verdict here: on a loaded machine the bigger batch's lead shrank below
# the 5% the comparison needs (3 failures in parallel passes), so they run in the timing pass, alone; the
# tests that share the module's real runs run there too, so the runs are trained once.
@pytest.mark.timing
def test_two_real_runs_ranked_by_time_to_target_and_by_samples_per_s(
    real_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Done-when: the bigger batch trains more samples a second and needs more steps to the target;
    compare ranks the small batch first by time to the target and says both figures, and that they
    disagree."""
    small, big = real_runs
    out = tmp_path / "c.json"
    code = main(["compare", str(small), str(big), "--target", TARGET, "--json", str(out)])
    text = capsys.readouterr().out
    t = json.loads(out.read_text())["target"]
    b, c = t["baseline"], t["candidate"]
    assert (b["status"], c["status"]) == ("reached", "reached"), text
    assert c["samples_per_s"] > b["samples_per_s"]  # the bigger batch: more samples a second
    assert c["per_run"][0]["step"] > b["per_run"][0]["step"]  # and more steps to the target
    assert t["faster"] == "baseline" and c["hours"] > b["hours"]
    assert t["figures_agree"] is False
    assert "the baseline is" in text and "x faster to the target although its samples/s is" in text
    assert "samples/s alone would rank the candidate first" in text
    assert code == 1  # both reached it: slower to the target fails the comparison


@pytest.mark.timing
def test_advise_says_how_the_goodput_model_stands_against_the_recorded_curves(
    real_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """One rank measures no noise scale: the law S = S_min(1 + B_noise/B) still bounds the bigger batch's
    steps at or below the small batch's; the recorded big-batch run took more, which the statement calls a
    contradiction (its learning rate changed), not a fit."""
    small, big = real_runs
    assert main(["advise", str(small), str(big), "--target", TARGET, "--format", "json", "--no-whatif"]) == 0
    check = json.loads(capsys.readouterr().out)["convergence_check"]
    assert check["status"] == "reached" and check["global_batch"] == 16 and check["b_noise"] is None
    step = check["step"]
    assert check["predicted_step_high"] == pytest.approx(step)  # B_noise far below the batch: no fewer steps
    assert check["predicted_step_low"] == pytest.approx(step * 16 / check["proposed_batch"])
    (other,) = check["others"]
    assert other["global_batch"] == 128 and other["step"] > step and other["within"] is False
    assert other["implied_b_noise"] is None
    assert any("contradict" in line and "which no B_noise gives" in line for line in check["lines"])
    assert main(["advise", str(small), "--target", TARGET, "--no-whatif"]) == 0
    text = capsys.readouterr().out
    assert (
        f"convergence check ({TARGET}): this run, at a global batch of 16, reached it at step {step:,.0f}"
        in text
    )
    assert "gradient noise scale was not measured" in text
    assert main(["advise", str(small), "--target", "val_f1>=0.9", "--no-whatif"]) == 2


def test_the_law_and_the_implied_noise_scale() -> None:
    """S = S_min(1 + B_noise/B): 100 steps at B 16 with B_noise 48 is S_min 25, so B 64 takes 43.75; the
    two points give back B_noise 48. A bigger batch taking more steps fits no B_noise."""
    from tuneup.advise.convergence import implied_b_noise, steps_range, steps_ratio

    assert 100 * steps_ratio(16, 64, 48) == pytest.approx(43.75)
    assert implied_b_noise(100, 16, 43.75, 64) == pytest.approx(48)
    assert implied_b_noise(100, 16, 120, 64) is None
    assert steps_range(100, 16, 64, None, None) == pytest.approx((25, 100))
    low, high = steps_range(100, 16, 64, 24, 96)
    assert (low, high) == pytest.approx((100 * steps_ratio(16, 64, 96), 100 * steps_ratio(16, 64, 24)))


def test_sets_of_runs_compare_the_medians_and_list_each_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs a side (directories of runs, as compare takes them): a side's figure is the median of its
    runs that reached the target, and each run's own figure is listed under it."""
    for name, rates in (("base", (1.0, 0.8)), ("cand", (0.5, 2.0 / 9.0))):
        for i, rate in enumerate(rates):
            written_run(tmp_path / name / f"r{i}", f"{name}{i}", rate)
    out = tmp_path / "c.json"
    code = main(["compare", str(tmp_path / "base"), str(tmp_path / "cand"), "--target", "val_loss<=1.4",
                 "--json", str(out)])  # fmt: skip
    text = capsys.readouterr().out
    t = json.loads(out.read_text())["target"]
    # val_loss = 1 + 4/sqrt(rate x step) <= 1.4 at rate x step >= 100, recorded every 20 steps of 2 s:
    # base at steps 100 and 140, cand at 200 and 460 (past its 200 steps: projected, not reached).
    assert (t["baseline"]["reached"], t["candidate"]["reached"]) == (2, 1)
    assert t["baseline"]["hours"] == pytest.approx((100 + 140) / 2 * 2 / 3600)
    assert t["candidate"]["hours"] == pytest.approx(200 * 2 / 3600)  # the one that reached it
    assert "median of the 2 of 2 runs that reached it" in text
    assert "median of the 1 of 2 runs that reached it" in text
    assert "cand1: projected at step" in text and "cand0: reached at step 200" in text
    assert code == 1  # both sides measured, the candidate slower


@pytest.mark.timing
def test_tune_states_the_model_against_the_trials_curves(
    real_runs: tuple[Path, Path], tmp_path: Path
) -> None:
    """A `time` objective whose baseline and best trials recorded the callback's target: the tuning report
    (and the terminal text, given the directory) carries the same statement as advise."""
    import shutil

    from test_tune_render import _state

    from tuneup.tune.render import format_tune_text, write_tune_report
    from tuneup.tune.state import save_state

    small, big = real_runs
    state = _state(objective="time", target_samples=1_000_000.0)
    tune_dir = tmp_path / "tune"
    tune_dir.mkdir()
    save_state(tune_dir, state)
    best = next(t for t in state.trials if t.index == state.result["best_trial"])  # type: ignore[index]
    shutil.copytree(small, tune_dir / str(state.trials[0].run_dir))
    shutil.copytree(big, tune_dir / str(best.run_dir))
    text = format_tune_text(state, tune_dir)
    assert f"convergence check ({TARGET}): this run, at a global batch of 16, reached it" in text
    assert "at a global batch of 128, reached it" in text and "contradict" in text
    written = write_tune_report(tune_dir, None, "md,json")
    md = next(p for p in written if p.suffix == ".md").read_text()
    assert "Goodput model against the recorded curve" in md
    doc = json.loads(next(p for p in written if p.suffix == ".json").read_text())
    assert doc["convergence_check"]["others"][0]["global_batch"] == 128
    # The throughput objective says nothing of it.
    assert "convergence check" not in format_tune_text(_state(), tune_dir)
