"""The columns of the packaged catalogs, in file order.

Here, apart from the loader (tuneup.cost.catalog, which reads the packaged files when imported), so that
scripts/build_catalogs.py can write the files from nothing with the same columns the loader reads.
"""

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
