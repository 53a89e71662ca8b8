"""The advice's held-out misses (issue 25), each at its cause: the two-run fit giving back its own runs, a
measured setting judged by its measurement, one batch size's honest interval and its cap, one named
objective, the noise scale's one verdict, precision read from the run, and the YAML in the text output.
Synthetic observations and one recorded run without training."""

from __future__ import annotations

import dataclasses

import pytest

from tests.synthetic import make_run
from tests.test_advise import obs
from tuneup.advise import AdviceOptions, advise, batch, precision
from tuneup.advise.context import AdviceContext
from tuneup.advise.model import Advice, Change, Range, Recommendation, Setting
from tuneup.advise.observe import Observation
from tuneup.advise.outcomes import Economics
from tuneup.advise.step_model import fit_step_model, observed_setting
from tuneup.analyze.model import NoiseScale, RunAnalysis
from tuneup.analyze.noise_scale import noise_verdict
from tuneup.report import analyze
from tuneup.report.advice import advice_text
from tuneup.report.sections import noise_scale as noise_section


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> RunAnalysis:
    return analyze(make_run(tmp_path_factory.mktemp("cases") / "run", steps=60))


def context(analysis: RunAnalysis, runs: list[Observation]) -> AdviceContext:
    base = runs[0]
    return AdviceContext(
        analysis=analysis,
        observation=base,
        model=fit_step_model(runs),
        economics=Economics(None, None, None, base.samples_per_step),
        objective="samples/s",
        model_observations=runs,
    )


def considered(ctx: AdviceContext) -> dict[str, str]:
    return {c.knob: c.reason for c in ctx.considered}


# -- the two-run fit gives back its runs ------------------------------------------------------------------


# Batch 32 and 64: the data wait falls as the batch grows (the workers hide more behind a longer compute),
# the loop's own time grows (per-sample metrics). Averaged across the runs, as the model once did, each run
# came back off by half the difference.
def run(batch_size: int, compute_ms: float, data_ms: float, other_ms: float, **kw: object) -> Observation:
    """A one-rank run whose step is its phases' sum (2 ms optimizer unless given)."""
    optimizer = float(kw.pop("optimizer_ms", 2.0))  # type: ignore[arg-type]
    step = data_ms + compute_ms + optimizer + other_ms
    return obs(
        batch_size,
        compute_ms,
        data_ms=data_ms,
        other_ms=other_ms,
        optimizer_ms=optimizer,
        step_mean_ms=step,
        **kw,
    )


B32 = run(32, 20.0, data_ms=10.0, other_ms=1.0)
B64 = run(64, 36.0, data_ms=4.0, other_ms=3.0, optimizer_ms=2.6)


def test_the_two_run_fit_gives_back_each_of_its_runs() -> None:
    model = fit_step_model([B32, B64])
    for run in (B32, B64):
        assert model.predict(observed_setting(run)).mean_ms.value == pytest.approx(run.step_mean_ms, rel=1e-9)
    assert model.fit_error == pytest.approx(0.0, abs=1e-9)


def test_a_measured_setting_is_recommended_as_measured(recorded: RunAnalysis) -> None:
    # "Use a per-rank batch of 64: +19.5%" although the batch-64 run given had measured +31.9%.
    measured = (64 / B64.step_mean_ms) / (32 / B32.step_mean_ms) - 1
    # Where the model misses the run (here: its phases do not add up to its step), the measurement wins.
    off = dataclasses.replace(B64, step_mean_ms=B64.step_mean_ms * 0.9, step_median_ms=B64.step_mean_ms * 0.9)
    for runs, gain in (
        ([B32, B64], measured),
        ([B32, off], (64 / off.step_mean_ms) / (32 / B32.step_mean_ms) - 1),
    ):
        ctx = context(recorded, runs)
        p = ctx.predict(Setting(64, 1, 1, "32-true", 0))
        assert p.measured_run == "b64"
        assert p.samples_per_s.value / ctx.baseline(p).samples_per_s.value - 1 == pytest.approx(
            gain, rel=1e-9
        )
        (rec,) = batch.recommend(ctx)
        if rec.title == "Use a per-rank batch of 64":
            assert rec.gain.value == pytest.approx(gain, rel=1e-9) and rec.gain.low < gain < rec.gain.high
            assert rec.confidence == "high" and "measured: run b64" in rec.evidence[0]
        else:  # a larger batch predicted better still: the 64 is listed with its measured gain
            assert f"+{gain:.1%}" in considered(ctx)["Use a per-rank batch of 64"]


# -- one batch size ------------------------------------------------------------------------------------------


def test_one_batch_size_holds_every_term_fixed_or_proportional() -> None:
    # 256 -> 1024 was predicted +71% [+11, +240] and measured +6% and +20%: the loop's time and the data
    # wait grew with the batch, and compute faster than it. 8 -> 32 was predicted +129% and measured
    # +277%: almost all of the step was fixed.
    one = run(256, 40.0, data_ms=10.0, other_ms=8.0)
    model = fit_step_model([one])
    step, optimizer = one.step_mean_ms, one.optimizer_ms
    for k in (2, 4):
        p = model.predict(Setting(256 * k, 1, 1)).mean_ms
        assert p.high >= k * (step - optimizer) + optimizer  # every term proportional: no gain at all
        assert p.low <= step  # every term fixed: k times the samples/s
    assert model.predict(Setting(1024, 1, 1)).mean_ms.high >= 4 * (step - optimizer) * 2**0.25


def test_one_batch_size_is_a_hypothesis_to_measure_not_beyond_twice(recorded: RunAnalysis) -> None:
    ctx = context(recorded, [run(8, 2.0, data_ms=0.5, other_ms=6.0)])
    recs = batch.recommend(ctx)
    reasons = considered(ctx)
    assert (
        "beyond 2x" in reasons["batch_size 8 → 32"]
        and "tuneup advise --measure" in reasons["batch_size 8 → 32"]
    )
    assert all(r.changes[0].proposed in ("4", "16") for r in recs)
    for rec in recs:
        assert rec.confidence == "low" and rec.caveats[0].startswith("a hypothesis")
        assert "tuneup advise --measure -- COMMAND" in rec.caveats[0]
    if not recs:
        assert "tuneup advise --measure" in reasons["batch_size 8 → 16"]


# -- one objective, named ---------------------------------------------------------------------------------


def noise(b_simple: float | None, low: float | None = None, high: float | None = None) -> NoiseScale:
    return NoiseScale(
        method="DDP bucket norms before/after all-reduce", small_batch=8, big_batch=16, steps=100,
        b_simple=b_simple, ci_low=low, ci_high=high, grad_sq=-1.0 if b_simple is None else 1.0,
        trace_sigma=1.0, series_step=[], series_b_simple=[], ema_steps=10.0, comm_hook=None, notes=[],
    )  # fmt: skip


def test_one_objective_named_whatever_the_order_of_the_runs(recorded: RunAnalysis) -> None:
    measured = dataclasses.replace(recorded, noise_scale=noise(40.0, 30.0, 50.0))
    for runs in ([measured, recorded], [recorded, measured]):
        advice = advise(runs, AdviceOptions(whatif=False))
        assert advice.objective == "goodput"
        assert advice.notes[0].startswith("objective: goodput") and "B_simple is about 40" in advice.notes[0]
        assert all(r.objective == "goodput" for r in advice.recommendations)
    alone = advise([recorded], AdviceOptions(whatif=False))
    assert alone.objective == "samples/s" and alone.notes[0].startswith(
        "objective: samples/s for every figure"
    )


# -- the noise scale's verdict, shared ------------------------------------------------------------------


def test_measured_without_signal_is_not_called_not_measured(recorded: RunAnalysis) -> None:
    # A 2-rank DDP run on random labels: measured, and the mean |G|² came out negative.
    verdict = noise_verdict(noise(None), recorded.run)
    assert verdict.kind == "no signal" and verdict.b_simple is None
    advice = advise([dataclasses.replace(recorded, noise_scale=noise(None))], AdviceOptions(whatif=False))
    assert "came out with no signal" in advice.notes[0] and "not measured" not in " ".join(advice.notes)
    # The report's headline says the same.
    assert noise_section.b_simple_text(noise(None)).startswith("no signal")


def test_not_measured_says_why_in_the_report_and_the_advice(recorded: RunAnalysis) -> None:
    one_rank = dataclasses.replace(recorded.run, world_size=1, accumulate_grad_batches=1)
    verdict = noise_verdict(None, one_rank)
    assert verdict.kind == "not measured" and "one rank without gradient accumulation" in verdict.text
    fsdp = noise_verdict(None, dataclasses.replace(one_rank, strategy="FSDPStrategy"))
    assert "FSDP" in fsdp.text
    analysis = dataclasses.replace(recorded, run=one_rank, noise_scale=None)
    (paragraph,) = noise_section.blocks(analysis, [])
    assert "one rank without gradient accumulation" in paragraph.text  # type: ignore[attr-defined]
    advice = advise([analysis], AdviceOptions(whatif=False))
    assert "one rank without gradient accumulation" in advice.notes[0]
    assert noise_verdict(noise(40.0, 30.0, None), recorded.run).kind == "lower bound"


# -- precision read from the run ---------------------------------------------------------------------------


def test_bf16_on_a_cpu_without_bf16_arithmetic_is_told_32_true(recorded: RunAnalysis) -> None:
    # A bf16-mixed run on a CPU without AVX512-BF16 or AMX was told "keep 32-true"; 32-true measured +63%
    # (8,304 against 5,090 samples/s). Compute is most of such a step.
    run = obs(32, 30.0, precision="bf16-mixed", cpu_bf16=False)
    ctx = context(recorded, [run])
    (rec,) = precision.recommend(ctx)
    assert rec.id == "precision.fp32_on_cpu" and "precision='32-true'" in rec.code
    assert rec.changes == [Change("precision", "bf16-mixed", "32-true")]
    assert rec.gain.low < 8304 / 5090 - 1 < rec.gain.high
    has = context(recorded, [dataclasses.replace(run, cpu_bf16=True)])
    assert precision.recommend(has) == [] and "keep it" in considered(has)["precision"]
    fp32 = context(recorded, [obs(32, 30.0, precision="32-true", cpu_bf16=False)])
    assert precision.recommend(fp32) == [] and "a CPU run in 32-true" in considered(fp32)["precision"]


# -- the YAML in the text output ------------------------------------------------------------------------------


def test_text_output_prints_the_lightningcli_yaml() -> None:
    # The README says `tuneup advise` prints a LightningCLI YAML fragment; only --format json had it.
    rec = Recommendation(
        id="batch.size", title="Use a per-rank batch of 64", changes=[Change("batch_size", "32", "64")],
        objective="samples/s", gain=Range(0.2, 0.1, 0.3), confidence="medium", evidence=["e"],
        code="trainer = Trainer()", yaml="data:\n  init_args:\n    batch_size: 64",
    )  # fmt: skip
    advice = Advice(
        runs=["r1"], objective="samples/s", min_gain=0.05, model=None, current=None, recommendations=[rec],
        considered=[],
    )  # fmt: skip
    lines = advice_text(advice)
    at = lines.index("   or in a LightningCLI config (YAML):")
    assert lines[at + 1 : at + 4] == ["     data:", "       init_args:", "         batch_size: 64"]


def test_a_change_to_what_the_run_has_is_never_recommended(recorded: RunAnalysis) -> None:
    ctx = context(recorded, [B32])
    same = ctx.predict(ctx.setting)
    rec = ctx.recommendation("x", "x", [Change("batch_size", "32", "32")], same, ["e"], ("code", None))
    assert rec is None and considered(ctx)["batch_size 32 → 32"] == "the run already has this setting"
