"""Packaged reference data: what cloud instances cost, what GPUs can do, what links carry.

- `instances`: the price catalog (tuneup/data/instances.csv, extendable with the user's CSV).
- `gpus`: dense peak TFLOP/s, memory bandwidth and TDP per GPU, and which row a device is.
- `interconnects`: the links (NVLink, PCIe, networks) and the bandwidth each typically reaches, and which
  one a run's hardware has.

Facts only, each with a source and an "as of" date, read from files packaged with the code: no network,
no torch, and nothing from tuneup.analyze (the analysis reads the catalog, never the reverse).
"""

from tuneup.catalog.csv_text import CatalogError
from tuneup.catalog.gpus import (
    GpuSpec,
    load_gpu_specs,
    match_gpu,
    parse_pci_device_id,
    peak_tflops_for_precision,
)
from tuneup.catalog.instances import (
    CATALOG_VERSION,
    AmbiguousInstanceError,
    Instance,
    InstanceCatalog,
    PriceDates,
    UnknownInstanceError,
    load_instances,
)
from tuneup.catalog.interconnects import Interconnect, LinkChoice, expected_link, load_interconnects

__all__ = [
    "CATALOG_VERSION",
    "AmbiguousInstanceError",
    "CatalogError",
    "GpuSpec",
    "Instance",
    "InstanceCatalog",
    "Interconnect",
    "LinkChoice",
    "PriceDates",
    "UnknownInstanceError",
    "expected_link",
    "load_gpu_specs",
    "load_instances",
    "load_interconnects",
    "match_gpu",
    "parse_pci_device_id",
    "peak_tflops_for_precision",
]
