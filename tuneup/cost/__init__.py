"""Cost: what a run's hardware costs per hour, and what its GPUs could have done.

Pure functions over packaged data and a loaded run; no torch or Lightning import (reports are made on
machines without them).
"""

from tuneup.cost.catalog import (
    CATALOG_VERSION,
    AmbiguousInstanceError,
    CatalogError,
    GpuSpec,
    Instance,
    InstanceCatalog,
    PriceDates,
    UnknownInstanceError,
    load_gpu_specs,
    load_instances,
    match_gpu,
    parse_pci_device_id,
    peak_tflops_for_precision,
)

__all__ = [
    "CATALOG_VERSION",
    "AmbiguousInstanceError",
    "CatalogError",
    "GpuSpec",
    "Instance",
    "InstanceCatalog",
    "PriceDates",
    "UnknownInstanceError",
    "load_gpu_specs",
    "load_instances",
    "match_gpu",
    "parse_pci_device_id",
    "peak_tflops_for_precision",
]
