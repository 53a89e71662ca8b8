"""The what-if over instances (tuneup/advise/whatif.py), checked against a ground truth computed here.

The workload is a real recorded run (tests/data/whatif_h200_bf16_b32: an 84M-parameter model, bf16-mixed,
batch 32, one NVIDIA H200); the catalog is synthetic, made-up GPUs and instances read through the
catalogs' own CSV parsers. The ground truth recomputes each instance's $ per 1M samples from the same
stated assumptions, with its own arithmetic (full overlap of the all-reduce with backward, where the
model uses its γ), and the what-if's ranking must agree with it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest

from tuneup.advise import AdviceOptions
from tuneup.advise.context import AdviceContext
from tuneup.advise.model import WhatIf, WhatIfRow
from tuneup.advise.observe import Observation, observe
from tuneup.advise.outcomes import Economics
from tuneup.advise.step_model import fit_step_model
from tuneup.advise.whatif import rework_share, split_batch, what_if
from tuneup.analyze.model import RunAnalysis
from tuneup.catalog.gpus import GpuSpec, parse_gpu_specs
from tuneup.catalog.instances import InstanceCatalog, parse_instances
from tuneup.catalog.interconnects import load_interconnects
from tuneup.report import analyze

RUN = Path(__file__).parent / "data" / "whatif_h200_bf16_b32"

GPUS_CSV = """\
name,match_names,pci_device_id,mem_gib,bf16_dense_tflops,fp16_dense_tflops,tf32_dense_tflops,fp32_tflops,fp8_dense_tflops,mem_bw_gbytes_per_s,tdp_w,intra_node_link,notes,doubt
RefGPU,NVIDIA H200,,141,1000,1000,500,60,,4000,700,NVLink4 900 GB/s bidirectional,the run's GPU,
FastGPU,,,80,2000,2000,1000,120,,8000,1000,NVLink4 900 GB/s bidirectional,,
MidGPU,,,48,500,500,250,40,,2000,350,PCIe Gen4 x16,,
SlowGPU,,,24,100,100,50,30,,300,70,PCIe Gen4 x16,,
SmallGPU,,,2.5,1000,1000,500,60,,4000,300,PCIe Gen4 x16,fits only smaller micro-batches,
TinyGPU,,,1,500,500,250,40,,2000,100,PCIe Gen4 x16,holds less than the weights and Adam's states,
OldGPU,,,32,,120,,15,,900,300,PCIe Gen3 x16,no bf16,
"""

INSTANCES_CSV = """\
provider,instance,gpu,gpu_count,gpu_mem_gib,on_demand_usd_hr,spot_usd_hr,intra_node_link,inter_node_gbps,source,as_of
test,ref-1,RefGPU,1,141,4.00,1.50,single GPU,,made up,2026-11-30
test,fast-1,FastGPU,1,80,9.00,,single GPU,,made up,2026-11-30
test,fast-8,FastGPU,8,80,72.00,25.00,nvlink4,3200,made up,2026-11-30
test,mid-1,MidGPU,1,48,1.50,0.60,single GPU,,made up,2026-11-30
test,mid-4,MidGPU,4,48,6.00,,PCIe,,made up,2026-11-30
test,slow-1,SlowGPU,1,24,0.60,0.25,single GPU,,made up,2026-11-30
test,small-1,SmallGPU,1,2.5,2.00,,single GPU,,made up,2026-11-30
test,tiny-1,TinyGPU,1,1,0.10,,single GPU,,made up,2026-11-30
test,old-1,OldGPU,1,32,0.50,,single GPU,,made up,2026-11-30
"""

# The assumptions the truth shares with the what-if (its module doc and `assumptions` state them).
STATIC_BYTES_PER_PARAMETER = 16
NCCL_STEP_LATENCY_S = {"nvlink": 3.4e-6, "pcie": 5.7e-6}
NCCL_BASE_LATENCY_S = 8.4e-6
CHECKPOINT_SAVE_S_PER_PARAMETER = 12 / 0.5e9
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def analysis() -> RunAnalysis:
    return analyze(RUN)


@pytest.fixture(scope="module")
def specs() -> list[GpuSpec]:
    return parse_gpu_specs(GPUS_CSV, "<test gpus>")


@pytest.fixture(scope="module")
def catalog(specs: list[GpuSpec]) -> InstanceCatalog:
    return InstanceCatalog(
        version="test", rows=tuple(parse_instances(INSTANCES_CSV, "<test instances>", specs=specs))
    )


def context(
    analysis: RunAnalysis, observation: Observation | None = None, b_noise: float | None = None
) -> AdviceContext:
    """The context `tuneup.advise.advise` builds for one run."""
    o = observation or observe(analysis)
    economics = Economics(None, o.tokens_per_sample, b_noise, o.samples_per_step)
    return AdviceContext(
        analysis=analysis,
        observation=o,
        model=fit_step_model([o]),
        economics=economics,
        objective="goodput" if b_noise else "samples/s",
    )


def run_whatif(
    analysis: RunAnalysis, specs: list[GpuSpec], catalog: InstanceCatalog, **options: object
) -> WhatIf:
    return what_if(context(analysis), AdviceOptions(**options), catalog=catalog, gpu_specs=specs)  # type: ignore[arg-type]


# -- the ground truth ---------------------------------------------------------------------------------


def ddp_buckets(gradient_bytes: float) -> list[float]:
    sizes, left, cap = [], gradient_bytes, 1 * MIB
    while left > 0:
        sizes.append(min(cap, left))
        left -= sizes[-1]
        cap = 25 * MIB
    return sizes


def ring_all_reduce_s(p: int, size_bytes: float, busbw_bytes_per_s: float, hop: str) -> float:
    alpha = NCCL_STEP_LATENCY_S[hop] + NCCL_BASE_LATENCY_S / (2 * (p - 1))
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * size_bytes / busbw_bytes_per_s


def true_usd_per_million(
    o: Observation,
    spec: GpuSpec,
    run_spec: GpuSpec,
    gpus: int,
    price_usd_per_hour: float,
    hop: str | None,
    spot: bool,
) -> float:
    """$ per 1M samples from the stated assumptions, computed without the step-time model."""
    per_rank = o.samples_per_step // gpus
    compute_b0_ms = o.forward_ms + o.backward_ms  # one micro-batch of the run's size (no exposed wait)
    # One batch size seen: half the compute fixed, half in proportion to the batch (AdaptDL's prior).
    compute_ms = (
        (compute_b0_ms / 2 + compute_b0_ms / 2 * per_rank / o.batch_size)
        * run_spec.peak_tflops["bf16"]
        / spec.peak_tflops["bf16"]
    )
    backward_share = o.backward_ms / compute_b0_ms
    sync_ms = 0.0
    if gpus > 1:
        link = {r.key: r for r in load_interconnects()}["nvlink4" if hop == "nvlink" else "pcie4_x16"]
        busbw = (link.typical_busbw_low_bytes_per_s + link.typical_busbw_high_bytes_per_s) / 2
        sync_ms = 1000 * sum(ring_all_reduce_s(gpus, b, busbw, hop) for b in ddp_buckets(o.parameters * 4))
    forward, backward = compute_ms * (1 - backward_share), compute_ms * backward_share
    optimizer_ms = o.optimizer_ms * run_spec.mem_bw_gbytes_per_s / spec.mem_bw_gbytes_per_s
    data_ms = o.data_ms / o.batch_size * per_rank
    step_ms = data_ms + forward + max(backward, sync_ms) + optimizer_ms + o.other_ms + o.sync_ms
    samples_per_s = o.samples_per_step * 1000 / step_ms
    usd = price_usd_per_hour / 3600 / samples_per_s * 1e6
    if spot:
        usd /= 1 - math.sqrt(2 * max(1.0, CHECKPOINT_SAVE_S_PER_PARAMETER * o.parameters) / (24 * 3600))
    return usd


def kendall_tau(a: list[str], b: list[str]) -> float:
    """Kendall's tau between two rankings of the same items (no ties)."""
    assert sorted(a) == sorted(b)
    pos_a = {x: i for i, x in enumerate(a)}
    pos_b = {x: i for i, x in enumerate(b)}
    items = list(a)
    concordant = discordant = 0
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            x, y = items[i], items[j]
            sign = (pos_a[x] - pos_a[y]) * (pos_b[x] - pos_b[y])
            concordant += sign > 0
            discordant += sign < 0
    return (concordant - discordant) / (concordant + discordant)


def label(row: WhatIfRow) -> str:
    return row.instance + (" spot" if row.spot else "")


# -- tests --------------------------------------------------------------------------------------------


def test_ranking_matches_the_ground_truth(
    analysis: RunAnalysis, specs: list[GpuSpec], catalog: InstanceCatalog
) -> None:
    w = run_whatif(analysis, specs, catalog)
    o = observe(analysis)
    by_name = {s.name: s for s in specs}
    instances = {r.qualified_key: r for r in catalog}
    # small-1 runs a smaller micro-batch (memory): the truth here is for the run's own split only.
    rows = [r for r in w.rows if r.instance != "test:small-1"]
    truth = {}
    for r in rows:
        inst = instances[r.instance]
        hop = None if inst.gpu_count == 1 else ("nvlink" if inst.intra_node_link == "nvlink4" else "pcie")
        truth[label(r)] = true_usd_per_million(
            o, by_name[inst.gpu], by_name["RefGPU"], r.gpus, r.usd_per_hour, hop, r.spot
        )
        # Each figure within a few percent of the truth (the model's γ = 20 against full overlap).
        assert r.usd_per_million_samples is not None
        assert r.usd_per_million_samples.value == pytest.approx(truth[label(r)], rel=0.05)
        assert r.usd_per_million_samples.low <= truth[label(r)] <= r.usd_per_million_samples.high
    predicted_order = [label(r) for r in rows]
    true_order = sorted(truth, key=truth.__getitem__)
    tau = kendall_tau(predicted_order, true_order)
    print(
        f"what-if vs truth over {len(rows)} rows: Kendall tau {tau:.3f}, top-1 {predicted_order[0]} / {true_order[0]}"
    )
    assert predicted_order[0] == true_order[0]
    assert tau >= 0.8
    assert w.ranked_by == "$ per 1M samples"


def test_the_cheapest_instance_per_hour_is_not_the_cheapest_per_sample(
    analysis: RunAnalysis, specs: list[GpuSpec], catalog: InstanceCatalog
) -> None:
    w = run_whatif(analysis, specs, catalog)
    on_demand = [r for r in w.rows if not r.spot]
    cheapest_per_hour = min(on_demand, key=lambda r: r.usd_per_hour)
    cheapest_per_sample = on_demand[0]
    assert cheapest_per_hour.instance == "test:slow-1"
    assert cheapest_per_sample.instance != cheapest_per_hour.instance
    assert cheapest_per_sample.usd_per_hour > cheapest_per_hour.usd_per_hour
    assert cheapest_per_sample.usd_per_million_samples.value < cheapest_per_hour.usd_per_million_samples.value


def test_an_instance_too_small_for_the_weights_is_excluded_with_its_reason(
    analysis: RunAnalysis, specs: list[GpuSpec], catalog: InstanceCatalog
) -> None:
    w = run_whatif(analysis, specs, catalog)
    excluded = {c.knob: c.reason for c in w.excluded}
    assert "test:tiny-1" in excluded
    assert "does not fit in memory" in excluded["test:tiny-1"]
    assert "GiB usable of 1.0 GiB" in excluded["test:tiny-1"]
    assert "no bf16 peak" in excluded["test:old-1"]
    assert all(r.instance not in ("test:tiny-1", "test:old-1") for r in w.rows)


def test_a_gpu_that_holds_only_smaller_micro_batches_accumulates_to_keep_the_global_batch(
    analysis: RunAnalysis, specs: list[GpuSpec], catalog: InstanceCatalog
) -> None:
    w = run_whatif(analysis, specs, catalog)
    small = next(r for r in w.rows if r.instance == "test:small-1")
    # 16 bytes per parameter fixed (1.34 GB), the rest of the run's 3.59 GB peak over its 32 samples:
    # 2.25 GiB usable holds 8 samples per micro-batch, not 16.
    assert (small.batch_size, small.accumulate_grad_batches, small.global_batch) == (8, 4, 32)
    assert small.fits_in_memory is True
    assert small.peak_memory_gib is not None and small.peak_memory_gib <= 2.5 * 0.9
    assert "to fit in memory" in (small.note or "")
    o = observe(analysis)
    m1 = (o.gpu_peak_allocated_bytes - STATIC_BYTES_PER_PARAMETER * o.parameters) / o.batch_size
    assert small.peak_memory_gib * 1024**3 == pytest.approx(
        STATIC_BYTES_PER_PARAMETER * o.parameters + 8 * m1
    )


def test_multi_gpu_rows_split_the_global_batch_and_price_the_link(
    analysis: RunAnalysis, specs: list[GpuSpec], catalog: InstanceCatalog
) -> None:
    w = run_whatif(analysis, specs, catalog)
    fast8 = next(r for r in w.rows if r.instance == "test:fast-8" and not r.spot)
    mid4 = next(r for r in w.rows if r.instance == "test:mid-4")
    assert (fast8.batch_size, fast8.accumulate_grad_batches, fast8.gpus) == (4, 1, 8)
    assert fast8.link == "NVLink4 (H100/H200)"
    assert mid4.link == "PCIe Gen4 x16"
    # Unknown overlap (one rank measured): the interval spans none to full, wider than one GPU's.
    fast1 = next(r for r in w.rows if r.instance == "test:fast-1")
    assert fast8.step_ms.high / fast8.step_ms.value > fast1.step_ms.high / fast1.step_ms.value


def test_two_nodes_use_the_slower_of_link_and_network_and_exclude_instances_without_one(
    analysis: RunAnalysis, specs: list[GpuSpec], catalog: InstanceCatalog
) -> None:
    w = what_if(context(analysis), AdviceOptions(), catalog=catalog, gpu_specs=specs, nodes=2)
    fast8 = next(r for r in w.rows if r.instance == "test:fast-8" and not r.spot)
    assert (fast8.gpus, fast8.nodes, fast8.batch_size) == (16, 2, 2)
    assert fast8.usd_per_hour == pytest.approx(144.0)
    assert "3200 Gb/s network" in (fast8.link or "")
    excluded = {c.knob: c.reason for c in w.excluded}
    assert "no network between nodes" in excluded["test:mid-4"]


def test_spot_rows_carry_the_young_daly_rework(
    analysis: RunAnalysis, specs: list[GpuSpec], catalog: InstanceCatalog
) -> None:
    w = run_whatif(analysis, specs, catalog, interruptions_per_hour=0.5)
    o = observe(analysis)
    save_s = CHECKPOINT_SAVE_S_PER_PARAMETER * o.parameters  # the run timed no save: 12 B/param at 0.5 GB/s
    share = math.sqrt(2 * save_s / 7200)
    on_demand = next(r for r in w.rows if r.instance == "test:ref-1" and not r.spot)
    spot = next(r for r in w.rows if r.instance == "test:ref-1" and r.spot)
    assert spot.rework_share == pytest.approx(share)
    assert rework_share(save_s, 7200) == pytest.approx(share)
    expected = on_demand.usd_per_million_samples.value * 1.50 / 4.00 / (1 - share)
    assert spot.usd_per_million_samples.value == pytest.approx(expected)
    assert spot.step_ms == on_demand.step_ms
    assert "0.5 interruptions per hour, as given" in " ".join(w.assumptions)
    assert not any(r.spot for r in w.rows if r.instance == "test:fast-1")  # no spot quote, no spot row


def test_the_run_s_own_gpu_predicts_the_run(
    analysis: RunAnalysis, specs: list[GpuSpec], catalog: InstanceCatalog
) -> None:
    w = run_whatif(analysis, specs, catalog, target_samples=1e9)
    o = observe(analysis)
    ref = next(r for r in w.rows if r.instance == "test:ref-1" and not r.spot)
    assert ref.compute_scale == pytest.approx(1.0)
    assert ref.samples_per_s.value == pytest.approx(o.samples_per_s, rel=0.02)
    assert ref.usd_to_target.value == pytest.approx(ref.usd_per_million_samples.value * 1000)
    assert ref.usd_per_million_tokens.value == pytest.approx(ref.usd_per_million_samples.value / 257)
    assert w.target == "1e+09 samples (2.57e+11 tokens)"


def test_a_measured_noise_scale_ranks_by_progress_per_dollar(
    analysis: RunAnalysis, specs: list[GpuSpec], catalog: InstanceCatalog
) -> None:
    ctx = context(analysis, b_noise=64.0)
    w = what_if(ctx, AdviceOptions(), catalog=catalog, gpu_specs=specs, global_batch=48)
    assert "progress" in w.ranked_by
    fast8 = next(r for r in w.rows if r.instance == "test:fast-8" and not r.spot)
    # 48 over 8 GPUs: 6 each; E(48) against the run's 32 = (64 + 32) / (64 + 48).
    assert fast8.statistical_efficiency == pytest.approx(96 / 112)
    assert fast8.goodput_samples_per_s.value == pytest.approx(fast8.samples_per_s.value * 96 / 112)


def test_split_batch_keeps_the_global_batch_or_says_why_not() -> None:
    assert split_batch(32, 8, 1) == (4, 1, None)
    assert split_batch(32, 4, 4) == (2, 4, None)
    b, s, note = split_batch(32, 8, 8)
    assert (b, s) == (1, 4) and note is not None and "accumulation 8 -> 4" in note
    b, s, note = split_batch(36, 8, 1)
    assert (b, s) == (4, 1) and note is not None and "does not divide" in note and "global batch 32" in note


def test_a_cpu_run_says_compute_cannot_be_scaled(
    tmp_path: Path, specs: list[GpuSpec], catalog: InstanceCatalog
) -> None:
    run = tmp_path / "cpu-run"
    shutil.copytree(RUN, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["trainer"]["accelerator"] = "CPUAccelerator"
    (run / "manifest.json").write_text(json.dumps(manifest))
    cpu = analyze(run)
    assert observe(cpu).on_gpu is False
    w = what_if(context(cpu), AdviceOptions(), catalog=catalog, gpu_specs=specs)
    assert w.rows == [] and w.excluded == []
    assert "cannot be scaled to a GPU" in w.assumptions[0]


def test_a_gpu_run_without_a_known_peak_says_so(
    analysis: RunAnalysis, specs: list[GpuSpec], catalog: InstanceCatalog
) -> None:
    o = dataclasses.replace(observe(analysis), gpu_name="Mystery GPU", peak_tflops_per_device=None)
    w = what_if(context(analysis, o), AdviceOptions(), catalog=catalog, gpu_specs=specs)
    assert w.rows == []
    assert "no dense peak" in w.assumptions[0]


def test_the_packaged_catalog_and_a_user_csv(analysis: RunAnalysis, tmp_path: Path) -> None:
    user = tmp_path / "mine.csv"
    user.write_text(
        "provider,instance,gpu,gpu_count,on_demand_usd_hr,source,as_of\n"
        "mine,h100-box,H100-SXM,1,1.00,my invoice,2026-11-30\n"
    )
    w = what_if(context(analysis), AdviceOptions(user_catalog=str(user)))
    assert w.rows and w.catalog is not None and str(user) in w.catalog
    assert w.rows[0].instance == "mine:h100-box"  # an H100 at $1/h beats every packaged price
    assert any("bf16 peak" in c.reason for c in w.excluded)  # V100s and T4s have no bf16 tensor path
    only = what_if(context(analysis), AdviceOptions(instances=("aws:p5.4xlarge", "nope:none")))
    assert [r.instance for r in only.rows] == ["aws:p5.4xlarge@us-east-1"]
    assert [c.knob for c in only.excluded] == ["nope:none"]
