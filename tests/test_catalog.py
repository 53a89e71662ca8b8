"""The packaged price and GPU catalogs: integrity, doubts, GPU matching traps, lookups, user catalogs.

Expected figures are written out here from the facts (shared/data), not read back from the module, so
that a wrong build or a wrong parse cannot agree with itself.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import io
import re
import subprocess
import sys
from datetime import date
from pathlib import Path
from types import ModuleType

import pytest

from tuneup.catalog import (
    CATALOG_VERSION,
    AmbiguousInstanceError,
    CatalogError,
    GpuSpec,
    Instance,
    InstanceCatalog,
    UnknownInstanceError,
    load_gpu_specs,
    load_instances,
    match_gpu,
    parse_pci_device_id,
    peak_tflops_for_precision,
)
from tuneup.catalog.csv_text import catalog_version_from_text
from tuneup.catalog.instances import REQUIRED_INSTANCE_COLUMNS
from tuneup.data.catalog_format import as_of_date_from_text

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tuneup" / "data"
SHARED_DATA = ROOT.parent / "shared" / "data"
BUILD_SCRIPT = ROOT / "scripts" / "build_catalogs.py"

# Words that mark a fact as doubtful in the source texts (README of shared/data and the issue).
DOUBT_WORDS = re.compile(r"uncertain|anomal|stale|suspicious|unverified|derived|gpu[- ]only", re.I)


@pytest.fixture(scope="module")
def catalog() -> InstanceCatalog:
    return load_instances()


@pytest.fixture(scope="module")
def specs() -> list[GpuSpec]:
    return load_gpu_specs()


def spec(name: str) -> GpuSpec:
    (row,) = [s for s in load_gpu_specs() if s.name == name]
    return row


def row(catalog: InstanceCatalog, qualified_key: str) -> Instance:
    (found,) = [r for r in catalog.rows if r.qualified_key == qualified_key]
    return found


def build_script() -> ModuleType:
    module_spec = importlib.util.spec_from_file_location("build_catalogs", BUILD_SCRIPT)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules["build_catalogs"] = module  # dataclasses look their module up while the class is made
    module_spec.loader.exec_module(module)
    return module


def write(tmp_path: Path, text: str, name: str = "my_prices.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


HEADER = ",".join(REQUIRED_INSTANCE_COLUMNS)  # provider,instance,gpu,gpu_count,on_demand_usd_hr,source,as_of


# ---------------------------------------------------------------------------------------------------
# Integrity of the packaged files
# ---------------------------------------------------------------------------------------------------


def test_version_is_in_both_files_and_exposed(catalog: InstanceCatalog) -> None:
    assert re.fullmatch(r"\d{4}\.\d{2}\.\d{2}", CATALOG_VERSION)
    assert catalog.version == CATALOG_VERSION
    for name in ("instances.csv", "gpus.csv"):
        assert catalog_version_from_text((DATA / name).read_text(encoding="utf-8")) == CATALOG_VERSION


def test_every_price_has_a_source_a_date_and_a_valid_unique_key(catalog: InstanceCatalog) -> None:
    assert len(catalog) == 42  # every row of shared/data/cloud_prices.csv
    for r in catalog:
        assert r.origin == "packaged"
        assert r.on_demand_usd_per_hour > 0, r.key
        assert r.source.strip() and r.as_of.strip(), r.key
        assert re.fullmatch(r"[a-z0-9_-]+:[A-Za-z0-9][A-Za-z0-9._+-]*", r.key), r.key
        assert r.key == f"{r.provider}:{r.instance}"
        assert r.gpu_count >= 1
        if r.as_of_date is None:
            assert r.doubt and "undated" in r.doubt, r.qualified_key
        else:
            assert date.fromisoformat(r.as_of_date).isoformat() == r.as_of_date
            assert r.as_of_date in r.as_of  # the date the verbatim text names, nothing invented
    keys = [r.qualified_key.lower() for r in catalog]
    assert len(keys) == len(set(keys))
    # A key repeats only for another region.
    assert {k for k in (r.key for r in catalog) if [r.key for r in catalog].count(k) > 1} == {
        "gcp:a3-highgpu-8g"
    }


def test_spot_is_below_on_demand_or_doubted(catalog: InstanceCatalog) -> None:
    for r in catalog:
        if r.spot_usd_per_hour is not None:
            assert r.spot_usd_per_hour > 0
            assert r.spot_usd_per_hour < r.on_demand_usd_per_hour or r.doubt, r.qualified_key


def test_figures_are_copied_from_the_facts(catalog: InstanceCatalog) -> None:
    p4d = catalog.lookup("aws:p4d.24xlarge")
    assert (p4d.on_demand_usd_per_hour, p4d.spot_usd_per_hour) == (21.957642, 2.4655)
    assert (p4d.gpu, p4d.gpu_count, p4d.gpu_mem_gib, p4d.vcpus, p4d.mem_gib) == (
        "A100-SXM4-40GB",
        8,
        40,
        96,
        1152,
    )
    assert p4d.inter_node_gbps == "400 (4x100 EFA)" and p4d.intra_node_link == "NVSwitch (NVLink)"
    assert p4d.region == "us-east-1" and p4d.as_of_date == "2026-11-09" and p4d.doubt is None
    assert p4d.usd_per_gpu_hour() == pytest.approx(21.957642 / 8)
    assert p4d.usd_per_gpu_hour(spot=True) == pytest.approx(2.4655 / 8)
    p5_single = catalog.lookup("aws:p5.4xlarge")
    assert p5_single.spot_usd_per_hour is None and p5_single.usd_per_gpu_hour(spot=True) is None
    assert p5_single.inter_node_gbps is None
    h200 = catalog.lookup("gcp:a3-ultragpu-8g")
    assert (h200.on_demand_usd_per_hour, h200.gpu, h200.gpu_mem_gib) == (86.75992, "H200-SXM", 141)
    lam = catalog.lookup("lambda:gpu_8x_h100_sxm5")
    assert lam.region is None and lam.as_of_date == "2026-09-25" and lam.on_demand_usd_per_hour == 31.92


def test_price_date_range(catalog: InstanceCatalog) -> None:
    dates = catalog.as_of_dates()
    assert (dates.earliest, dates.latest) == ("2026-09-25", "2026-11-09")
    assert dates.undated == 12  # the GCP rows: their catalog commit is undated


def test_every_gpu_has_dense_figures(specs: list[GpuSpec]) -> None:
    assert len(specs) == 15
    for s in specs:
        peaks = s.peak_tflops
        assert set(peaks) == {"bf16", "fp16", "tf32", "fp32", "fp8"}
        assert peaks["fp32"] and peaks["fp32"] > 0, s.name
        assert (peaks["bf16"] or peaks["fp16"] or 0) > peaks["fp32"], s.name
        assert s.mem_bw_gbytes_per_s > 0 and s.tdp_w > 0 and s.mem_gib > 0, s.name
        # Dense figures keep these ratios; a "with sparsity" headline mixed into one column breaks them.
        if peaks["bf16"] and peaks["fp8"]:
            assert 1.9 < peaks["fp8"] / peaks["bf16"] < 2.1, s.name
        if peaks["bf16"] and peaks["tf32"]:
            assert 0.45 < peaks["tf32"] / peaks["bf16"] < 0.55, s.name
    assert spec("H100-SXM").peak_tflops["bf16"] == 989.4  # the datasheet's 1979 is with sparsity
    assert spec("A100-SXM4-80GB").peak_tflops["bf16"] == 312
    assert spec("T4").peak_tflops["bf16"] is None and spec("T4").peak_tflops["fp16"] == 65


def test_pci_ids_are_unique_and_normalized(specs: list[GpuSpec]) -> None:
    ids = [s.pci_device_id for s in specs if s.pci_device_id is not None]
    assert len(ids) == len(specs) == len(set(ids))
    assert spec("H200-SXM").pci_device_id == 0x2335 and spec("A100-SXM4-40GB").pci_device_id == 0x20B0


def test_every_instance_gpu_resolves_to_a_spec_row(catalog: InstanceCatalog, specs: list[GpuSpec]) -> None:
    for r in catalog:
        found = r.gpu_spec(specs)
        assert found is not None and found.name == r.gpu, r.qualified_key


@pytest.mark.parametrize(
    ("key", "gpu"),
    [
        ("aws:p5.48xlarge", "H100-SXM"),  # 8 GPUs on NVSwitch: the SXM part
        ("aws:p4de.24xlarge", "A100-SXM4-80GB"),
        ("aws:p3dn.24xlarge", "V100-SXM2"),
        ("aws:g5.xlarge", "A10G"),
        ("aws:g6e.12xlarge", "L40S"),
        ("gcp:a2-highgpu-8g@us-central1", "A100-SXM4-40GB"),
        ("azure:Standard_NC40ads_H100_v5", "H100-NVL"),
        ("azure:Standard_NC24ads_A100_v4", "A100-PCIe-80GB"),  # "single GPU (PCIe)"
        ("lambda:gpu_1x_h100_pcie", "H100-PCIe"),
        ("lambda:gpu_1x_h100_sxm5", "H100-SXM"),
        ("lambda:gpu_1x_a10", "A10"),
    ],
)
def test_gpu_labels_map_to_the_right_part(catalog: InstanceCatalog, key: str, gpu: str) -> None:
    assert catalog.lookup(key).gpu == gpu


# ---------------------------------------------------------------------------------------------------
# Doubt is carried, never dropped
# ---------------------------------------------------------------------------------------------------


def test_every_doubtful_row_says_so(catalog: InstanceCatalog) -> None:
    flagged = [r for r in catalog if DOUBT_WORDS.search(r.source) or DOUBT_WORDS.search(r.as_of)]
    assert len(flagged) >= 10
    for r in flagged:
        assert r.doubt, r.qualified_key
    # ...and doubt is not blanket: plain rows stay plain.
    assert catalog.lookup("aws:p5.48xlarge").doubt is None
    assert catalog.lookup("lambda:gpu_1x_a10").doubt is None


@pytest.mark.parametrize(
    ("qualified_key", "words"),
    [
        ("gcp:a3-highgpu-8g@us-central1", ("UNCERTAIN", "anomalous")),
        ("gcp:a2-ultragpu-8g@us-central1", ("UNCERTAIN", "anomalous")),
        ("gcp:a2-highgpu-1g@us-central1", ("derived", "form factor")),
        ("gcp:g2-standard-48@us-central1", ("derived",)),
        ("azure:Standard_NC96ads_A100_v4@eastus", ("STALE", "19.108")),
        ("azure:Standard_ND96asr_v4@eastus", ("suspiciously low",)),
        ("azure:Standard_NC4as_T4_v3@eastus", ("stale",)),  # only its as_of says so
        ("aws:p4de.24xlarge@us-east-1", ("not verified",)),
        ("aws:g6.12xlarge@us-east-2", ("us-east-2", "us-east-1")),
        ("aws:p5.4xlarge@us-east-1", ("form factor", "SXM")),
        ("lambda:gpu_1x_a100", ("form factor", "PCIe")),
        ("gcp:a3-highgpu-8g@us-east4", ("undated",)),
    ],
)
def test_named_doubts(catalog: InstanceCatalog, qualified_key: str, words: tuple[str, ...]) -> None:
    doubt = row(catalog, qualified_key).doubt or ""
    for word in words:
        assert word in doubt, (qualified_key, doubt)


def test_gpu_only_prices_say_the_host_is_extra(catalog: InstanceCatalog) -> None:
    gpu_only = [r for r in catalog if not r.host_included]
    assert sorted(r.key for r in gpu_only) == ["gcp:n1-gpu-t4", "gcp:n1-gpu-v100", "gcp:n1-gpu-v100x8"]
    for r in gpu_only:
        assert r.doubt and "GPU-only" in r.doubt and "host" in r.doubt
        assert r.vcpus is None and r.mem_gib is None and r.region == "us-central1"
    v100x8 = catalog.lookup("gcp:n1-gpu-v100x8")
    assert (v100x8.gpu_count, v100x8.on_demand_usd_per_hour, v100x8.gpu) == (8, 19.84, "V100-SXM2")
    assert all(r.host_included for r in catalog if r.provider != "gcp")


def test_doubtful_gpu_rows(specs: list[GpuSpec]) -> None:
    assert "UNCERTAIN" in (spec("A10G").doubt or "")
    assert "unverified" in (spec("H100-NVL").doubt or "")
    assert "unverified" in (spec("A100-PCIe-80GB").doubt or "")
    assert [s.name for s in specs if s.doubt] == ["H100-NVL", "A100-PCIe-80GB", "A10G"]


# ---------------------------------------------------------------------------------------------------
# GPU matching: the traps
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H200", "H200-SXM"),  # Lightning 2.6.6 has no peak for it
        ("NVIDIA L40S", "L40S"),  # Lightning matches it to L4 by substring
        ("NVIDIA L40", None),  # not in the catalog: unknown, never the L4
        ("NVIDIA L4", "L4"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-32GB", "V100-SXM2"),
        ("  nvidia   h200 ", "H200-SXM"),  # case and spacing do not matter
        ("L40S", "L40S"),  # a row name
        ("H100-PCIe", "H100-PCIe"),
        ("NVIDIA H100", None),  # a prefix of two rows' names: no guess
        ("H100", None),
        ("NVIDIA A100", None),
        ("", None),
        (None, None),
    ],
)
def test_match_gpu_by_whole_name(name: str | None, expected: str | None) -> None:
    found = match_gpu(name)
    assert (found.name if found else None) == expected


@pytest.mark.parametrize(
    ("name", "pci", "expected"),
    [
        (None, 0x2335, "H200-SXM"),
        (None, "0x2335", "H200-SXM"),
        (None, "0x233510de", "H200-SXM"),  # NVML's packed pciDeviceId: device high, vendor low
        (None, 0x233510DE, "H200-SXM"),
        (None, "10de:2335", "H200-SXM"),  # lspci -n
        (None, "0x26B9", "L40S"),
        ("NVIDIA L4", "0x233510de", "H200-SXM"),  # the id beats a conflicting name
        ("NVIDIA L40S", "0x26b910de", "L40S"),
        ("Tesla V100-SXM2-32GB", "0x1db510de", "V100-SXM2"),  # an id the catalog lacks: the name decides
        ("NVIDIA H200", "0x23351002", "H200-SXM"),  # not NVIDIA's vendor id: the id is ignored
        (None, "0x9999", None),
        (None, "0x23351002", None),
    ],
)
def test_match_gpu_by_pci_id_first(name: str | None, pci: str | int, expected: str | None) -> None:
    found = match_gpu(name, pci)
    assert (found.name if found else None) == expected


def test_pci_id_forms() -> None:
    assert parse_pci_device_id("0x233510de") == parse_pci_device_id("0x2335") == 0x2335
    assert parse_pci_device_id(None) is None and parse_pci_device_id("") is None
    for bad in ("H100", "0xZZ", True, -1, "0x1233510de"):
        with pytest.raises(ValueError):
            parse_pci_device_id(bad)  # type: ignore[arg-type]


def test_rows_sharing_a_pci_id_are_told_apart_by_name_or_not_at_all(specs: list[GpuSpec]) -> None:
    h100 = spec("H100-SXM")
    twin = dataclasses.replace(h100, name="H100-SXM-twin", match_names=("NVIDIA H100 twin",))
    rows = [*specs, twin]
    assert match_gpu("NVIDIA H100 twin", 0x2330, rows) == twin
    assert match_gpu("NVIDIA H100 80GB HBM3", "0x233010de", rows) == h100
    assert match_gpu(None, 0x2330, rows) is None
    assert match_gpu("NVIDIA L4", 0x2330, rows) is None  # the id narrows to two rows, the name to neither


@pytest.mark.parametrize(
    ("gpu", "precision", "expected"),
    [
        ("H100-SXM", "bf16-mixed", (989.4, "bf16")),
        ("H100-SXM", "bf16-true", (989.4, "bf16")),
        ("H100-SXM", "16-mixed", (989.4, "fp16")),
        ("H100-SXM", "32-true", (66.9, "fp32")),
        ("H100-SXM", 32, (66.9, "fp32")),
        ("H100-SXM", "tf32", (494.7, "tf32")),
        ("H100-SXM", "transformer-engine", (1978.9, "fp8")),
        ("H100-SXM", "64-true", (None, "fp64")),
        ("A100-SXM4-40GB", "transformer-engine-float16", (None, "fp8")),
        ("A100-SXM4-40GB", "16", (312, "fp16")),
        ("T4", "bf16-mixed", (None, "bf16")),  # no bf16 on a T4: MFU is not defined
        ("T4", "16-mixed", (65, "fp16")),
        ("V100-PCIe", "16-true", (112, "fp16")),
        ("L40S", "BF16-Mixed", (362, "bf16")),
    ],
)
def test_peak_for_precision(gpu: str, precision: str | int, expected: tuple[float | None, str]) -> None:
    assert peak_tflops_for_precision(spec(gpu), precision) == expected


def test_unknown_precision_is_an_error() -> None:
    with pytest.raises(ValueError, match="bf17"):
        peak_tflops_for_precision(spec("L4"), "bf17-mixed")


# ---------------------------------------------------------------------------------------------------
# Lookup
# ---------------------------------------------------------------------------------------------------


def test_unknown_instance_names_the_closest_matches(catalog: InstanceCatalog) -> None:
    with pytest.raises(UnknownInstanceError) as caught:
        catalog.lookup("aws:p4d.24xl")
    assert caught.value.matches[0] == "aws:p4d.24xlarge"
    assert "aws:p4d.24xlarge" in str(caught.value) and "\n" not in str(caught.value)
    assert isinstance(caught.value, CatalogError)
    with pytest.raises(UnknownInstanceError) as caught:
        catalog.lookup("p4d")
    assert caught.value.matches[:2] == ("aws:p4d.24xlarge", "aws:p4de.24xlarge")
    with pytest.raises(UnknownInstanceError) as caught:
        catalog.lookup("azure:Standard_ND96isr_H100_v6")
    assert caught.value.matches[0] == "azure:Standard_ND96isr_H100_v5"
    with pytest.raises(UnknownInstanceError):
        catalog.lookup("oracle:bm.gpu.h100.8")


def test_lookup_is_case_insensitive(catalog: InstanceCatalog) -> None:
    assert catalog.lookup("AWS:P4D.24XLARGE").key == "aws:p4d.24xlarge"
    assert catalog.lookup(" azure:standard_nd96isr_h100_v5 ").key == "azure:Standard_ND96isr_H100_v5"
    assert catalog.lookup("p5.48xlarge").key == "aws:p5.48xlarge"  # a bare name one provider has


def test_lookup_regions(catalog: InstanceCatalog) -> None:
    with pytest.raises(AmbiguousInstanceError) as caught:
        catalog.lookup("gcp:a3-highgpu-8g")  # both regions carry doubt: no silent pick
    assert set(caught.value.choices) == {"gcp:a3-highgpu-8g@us-east4", "gcp:a3-highgpu-8g@us-central1"}
    assert "gcp:a3-highgpu-8g@us-east4" in str(caught.value)
    assert catalog.lookup("gcp:a3-highgpu-8g@us-east4").on_demand_usd_per_hour == 87.83247
    central = catalog.lookup("GCP:A3-HIGHGPU-8G@US-CENTRAL1")
    assert central.on_demand_usd_per_hour == 43.06615 and central.doubt
    assert catalog.lookup("aws:p4d.24xlarge@us-east-1").key == "aws:p4d.24xlarge"
    assert catalog.lookup("lambda:gpu_1x_a10@us-west-1").key == "lambda:gpu_1x_a10"  # one price everywhere
    with pytest.raises(UnknownInstanceError) as caught:
        catalog.lookup("aws:p4d.24xlarge@eu-west-1")
    assert caught.value.matches == ("aws:p4d.24xlarge@us-east-1",)


def test_keys_lists_every_row(catalog: InstanceCatalog) -> None:
    keys = catalog.keys()
    assert len(keys) == 42 and "gcp:n1-gpu-t4@us-central1" in keys and "lambda:gpu_1x_a100" in keys


# ---------------------------------------------------------------------------------------------------
# The user's catalog
# ---------------------------------------------------------------------------------------------------


def test_user_catalog_adds_a_row(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"{HEADER}\n"
        "coreweave,gd-8xh100ib-i128,NVIDIA H100 80GB HBM3,8,49.24,our contract,2026-10-31\n"
        "vast,rtx-6000-ada,RTX 6000 Ada,1,0.80,marketplace quote,read 2026-11-20\n",
    )
    catalog = load_instances(path)
    assert len(catalog) == 44 and catalog.user_catalog == str(path)
    mine = catalog.lookup("coreweave:gd-8xh100ib-i128")
    assert (mine.gpu, mine.gpu_count, mine.on_demand_usd_per_hour) == ("H100-SXM", 8, 49.24)
    assert (mine.origin, mine.as_of_date, mine.region, mine.spot_usd_per_hour) == (
        str(path),
        "2026-10-31",
        None,
        None,
    )
    assert mine.host_included and mine.doubt is None
    unknown_gpu = catalog.lookup("vast:rtx-6000-ada")
    assert unknown_gpu.gpu == "RTX 6000 Ada" and unknown_gpu.gpu_spec() is None  # priced, no MFU
    assert unknown_gpu.as_of_date == "2026-11-20"
    assert catalog.lookup("aws:p5.48xlarge").origin == "packaged"


def test_user_catalog_overrides_a_packaged_price(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "# negotiated rates\n"
        f"{HEADER},spot_usd_hr\n"
        "aws,p4d.24xlarge,A100-SXM4-40GB,8,15.00,enterprise discount,2026-11-01,\n",
    )
    catalog = load_instances(str(path))
    assert len(catalog) == 42
    p4d = catalog.lookup("aws:p4d.24xlarge")
    assert (p4d.on_demand_usd_per_hour, p4d.spot_usd_per_hour, p4d.origin) == (15.0, None, str(path))
    assert [r.key for r in catalog].count("aws:p4d.24xlarge") == 1
    assert catalog.keys().index("aws:p4d.24xlarge") == 2  # in the packaged row's place


def test_user_row_with_a_region_overrides_only_that_region(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"{HEADER},region\n"
        "gcp,a3-highgpu-8g,H100-SXM,8,80.00,committed-use quote,2026-11-15,us-east4\n"
        "gcp,a3-megagpu-8g,H100-SXM,8,90.00,committed-use quote,2026-11-15,europe-west4\n",
    )
    catalog = load_instances(path)
    assert catalog.lookup("gcp:a3-highgpu-8g@us-east4").on_demand_usd_per_hour == 80.0
    assert catalog.lookup("gcp:a3-highgpu-8g@us-central1").origin == "packaged"
    # Several regions, one without doubt (the user's): that one is the answer.
    assert catalog.lookup("gcp:a3-megagpu-8g").region == "europe-west4"
    assert catalog.lookup("gcp:a3-megagpu-8g@us-central1").on_demand_usd_per_hour == 92.21427


def test_user_catalog_with_every_column(tmp_path: Path) -> None:
    packaged_header = (DATA / "instances.csv").read_text(encoding="utf-8").splitlines()[1]
    line = (
        'acme:big-8,acme,big-8,mars-1,NVIDIA H200,8,141,96,2048,40,12.5,no,NVSwitch,"800 (4x200, RoCE)",'
        'quote #42,"2026-11-01, by phone",2026-11-02,spot is a guess'
    )
    catalog = load_instances(write(tmp_path, f"{packaged_header}\n{line}\n"))
    mine = catalog.lookup("acme:big-8@mars-1")
    assert (mine.gpu, mine.spot_usd_per_hour, mine.host_included) == ("H200-SXM", 12.5, False)
    assert (mine.inter_node_gbps, mine.as_of_date, mine.doubt) == (
        "800 (4x200, RoCE)",
        "2026-11-02",
        "spot is a guess",
    )
    assert mine.source == "quote #42"  # a '#' inside a row is text, not a comment


BAD_ROWS = [
    # (name, text, line, words in the message)
    (
        "non-numeric price",
        f"{HEADER}\naws,p9.xl,H100-SXM,8,55.0,quote,2026-11-01\naws,p9.2xl,H100-SXM,8,abc,quote,2026-11-01\n",
        3,
        ("on_demand_usd_hr", "'abc'"),
    ),
    ("missing source", f"{HEADER}\naws,p9.xl,H100-SXM,8,55.0,,2026-11-01\n", 2, ("source is empty",)),
    ("negative price", f"{HEADER}\naws,p9.xl,H100-SXM,8,-1,quote,2026-11-01\n", 2, ("-1", "above 0")),
    ("zero price", f"{HEADER}\naws,p9.xl,H100-SXM,8,0,quote,2026-11-01\n", 2, ("above 0",)),
    ("nan price", f"{HEADER}\naws,p9.xl,H100-SXM,8,nan,quote,2026-11-01\n", 2, ("above 0",)),
    ("gpu_count 0", f"{HEADER}\naws,p9.xl,H100-SXM,0,5,quote,2026-11-01\n", 2, ("gpu_count", "at least 1")),
    ("gpu_count 1.5", f"{HEADER}\naws,p9.xl,H100-SXM,1.5,5,quote,2026-11-01\n", 2, ("gpu_count",)),
    (
        "unknown column",
        f"{HEADER},discount\naws,p9.xl,H100-SXM,8,5,quote,2026-11-01,10\n",
        1,
        ("'discount'",),
    ),
    ("misspelled column", f"{HEADER},spot_usd_hour\n", 1, ("did you mean 'spot_usd_hr'",)),
    ("missing column", "provider,instance,gpu,gpu_count,source,as_of\n", 1, ("on_demand_usd_hr",)),
    ("empty file", "", 1, ("empty",)),
    ("header only", f"{HEADER}\n", 2, ("no rows",)),
    ("extra field", f"{HEADER}\naws,p9.xl,H100-SXM,8,5,quote,2026-11-01,surprise\n", 2, ("8 fields",)),
    (
        "repeated row",
        f"{HEADER}\naws,p9.xl,H100-SXM,8,5,quote,2026-11-01\n\nAWS,P9.XL,H100-SXM,8,6,quote,2026-11-01\n",
        4,
        ("twice", "line 2"),
    ),
    (
        "after comments and blank lines",
        f"# my prices\n#\n\n{HEADER}\n\naws,p9.xl,H100-SXM,8,,quote,2026-11-01\n",
        6,
        ("on_demand_usd_hr is empty",),
    ),
    (
        "after a quoted field spanning lines",
        f'{HEADER}\naws,p9.xl,H100-SXM,8,5,"quote,\nsecond line",2026-11-01\naws,p9.2xl,H100-SXM,x,5,q,2026-11-01\n',
        4,
        ("gpu_count",),
    ),
    ("spaces in instance", f"{HEADER}\naws,p9 xl,H100-SXM,8,5,quote,2026-11-01\n", 2, ("without spaces",)),
    ("region in the key", f"{HEADER}\naws,p9.xl@us-east-1,H100-SXM,8,5,q,2026-11-01\n", 2, ("region",)),
    (
        "bad as_of_date",
        f"{HEADER},as_of_date\naws,p9.xl,H100-SXM,8,5,q,Nov 1,11/01/2026\n",
        2,
        ("YYYY-MM-DD",),
    ),
    (
        "bad host_included",
        f"{HEADER},host_included\naws,p9.xl,H100-SXM,8,5,q,2026-11-01,maybe\n",
        2,
        ("yes",),
    ),
    (
        "key mismatch",
        f"key,{HEADER}\naws:p8.xl,aws,p9.xl,H100-SXM,8,5,q,2026-11-01\n",
        2,
        ("provider:instance",),
    ),
]


@pytest.mark.parametrize(("name", "text", "line", "words"), BAD_ROWS, ids=[b[0] for b in BAD_ROWS])
def test_bad_user_catalog_names_file_and_line(
    tmp_path: Path, name: str, text: str, line: int, words: tuple[str, ...]
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(CatalogError) as caught:
        load_instances(path)
    message = str(caught.value)
    assert f"{path}:{line}:" in message, message
    assert "my_prices.csv" in message and "fix:" in message and "\n" not in message
    assert (caught.value.path, caught.value.line) == (str(path), line)
    for word in words:
        assert word in message, message


def test_missing_or_unreadable_user_catalog(tmp_path: Path) -> None:
    for path, words in (
        (tmp_path / "nope.csv", "no such file"),
        (tmp_path, "not a file"),
    ):
        with pytest.raises(CatalogError) as caught:
            load_instances(path)
        assert str(path) in str(caught.value) and words in str(caught.value)
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes(f"{HEADER}\naws,p9.xl,H100-SXM,8,5,Caf\xe9,2026-11-01\n".encode("latin-1"))
    with pytest.raises(CatalogError, match="UTF-8"):
        load_instances(latin1)


def test_user_catalog_is_read_as_data_only(tmp_path: Path) -> None:
    # Text that would be code or a spreadsheet formula elsewhere stays text here.
    path = write(
        tmp_path,
        "\ufeff" + f'{HEADER}\nacme,x1,__import__(\'os\'),1,1.5,"=HYPERLINK(""x"")",{{0}}\n',
    )
    mine = load_instances(path).lookup("acme:x1")
    assert (mine.gpu, mine.source, mine.as_of, mine.as_of_date) == (
        "__import__('os')",
        '=HYPERLINK("x")',
        "{0}",
        None,
    )


# ---------------------------------------------------------------------------------------------------
# The build script
# ---------------------------------------------------------------------------------------------------


@pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason="../shared/data (the gathered facts) is not next to this checkout"
)
def test_packaged_files_are_what_the_facts_build() -> None:
    built = build_script().build(SHARED_DATA / "cloud_prices.csv", SHARED_DATA / "gpu_specs.csv")
    for name, text in built.items():
        assert (DATA / name).read_text(encoding="utf-8") == text, f"rerun scripts/build_catalogs.py ({name})"
    proc = subprocess.run([sys.executable, str(BUILD_SCRIPT), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason="../shared/data (the gathered facts) is not next to this checkout"
)
def test_every_doubtful_fact_reaches_the_catalog(catalog: InstanceCatalog) -> None:
    # Read the facts independently of the build: a source row with a doubt word anywhere has a doubt.
    text = (SHARED_DATA / "cloud_prices.csv").read_text(encoding="utf-8")
    facts = list(csv.DictReader(io.StringIO(text)))
    prices = {(r.provider, r.on_demand_usd_per_hour): r for r in catalog}
    assert len(prices) == len(facts) == len(catalog)
    doubtful = 0
    for fact in facts:
        mine = prices[(fact["provider"], float(fact["on_demand_usd_hr"]))]
        assert (mine.source, mine.as_of) == (fact["source"], fact["as_of"])
        if any(DOUBT_WORDS.search(fact[c]) for c in ("instance", "source", "as_of")):
            doubtful += 1
            assert mine.doubt, fact["instance"]
        if "UNCERTAIN" in fact["instance"]:
            assert "UNCERTAIN" in (mine.doubt or "")
    assert doubtful == 15  # 2 UNCERTAIN, 2 derived, 3 GPU-only, 8 Azure (as_of: partly stale)


def test_build_splits_names_and_keeps_doubt(tmp_path: Path) -> None:
    build = build_script()
    header = (
        "provider,instance,gpu,gpu_count,gpu_mem_gib,vcpus,mem_gib,on_demand_usd_hr,spot_usd_hr,"
        "intra_node_interconnect,inter_node_gbps,source,as_of"
    )
    prices = (
        f"{header}\n"
        "gcp,a3-highgpu-8g (europe-west4) UNCERTAIN,H100,8,80,208,1872,90,30,NVSwitch (NVLink),1000,"
        "src; looks anomalous,commit abc (date not exposed by index)\n"
        'gcp,"L4 x2 attached to G2 (GPU only, asia-east1)",L4,2,24,,,1.4,,PCIe,,src,read 2026-10-02\n'
        "aws,p5.48xlarge,H100,8,80,192,2048,55.04,,NVSwitch (NVLink),,"
        "skypilot vms.csv@00148f2a eu-west-2; fine,commit x (read 2026-11-09)\n"
    )
    text = build.build_instances(prices, "1.2.3")
    assert text.startswith("# tuneup catalog version 1.2.3;")
    rows = list(csv.DictReader(line for line in io.StringIO(text) if not line.startswith("#")))
    assert [(r["key"], r["region"], r["gpu"]) for r in rows] == [
        ("gcp:a3-highgpu-8g", "europe-west4", "H100-SXM"),
        ("gcp:g2-gpu-l4x2", "asia-east1", "L4"),
        ("aws:p5.48xlarge", "eu-west-2", "H100-SXM"),
    ]
    first, second, third = rows
    assert (
        "UNCERTAIN" in first["doubt"] and "looks anomalous" in first["doubt"] and "undated" in first["doubt"]
    )
    assert first["as_of_date"] == "" and first["instance"] == "a3-highgpu-8g"
    assert second["host_included"] == "no" and "G2 host" in second["doubt"]
    assert second["as_of_date"] == "2026-10-02" and second["vcpus"] == ""
    assert (third["doubt"], third["as_of_date"], third["on_demand_usd_hr"]) == ("", "2026-11-09", "55.04")
    # The build and the loader date an as-of text with the same function: the latest date it names.
    assert build.as_of_date_from_text is as_of_date_from_text
    assert as_of_date_from_text("x 2026-09-25 and 2026-11-09") == "2026-11-09"
    assert as_of_date_from_text("commit 006059e0 (date not exposed by index)") is None


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("aws,x1.big,B200,8,,,,10,,NVSwitch,,src,2026-11-01", "no GPU row for label 'B200'"),
        ("aws,x1.small,A100,1,40,,,3,,single GPU,,src,2026-11-01", "form factor"),
        ("aws,x1.big,H100,8,,,,-3,,NVSwitch,,src,2026-11-01", "on_demand_usd_hr"),
    ],
)
def test_build_refuses_facts_it_cannot_place(line: str, error: str) -> None:
    build = build_script()
    header = (
        "provider,instance,gpu,gpu_count,gpu_mem_gib,vcpus,mem_gib,on_demand_usd_hr,spot_usd_hr,"
        "intra_node_interconnect,inter_node_gbps,source,as_of"
    )
    with pytest.raises(build.BuildError, match=re.escape(error)):
        build.build_instances(f"{header}\n{line}\n")


def test_catalog_and_cost_packages_do_not_import_torch() -> None:
    code = (
        "import sys, tuneup.cost.pricing, tuneup.cost.options; import tuneup.catalog as c;"
        "c.load_instances().lookup('aws:p4d.24xlarge');"
        "c.match_gpu('NVIDIA H200');"
        "assert not {'torch', 'lightning', 'pytorch_lightning'} & set(sys.modules), 'heavy import'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
