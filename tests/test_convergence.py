"""The convergence section: logged metrics against steps, hours, samples and dollars, best and since, plateau,
divergence, spikes, ranks drifting apart, and the time and cost to a target (reached, or projected)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from tuneup.analyze.analysis import analyze_run
from tuneup.analyze.convergence import PLATEAU_EVALUATIONS, metric_direction
from tuneup.analyze.model import RunAnalysis, from_json
from tuneup.cli import main
from tuneup.cost.options import CostOptions
from tuneup.cost.pricing import PriceChoice
from tuneup.record import RankWriter, load_run, write_manifest
from tuneup.record.schema import MetricRecord
from tuneup.target import parse_target

T0 = 1_000_000.0  # the run's start, unix seconds
STEP_S = 2.0  # every step takes this long
BATCH = 8  # samples per step per rank
USD_PER_HOUR = 36.0
PRICE = CostOptions(price=PriceChoice(price_per_hour=USD_PER_HOUR, source="command line"))

Metrics = Callable[[int, int], dict[str, float]]  # (rank, step) -> the values logged at that step


def _t(step: int) -> float:
    """When `step` optimizer steps were done."""
    return T0 + step * STEP_S


def write_run(
    path: Path,
    *,
    steps: int = 200,
    ranks: int = 1,
    every: int = 20,
    metrics: Metrics | None = None,
    loss: Callable[[int, int], float] | None = None,
    grad_norm: Callable[[int], float | None] | None = None,
    target: str | None = None,
) -> Path:
    """A run recorded through the real writer: `steps` steps of STEP_S each on every rank, and at every
    `every`-th step the values `metrics` gives, as validation metrics with their samples."""
    manifest = {"run_id": "conv", "created_unix": T0, "world_size": ranks, "num_nodes": 1}
    if target is not None:
        manifest["recording"] = {"target": target}
    write_manifest(path, manifest)
    for rank in range(ranks):
        w = RankWriter(path, rank)
        w.open({"host": "node0", "start_unix": T0})
        for s in range(steps):
            w.add_step(
                {
                    "step": s,
                    "epoch": 0,
                    "t_end": _t(s + 1),
                    "wall_ms": STEP_S * 1000,
                    "data_ms": 100.0,
                    "forward_ms": 600.0,
                    "backward_ms": 900.0,
                    "optimizer_ms": 300.0,
                    "other_ms": 100.0,
                    "micro_batches": 1,
                    "samples": BATCH,
                    "loss": loss(rank, s) if loss else 2.0 - s * 0.001,
                    "grad_norm": grad_norm(s) if grad_norm else None,
                }
            )
            done = s + 1
            if metrics is not None and done % every == 0:
                for name, value in metrics(rank, done).items():
                    w.add_metric(MetricRecord(name, value, done, _t(done), "validation", 0, done * BATCH))
        w.close(status="completed")
    return path


def analysis_of(path: Path, target: str | None = None, cost: CostOptions | None = PRICE) -> RunAnalysis:
    return analyze_run(load_run(path), cost, target=parse_target(target) if target else None)


def falling(rank: int, step: int) -> dict[str, float]:
    """val_loss falls as a power law, val_acc rises, both noiseless."""
    return {"val_loss": 1.0 + 4.0 * step**-0.5, "val_acc": 1.0 - 2.0 * step**-0.5}


def test_direction_from_the_name() -> None:
    assert metric_direction("val_loss") == "lower"
    assert metric_direction("val/perplexity") == "lower"
    assert metric_direction("val_acc") == "higher"
    assert metric_direction("valid_f1_macro") == "higher"
    assert metric_direction("dice_loss") == "lower"  # a loss word wins
    assert metric_direction("lr") == "unknown"
    assert metric_direction("val_wer") == "lower"
    assert metric_direction("answer_length") == "unknown"  # "wer" inside a word is not a word error rate
    assert metric_direction("heatmap_peak") == "unknown"


def test_best_and_since_in_every_unit(tmp_path: Path) -> None:
    # val_loss bottoms out at step 100 and rises after: the best is there, and since then the run spent 100
    # steps, 200 s and 200 s at $36/h.
    def vshape(rank: int, step: int) -> dict[str, float]:
        return {"val_loss": 1.0 + abs(step - 100) / 100}

    conv = analysis_of(write_run(tmp_path / "r", metrics=vshape)).convergence
    assert conv is not None
    (curve,) = conv.metrics
    assert curve.direction == "lower" and curve.source == "validation"
    assert curve.step == list(range(20, 201, 20))
    assert curve.best is not None and curve.best.step == 100 and curve.best.value == pytest.approx(1.0)
    assert curve.best.hours == pytest.approx(100 * STEP_S / 3600)
    assert curve.best.usd == pytest.approx(100 * STEP_S / 3600 * USD_PER_HOUR)
    assert curve.best.samples == 100 * BATCH
    assert curve.evaluations_since_best == 5 and curve.steps_since_best == 100
    assert curve.hours_since_best == pytest.approx(100 * STEP_S / 3600)
    assert curve.usd_since_best == pytest.approx(100 * STEP_S / 3600 * USD_PER_HOUR)
    assert curve.hours == pytest.approx([s * STEP_S / 3600 for s in curve.step])


def test_plateau_after_n_validations_and_not_before(tmp_path: Path) -> None:
    def flat_after(best_at: int) -> Metrics:
        return lambda rank, step: {"val_loss": 1.0 + max(0, best_at - step) / 100}

    evaluations = 200 // 20
    late = analysis_of(write_run(tmp_path / "a", metrics=flat_after(200 - 20 * (PLATEAU_EVALUATIONS - 1))))
    assert late.convergence is not None and not late.convergence.metrics[0].plateau
    assert "metric_plateau" not in {f.id for f in late.findings}
    best_at = 200 - 20 * PLATEAU_EVALUATIONS
    early = analysis_of(write_run(tmp_path / "b", metrics=flat_after(best_at)))
    curve = early.convergence.metrics[0]  # type: ignore[union-attr]
    assert curve.plateau and curve.evaluations_since_best == PLATEAU_EVALUATIONS < evaluations
    (finding,) = [f for f in early.findings if f.id == "metric_plateau"]
    assert f"step {best_at:,}" in finding.evidence and "$" in finding.evidence


def test_nan_is_divergence(tmp_path: Path) -> None:
    def blows_up(rank: int, step: int) -> dict[str, float]:
        return {"val_loss": math.nan if step >= 160 else 2.0 - step / 1000}

    analysis = analysis_of(write_run(tmp_path / "r", metrics=blows_up))
    curve = analysis.convergence.metrics[0]  # type: ignore[union-attr]
    assert curve.nonfinite_steps == [160, 180, 200]
    assert curve.values[-1] is None and curve.best is not None and curve.best.step == 140
    assert any(f.id == "metric_nonfinite" and "160" in f.evidence for f in analysis.findings)


def test_a_spike_is_found_and_noise_is_not(tmp_path: Path) -> None:
    rng = random.Random(0)

    def noisy(spike: bool) -> Metrics:
        def values(rank: int, step: int) -> dict[str, float]:
            value = 2.0 - step / 1000 + rng.gauss(0, 0.005)
            return {"val_loss": value + (1.0 if spike and step == 500 else 0.0)}

        return values

    quiet = analysis_of(write_run(tmp_path / "a", steps=600, every=10, metrics=noisy(False)))
    assert quiet.convergence.metrics[0].spike_steps == []  # type: ignore[union-attr]
    loud = analysis_of(write_run(tmp_path / "b", steps=600, every=10, metrics=noisy(True)))
    assert loud.convergence.metrics[0].spike_steps == [500]  # type: ignore[union-attr]
    assert any(f.id == "metric_spike" for f in loud.findings)


def test_ranks_drifting_apart_and_not(tmp_path: Path) -> None:
    rng = random.Random(1)

    def together(rank: int, step: int) -> float:
        return 2.0 - step / 1000 + rng.gauss(0, 0.05)

    def apart(rank: int, step: int) -> float:
        return 2.0 - step / 1000 + rank * step / 500 + rng.gauss(0, 0.05)

    same = analysis_of(write_run(tmp_path / "a", ranks=2, loss=together)).convergence
    assert same is not None and same.loss_spread is not None and not same.loss_spread.drifting
    drift = analysis_of(write_run(tmp_path / "b", ranks=2, loss=apart))
    spread = drift.convergence.loss_spread  # type: ignore[union-attr]
    assert spread is not None and spread.drifting and spread.spread[-1] > spread.spread[0]
    assert any(f.id == "rank_loss_drift" for f in drift.findings)


def test_grad_norm_series_and_spike(tmp_path: Path) -> None:
    analysis = analysis_of(
        write_run(tmp_path / "r", grad_norm=lambda s: 50.0 if s == 150 else 1.0 + s / 1000)
    )
    gn = analysis.convergence.grad_norm  # type: ignore[union-attr]
    assert gn is not None and gn.source == "grad_norm" and len(gn.step) == 200
    assert gn.spike_steps == [150]
    assert any(f.id == "grad_norm_spike" for f in analysis.findings)


def test_target_reached_is_the_first_row_meeting_it(tmp_path: Path) -> None:
    path = write_run(tmp_path / "r", metrics=falling)
    analysis = analysis_of(path, "val_acc>=0.8")
    outcome = analysis.convergence.target  # type: ignore[union-attr]
    assert outcome is not None and outcome.status == "reached" and outcome.given_by == "command line"
    # The run's own history, read from metrics.jsonl: its first row with val_acc >= 0.8.
    rows = [json.loads(line) for line in (path / "rank-0" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r["name"] == "val_acc" and r["value"] >= 0.8)
    p = outcome.reached
    assert p is not None
    assert (p.step, p.value, p.samples) == (first["step"], first["value"], first["samples"])
    assert p.hours == pytest.approx((first["t"] - T0) / 3600)
    assert p.usd == pytest.approx((first["t"] - T0) / 3600 * USD_PER_HOUR)


def test_target_without_a_price_says_so(tmp_path: Path) -> None:
    analysis = analysis_of(write_run(tmp_path / "r", metrics=falling), "val_acc>=0.8", cost=None)
    conv = analysis.convergence
    assert conv is not None and conv.usd_per_hour is None and conv.not_priced_reason
    assert conv.target is not None and conv.target.reached is not None and conv.target.reached.usd is None
    assert all(u is None for u in conv.metrics[0].usd)


def test_target_not_reached_is_projected_with_hours_and_dollars(tmp_path: Path) -> None:
    pytest.importorskip("tuneup.analyze.projection")
    rng = random.Random(3)

    def noisy(rank: int, step: int) -> dict[str, float]:
        return {"val_loss": 1.0 + 4.0 * step**-0.5 + rng.gauss(0, 0.002)}

    analysis = analysis_of(write_run(tmp_path / "r", steps=400, every=10, metrics=noisy), "val_loss<=1.15")
    conv = analysis.convergence
    assert conv is not None and conv.s_per_step == pytest.approx(STEP_S, rel=0.01)
    outcome = conv.target
    assert outcome is not None and outcome.status == "projected", outcome.reason
    # The law reaches 1.15 at step (4/0.15)^2 = 711.
    assert outcome.step_low is not None and outcome.step_low <= 711 * 1.1
    assert outcome.step_high is None or outcome.step_high >= 711 * 0.9
    # From the last value's hours on, at the steady step time: the projected step's hours.
    assert outcome.hours == pytest.approx(outcome.step * STEP_S / 3600, rel=0.01)  # type: ignore[operator]
    assert outcome.usd == pytest.approx(outcome.hours * USD_PER_HOUR)  # type: ignore[operator]
    assert outcome.form


def test_a_plateau_is_not_projected(tmp_path: Path) -> None:
    pytest.importorskip("tuneup.analyze.projection")
    analysis = analysis_of(
        write_run(tmp_path / "r", metrics=lambda rank, step: {"val_loss": max(1.5, 2.0 - step / 100)}),
        "val_loss<=1.0",
    )
    outcome = analysis.convergence.target  # type: ignore[union-attr]
    assert outcome is not None and outcome.status == "not_projected" and outcome.step is None
    assert "plateau" in outcome.reason


def test_the_target_the_callback_recorded_is_the_default(tmp_path: Path) -> None:
    analysis = analysis_of(write_run(tmp_path / "r", metrics=falling, target="val_acc>=0.8"))
    outcome = analysis.convergence.target  # type: ignore[union-attr]
    assert outcome is not None and outcome.given_by == "callback" and outcome.status == "reached"


def test_report_in_every_format_with_a_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "r", metrics=falling)
    out = tmp_path / "report"
    assert (
        main(["report", str(run), "-o", str(out), "--target", "val_acc>=0.8", "--price-per-hour", "36"]) == 0
    )
    names = {p.name for p in out.iterdir()}
    assert {f"convergence_{axis}.png" for axis in ("steps", "hours", "samples", "usd")} <= names
    page = (out / "report.html").read_text()
    assert 'id="convergence"' in page and 'type="radio"' in page and "<script" not in page
    assert "val_acc&gt;=0.8 reached at step 100" in page
    markdown = (out / "report.md").read_text()
    assert "convergence_hours.png" in markdown and "convergence_usd.png" in markdown
    document = json.loads((out / "report.json").read_text())
    assert document["convergence"]["target"]["reached"]["step"] == 100
    assert from_json(document).convergence.target.reached.step == 100  # type: ignore[union-attr]
    capsys.readouterr()
    assert main(["show", str(run), "--target", "val_acc>=0.8", "--price-per-hour", "36"]) == 0
    shown = capsys.readouterr().out
    assert "target: val_acc>=0.8 reached at step 100" in shown and "val_loss: best" in shown


def test_unknown_metric_and_malformed_target_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(tmp_path / "r", metrics=falling)
    out = ["-o", str(tmp_path / "o")]
    for command, extra in (("show", []), ("report", out)):
        assert main([command, str(run), "--target", "val_f1>=0.9", *extra]) == 2
        err = capsys.readouterr().err
        assert "'val_f1'" in err and "val_acc, val_loss" in err
        assert main([command, str(run), "--target", "val_acc=>0.9", *extra]) == 2
        assert "cannot read the target" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before anything was written


@pytest.mark.parametrize("namespace", ["lightning", "pytorch_lightning"])
def test_a_real_lightning_run_reaches_its_target(
    tmp_path: Path, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tiny classifier that logs val_loss and val_acc, recorded by the callback: `--target val_acc>=0.9`
    gives the first recorded validation value that met it, as the run's own metrics.jsonl has it."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    from tuneup import TuneupCallback

    from workloads.tiny import lightning_namespace, make_trainer

    L = lightning_namespace(namespace)
    g = torch.Generator().manual_seed(0)
    # Two Gaussian blobs: learnable within a few dozen steps, not random labels.
    x = torch.randn(512, 8, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 2)

        def training_step(self, batch, _i):  # type: ignore[no-untyped-def]
            xb, yb = batch
            loss = torch.nn.functional.cross_entropy(self.net(xb), yb)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, _i):  # type: ignore[no-untyped-def]
            xb, yb = batch
            logits = self.net(xb)
            self.log("val_loss", torch.nn.functional.cross_entropy(logits, yb))
            self.log("val_acc", (logits.argmax(-1) == yb).float().mean())

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    data = TensorDataset(x, y)
    run_dir = tmp_path / "run"
    trainer = make_trainer(
        namespace,
        [TuneupCallback(dirpath=run_dir, telemetry_interval_s=0.5)],
        max_steps=60,
        val_check_interval=5,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        log_every_n_steps=5,
    )
    trainer.fit(
        Classifier(),
        DataLoader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1)),
        DataLoader(data, batch_size=128),
    )
    rows = [json.loads(line) for line in (run_dir / "rank-0" / "metrics.jsonl").read_text().splitlines()]
    names = {r["name"] for r in rows}
    assert {"val_loss", "val_acc"} <= names, names
    first = next(r for r in rows if r["name"] == "val_acc" and r["value"] is not None and r["value"] >= 0.9)
    analysis = analyze_run(load_run(run_dir), PRICE, target=parse_target("val_acc>=0.9"))
    conv = analysis.convergence
    assert conv is not None
    assert {c.name for c in conv.metrics} >= {"val_loss", "val_acc"}
    outcome = conv.target
    assert outcome is not None and outcome.status == "reached" and outcome.reached is not None
    p = outcome.reached
    assert (p.step, p.value) == (first["step"], pytest.approx(first["value"]))
    start = analysis.run.start_unix
    assert start is not None and p.hours == pytest.approx((first["t"] - start) / 3600)
    assert p.usd == pytest.approx(p.hours * USD_PER_HOUR)
    val_acc = next(c for c in conv.metrics if c.name == "val_acc")
    assert val_acc.source == "validation" and val_acc.best is not None and val_acc.best.value >= 0.9
    capsys.readouterr()
    assert main(["show", str(run_dir), "--target", "val_acc>=0.9", "--price-per-hour", "36"]) == 0
    assert f"target: val_acc>=0.9 reached at step {first['step']:,}" in capsys.readouterr().out


def test_a_nan_training_loss_is_divergence(tmp_path: Path) -> None:
    # steps.jsonl writes a non-finite loss as null (JSON has no NaN): the writer's nonfinite_loss event,
    # recorded at the first such step of each rank, is what tells it from a loss never measured.
    path = write_run(
        tmp_path / "r", ranks=2, loss=lambda rank, step: math.inf if rank == 1 and step >= 120 else 2.0
    )
    run = load_run(path)
    assert all(s.loss is None for s in run.ranks[1].steps[120:])  # as written: null
    assert [e["step"] for e in run.ranks[1].events if e.get("kind") == "nonfinite_loss"] == [120]
    analysis = analyze_run(run, PRICE)
    conv = analysis.convergence
    assert conv is not None and (conv.train_loss_nonfinite_step, conv.train_loss_nonfinite_rank) == (120, 1)
    assert any(f.id == "metric_nonfinite" and "step 120" in f.title for f in analysis.findings)


def test_a_target_gives_an_unknown_metric_its_direction(tmp_path: Path) -> None:
    path = write_run(tmp_path / "r", metrics=lambda rank, step: {"score": step / 200})
    assert analysis_of(path).convergence.metrics[0].best is None  # type: ignore[union-attr]
    conv = analysis_of(path, "score>=0.5").convergence
    assert conv is not None and conv.metrics[0].direction == "higher" and conv.metrics[0].best is not None
    assert conv.target is not None and conv.target.reached is not None and conv.target.reached.step == 100
