"""The format of the packaged catalogs: their columns in file order, and how an as-of text is dated.

Here, apart from the loader (tuneup.catalog, which reads the packaged files when imported), so that
scripts/build_catalogs.py can write the files from nothing in the format the loader reads.
"""

from __future__ import annotations

import re
from datetime import date

_ISO_DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")

INSTANCE_COLUMNS = (
    "key",
    "provider",
    "instance",
    "region",
    "gpu",
    "gpu_count",
    "gpu_mem_gib",
    "vcpus",
    "mem_gib",
    "on_demand_usd_hr",
    "spot_usd_hr",
    "host_included",
    "intra_node_link",
    "inter_node_gbps",
    "source",
    "as_of",
    "as_of_date",
    "doubt",
)

GPU_COLUMNS = (
    "name",
    "match_names",
    "pci_device_id",
    "mem_gib",
    "bf16_dense_tflops",
    "fp16_dense_tflops",
    "tf32_dense_tflops",
    "fp32_tflops",
    "fp8_dense_tflops",
    "mem_bw_gbytes_per_s",
    "tdp_w",
    "intra_node_link",
    "notes",
    "doubt",
)


def as_of_date_from_text(as_of: str) -> str | None:
    """The latest ISO date (YYYY-MM-DD) an as_of text names, or None when it names none."""
    dates = []
    for text in _ISO_DATE.findall(as_of):
        try:
            dates.append(date.fromisoformat(text).isoformat())
        except ValueError:
            continue
    return max(dates) if dates else None
