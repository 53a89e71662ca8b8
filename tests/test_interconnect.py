"""Collective bandwidth: nccl-tests' bus bandwidth, the latency-bandwidth fit, the link catalog, verdicts.

Synthetic timings are generated here from the model's formulas written out again, not from the module,
so that a wrong formula in the module cannot agree with itself.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tuneup.analyze.interconnect import (
    bus_factor,
    busbw_bytes_per_s,
    collective_size_bytes,
    collective_table,
    fit_alpha_beta,
    link_verdict,
    model_time_s,
)
from tuneup.catalog.interconnects import (
    GB,
    Interconnect,
    expected_link,
    gpu_link_from_inventory,
    load_interconnects,
)
from tuneup.record.schema import COLLECTIVE_KINDS, CollectiveRecord


def ring_time_s(kind: str, p: int, n: float, alpha: float, beta: float) -> float:
    if kind == "all_reduce":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta
    return (p - 1) * alpha + (p - 1) / p * n * beta  # all_gather, reduce_scatter


def by_key(key: str) -> Interconnect:
    (row,) = [r for r in load_interconnects() if r.key == key]
    return row


# --- bus bandwidth -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "p2", "p8"),
    [
        ("all_reduce", 1.0, 1.75),
        ("all_gather", 0.5, 0.875),
        ("reduce_scatter", 0.5, 0.875),
        ("all_to_all", 0.5, 0.875),
        ("broadcast", 1.0, 1.0),
    ],
)
def test_bus_factor_matches_nccl_tests(kind: str, p2: float, p8: float) -> None:
    assert bus_factor(kind, 2) == pytest.approx(p2)
    assert bus_factor(kind, 8) == pytest.approx(p8)
    # One rank: nothing crosses a link, whatever the kind.
    assert bus_factor(kind, 1) == 0.0


def test_bus_factor_covers_every_recorded_kind_and_rejects_others() -> None:
    for kind in COLLECTIVE_KINDS:
        assert bus_factor(kind, 4) > 0
    with pytest.raises(ValueError, match="unknown collective kind"):
        bus_factor("allreduce", 4)
    with pytest.raises(ValueError, match="world_size"):
        bus_factor("all_reduce", 0)


def test_busbw_of_one_gigabyte_all_reduce_in_ten_ms_on_eight_ranks() -> None:
    assert busbw_bytes_per_s("all_reduce", 8, 1e9, 0.010) == pytest.approx(175e9)
    with pytest.raises(ValueError, match="seconds > 0"):
        busbw_bytes_per_s("all_reduce", 8, 1e9, 0.0)


def test_an_all_gather_input_shard_converts_to_the_gathered_size() -> None:
    assert collective_size_bytes("all_gather", 1000, 4) == 4000
    assert collective_size_bytes("reduce_scatter", 4000, 4) == 4000
    assert collective_size_bytes("all_reduce", 4000, 4) == 4000


def test_collective_table_groups_by_kind_ranks_and_size_with_median_times() -> None:
    def rec(kind: str, nbytes: int, ms: float, world_size: int | None = None) -> CollectiveRecord:
        return CollectiveRecord(step=0, kind=kind, bytes=nbytes, duration_ms=ms, world_size=world_size)

    records = [
        rec("all_gather", 10**9, 5.0),  # the gathered output, as tuneup/collect/comm.py records it
        rec("all_reduce", 10**9, 10.0),
        rec("all_reduce", 10**9, 1000.0),  # a stall: the median ignores it
        rec("all_reduce", 10**9, 10.0),
        rec("all_reduce", 10**6, 0.1, world_size=2),  # its own group of ranks wins over the argument
    ]
    rows = collective_table(records, world_size=4)
    assert [(r.kind, r.world_size, r.size_bytes, r.count) for r in rows] == [
        ("all_reduce", 2, 10**6, 1),
        ("all_reduce", 4, 10**9, 3),
        ("all_gather", 4, 10**9, 1),
    ]
    big = rows[1]
    assert big.median_time_us == pytest.approx(10_000)
    assert big.algbw_gbytes_per_s == pytest.approx(100.0)
    assert big.busbw_gbytes_per_s == pytest.approx(150.0)
    gather = rows[2]
    assert gather.algbw_gbytes_per_s == pytest.approx(200.0)
    assert gather.busbw_gbytes_per_s == pytest.approx(150.0)
    assert rows[0].busbw_gbytes_per_s == pytest.approx(10.0)


# --- latency-bandwidth fit -----------------------------------------------------------------------


def synthetic_samples(kind: str, p: int, alpha: float, beta: float, seed: int) -> list[tuple[int, float]]:
    """7 repeats at each of 11 sizes from 1 KiB to 1 GiB, 5% multiplicative noise, and a few stalls."""
    rng = random.Random(seed)
    samples = []
    for k in range(10, 31, 2):
        n = 2**k
        for _ in range(7):
            samples.append((n, ring_time_s(kind, p, n, alpha, beta) * (1 + rng.gauss(0, 0.05))))
    for i in rng.sample(range(len(samples)), 4):
        n, t = samples[i]
        samples[i] = (n, t * rng.uniform(3, 10))
    return samples


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather"])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_fit_recovers_alpha_and_beta_despite_noise_and_outliers(kind: str, p: int) -> None:
    alpha, beta = 8e-6, 1 / 50e9  # 8 µs per step, 50 GB/s per link
    samples = synthetic_samples(kind, p, alpha, beta, seed=p)
    fit = fit_alpha_beta(samples, kind, p)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.10)
    assert fit.beta_s_per_byte == pytest.approx(beta, rel=0.10)
    assert fit.link_bytes_per_s == pytest.approx(50e9, rel=0.10)
    # Under the ring model the bus factor is the bandwidth coefficient: busbw is the link's bandwidth.
    assert fit.busbw_bytes_per_s == pytest.approx(fit.link_bytes_per_s)
    assert (fit.points, fit.sizes) == (77, 11)
    assert not fit.alpha_clamped and not fit.beta_clamped and fit.notes == ()
    assert fit.r_squared > 0.99
    for n in (2**10, 2**20, 2**30):
        assert fit.predict(n) == pytest.approx(ring_time_s(kind, p, n, alpha, beta), rel=0.10)
        assert model_time_s(kind, p, n, fit.alpha_s, fit.beta_s_per_byte) == pytest.approx(fit.predict(n))


def test_fit_on_distinct_sizes_uses_the_raw_points_exactly() -> None:
    alpha, beta = 20e-6, 1 / 10e9
    samples = [(2**k, ring_time_s("reduce_scatter", 4, 2**k, alpha, beta)) for k in range(12, 28, 3)]
    fit = fit_alpha_beta(samples, "reduce_scatter", 4)
    assert fit.points == fit.sizes == len(samples)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.beta_s_per_byte == pytest.approx(beta, rel=1e-6)
    assert fit.r_squared == pytest.approx(1.0)
    # Half the asymptotic bandwidth where latency and transfer take equally long.
    assert fit.half_bandwidth_bytes == pytest.approx(3 * alpha / (0.75 * beta))


def test_tree_all_reduce_model() -> None:
    alpha, beta, p = 10e-6, 1 / 20e9, 8
    depth = 2 * math.ceil(math.log2(p))
    samples = [(n, depth * (alpha + n * beta)) for n in (10**4, 10**6, 10**8)]
    fit = fit_alpha_beta(samples, "all_reduce", p, algorithm="tree")
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.beta_s_per_byte == pytest.approx(beta, rel=1e-6)
    with pytest.raises(ValueError, match="all_reduce only"):
        fit_alpha_beta(samples, "all_gather", p, algorithm="tree")


def test_fit_needs_two_distinct_sizes() -> None:
    with pytest.raises(ValueError, match="2 or more distinct sizes; got 1"):
        fit_alpha_beta([(1024, 1e-4), (1024, 1.1e-4), (1024, 0.9e-4)], "all_reduce", 2)
    with pytest.raises(ValueError, match="distinct sizes; got 0"):
        fit_alpha_beta([], "all_reduce", 2)
    with pytest.raises(ValueError, match="one rank"):
        fit_alpha_beta([(1, 1.0), (2, 2.0)], "all_reduce", 1)
    with pytest.raises(ValueError, match="seconds >= 0"):
        fit_alpha_beta([(1, -1.0), (2, 2.0)], "all_reduce", 2)


def test_negative_slope_clamps_beta_to_zero_and_says_why() -> None:
    fit = fit_alpha_beta([(1000, 2e-3), (2000, 1.5e-3), (4000, 1e-3)], "all_reduce", 2)
    assert fit.beta_clamped and not fit.alpha_clamped
    assert fit.beta_s_per_byte == 0.0 and fit.slope_s_per_byte == 0.0
    assert fit.link_bytes_per_s is None and fit.busbw_bytes_per_s is None
    assert fit.alpha_s > 0
    assert any("β is set to 0" in note for note in fit.notes)
    assert fit.predict(10**9) == pytest.approx(fit.intercept_s)


def test_negative_intercept_clamps_alpha_to_zero_and_says_why() -> None:
    fit = fit_alpha_beta([(10**6, 1e-3), (2 * 10**6, 3e-3), (3 * 10**6, 5e-3)], "all_gather", 2)
    assert fit.alpha_clamped and not fit.beta_clamped
    assert fit.alpha_s == 0.0 and fit.beta_s_per_byte > 0
    assert any("α is set to 0" in note for note in fit.notes)


def test_zero_durations_are_left_out_and_noted() -> None:
    fit = fit_alpha_beta([(8, 0.0), (1000, 1e-4), (10**6, 1e-3)], "broadcast", 2)
    assert (fit.points, fit.sizes) == (2, 2)
    assert any("timed at 0 s" in note for note in fit.notes)


# --- catalog -------------------------------------------------------------------------------------


def test_catalog_rows_have_a_source_a_date_and_sane_figures() -> None:
    rows = load_interconnects()
    assert len(rows) >= 15
    assert len({r.key for r in rows}) == len(rows)
    for r in rows:
        assert r.source and r.as_of, r.key
        assert r.scope in ("intra-node", "inter-node", "host"), r.key
        for v in (r.nominal_bytes_per_s, r.typical_busbw_low_bytes_per_s, r.typical_busbw_high_bytes_per_s):
            assert v is None or v > 0, r.key
        if r.typical_busbw_low_bytes_per_s and r.typical_busbw_high_bytes_per_s:
            assert r.typical_busbw_low_bytes_per_s <= r.typical_busbw_high_bytes_per_s, r.key
    assert by_key("nvlink4").nominal_bytes_per_s == pytest.approx(450 * GB)  # per direction, not 900
    assert by_key("pcie4_x16").typical_busbw_high_bytes_per_s == pytest.approx(24 * GB)
    # Not vendor figures: left blank rather than invented.
    for key in ("loopback", "sockets"):
        assert by_key(key).nominal_bytes_per_s is None
        assert "not a vendor figure" in by_key(key).source


def test_a_user_catalog_replaces_the_packaged_one_and_bad_rows_name_their_line(tmp_path: Path) -> None:
    header = (
        "key,name,scope,links,nominal_gbytes_per_s_per_direction,typical_busbw_gbytes_per_s_low,"
        "typical_busbw_gbytes_per_s_high,nominal_as_published,typical_busbw_as_published,source,as_of,notes\n"
    )
    good = tmp_path / "good.csv"
    good.write_text(header + "lab,Lab fabric,inter-node,,40,30,35,,,our own nccl-tests,2026-01-01,\n")
    (row,) = load_interconnects(good)
    assert row.typical_busbw_low_bytes_per_s == pytest.approx(30 * GB)
    bad = tmp_path / "bad.csv"
    bad.write_text(header + "lab,Lab fabric,inter-node,,40,30,35,,,,2026-01-01,\n")
    with pytest.raises(ValueError, match=r"bad\.csv line 2: every row needs a source"):
        load_interconnects(bad)


# --- which link, and the verdict -----------------------------------------------------------------


def test_expected_link_gloo_on_one_cpu_node_is_loopback() -> None:
    choice = expected_link(backend="gloo", device="cpu", num_nodes=1)
    assert choice.link is not None and choice.link.key == "loopback"
    assert "loopback" in choice.reason


def test_expected_link_nvlink4() -> None:
    choice = expected_link(
        backend="nccl", device="cuda", gpu_link={"nvlink_links_active": 18, "nvlink_version": 4}
    )
    assert choice.link == by_key("nvlink4")
    # NVML's raw version is an enum: 6 is NVLink 4.0, and 4 would be NVLink 3.0.
    raw = expected_link(
        backend="nccl", device="cuda", gpu_link={"nvlink_links_active": 18, "nvml_nvlink_version": 6}
    )
    assert raw.link == by_key("nvlink4")


def test_expected_link_fewer_nvlinks_scales_the_reference_and_says_so() -> None:
    choice = expected_link(backend="nccl", gpu_link={"nvlink_links_active": 12, "nvlink_version": 4})
    assert choice.link is not None
    assert choice.link.nominal_bytes_per_s == pytest.approx(300 * GB)
    assert "12 links are active" in choice.reason


def test_expected_link_pcie() -> None:
    choice = expected_link(backend="nccl", device="cuda", gpu_link={"pcie_gen": 4, "pcie_width": 16})
    assert choice.link == by_key("pcie4_x16")
    narrow = expected_link(backend="nccl", device="cuda", gpu_link={"pcie_gen": 4, "pcie_width": 8})
    assert narrow.link is not None and narrow.link.nominal_bytes_per_s == pytest.approx(15.75 * GB)


def test_the_inventory_link_facts_name_the_link() -> None:
    # As tuneup/collect/nvml.py records them for an H100 SXM: the maxima, NVML's raw NVLink version.
    gpu = {"name": "NVIDIA H100 80GB HBM3", "pcie_max_gen": 5, "pcie_max_width": 16, "nvml_nvlink_version": 6}
    facts = gpu_link_from_inventory({**gpu, "nvlink_links_active": 18, "pcie_gen": None})
    assert facts == {"pcie_gen": 5, "pcie_width": 16, "nvml_nvlink_version": 6, "nvlink_links_active": 18}
    assert expected_link(backend="nccl", gpu_link=facts).link == by_key("nvlink4")
    # No NVLink active: the PCIe link it recorded.
    assert expected_link(backend="nccl", gpu_link=gpu_link_from_inventory(gpu)).link == by_key("pcie5_x16")
    assert gpu_link_from_inventory(None) == {} and gpu_link_from_inventory({"name": "x"}) == {}


def test_expected_link_multi_node_needs_to_know_the_network() -> None:
    unknown = expected_link(backend="nccl", device="cuda", num_nodes=2)
    assert unknown.link is None and "did not record" in unknown.reason
    known = expected_link(backend="nccl", device="cuda", num_nodes=2, network="efa_p5")
    assert known.link == by_key("efa_p5")


def test_link_verdict_nvlink4() -> None:
    slow = link_verdict(5 * GB, by_key("nvlink4"))
    assert slow.far_below and slow.reference == "typical"
    assert slow.ratio == pytest.approx(5 / 370)
    assert "5.0 GB/s" in slow.sentence and "370" in slow.sentence and "NCCL_DEBUG=INFO" in slow.sentence
    fine = link_verdict(350 * GB, by_key("nvlink4"))
    assert not fine.far_below and fine.ratio == pytest.approx(350 / 370)


def test_link_verdict_falls_back_to_nominal_and_to_nothing() -> None:
    pcie5 = by_key("pcie5_x16")  # no typical figure: a tenth of the nominal 63 GB/s is the line
    assert link_verdict(5 * GB, pcie5).far_below
    assert not link_verdict(10 * GB, pcie5).far_below
    assert link_verdict(10 * GB, pcie5).reference == "nominal"
    efa = link_verdict(5 * GB, by_key("efa_p5"))
    assert efa.far_below and "NET/Socket" in efa.sentence
    none = link_verdict(1 * GB, by_key("loopback"))
    assert none.reference == "none" and none.ratio is None and not none.far_below
    with pytest.raises(ValueError, match="above 0"):
        link_verdict(0.0, by_key("nvlink4"))


def test_module_imports_without_torch_numpy_or_lightning() -> None:
    code = (
        "import sys, tuneup.analyze.interconnect, tuneup.catalog.interconnects as m; m.load_interconnects();"
        "heavy = [n for n in ('torch', 'numpy', 'lightning', 'pytorch_lightning') if n in sys.modules];"
        "assert not heavy, heavy"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
