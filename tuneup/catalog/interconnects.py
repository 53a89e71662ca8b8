"""The catalog of links: which link a run's hardware has, and what bandwidth the catalog gives it.

tuneup/data/interconnects.csv (or the user's CSV with the same columns) lists each link with its nominal
bandwidth per direction and the bus bandwidth nccl-tests typically reaches over it, each with a source
and an "as of" date. `expected_link` picks the row a run's collectives should be compared with, from
the backend, the node count and the GPUs' NVML link facts; tuneup.analyze.interconnect measures the
run against it.

Units: bandwidths are bytes per second in the API (`*_bytes_per_s`); the CSV gives GB/s (10⁹ bytes per
second, as nccl-tests prints them). No torch here.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

GB = 1e9  # nccl-tests' GB: bandwidths are printed in 10⁹ bytes per second

SCOPES = ("intra-node", "inter-node", "host")

# nvmlDeviceGetNvLinkVersion returns an nvmlNvlinkVersion_t, not the generation: 4 means NVLink 3.0
# and an H100 reports 6 (NVML_NVLINK_VERSION_4_0). NVML's docs said otherwise until 2025 (hwloc issue
# 658). Raw value -> NVLink generation.
NVML_NVLINK_VERSION_TO_GENERATION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}

# The run inventory's names for a GPU's NVML link facts (tuneup/collect/nvml.py) -> expected_link's,
# which speak of the link's generation and width: the inventory records the maxima, as an idle link
# reports Gen1.
INVENTORY_LINK_FACTS = {
    "nvml_nvlink_version": "nvml_nvlink_version",
    "nvlink_links_active": "nvlink_links_active",
    "pcie_max_gen": "pcie_gen",
    "pcie_max_width": "pcie_width",
}


@dataclass(frozen=True, slots=True)
class Interconnect:
    """A link and what it carries: nominal per direction, and the busbw nccl-tests typically reaches."""

    key: str  # stable identifier, e.g. "nvlink4"
    name: str
    scope: str  # "intra-node", "inter-node" or "host"
    nominal_bytes_per_s: float | None  # per direction; per port or per node as `notes` says
    typical_busbw_low_bytes_per_s: float | None
    typical_busbw_high_bytes_per_s: float | None
    source: str
    as_of: str
    links: int | None = None  # PCIe lanes or NVLink links the figures assume
    notes: str = ""


CATALOG_COLUMNS = (
    "key",
    "name",
    "scope",
    "links",
    "nominal_gbytes_per_s_per_direction",
    "typical_busbw_gbytes_per_s_low",
    "typical_busbw_gbytes_per_s_high",
    "nominal_as_published",
    "typical_busbw_as_published",
    "source",
    "as_of",
    "notes",
)


def _gbytes(where: str, column: str, text: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {column} must be a number of GB/s or empty, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{where}: {column} must be above 0, got {text!r}")
    return value * GB


def _parse_catalog(text: str, origin: str) -> list[Interconnect]:
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in CATALOG_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"{origin}: missing column(s) {', '.join(missing)}")
    rows: list[Interconnect] = []
    seen: set[str] = set()
    for row in reader:
        where = f"{origin} line {reader.line_num}"
        if None in row:
            raise ValueError(f"{where}: more fields than columns (quote fields that hold commas)")
        key = (row["key"] or "").strip()
        if not key or key in seen:
            raise ValueError(f"{where}: key {key!r} is empty or repeated")
        seen.add(key)
        scope = (row["scope"] or "").strip()
        if scope not in SCOPES:
            raise ValueError(f"{where}: scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        source, as_of = (row["source"] or "").strip(), (row["as_of"] or "").strip()
        if not source or not as_of:
            raise ValueError(f"{where}: every row needs a source and an as_of date")
        links_text = (row["links"] or "").strip()
        if links_text and not (links_text.isdigit() and int(links_text) > 0):
            raise ValueError(f"{where}: links must be a whole number above 0 or empty, got {links_text!r}")
        low = _gbytes(where, "typical_busbw_gbytes_per_s_low", row["typical_busbw_gbytes_per_s_low"] or "")
        high = _gbytes(where, "typical_busbw_gbytes_per_s_high", row["typical_busbw_gbytes_per_s_high"] or "")
        if low is not None and high is not None and low > high:
            raise ValueError(f"{where}: the typical low end is above the high end")
        rows.append(
            Interconnect(
                key=key,
                name=(row["name"] or "").strip() or key,
                scope=scope,
                nominal_bytes_per_s=_gbytes(
                    where,
                    "nominal_gbytes_per_s_per_direction",
                    row["nominal_gbytes_per_s_per_direction"] or "",
                ),
                typical_busbw_low_bytes_per_s=low,
                typical_busbw_high_bytes_per_s=high,
                source=source,
                as_of=as_of,
                links=int(links_text) if links_text else None,
                notes=(row["notes"] or "").strip(),
            )
        )
    return rows


def load_interconnects(path: str | Path | None = None) -> list[Interconnect]:
    """The catalog of links: the packaged one, or a CSV with the same columns at `path` (replacing it).

    Raises ValueError naming the file and line of a malformed row.
    """
    if path is None:
        text = resources.files("tuneup.data").joinpath("interconnects.csv").read_text(encoding="utf-8")
        return _parse_catalog(text, "tuneup/data/interconnects.csv")
    return _parse_catalog(Path(path).read_text(encoding="utf-8"), str(path))


# ---------------------------------------------------------------------------------------------------
# Which link to compare with
# ---------------------------------------------------------------------------------------------------


def gpu_link_from_inventory(gpu: Mapping[str, Any] | None) -> dict[str, Any]:
    """One GPU's recorded link facts (an entry of the manifest's GPU inventory) in the names
    `expected_link` takes as `gpu_link`; empty when it recorded none."""
    if not isinstance(gpu, Mapping):
        return {}
    return {theirs: gpu[ours] for ours, theirs in INVENTORY_LINK_FACTS.items() if gpu.get(ours) is not None}


@dataclass(frozen=True, slots=True)
class LinkChoice:
    link: Interconnect | None  # None: nothing in the catalog fits what the run recorded
    reason: str


def _scaled(row: Interconnect, have: int, unit: str) -> Interconnect:
    """The row's figures scaled to `have` lanes or links: bandwidth grows with them, roughly linearly."""
    share = have / row.links if row.links else 1.0

    def scale(v: float | None) -> float | None:
        return v * share if v is not None else None

    return replace(
        row,
        key=f"{row.key}@{have}",
        name=f"{row.name}, scaled to {have} {unit}",
        nominal_bytes_per_s=scale(row.nominal_bytes_per_s),
        typical_busbw_low_bytes_per_s=scale(row.typical_busbw_low_bytes_per_s),
        typical_busbw_high_bytes_per_s=scale(row.typical_busbw_high_bytes_per_s),
        links=have,
        notes=f"{row.notes}; figures scaled from {row.links} {unit} in proportion".lstrip("; "),
    )


def _by_key(catalog: Sequence[Interconnect], key: str) -> Interconnect | None:
    return next((r for r in catalog if r.key.lower() == key.lower()), None)


def _int_hint(hints: Mapping[str, Any], name: str) -> int | None:
    value = hints.get(name)
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _nvlink_generation(hints: Mapping[str, Any]) -> int | None:
    generation = _int_hint(hints, "nvlink_version")
    if generation is not None:
        return generation
    raw = _int_hint(hints, "nvml_nvlink_version")
    return NVML_NVLINK_VERSION_TO_GENERATION.get(raw) if raw is not None else None


def expected_link(
    *,
    backend: str | None,
    device: str | None = None,
    num_nodes: int = 1,
    gpu_link: Mapping[str, Any] | None = None,
    network: str | None = None,
    catalog: Sequence[Interconnect] | None = None,
) -> LinkChoice:
    """The catalog row a run's collective bandwidth should be compared with, and why.

    - Several nodes: the network bounds every collective that spans them. `network` names a row (key or
      name, e.g. "efa_p5"); without it there is nothing to compare with.
    - gloo on one node: loopback TCP, whatever the device (gloo stages CUDA tensors through the host).
    - NCCL on one node, from `gpu_link` (NVML facts of one GPU):
      "nvlink_links_active" with "nvlink_version" (the generation, 4 for H100) or
      "nvml_nvlink_version" (NVML's raw nvmlNvlinkVersion_t, 6 for H100) -> that NVLink;
      otherwise "pcie_gen" and "pcie_width" -> that PCIe. Pass the link's maximum generation
      (nvmlDeviceGetMaxPcieLinkGeneration): the current one drops to Gen1 while the GPU idles.
      Fewer active links or lanes than the row assumes scale its figures, and the reason says so:
      a link that is down is itself a finding.
    """
    rows = list(catalog) if catalog is not None else load_interconnects()
    backend_l = (backend or "").lower()
    hints = gpu_link or {}

    if num_nodes > 1:
        if network:
            row = _by_key(rows, network) or next((r for r in rows if r.name.lower() == network.lower()), None)
            if row is None:
                return LinkChoice(None, f"no catalog row named {network!r}")
            return LinkChoice(
                row, f"{num_nodes} nodes: the network between them ({row.name}) bounds the collectives"
            )
        return LinkChoice(
            None,
            f"{num_nodes} nodes: the network between them bounds the collectives, and the run did not "
            "record which network that is",
        )

    if backend_l == "gloo":
        row = _by_key(rows, "loopback")
        return LinkChoice(
            row, "gloo on one node sends every collective through TCP on the loopback interface"
        )

    if backend_l != "nccl":
        return LinkChoice(None, f"no link model for backend {backend!r} on device {device!r}")

    links_active = _int_hint(hints, "nvlink_links_active")
    generation = _nvlink_generation(hints)
    if links_active and links_active > 0:
        if generation is None:
            return LinkChoice(None, f"{links_active} NVLink links are active, but their version is unknown")
        row = _by_key(rows, f"nvlink{generation}")
        if row is None:
            return LinkChoice(None, f"no catalog row for NVLink {generation}")
        if row.links and links_active != row.links:
            return LinkChoice(
                _scaled(row, links_active, "links"),
                f"NCCL on one node uses NVLink {generation}; {links_active} links are active where "
                f"{row.name} has {row.links}",
            )
        return LinkChoice(row, f"NCCL on one node uses NVLink {generation} ({links_active} links active)")

    gen, width = _int_hint(hints, "pcie_gen"), _int_hint(hints, "pcie_width")
    if gen is not None and width:
        row = _by_key(rows, f"pcie{gen}_x16")
        if row is None:
            return LinkChoice(None, f"no catalog row for PCIe Gen{gen}")
        if row.links and width != row.links:
            return LinkChoice(
                _scaled(row, width, "lanes"),
                f"NCCL on one node without NVLink goes over PCIe Gen{gen}, here x{width}",
            )
        return LinkChoice(row, f"NCCL on one node without NVLink goes over PCIe Gen{gen} x{width}")

    return LinkChoice(None, "the run recorded neither NVLink nor PCIe link facts for its GPUs")
