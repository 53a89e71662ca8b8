"""The advice: the step-time model's fit and predictions (synthetic workloads with known terms, and real
runs recorded on an NVIDIA H200), the recommendations' threshold and evidence, the report's section, and
`tuneup advise` on the command line."""

from __future__ import annotations

import json
import math
import tarfile
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from tests.archives import extract_all
from tests.synthetic import make_run
from tuneup.advise import AdviceOptions, advise
from tuneup.advise.model import Range, Setting
from tuneup.advise.observe import Observation
from tuneup.advise.outcomes import Economics, outcome, relative_gain
from tuneup.advise.precision import compute_scale
from tuneup.advise.step_model import (
    _solve_gamma,
    fit_step_model,
    overlapped_ms,
    sync_ms,
    with_link,
)
from tuneup.analyze.model import CollectiveFit, from_json
from tuneup.cli import main
from tuneup.report import analyze, build_report, report_schema, write_report

SWEEP = Path(__file__).parent / "data" / "h200_sweep.tgz"


def obs(batch: int, compute_ms: float, accumulation: int = 1, world: int = 1, **kw: object) -> Observation:
    """A run whose micro-batch computes `compute_ms` (a third forward, two thirds backward)."""
    fwd, bwd = compute_ms / 3 * accumulation, compute_ms * 2 / 3 * accumulation
    fields: dict[str, object] = dict(
        run_id=f"b{batch}", batch_size=batch, accumulation=accumulation, world_size=world, num_nodes=1,
        precision="32-true", on_gpu=False, gpu_name=None, step_mean_ms=0.0, step_median_ms=0.0,
        data_ms=0.0, forward_ms=fwd, backward_ms=bwd, optimizer_ms=2.0, sync_ms=0.0, other_ms=0.5,
        comm_ms=None, exposed_ms=None, comm_bytes=None, bucket_bytes=(), fits=(), backend=None,
        samples_per_s=None, tokens_per_sample=None, flops_per_sample=None, mfu=None,
        peak_tflops_per_device=None, usd_per_hour=None, devices_priced=None, parameters=1000,
        gpu_peak_allocated_bytes=None, gpu_mem_total_bytes=None, cpu_count=8, ranks_per_node=world,
        num_workers=0, pin_memory=False, persistent_workers=False,
    )  # fmt: skip
    fields.update(kw)
    # The step clock's backward holds the wait for exposed collectives.
    fields["backward_ms"] = bwd + float(fields.get("exposed_ms") or 0.0)  # type: ignore[arg-type]
    step = float(fields["data_ms"]) + fwd + float(fields["backward_ms"]) + 2.5  # type: ignore[arg-type]
    fields.setdefault("step_mean_ms", step)
    if not fields["step_mean_ms"]:
        fields["step_mean_ms"] = step
    if not fields["step_median_ms"]:
        fields["step_median_ms"] = fields["step_mean_ms"]
    return Observation(**fields)  # type: ignore[arg-type]


# -- the step-time model -----------------------------------------------------------------------------


def test_a_linear_workload_is_recovered_and_predicted_exactly() -> None:
    # compute = 4 ms + 0.5 ms per sample
    runs = [obs(b, 4.0 + 0.5 * b) for b in (8, 16, 32)]
    model = fit_step_model(runs)
    assert model.line.intercept_ms == pytest.approx(4.0)
    assert model.line.slope_ms == pytest.approx(0.5)
    assert model.line.prior is None
    for batch, accumulation in ((24, 1), (64, 1), (16, 4)):
        # Per micro-batch: compute and the loop's 0.5 ms; per step: the optimizer's 2 ms.
        want = accumulation * (4.0 + 0.5 * batch + 0.5) + 2.0
        got = model.predict(Setting(batch, accumulation, 1)).mean_ms
        assert got.value == pytest.approx(want)
        assert got.low < want < got.high


def test_one_batch_size_uses_adaptdls_prior_and_a_wider_interval() -> None:
    model = fit_step_model([obs(16, 20.0)])
    assert model.line.prior is not None and "AdaptDL" in model.line.prior
    assert model.line.intercept_ms == pytest.approx(10.0)  # half the compute
    p = model.predict(Setting(32, 1, 1)).mean_ms
    # Compute 20 ms (fixed) to 40 ms (proportional), plus 2.5 ms of optimizer and other.
    assert p.value == pytest.approx(32.5)
    assert p.low <= 22.5 and p.high >= 42.5
    fitted = fit_step_model([obs(8, 14.0), obs(16, 20.0), obs(32, 32.0)]).predict(Setting(32, 1, 1)).mean_ms
    assert fitted.high - fitted.low < p.high - p.low


def test_runs_of_different_models_are_refused() -> None:
    with pytest.raises(ValueError, match="not the same workload"):
        fit_step_model([obs(8, 10.0), obs(16, 20.0, parameters=5000)])


def test_overlap_gamma_round_trips() -> None:
    for gamma in (1.0, 1.5, 3.0, 8.0):
        combined = overlapped_ms(10.0, 6.0, gamma)
        assert _solve_gamma(10.0, 6.0, combined - 10.0) == pytest.approx(gamma, rel=1e-3)
    assert _solve_gamma(10.0, 6.0, 6.0) == 1.0  # nothing overlapped
    assert overlapped_ms(10.0, 6.0, 1.0) == pytest.approx(16.0)


def test_sync_time_follows_the_ring_model() -> None:
    fit = CollectiveFit("all_reduce", alpha_us=10.0, beta_ns_per_byte=1.0, busbw_gbytes_per_s=1.0,
                        r_squared=1.0, points=10, sizes=3, notes=[])  # fmt: skip
    # 2 ranks: 2(p-1) = 2 latency steps and 2(p-1)/p = 1 pass of the bytes per bucket
    assert sync_ms([fit], [1e6], 2) == pytest.approx((2 * 10e-6 + 1e6 * 1e-9) * 1000)
    # 4 ranks: 6 latency steps, 1.5 passes
    assert sync_ms([fit], [1e6], 4) == pytest.approx((6 * 10e-6 + 1.5e6 * 1e-9) * 1000)
    assert sync_ms([fit], [1e6], 4, bytes_factor=0.5) < sync_ms([fit], [1e6], 4)  # type: ignore[operator]
    assert sync_ms([fit], [1e6], 1) == 0.0


def test_world_size_prediction_uses_the_link_and_the_gradient_size() -> None:
    model = fit_step_model([obs(8, 10.0, parameters=10_000_000), obs(16, 18.0, parameters=10_000_000)])
    fit = CollectiveFit("all_reduce", alpha_us=50.0, beta_ns_per_byte=0.1, busbw_gbytes_per_s=10.0,
                        r_squared=1.0, points=10, sizes=3, notes=[])  # fmt: skip
    linked = with_link(model, [fit], 40_000_000)
    assert sum(linked.bucket_bytes) == pytest.approx(40_000_000)
    assert linked.bucket_bytes[0] == 1024 * 1024  # DDP's small first bucket
    two = linked.predict(Setting(16, 1, 2))
    one = linked.predict(Setting(16, 1, 1))
    assert two.mean_ms.value > one.mean_ms.value
    # Overlap unknown: the interval spans none to complete.
    assert two.mean_ms.high - two.mean_ms.low > one.mean_ms.high - one.mean_ms.low


def test_interference_is_measured_against_a_one_rank_run() -> None:
    fit = CollectiveFit("all_reduce", alpha_us=10.0, beta_ns_per_byte=1.0, busbw_gbytes_per_s=1.0,
                        r_squared=1.0, points=10, sizes=3, notes=[])  # fmt: skip
    comm = dict(comm_ms=3.0, exposed_ms=1.0, bucket_bytes=(1_000_000, 1_000_000), fits=(fit,))
    one = [obs(8, 10.0), obs(16, 18.0)]
    two = obs(16, 18.0 + 4.0, world=2, **comm)  # 4 ms slower compute beside its collectives
    model = fit_step_model([two, *one])
    assert model.interference_known
    assert model.interference_ms[2] == pytest.approx(4.0)
    alone = fit_step_model([two])
    assert not alone.interference_known and any("interference" in n for n in alone.notes)


def test_collectives_of_one_size_still_count_at_their_measured_time() -> None:
    # One bucket size gives the link no alpha-beta fit: the measured collective time must stay in the step
    # (a 2-rank LightningCLI BoringModel run lost its 2 ms of exposed wait, half the step, without it).
    comm = dict(comm_ms=3.0, exposed_ms=3.0, bucket_bytes=(264,), fits=())
    for cpus in (2, 64):
        run = obs(8, 1.0, world=2, cpu_count=cpus, **comm)
        model = fit_step_model([run])
        assert model.predict(Setting(8, 1, 2)).mean_ms.value == pytest.approx(run.step_mean_ms, rel=1e-6)
        assert any("one size" in n for n in model.notes)
        # Half the bytes: the collectives' time halves (pure bandwidth).
        half = model.predict(Setting(8, 1, 2, comm_bytes_factor=0.5)).mean_ms.value
        assert half == pytest.approx(run.step_mean_ms - 1.5, rel=1e-6)


def test_unmeasured_interference_spans_both_readings_and_reproduces_the_run() -> None:
    fit = CollectiveFit("all_reduce", alpha_us=10.0, beta_ns_per_byte=1.0, busbw_gbytes_per_s=1.0,
                        r_squared=1.0, points=10, sizes=3, notes=[])  # fmt: skip
    # 20 ms of compute, collectives 12 ms of which 4 ms exposed: 8 ms ran beside backward.
    comm = dict(comm_ms=12.0, exposed_ms=4.0, bucket_bytes=(1_000_000, 1_000_000), fits=(fit,))
    for cpus, point in ((2, "serialized"), (64, "overlapped")):
        run = obs(16, 20.0, world=2, cpu_count=cpus, **comm)
        model = fit_step_model([run])
        assert model.variants[0].name == point
        here = model.predict(Setting(16, 1, 2)).mean_ms
        assert here.value == pytest.approx(
            run.step_mean_ms, rel=1e-6
        )  # both readings agree on the run itself
        # Accumulating 2 micro-batches: the serialized reading's first micro-batch runs without the 8 ms.
        two = model.predict(Setting(16, 2, 2)).mean_ms
        # The second micro-batch adds its compute and the loop's 0.5 ms per batch.
        overlap_only = run.step_mean_ms + 20.0 + 0.5
        serialized = run.step_mean_ms + 20.0 - 8.0 + 0.5
        assert two.low <= serialized * 1.0001 and two.high >= overlap_only * 0.9999
        assert two.value == pytest.approx(serialized if point == "serialized" else overlap_only, rel=1e-6)


# -- outcomes ------------------------------------------------------------------------------------------


def test_goodput_and_dollars() -> None:
    model = fit_step_model([obs(8, 10.0), obs(16, 18.0)])
    econ = Economics(usd_per_device_hour=3.6, tokens_per_sample=100.0, b_noise=32.0, b_reference=16)
    now = outcome(Setting(16, 1, 1), model.predict(Setting(16, 1, 1)), econ)
    big = outcome(Setting(64, 1, 1), model.predict(Setting(64, 1, 1)), econ)
    assert now.statistical_efficiency == 1.0
    assert big.statistical_efficiency == pytest.approx((32 + 16) / (32 + 64))
    assert big.goodput_samples_per_s.value == pytest.approx(  # type: ignore[union-attr]
        big.samples_per_s.value * big.statistical_efficiency
    )
    # $3.6/h = $0.001/s: $ per 1M samples = 0.001 / (samples/s) * 1e6
    assert now.usd_per_million_samples.value == pytest.approx(1000.0 / now.samples_per_s.value)  # type: ignore[union-attr]
    assert now.usd_per_million_tokens.value == pytest.approx(now.usd_per_million_samples.value / 100)  # type: ignore[union-attr]
    # Goodput can fall while samples/s rises: the objective decides.
    assert relative_gain(now, big, "samples/s").value > 0
    assert relative_gain(now, big, "goodput").value < relative_gain(now, big, "samples/s").value


def test_precision_scale_spans_the_peak_ratio_and_memory_bound() -> None:
    s = compute_scale(66.9, 989.4)
    assert s.low == pytest.approx(66.9 / 989.4)
    assert s.high == 0.5
    assert s.low < s.value < s.high


# -- real runs on an H200 (benchmarks/gpu_check.py's workload sweep) ------------------------------------


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sweep")
    with tarfile.open(SWEEP) as tar:
        extract_all(tar, out)
    return out / "sweep"


def test_h200_runs_predict_unseen_batch_sizes(sweep: Path) -> None:
    from tuneup.advise.observe import observe

    fit = [observe(analyze(sweep / f"32-true-b{b}-a1")) for b in (16, 8, 32)]
    model = fit_step_model(fit)
    for name, batch, accumulation, tolerance in (
        ("b24-a1", 24, 1, 0.10),
        ("b64-a1", 64, 1, 0.10),
        ("b16-a4", 16, 4, 0.10),
    ):
        measured = observe(analyze(sweep / f"32-true-{name}")).step_median_ms
        predicted = model.predict(Setting(batch, accumulation, 1)).median_ms
        assert abs(predicted.value / measured - 1) < tolerance, (name, predicted, measured)


def test_h200_bf16_advice_brackets_the_measured_bf16_step(sweep: Path) -> None:
    base = analyze(sweep / "32-true-b32-a1")
    advice = advise([base], AdviceOptions(whatif=False))
    rec = next(r for r in advice.recommendations if r.id == "precision.bf16")
    measured = analyze(sweep / "bf16-mixed-b32-a1").step_time.median_ms
    assert rec.predicted is not None
    assert rec.predicted.step_ms.low <= measured <= rec.predicted.step_ms.high
    assert "precision='bf16-mixed'" in rec.code and "precision: bf16-mixed" in (rec.yaml or "")
    assert any("H200" in e for e in rec.evidence)


def test_h200_batch_advice_checks_memory_and_interpolates(sweep: Path) -> None:
    runs = [analyze(sweep / f"32-true-b{b}-a1") for b in (16, 8, 32, 64)]
    advice = advise(runs, AdviceOptions(whatif=False))
    assert advice.model is not None and advice.model.compute_prior is None
    assert advice.model.batch_sizes == [8, 16, 32, 64]
    # GPU memory headroom is in the batch evidence or the considered list; nothing exceeds the GPU.
    text = json.dumps(
        [c.reason for c in advice.considered] + [e for r in advice.recommendations for e in r.evidence]
    )
    assert "GiB" in text


# -- the threshold, the report and the command line ----------------------------------------------------


def test_nothing_below_the_threshold_and_every_recommendation_has_evidence(tmp_path: Path) -> None:
    analysis = analyze(make_run(tmp_path / "run", steps=60))
    advice = advise([analysis], AdviceOptions(whatif=False))
    for rec in advice.recommendations:
        assert rec.gain.value >= advice.min_gain and rec.gain.low > 0
        assert rec.evidence and rec.code
    strict = advise([analysis], AdviceOptions(whatif=False, min_gain=10.0))
    assert strict.recommendations == []
    assert strict.considered  # what was looked at is still said


def test_report_has_recommendations_after_the_summary(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=60)
    written = write_report(run, tmp_path / "out", "md,json")
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.index("## Recommendations") < md.index("## Where the fit's time went")
    document = json.loads((tmp_path / "out" / "report.json").read_text())
    assert "recommendations" in document
    assert isinstance(document["recommendations"], dict)
    validator = jsonschema.validators.validator_for(report_schema())(report_schema())
    validator.validate(document)
    broken = {**document, "recommendations": {"runs": "r1"}}
    assert not validator.is_valid(broken)
    assert from_json(document).run.run_id == "r1"  # readers of the analysis skip the advice
    assert written.files
    assert build_report(run)["recommendations"]["objective"] in ("samples/s", "goodput")


def test_cli_advise(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run", steps=60)
    assert main(["advise", str(run), "--no-whatif"]) == 0
    assert main(["advise", str(run), "--format", "json", "--no-whatif"]) == 0
    out = capsys.readouterr().out
    document = json.loads(out[out.index("{") :])
    assert document["runs"] == ["r1"]
    write_report(run, tmp_path / "rep", "json")
    assert main(["advise", str(tmp_path / "rep" / "report.json"), "--format", "md", "--no-whatif"]) == 0
    assert "## Recommendations" in capsys.readouterr().out


def test_cli_advise_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", str(tmp_path / "missing")]) == 2
    assert "error" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["advise", str(bad)]) == 2
    run = make_run(tmp_path / "run", steps=60)
    assert main(["advise", str(run), "--min-gain", "-1"]) == 2
    assert main(["advise", str(run), "--link", str(run)]) == 2  # a one-rank run has no link fit
    err = capsys.readouterr().err
    assert "probe-network" in err


def test_ranges_scale() -> None:
    r = Range(2.0, 1.0, 3.0).scaled(-1.0)
    assert (r.value, r.low, r.high) == (-2.0, -3.0, -1.0)
    assert math.isclose(replace(r, value=0.0).value, 0.0)


def test_advice_needs_no_torch() -> None:
    # The advice sits above the analysis and the catalogs: a report.json is advised on where torch is
    # not installed (a CI runner, a laptop).
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[1] / "reports" / "example" / "report.json"
    code = (
        "import json, sys\n"
        "from tuneup.analyze.model import from_json\n"
        "from tuneup.advise import advise\n"
        "from tuneup.report.advice import advice_blocks\n"
        f"advice = advise([from_json(json.load(open({str(example)!r})))])\n"
        "advice_blocks(advice)\n"
        "assert advice.considered\n"
        "assert 'torch' not in sys.modules and 'lightning' not in sys.modules, 'torch imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
