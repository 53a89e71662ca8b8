#!/usr/bin/env python3
"""Write tuneup's packaged catalogs (tuneup/data/instances.csv, gpus.csv) from the gathered facts.

    python scripts/build_catalogs.py [--prices CSV] [--specs CSV] [--out DIR] [--version V] [--check]

The facts live in ../shared/data (cloud_prices.csv, gpu_specs.csv) next to the development checkout;
that folder is not there in CI or in an installed package, so the output is committed as package data.
Edit this script (or the facts), never the generated files, and bump CATALOG_VERSION when a figure
changes. `--check` writes nothing and exits 1 when the committed files differ from what would be built.

What the build decides, row by row:

- key: `provider:instance`, the provider's own spelling of the instance. GCP rows name their region in
  parentheses ("a3-highgpu-8g (us-east4)"); it moves to the region column. Other providers' regions come
  from the source text ("vms.csv@<commit> us-east-1"); Lambda's price holds in every region (no region).
- GCP's GPU-only rows ("T4 attached to N1 (GPU only, us-central1)") become `gcp:n1-gpu-t4`,
  `gcp:n1-gpu-v100` and `gcp:n1-gpu-v100x8`: `<host>-gpu-<gpu>[x<count>]`, lowercase. Their price
  leaves out the host VM: host_included is "no" and the doubt says to add the host.
- gpu: the source's label ("H100", "A100-80GB") becomes the GPU row name ("H100-SXM",
  "A100-SXM4-80GB"). GPUs joined by NVSwitch or NVLink are SXM parts (PCIe A100/H100 and V100 boards
  have no NVSwitch, and V100 PCIe has no NVLink at all); an explicit PCIe link or name makes the PCIe
  part. A row that says neither is listed in FORM_FACTOR_TAKEN_AS, and its doubt says what was assumed.
- doubt: every reason to distrust a row, in words: "UNCERTAIN" in its name; clauses of its source or
  as_of that say anomalous, stale, suspicious(ly), unverified/not verified, derived or error; a GPU-only
  price; an assumed GPU form factor; an undated price; and the few facts in EXTRA_DOUBTS. Empty when none.
- as_of stays verbatim. as_of_date is the latest ISO date the as_of text names: the date a third-party
  read checked prices of that catalog commit. One commit is one snapshot, so that date dates its other
  rows too (where the commit is known to be partly stale, the rows say so in their doubt). Where the
  as_of text names no date (GCP: "date not exposed by index") as_of_date is empty and the doubt says
  "undated": a date named only in a row's source (a read that contradicted the row) does not date it.
- Numbers are copied as written; only validated.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tuneup.data.catalog_format import GPU_COLUMNS, INSTANCE_COLUMNS, as_of_date_from_text

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
OUT_DIR = ROOT / "tuneup" / "data"

CATALOG_VERSION = "2026.11.29"


# Words in a source, as_of or notes clause that mark it as a reason for doubt.
DOUBT_WORDS = re.compile(r"uncertain|anomal|stale|suspicious|unverified|not verified|derived|\berror\b", re.I)

# GPU labels of cloud_prices.csv whose one spec row needs no more context.
GPU_BY_LABEL = {
    "H100 PCIe": "H100-PCIe",
    "H100 NVL": "H100-NVL",
    "A10G": "A10G",
    "A10": "A10",
    "L4": "L4",
    "L40S": "L40S",
    "T4": "T4",
}
# Labels with an SXM and a PCIe part: (SXM row, PCIe row).
GPU_FORMS = {
    "H100": ("H100-SXM", "H100-PCIe"),
    "H200": ("H200-SXM", None),
    "A100": ("A100-SXM4-40GB", "A100-PCIe-40GB"),
    "A100-80GB": ("A100-SXM4-80GB", "A100-PCIe-80GB"),
    "V100": ("V100-SXM2", "V100-PCIe"),
    "V100-32GB": ("V100-SXM2", "V100-PCIe"),
}
# Single-GPU rows whose source states no form factor: what we take, and why (carried as doubt).
FORM_FACTOR_TAKEN_AS = {
    "aws:p5.4xlarge": ("H100-SXM", "taken as SXM, like the rest of the p5 family"),
    "aws:p3.2xlarge": ("V100-SXM2", "taken as SXM2, like the rest of the p3 family"),
    "gcp:a2-highgpu-1g": (
        "A100-SXM4-40GB",
        "taken as SXM4, like the a2-highgpu-8g (both 40GB parts have the same peak TFLOP/s and memory bandwidth)",
    ),
    "gcp:n1-gpu-v100": ("V100-SXM2", "taken as SXM2, like GCP's 8-GPU NVLink V100 row"),
    "azure:Standard_NC6s_v3": ("V100-PCIe", "taken as PCIe (the NCv3 series)"),
    "lambda:gpu_1x_a100": (
        "A100-PCIe-40GB",
        "taken as PCIe, since Lambda names its SXM4 types with an _sxm4 suffix (both 40GB parts have the "
        "same peak TFLOP/s and memory bandwidth)",
    ),
}
# Doubts the keyword scan cannot see, by key@region.
EXTRA_DOUBTS = {
    "aws:g6.12xlarge@us-east-2": "on-demand price is us-east-2's (the us-east-1 row was not read) while spot "
    "is the minimum over us-east-1 zones",
    "gcp:n1-gpu-t4@us-central1": "per-GPU price derived as the T4x4 row divided by 4",
}
UNDATED = "undated: the source catalog commit's date is not known"

_PARENS = re.compile(r"^(?P<name>[^()]+?)\s*\((?P<inside>[^()]*)\)\s*(?P<rest>.*)$")
_GPU_ONLY = re.compile(r"^(?P<gpu>[A-Za-z0-9]+)(?: x(?P<count>\d+))? attached to (?P<host>[A-Za-z0-9]+)$")
_SOURCE_REGION = re.compile(r"vms\.csv@[0-9a-f]+ (?P<region>[a-z]+(?:-[a-z]+)*(?:-?\d+)?)(?=[\s;]|$)")
_NUMBER = re.compile(r"^\d+(\.\d+)?$")


class BuildError(ValueError):
    """A fact the build cannot place: fix the facts or teach this script, never guess."""


@dataclass(frozen=True)
class NamedInstance:
    instance: str
    region: str | None
    marked_uncertain: bool
    gpu_only_host: str | None  # the host family a GPU-only price leaves out, e.g. "N1"


def split_name(provider: str, raw: str, source: str) -> NamedInstance:
    """The instance, its region, and what the raw name said about it ("UNCERTAIN", "GPU only")."""
    name = raw.strip()
    marked = bool(re.search(r"\bUNCERTAIN\b", name))
    name = re.sub(r"\s*\bUNCERTAIN\b\s*", " ", name).strip()
    region: str | None = None
    host: str | None = None
    parts = _PARENS.match(name)
    if parts:
        if parts["rest"]:
            raise BuildError(f"{provider}: cannot read instance name {raw!r}")
        name, inside = parts["name"].strip(), [p.strip() for p in parts["inside"].split(",")]
        if inside[0].lower() == "gpu only":
            gpu_only = _GPU_ONLY.match(name)
            if not gpu_only or len(inside) != 2:
                raise BuildError(f"{provider}: cannot read GPU-only row {raw!r}")
            host = gpu_only["host"]
            count = f"x{gpu_only['count']}" if gpu_only["count"] else ""
            name = f"{host}-gpu-{gpu_only['gpu']}{count}".lower()
            region = inside[1]
        elif len(inside) == 1:
            region = inside[0]
        else:
            raise BuildError(f"{provider}: cannot read instance name {raw!r}")
    elif found := _SOURCE_REGION.search(source):
        region = found["region"]
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$", name):
        raise BuildError(f"{provider}: instance name {name!r} (from {raw!r}) is not a clean key")
    return NamedInstance(instance=name, region=region, marked_uncertain=marked, gpu_only_host=host)


def gpu_row(
    label: str, key: str, gpu_count: int, intra_node_link: str, instance: str
) -> tuple[str, str | None]:
    """The GPU spec row name for a price row's GPU label, and the doubt of that choice (None if sure)."""
    if label in GPU_BY_LABEL:
        return GPU_BY_LABEL[label], None
    if label not in GPU_FORMS:
        raise BuildError(f"{key}: no GPU row for label {label!r}: add it to GPU_BY_LABEL or GPU_FORMS")
    sxm, pcie = GPU_FORMS[label]
    link = intra_node_link.lower()
    if "nvswitch" in link or "nvlink" in link or "sxm" in instance.lower():
        return sxm, None
    if "pcie" in link or "pcie" in instance.lower():
        if pcie is None:
            raise BuildError(f"{key}: {label} has no PCIe row")
        return pcie, None
    if key in FORM_FACTOR_TAKEN_AS:
        row, why = FORM_FACTOR_TAKEN_AS[key]
        return row, f"GPU form factor not stated in the source: {why}"
    raise BuildError(
        f"{key}: cannot tell the {label}'s form factor ({gpu_count} GPU, link {intra_node_link!r})"
    )


def clauses(text: str) -> list[str]:
    """A ';'-separated text's clauses, each without the parenthesis the split left unmatched."""
    out = []
    for part in text.split(";"):
        part = part.strip()
        if part.count("(") < part.count(")") and part.endswith(")"):
            part = part[:-1].rstrip()
        if part.count("(") > part.count(")"):
            part = " ".join(part.replace("(", " ", 1).split())
        if part:
            out.append(part)
    return out


def doubtful_clauses(text: str) -> list[str]:
    return [c for c in clauses(text) if DOUBT_WORDS.search(c)]


def _number(key: str, column: str, text: str, *, whole: bool = False, required: bool = False) -> str:
    text = text.strip()
    if not text:
        if required:
            raise BuildError(f"{key}: {column} is empty")
        return ""
    if not _NUMBER.match(text) or float(text) <= 0 or (whole and "." in text):
        raise BuildError(f"{key}: {column} is {text!r}")
    return text


def _csv_text(version_line: str, columns: Sequence[str], rows: Sequence[dict[str, str]]) -> str:
    out = io.StringIO()
    out.write(version_line + "\n")
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _version_line(version: str, what: str) -> str:
    return (
        f"# tuneup catalog version {version}; {what}; generated by scripts/build_catalogs.py: "
        "edit the script or pass --catalog, not this file"
    )


def build_instances(prices_text: str, version: str = CATALOG_VERSION, *, all_facts: bool = False) -> str:
    """instances.csv's text. `all_facts`: the input is the whole facts file, so every row the hand-written
    tables name must be in it (a renamed row would otherwise lose its doubt silently)."""
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    for line, src in enumerate(csv.DictReader(io.StringIO(prices_text)), start=2):
        provider = src["provider"].strip().lower()
        named = split_name(provider, src["instance"], src["source"])
        key = f"{provider}:{named.instance}"
        qualified = f"{key}@{named.region}" if named.region else key
        if qualified.lower() in seen:
            raise BuildError(f"cloud_prices.csv line {line}: {qualified} twice")
        seen.add(qualified.lower())
        gpu_count = int(_number(key, "gpu_count", src["gpu_count"], whole=True, required=True))
        gpu, gpu_doubt = gpu_row(
            src["gpu"].strip(), key, gpu_count, src["intra_node_interconnect"], named.instance
        )
        on_demand = _number(key, "on_demand_usd_hr", src["on_demand_usd_hr"], required=True)
        spot = _number(key, "spot_usd_hr", src["spot_usd_hr"])
        as_of = src["as_of"].strip()
        dated = as_of_date_from_text(as_of)
        doubts: list[str] = []
        if named.gpu_only_host:
            doubts.append(
                f"GPU-only price: the {named.gpu_only_host} host VM (vCPUs, memory) is not included; add its price"
            )
        if named.marked_uncertain:
            doubts.append("marked UNCERTAIN in the source")
        doubts += doubtful_clauses(src["source"])
        if qualified in EXTRA_DOUBTS:
            doubts.append(EXTRA_DOUBTS[qualified])
        if gpu_doubt:
            doubts.append(gpu_doubt)
        if spot and float(spot) >= float(on_demand):
            doubts.append("spot price is not below on-demand")
        doubts += [f"as of: {c}" for c in doubtful_clauses(as_of)]
        if dated is None:
            doubts.append(UNDATED)
        if not src["source"].strip() or not as_of:
            raise BuildError(f"{key}: every price needs a source and an as_of")
        rows.append(
            {
                "key": key,
                "provider": provider,
                "instance": named.instance,
                "region": named.region or "",
                "gpu": gpu,
                "gpu_count": str(gpu_count),
                "gpu_mem_gib": _number(key, "gpu_mem_gib", src["gpu_mem_gib"]),
                "vcpus": _number(key, "vcpus", src["vcpus"], whole=True),
                "mem_gib": _number(key, "mem_gib", src["mem_gib"]),
                "on_demand_usd_hr": on_demand,
                "spot_usd_hr": spot,
                "host_included": "no" if named.gpu_only_host else "yes",
                "intra_node_link": src["intra_node_interconnect"].strip(),
                "inter_node_gbps": src["inter_node_gbps"].strip(),
                "source": src["source"].strip(),
                "as_of": as_of,
                "as_of_date": dated or "",
                "doubt": "; ".join(doubts),
            }
        )
    if all_facts:
        for key in FORM_FACTOR_TAKEN_AS:
            if not any(r["key"] == key for r in rows):
                raise BuildError(f"FORM_FACTOR_TAKEN_AS names {key}, which no row has")
        for qualified in EXTRA_DOUBTS:
            if not any(f"{r['key']}@{r['region']}" == qualified for r in rows):
                raise BuildError(f"EXTRA_DOUBTS names {qualified}, which no row has")
    line = _version_line(version, "cloud instance prices in USD per hour")
    return _csv_text(line, INSTANCE_COLUMNS, rows)


def build_gpus(specs_text: str, version: str = CATALOG_VERSION) -> str:
    rows: list[dict[str, str]] = []
    for src in csv.DictReader(io.StringIO(specs_text)):
        name = src["gpu"].strip()
        pci = src["pci_device_id"].strip()
        if pci and not re.match(r"^0x[0-9a-fA-F]{4}$", pci):
            raise BuildError(f"{name}: pci_device_id {pci!r}")
        notes = src["notes"].strip()
        rows.append(
            {
                "name": name,
                "match_names": ";".join(n.strip() for n in src["match_names"].split(";") if n.strip()),
                "pci_device_id": pci.lower(),
                "mem_gib": _number(name, "mem_gib", src["mem_gib"], required=True),
                "bf16_dense_tflops": _number(name, "bf16", src["bf16_dense_tflops"]),
                "fp16_dense_tflops": _number(name, "fp16", src["fp16_dense_tflops"]),
                "tf32_dense_tflops": _number(name, "tf32", src["tf32_dense_tflops"]),
                "fp32_tflops": _number(name, "fp32", src["fp32_tflops"], required=True),
                "fp8_dense_tflops": _number(name, "fp8", src["fp8_dense_tflops"]),
                "mem_bw_gbytes_per_s": _number(name, "mem_bw", src["mem_bw_gbs"], required=True),
                "tdp_w": _number(name, "tdp_w", src["tdp_w"], required=True),
                "intra_node_link": src["intra_node_link"].strip(),
                "notes": notes,
                "doubt": "; ".join(doubtful_clauses(notes)),
            }
        )
    line = _version_line(version, "GPU peaks in dense TFLOP/s, memory bandwidth in GB/s (1e9 bytes/s)")
    return _csv_text(line, GPU_COLUMNS, rows)


def build(
    prices: Path = SHARED_DATA / "cloud_prices.csv",
    specs: Path = SHARED_DATA / "gpu_specs.csv",
    version: str = CATALOG_VERSION,
) -> dict[str, str]:
    """File name -> text of each packaged catalog, built from the facts."""
    return {
        "instances.csv": build_instances(prices.read_text(encoding="utf-8"), version, all_facts=True),
        "gpus.csv": build_gpus(specs.read_text(encoding="utf-8"), version),
    }


def validate(files: dict[str, str]) -> None:
    """Read the built text back with tuneup's own loader: what it refuses, the package would too."""
    from tuneup.catalog.gpus import parse_gpu_specs
    from tuneup.catalog.instances import parse_instances

    specs = parse_gpu_specs(files["gpus.csv"], "gpus.csv")
    for row in parse_instances(files["instances.csv"], "instances.csv", "packaged", specs):
        if row.gpu not in {s.name for s in specs}:
            raise BuildError(f"{row.qualified_key}: GPU {row.gpu!r} has no row in gpus.csv")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prices", type=Path, default=SHARED_DATA / "cloud_prices.csv")
    parser.add_argument("--specs", type=Path, default=SHARED_DATA / "gpu_specs.csv")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where to write (default: tuneup/data)")
    parser.add_argument("--version", default=CATALOG_VERSION, help="catalog version to stamp")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the files differ")
    args = parser.parse_args(argv)
    try:
        files = build(args.prices, args.specs, args.version)
        if args.check:
            stale = [n for n, text in files.items() if _written(args.out / n) != text]
            for name in stale:
                print(f"build_catalogs: {args.out / name} is not what the facts build; rerun without --check")
            return 1 if stale else 0
        for name, text in files.items():
            (args.out / name).write_text(text, encoding="utf-8")
            print(f"wrote {args.out / name} ({text.count(chr(10)) - 2} rows, version {args.version})")
        # After writing: importing tuneup.cost reads the packaged files, which a first build creates.
        validate(files)
    except (OSError, ValueError) as error:
        print(f"build_catalogs: {error}", file=sys.stderr)
        return 2
    return 0


def _written(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


if __name__ == "__main__":
    sys.exit(main())
