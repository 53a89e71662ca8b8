"""The packaged GPU catalog: what each GPU can do, and which row a device is.

tuneup/data/gpus.csv, written by scripts/build_catalogs.py from facts the developers gathered: dense peak
TFLOP/s per precision (never the "with sparsity" headline), memory bandwidth and TDP of each GPU,
matched by PCI device id first and by whole name second, never by substring. A row known to be doubtful
says why in `doubt`.

No torch here: reports are made on machines without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tuneup.catalog.csv_text import PACKAGED_LABEL, Cells, packaged_text, read_records
from tuneup.data.catalog_format import GPU_COLUMNS

GPUS_FILE = "gpus.csv"

PRECISION_COLUMNS = ("bf16", "fp16", "tf32", "fp32", "fp8")
_PEAK_COLUMN = {
    "bf16": "bf16_dense_tflops",
    "fp16": "fp16_dense_tflops",
    "tf32": "tf32_dense_tflops",
    "fp32": "fp32_tflops",
    "fp8": "fp8_dense_tflops",
}

# Lightning's precision strings -> the peak column whose units do the matmuls. Transformer Engine runs
# the layers it replaces in fp8, so its peak is the fp8 one (MFU against it is the conservative figure).
# The catalog has no fp64 figures: "64-true" maps to a column no row has, so MFU is not defined.
PRECISION_TO_COLUMN = {
    "bf16-mixed": "bf16",
    "bf16-true": "bf16",
    "bf16": "bf16",
    "16-mixed": "fp16",
    "16-true": "fp16",
    "16": "fp16",
    "fp16": "fp16",
    "32-true": "fp32",
    "32": "fp32",
    "fp32": "fp32",
    "tf32": "tf32",
    "64-true": "fp64",
    "64": "fp64",
    "transformer-engine": "fp8",
    "transformer-engine-float16": "fp8",
    "fp8": "fp8",
}

NVIDIA_PCI_VENDOR_ID = 0x10DE


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: dense peaks per precision (None where the GPU has no such tensor path)."""

    name: str  # the catalog's row name, e.g. "H100-SXM"
    match_names: tuple[str, ...]  # device names as the driver reports them, e.g. "NVIDIA H100 80GB HBM3"
    pci_device_id: int | None  # 16-bit PCI device id, e.g. 0x2330
    mem_gib: float
    # "bf16", "fp16", "tf32", "fp32", "fp8" -> dense TFLOP/s; kept out of the hash (a dict has none).
    peak_tflops: dict[str, float | None] = field(hash=False)
    mem_bw_gbytes_per_s: float
    tdp_w: float
    intra_node_link: str
    notes: str
    doubt: str | None

    @property
    def name_keys(self) -> frozenset[str]:
        """The whole names this row answers to, normalized as `match_gpu` compares them."""
        return frozenset(_gpu_name_key(n) for n in (self.name, *self.match_names))


def _gpu_name_key(name: str) -> str:
    # Whole names only, compared without case, runs of spaces or the vendor prefix: "NVIDIA L40S" and
    # "L40S" are one name, "L40S" and "L4" are two (a substring match is how L40S became an L4).
    text = " ".join(name.lower().split())
    return text[len("nvidia ") :] if text.startswith("nvidia ") else text


def parse_pci_device_id(value: str | int | None) -> int | None:
    """The 16-bit PCI device id from an int, "0x2335", "2335", "10de:2335" or NVML's packed "0x233510de".

    NVML's pciDeviceId packs the device id in the high 16 bits and the vendor id in the low 16; a packed
    id of another vendor gives None. Raises ValueError for text that is not a PCI id.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"not a PCI device id: {value!r}")
    if isinstance(value, int):
        number = value
    else:
        text = value.strip().lower()
        if not text:
            return None
        vendor_text, colon, device_text = text.partition(":")
        try:
            if colon:
                if int(vendor_text, 16) != NVIDIA_PCI_VENDOR_ID:
                    return None
                return int(device_text, 16)
            number = int(text, 16)
        except ValueError:
            raise ValueError(f"not a PCI device id: {value!r}") from None
    if number < 0 or number > 0xFFFFFFFF:
        raise ValueError(f"not a PCI device id: {value!r}")
    if number > 0xFFFF:
        return number >> 16 if number & 0xFFFF == NVIDIA_PCI_VENDOR_ID else None
    return number


def parse_gpu_specs(text: str, label: str = "<gpus>") -> list[GpuSpec]:
    """The rows of a GPU catalog CSV text (the columns of tuneup/data/gpus.csv). Raises CatalogError."""
    specs: list[GpuSpec] = []
    seen: dict[str, int] = {}
    for line, cells in read_records(text, label, GPU_COLUMNS, GPU_COLUMNS[:2]):
        c = Cells(label, line, cells)
        name = c.required_text("name")
        if name.lower() in seen:
            raise c.error(
                f"GPU {name!r} is listed twice (first on line {seen[name.lower()]})", "keep one row"
            )
        seen[name.lower()] = line
        try:
            pci = parse_pci_device_id(c.text("pci_device_id"))
        except ValueError:
            raise c.error(
                f"pci_device_id {c.text('pci_device_id')!r}", "write it in hex, e.g. 0x2330"
            ) from None
        specs.append(
            GpuSpec(
                name=name,
                match_names=tuple(n.strip() for n in (c.text("match_names") or "").split(";") if n.strip()),
                pci_device_id=pci,
                mem_gib=c.required_number("mem_gib"),
                peak_tflops={p: c.number(col) for p, col in _PEAK_COLUMN.items()},
                mem_bw_gbytes_per_s=c.required_number("mem_bw_gbytes_per_s"),
                tdp_w=c.required_number("tdp_w"),
                intra_node_link=c.text("intra_node_link") or "",
                notes=c.text("notes") or "",
                doubt=c.text("doubt"),
            )
        )
    return specs


def load_gpu_specs() -> list[GpuSpec]:
    """The packaged GPU rows (a fresh list: callers may keep or filter it)."""
    return parse_gpu_specs(packaged_text(GPUS_FILE), PACKAGED_LABEL.format(GPUS_FILE))


def match_gpu(
    name: str | None, pci_device_id: str | int | None = None, specs: Sequence[GpuSpec] | None = None
) -> GpuSpec | None:
    """The spec row of a GPU: by PCI device id first, then by exact whole name; never by substring.

    `name` is the device name as torch or NVML reports it ("NVIDIA H100 80GB HBM3") or a row name
    ("H100-SXM"), compared without case and without a leading "NVIDIA ". `pci_device_id` takes any form
    `parse_pci_device_id` reads. An id the catalog knows wins over a conflicting name; an id it does not
    know leaves the name to decide. Where rows share an id, the name picks one of them or nothing.
    None when nothing matches exactly: a caller then says MFU is unknown rather than guessing.
    """
    rows = list(specs) if specs is not None else load_gpu_specs()
    wanted = _gpu_name_key(name) if name and name.strip() else None
    device = parse_pci_device_id(pci_device_id)
    if device is not None:
        by_id = [s for s in rows if s.pci_device_id == device]
        if len(by_id) == 1:
            return by_id[0]
        if by_id:
            named = [s for s in by_id if wanted is not None and wanted in s.name_keys]
            return named[0] if len(named) == 1 else None
    if wanted is None:
        return None
    named = [s for s in rows if wanted in s.name_keys]
    return named[0] if len(named) == 1 else None


def peak_tflops_for_precision(spec: GpuSpec, precision: str | int) -> tuple[float | None, str]:
    """(dense peak TFLOP/s, the column used) for a Lightning precision setting on this GPU.

    "bf16-mixed"/"bf16-true" -> bf16, "16-mixed"/"16-true" -> fp16, "transformer-engine*" -> fp8,
    "32-true" -> fp32, "64-true" -> fp64 (no catalog figures). fp32 training is compared with the fp32
    (CUDA core) peak; where TF32 matmuls are enabled (torch.backends.cuda.matmul.allow_tf32, or
    `torch.set_float32_matmul_precision("high")`) the tf32 peak is the right one, and the caller may pass
    "tf32". The peak is None when the GPU has no such figure (a T4 has no bf16): MFU is then not defined.
    Raises ValueError for a precision it does not know.
    """
    text = str(precision).strip().lower()
    column = PRECISION_TO_COLUMN.get(text)
    if column is None:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISION_TO_COLUMN)}")
    return spec.peak_tflops.get(column), column
