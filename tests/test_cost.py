"""Cost figures: pricing a run, money per sample/token/epoch, projections, FLOPs and MFU, energy."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tuneup.analyze.analysis import analyze_run
from tuneup.analyze.model import to_json
from tuneup.catalog import CatalogError, load_instances
from tuneup.collect.flops import MicroBatchFlopCounter
from tuneup.cost.options import CostOptions
from tuneup.cost.pricing import PriceChoice, PricingError, choice_from_env, job_price, price_for_run
from tuneup.record import RankWriter, load_run, write_manifest

STEP_S = 0.1  # every step of the synthetic run takes 100 ms on every rank
SAMPLES, TOKENS = 8, 256  # per rank and step
WORLD = 2
STEPS = 40


def priced_run(
    path: Path,
    *,
    pricing: dict | None = None,
    gpus: bool = False,
    energy_counter: bool = True,
    flops_per_microbatch: float | None = None,
) -> Path:
    """Two ranks, 40 equal steps of 100 ms: 160 samples/s, 5,120 tokens/s, 10 steps/s in all."""
    manifest = {
        "run_id": "cost",
        "created_unix": 999.0,
        "world_size": WORLD,
        "num_nodes": 1,
        "trainer": {
            "max_steps": 1000,
            "max_epochs": -1,
            "accumulate_grad_batches": 1,
            "precision": "bf16-mixed",
            "accelerator": "CUDAAccelerator" if gpus else "CPUAccelerator",
        },
        "dataloader": {
            "batch_size": SAMPLES,
            "dataset_len": 6400,
            "drop_last": True,
            "sampler": "DistributedSampler",
        },
        "gpus": {
            "gpus": [{"index": i, "name": "NVIDIA H200", "pci_device_id": "0x233510de"} for i in range(WORLD)]
        }
        if gpus
        else None,
    }
    if pricing is not None:
        manifest["pricing"] = pricing
    write_manifest(path, manifest)
    for rank in range(WORLD):
        w = RankWriter(path, rank)
        w.open({"host": "node0", "start_unix": 1000.0})
        for s in range(STEPS):
            w.add_step(
                {
                    "step": s,
                    "epoch": 0,
                    "t_end": 1000.0 + (s + 1) * STEP_S,
                    "wall_ms": STEP_S * 1000,
                    "data_ms": 1.0,
                    "forward_ms": 30.0,
                    "backward_ms": 50.0,
                    "optimizer_ms": 10.0,
                    "other_ms": 9.0,
                    "micro_batches": 1,
                    "samples": SAMPLES,
                    "tokens": TOKENS,
                }
            )
        if flops_per_microbatch is not None:
            w.add_event("flops", flops=flops_per_microbatch, samples=SAMPLES, tokens=TOKENS, step=0)
        if gpus:
            for k in range(5):  # 4 s at a constant 500 W: 2,000 J per GPU
                g = {"index": rank, "power_w": 500.0}
                if energy_counter:
                    g["energy_j"] = 1e6 + 500.0 * k
                w.add_telemetry({"t": 1000.0 + k, "gpus": [g]})
        w.close(status="completed")
    return path


def cost_of(path: Path, options: CostOptions | None = None) -> dict:
    return to_json(analyze_run(load_run(path), options))["cost"]


# -- money ---------------------------------------------------------------------------------------------


def test_cost_arithmetic_matches_hand_computed_figures(tmp_path: Path) -> None:
    run = priced_run(tmp_path / "run")
    cost = cost_of(
        run, CostOptions(price=PriceChoice(price_per_hour=36.0, price_per="node", source="command line"))
    )
    f = cost["figures"]
    # $36/h is $0.01/s. 160 samples/s and 5,120 tokens/s.
    assert f["usd_per_hour"] == pytest.approx(36.0)
    assert f["samples_per_usd"] == pytest.approx(160 * 3600 / 36)  # 16,000
    assert f["tokens_per_usd"] == pytest.approx(5120 * 3600 / 36)  # 512,000
    assert f["usd_per_million_tokens"] == pytest.approx(1e6 / 512_000)  # $1.953125
    # 6,400 samples / 2 ranks / batch 8 = 400 steps per epoch, at 10 steps/s = 40 s = $0.40
    assert cost["steps_per_epoch"] == 400
    assert f["usd_per_epoch"] == pytest.approx(0.40)
    # The run took 4 s (start at 1000.0, last step ends at 1004.0): $0.04 so far.
    assert f["usd_so_far"] == pytest.approx(0.04)
    # 960 steps left to max_steps=1000 at 10 steps/s: 96 s, $0.96.
    (proj,) = cost["projections"]
    assert proj["target"] == "max_steps=1,000"
    assert proj["steps_remaining"] == 960
    assert proj["time_s"] == pytest.approx(96.0)
    assert proj["usd"] == pytest.approx(0.96)
    assert cost["priced"] and cost["price"]["source"] == "command line"


def test_price_per_gpu_is_charged_per_device_and_targets_project(tmp_path: Path) -> None:
    run = priced_run(tmp_path / "run")
    options = CostOptions(
        price=PriceChoice(price_per_hour=9.0, price_per="gpu"), target_tokens=5_120_000, target_steps=2040
    )
    cost = cost_of(run, options)
    assert cost["figures"]["usd_per_hour"] == pytest.approx(18.0)  # 2 ranks x $9
    by_target = {p["target"]: p for p in cost["projections"]}
    # 5,120,000 tokens at 5,120 tokens per step (2 ranks x 256 x ... per step: 512) -> 10,000 steps.
    tokens = by_target["5,120,000 tokens"]
    assert tokens["total_steps"] == pytest.approx(5_120_000 / 512)
    assert tokens["time_s"] == pytest.approx((10_000 - 40) / 10)
    assert by_target["2,040 steps"]["usd"] == pytest.approx(200 * 18 / 3600)


def test_an_instance_is_priced_per_gpu_used_and_carries_its_doubt() -> None:
    catalog = load_instances()
    ultra = catalog.lookup("gcp:a3-ultragpu-8g")
    one = job_price(PriceChoice(instance="gcp:a3-ultragpu-8g"), devices=1, nodes=1, catalog=catalog)
    assert one.usd_per_hour == pytest.approx(ultra.on_demand_usd_per_hour / 8)  # one eighth
    assert one.spot_usd_per_hour == pytest.approx(ultra.spot_usd_per_hour / 8)
    assert "1 of the 8 GPUs" in one.basis
    assert one.doubts and "undated" in one.doubts[0]
    full = job_price(PriceChoice(instance="aws:p4d.24xlarge"), devices=16, nodes=2, catalog=catalog)
    assert full.usd_per_hour == pytest.approx(2 * 21.957642)
    assert full.doubts == []
    spot = job_price(PriceChoice(instance="aws:p4d.24xlarge", spot=True), devices=8, nodes=1, catalog=catalog)
    assert spot.usd_per_hour == pytest.approx(2.4655)
    gpu_only = job_price(PriceChoice(instance="gcp:n1-gpu-t4"), devices=1, nodes=1, catalog=catalog)
    assert any("host machine is not included" in d for d in gpu_only.doubts)


def test_spot_figures_sit_beside_on_demand(tmp_path: Path) -> None:
    cost = cost_of(priced_run(tmp_path / "run"), CostOptions(price=PriceChoice(instance="aws:p4d.24xlarge")))
    assert cost["figures"]["usd_per_hour"] == pytest.approx(21.957642 / 8 * 2)
    assert cost["figures_spot"]["usd_per_hour"] == pytest.approx(2.4655 / 8 * 2)


def test_an_unpriced_run_says_how_to_price_it(tmp_path: Path) -> None:
    cost = cost_of(priced_run(tmp_path / "run"))
    assert not cost["priced"] and cost["price"] is None
    assert "--instance" in cost["not_priced_reason"]
    assert all(v is None for v in cost["figures"].values())


# -- precedence ----------------------------------------------------------------------------------------


def test_the_report_price_replaces_the_recorded_one(tmp_path: Path) -> None:
    recorded = PriceChoice(instance="aws:p4d.24xlarge", source="callback").as_dict()
    run = priced_run(tmp_path / "run", pricing={**recorded, "electricity_usd_per_kwh": 0.2})
    cost = cost_of(run)
    assert cost["price"]["instance"]["key"] == "aws:p4d.24xlarge" and cost["price"]["source"] == "callback"
    over = cost_of(run, CostOptions(price=PriceChoice(price_per_hour=1.0, source="command line")))
    assert over["price"]["source"] == "command line" and over["figures"]["usd_per_hour"] == 1.0


def test_a_recorded_price_that_no_longer_resolves_warns_and_leaves_the_run_unpriced(tmp_path: Path) -> None:
    run = priced_run(tmp_path / "run", pricing={"instance": "aws:p9.gone", "source": "callback"})
    report = analyze_run(load_run(run))
    assert report.cost is not None and not report.cost.priced
    assert any("aws:p9.gone" in w for w in report.warnings)


def test_environment_prices_and_is_checked() -> None:
    assert choice_from_env({}) is None
    env = choice_from_env({"TUNEUP_INSTANCE": "aws:p4d.24xlarge", "TUNEUP_SPOT": "1"})
    assert env is not None and env.instance == "aws:p4d.24xlarge" and env.spot and env.source == "environment"
    own = choice_from_env({"TUNEUP_PRICE_PER_HOUR": "3.5", "TUNEUP_PRICE_PER": "gpu"})
    assert own is not None and own.price_per_hour == 3.5 and own.price_per == "gpu"
    with pytest.raises(PricingError, match="TUNEUP_PRICE_PER_HOUR"):
        choice_from_env({"TUNEUP_PRICE_PER_HOUR": "cheap"})
    with pytest.raises(CatalogError, match=r"closest: aws:p4d\.24xlarge"):
        choice_from_env({"TUNEUP_INSTANCE": "aws:p4d.24xl"})


def test_callback_price_wins_over_the_environment_and_a_typo_fails_before_training(monkeypatch) -> None:
    from tuneup import TuneupCallback

    monkeypatch.setenv("TUNEUP_INSTANCE", "aws:p5.48xlarge")
    assert TuneupCallback().price.instance == "aws:p5.48xlarge"
    assert TuneupCallback(instance="aws:p4d.24xlarge").price.instance == "aws:p4d.24xlarge"
    assert TuneupCallback(price_per_hour=2.0).price.price_per_hour == 2.0
    with pytest.raises(ValueError, match=r"closest: aws:p4d\.24xlarge"):
        TuneupCallback(instance="aws:p4d.24xl")
    with pytest.raises(ValueError, match="not both"):
        TuneupCallback(instance="aws:p4d.24xlarge", price_per_hour=3.0)
    with pytest.raises(ValueError, match="no spot price"):
        TuneupCallback(instance="lambda:gpu_8x_h100_sxm5", spot=True)


def test_price_for_run_raises_for_a_bad_override_only() -> None:
    with pytest.raises(CatalogError):
        price_for_run(None, PriceChoice(instance="nope:nothing"), devices=1, nodes=1)


# -- FLOPs and MFU -------------------------------------------------------------------------------------


def test_counted_flops_of_a_linear_stack_match_six_times_parameters_times_tokens() -> None:
    torch.manual_seed(0)
    width, depth, tokens = 64, 16, 32
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(depth)])
    params = sum(p.numel() for p in model.parameters())
    x = torch.randn(tokens, width)  # no gradient for the input: the first layer skips one product
    counter = MicroBatchFlopCounter()
    counter.start()
    model(x).square().mean().backward()
    flops = counter.stop()
    analytic = 6 * params * tokens
    assert flops is not None
    assert flops == pytest.approx(analytic, rel=0.03)
    assert flops < analytic  # the first layer's input gradient is really skipped: counted, not assumed
    assert not counter.counting and counter.stop() is None


def test_mfu_and_achieved_flops_from_a_counted_micro_batch(tmp_path: Path) -> None:
    run = priced_run(tmp_path / "run", gpus=True, flops_per_microbatch=4.8e13)
    flops = cost_of(run)["flops"]
    # 4.8e13 per micro-batch x 2 ranks x 10 steps/s = 9.6e14 FLOP/s; 4.8e14 per GPU; H200 bf16 dense 989.4 TFLOP/s.
    assert flops["flops_per_step"] == pytest.approx(9.6e13)
    assert flops["achieved_tflops_per_s"] == pytest.approx(960.0)
    assert flops["achieved_tflops_per_s_per_device"] == pytest.approx(480.0)
    assert flops["gpu"] == "H200-SXM" and flops["peak_precision"] == "bf16"
    assert flops["mfu"] == pytest.approx(480.0 / 989.4, rel=1e-3)


def test_on_cpu_mfu_is_not_defined_but_achieved_flops_are_shown(tmp_path: Path) -> None:
    flops = cost_of(priced_run(tmp_path / "run", flops_per_microbatch=1e9))["flops"]
    assert flops["achieved_tflops_per_s"] == pytest.approx(1e9 * 2 * 10 / 1e12)
    assert flops["mfu"] is None and "not defined on CPU" in flops["note"]


def test_a_users_flops_per_sample_is_used_instead(tmp_path: Path) -> None:
    run = priced_run(tmp_path / "run", gpus=True)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["flops"] = {"flops_per_sample": 1e12}
    (run / "manifest.json").write_text(json.dumps(manifest))
    flops = cost_of(run)["flops"]
    assert flops["source"].startswith("user")
    assert flops["achieved_tflops_per_s"] == pytest.approx(160.0)  # 1e12 x 160 samples/s


# -- energy --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("counter", [True, False], ids=["energy counter", "power samples"])
def test_energy_from_the_counter_or_from_power_samples(tmp_path: Path, counter: bool) -> None:
    run = priced_run(tmp_path / "run", gpus=True, energy_counter=counter)
    cost = cost_of(run, CostOptions(electricity_usd_per_kwh=0.5))
    e = cost["energy"]
    assert e["source"] == ("counter" if counter else "power samples")
    # 2 GPUs x 500 W over 4 s = 4,000 J; 1,000 W at 10 steps/s = 100 J per step.
    assert e["energy_kwh"] == pytest.approx(4000 / 3.6e6)
    assert e["mean_power_w"] == pytest.approx(1000.0)
    assert e["j_per_step"] == pytest.approx(100.0)
    assert e["kwh_per_million_tokens"] == pytest.approx(1000 / 5120 * 1e6 / 3.6e6)
    assert e["electricity_usd"] == pytest.approx(4000 / 3.6e6 * 0.5)
    assert math.isclose(
        e["electricity_usd_per_million_tokens"], e["kwh_per_million_tokens"] * 0.5, rel_tol=1e-5
    )


def test_no_gpu_means_no_energy_and_says_so(tmp_path: Path) -> None:
    e = cost_of(priced_run(tmp_path / "run"))["energy"]
    assert e["source"] is None and "NVML" in e["note"]


# -- command line --------------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuneup", *args], capture_output=True, text=True, timeout=120
    )


def test_report_prices_from_the_command_line(tmp_path: Path) -> None:
    run = priced_run(tmp_path / "run")
    out = tmp_path / "out"
    proc = cli("report", str(run), "-o", str(out), "--format", "json", "--price-per-hour", "36")
    assert proc.returncode == 0, proc.stderr
    cost = json.loads((out / "report.json").read_text())["cost"]
    assert cost["figures"]["samples_per_usd"] == pytest.approx(16_000)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--instance", "aws:p4d.24xl"], "closest: aws:p4d.24xlarge"),
        (["--instance", "gcp:a3-highgpu-8g"], "@us-east4"),
        (["--price-per-hour", "-3"], "positive number"),
        (["--spot"], "--spot needs --instance"),
        (["--electricity-price", "0"], "--electricity-price must be a positive number"),
        (["--instance", "aws:p4d.24xlarge", "--price-per-hour", "3"], "not allowed with"),
    ],
)
def test_bad_cost_options_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    run = priced_run(tmp_path / "run")
    proc = cli("report", str(run), "-o", str(tmp_path / "out"), *args)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "report.json").exists()


def test_a_bad_user_catalog_names_its_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "mine.csv"
    bad.write_text(
        "provider,instance,gpu,gpu_count,on_demand_usd_hr,source,as_of\n"
        "acme,big-8,H100-SXM,8,40.0,our contract,2026-11-01\n"
        "acme,small-1,H100-SXM,1,five,our contract,2026-11-01\n"
    )
    proc = cli("report", str(priced_run(tmp_path / "run")), "--catalog", str(bad), "--instance", "acme:big-8")
    assert proc.returncode == 2
    assert "mine.csv" in proc.stderr and ":3" in proc.stderr and "Traceback" not in proc.stderr
    good = tmp_path / "ok.csv"
    good.write_text(bad.read_text().replace("five", "5.0"))
    out = tmp_path / "out"
    proc = cli(
        "report", str(tmp_path / "run"), "-o", str(out), "--format", "json", "--catalog", str(good),
        "--instance", "acme:big-8",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    price = json.loads((out / "report.json").read_text())["cost"]["price"]
    assert price["usd_per_hour"] == pytest.approx(40.0 / 8 * 2) and price["instance"]["origin"].endswith(
        "ok.csv"
    )


def test_catalog_lists_instances_and_filters_by_gpu() -> None:
    proc = cli("catalog", "--gpu", "H200")
    assert proc.returncode == 0
    assert "gcp:a3-ultragpu-8g@us-central1" in proc.stdout and "86.76" in proc.stdout
    assert "p4d" not in proc.stdout
    assert cli("catalog", "--gpu", "nosuchgpu").returncode == 2
