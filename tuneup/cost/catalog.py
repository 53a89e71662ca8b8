"""The packaged price and GPU catalogs: what a cloud instance costs, and what its GPUs can do.

Two package data files, written by scripts/build_catalogs.py from facts the developers gathered
(shared/data in the development checkout) and committed with the code; nothing is fetched at run time:

- tuneup/data/instances.csv: one row per instance type (and per region where the catalog lists several),
  with on-demand and spot USD per hour, the GPUs, the links, and for every price its source and "as of".
- tuneup/data/gpus.csv: dense peak TFLOP/s per precision (never the "with sparsity" headline), memory
  bandwidth and TDP of each GPU, matched by PCI device id first and by whole name second.

A row known to be doubtful says why in `doubt`; every figure is as exact as its source, no more, and a
report shows the doubt next to the figure.

The user's catalog (`--catalog FILE`, see `load_instances`) is a CSV with the columns of instances.csv;
it adds rows and overrides packaged ones. It is read with the csv module as data, nothing else.

Instance keys are `provider:instance` (e.g. `aws:p4d.24xlarge`, `gcp:a3-ultragpu-8g`); a key listed for
several regions is told apart by `provider:instance@region` (e.g. `gcp:a3-highgpu-8g@us-east4`).

No torch here: reports are made on machines without it.
"""

from __future__ import annotations

import csv
import difflib
import io
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from functools import cache
from importlib import resources
from pathlib import Path

from tuneup.data.catalog_format import GPU_COLUMNS, INSTANCE_COLUMNS, as_of_date_from_text

PACKAGED = "packaged"
INSTANCES_FILE = "instances.csv"
GPUS_FILE = "gpus.csv"
# How the packaged files name themselves in errors: the path a developer would open.
_PACKAGED_LABEL = "tuneup/data/{}"
VERSION_LINE_PREFIX = "# tuneup catalog version "

# A user's catalog needs only these; the other columns may be left out or empty.
REQUIRED_INSTANCE_COLUMNS = (
    "provider",
    "instance",
    "gpu",
    "gpu_count",
    "on_demand_usd_hr",
    "source",
    "as_of",
)

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
_PROVIDER = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_INSTANCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


class CatalogError(ValueError):
    """A catalog that cannot be used. The message is one line: the file, the line and the fix."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class UnknownInstanceError(CatalogError):
    """No row has the instance asked for; `matches` holds the closest keys, best first."""

    def __init__(self, message: str, matches: Sequence[str]) -> None:
        super().__init__(message)
        self.matches = tuple(matches)


class AmbiguousInstanceError(CatalogError):
    """Several rows fit the instance asked for (several regions, or providers); `choices` names them."""

    def __init__(self, message: str, choices: Sequence[str]) -> None:
        super().__init__(message)
        self.choices = tuple(choices)


def _row_error(label: str, line: int, problem: str, fix: str) -> CatalogError:
    return CatalogError(f"{label}:{line}: {problem}; fix: {fix}", path=label, line=line)


# ---------------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Instance:
    """One instance type's price and hardware. Money is USD; `doubt` says why a figure may be wrong."""

    key: str  # "provider:instance"; with `region` it is unique (see `qualified_key`)
    provider: str
    instance: str
    region: str | None  # None: the price holds in every region the provider offers it
    gpu: str  # the GpuSpec row name, or the user's label when no row matches it
    gpu_count: int
    gpu_mem_gib: float | None  # per GPU
    vcpus: int | None
    mem_gib: float | None  # host memory
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float | None  # None: no spot quote
    intra_node_link: str
    inter_node_gbps: str | None  # as the source gives it, e.g. "3200 (EFA)"
    source: str
    as_of: str  # verbatim from the source facts
    as_of_date: str | None  # ISO date the as_of text names; None when it names none
    doubt: str | None
    host_included: bool = True  # False for GPU-only prices: the host VM costs extra
    origin: str = PACKAGED  # "packaged" or the path of the user's catalog

    @property
    def qualified_key(self) -> str:
        """`key@region` when the row has a region, else `key`: unique within a catalog."""
        return f"{self.key}@{self.region}" if self.region else self.key

    def usd_per_gpu_hour(self, spot: bool = False) -> float | None:
        """The price of one GPU for one hour; None for spot when there is no spot quote."""
        price = self.spot_usd_per_hour if spot else self.on_demand_usd_per_hour
        return price / self.gpu_count if price is not None else None

    def gpu_spec(self, specs: Sequence[GpuSpec] | None = None) -> GpuSpec | None:
        """The GPU's spec row, or None when the catalog has none for it."""
        return match_gpu(self.gpu, specs=specs)


@dataclass(frozen=True)
class PriceDates:
    """The span of the catalog's price dates, for a README or a report's footnote."""

    earliest: str | None  # ISO dates
    latest: str | None
    undated: int  # rows whose as_of names no date


@dataclass(frozen=True)
class InstanceCatalog:
    """The instances a cost can be computed for: the packaged rows, then the user's."""

    version: str
    rows: tuple[Instance, ...]
    user_catalog: str | None = None  # the user's file, when one extends the packaged rows

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Instance]:
        return iter(self.rows)

    def keys(self) -> list[str]:
        """Every row's qualified key (`provider:instance`, with `@region` where the row has one)."""
        return [r.qualified_key for r in self.rows]

    def as_of_dates(self) -> PriceDates:
        dated = sorted(r.as_of_date for r in self.rows if r.as_of_date)
        return PriceDates(
            earliest=dated[0] if dated else None,
            latest=dated[-1] if dated else None,
            undated=sum(1 for r in self.rows if not r.as_of_date),
        )

    def lookup(self, key: str) -> Instance:
        """The row for `provider:instance` or `provider:instance@region`, case-insensitive.

        A bare instance name (no provider) is accepted when one provider has it. Without a region, a
        key listed for several regions resolves to its one row without doubt; otherwise this raises
        AmbiguousInstanceError naming the region-qualified choices. A row without a region matches any
        region asked for (its price holds everywhere). Unknown -> UnknownInstanceError with the closest
        keys.
        """
        asked = key.strip()
        name, _, region_text = asked.partition("@")
        name, region = name.strip().lower(), region_text.strip().lower() or None
        if ":" in name:
            provider, _, instance = name.partition(":")
            name = f"{provider.strip()}:{instance.strip()}"
            candidates = [r for r in self.rows if r.key.lower() == name]
        else:
            candidates = [r for r in self.rows if r.instance.lower() == name]
            providers = sorted({r.key for r in candidates})
            if len(providers) > 1:
                raise AmbiguousInstanceError(
                    f"instance {asked!r} is offered by several providers ({', '.join(providers)}); "
                    "fix: name the provider, e.g. " + providers[0],
                    providers,
                )
        if not candidates:
            raise self._unknown(asked, name)
        if region is not None:
            in_region = [r for r in candidates if r.region and r.region.lower() == region]
            everywhere = [r for r in candidates if r.region is None]
            if in_region or everywhere:
                return (in_region or everywhere)[0]
            listed = [r.qualified_key for r in candidates]
            raise UnknownInstanceError(
                f"{candidates[0].key} has no price for region {region_text.strip()!r} in catalog "
                f"{self.version}; listed: {', '.join(listed)}; fix: use one of those, or add the region's "
                "price with --catalog FILE",
                listed,
            )
        if len(candidates) == 1:
            return candidates[0]
        without_doubt = [r for r in candidates if not r.doubt]
        if len(without_doubt) == 1:
            return without_doubt[0]
        choices = [r.qualified_key for r in candidates]
        raise AmbiguousInstanceError(
            f"{candidates[0].key} is listed for several regions: "
            f"{', '.join(choices)}; fix: name the region, e.g. {choices[0]}",
            choices,
        )

    def _unknown(self, asked: str, name: str) -> UnknownInstanceError:
        # Compare with keys and with bare instance names: "p4d.24xl" and "aws:p4d.24xl" both find p4d.
        rows_per_key = Counter(r.key.lower() for r in self.rows)
        display: dict[str, str] = {}
        for r in self.rows:
            shown = r.qualified_key if rows_per_key[r.key.lower()] > 1 else r.key
            for choice in (r.key, r.instance, r.qualified_key):
                display.setdefault(choice.lower(), shown)
        # A name cut short ("p4d") is too far from its row for difflib: prefixes are suggested first.
        prefixed = [
            c for c in display if name and (c.startswith(name) or c.partition(":")[2].startswith(name))
        ]
        close = difflib.get_close_matches(name, list(display), n=8, cutoff=0.6)
        matches = list(dict.fromkeys(display[c] for c in [*sorted(prefixed), *close]))[:5]
        hint = f"closest: {', '.join(matches)}" if matches else "no close match"
        return UnknownInstanceError(
            f"unknown instance {asked!r} in catalog {self.version} ({hint}); fix: use a listed key "
            "(provider:instance[@region]) or add the instance with --catalog FILE",
            matches,
        )


# ---------------------------------------------------------------------------------------------------
# Reading CSV text
# ---------------------------------------------------------------------------------------------------


def catalog_version_from_text(text: str) -> str | None:
    """The version a catalog file names in its first line, `# tuneup catalog version X ...`."""
    first = text.lstrip("\ufeff").split("\n", 1)[0].strip()
    if not first.startswith(VERSION_LINE_PREFIX):
        return None
    rest = first[len(VERSION_LINE_PREFIX) :].split()
    return rest[0].rstrip(";,") if rest else None


def _records(
    text: str, label: str, columns: Sequence[str], required: Sequence[str]
) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number of the record's first line, cells by column) for each data row of a CSV text.

    Lines starting with "#" are comments; blank lines are skipped. Line numbers are 1-based, as an editor
    shows them.
    """
    # Comment lines become empty lines rather than disappearing, so csv's line count stays the editor's.
    lines = []
    for line in io.StringIO(text.lstrip("\ufeff"), newline=""):
        body = line.rstrip("\r\n")
        lines.append((line[len(body) :] or "\n") if body.lstrip().startswith("#") else line)
    reader = csv.reader(lines)
    header: list[str] | None = None
    header_line = 0
    rows = 0
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as error:
            raise _row_error(
                label, reader.line_num, f"not valid CSV ({error})", "quote fields that hold commas or quotes"
            ) from None
        if not any(c.strip() for c in cells):
            continue
        line = reader.line_num - sum(c.count("\n") for c in cells)
        if header is None:
            header, header_line = _header(cells, label, line, columns, required), line
            continue
        if len(cells) > len(header) and any(c.strip() for c in cells[len(header) :]):
            raise _row_error(
                label,
                line,
                f"{len(cells)} fields, but the header (line {header_line}) names {len(header)} columns",
                "quote fields that hold commas, or add the column to the header",
            )
        cells = cells + [""] * (len(header) - len(cells))
        rows += 1
        yield line, {name: cells[i].strip() for i, name in enumerate(header)}
    if header is None:
        raise _row_error(
            label,
            1,
            "empty: no header line",
            f"start with a header naming the columns (required: {', '.join(required)})",
        )
    if rows == 0:
        raise _row_error(
            label, header_line + 1, "no rows after the header", "add one row per entry, or drop the file"
        )


def _header(
    cells: list[str], label: str, line: int, columns: Sequence[str], required: Sequence[str]
) -> list[str]:
    names = [c.strip().lower() for c in cells]
    for name in names:
        if not name:
            raise _row_error(label, line, "the header has an empty column name", "name every column")
        if name not in columns:
            close = difflib.get_close_matches(name, columns, n=1)
            fix = f"did you mean {close[0]!r}? " if close else ""
            raise _row_error(
                label, line, f"unknown column {name!r}", f"{fix}use only these columns: {', '.join(columns)}"
            )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise _row_error(
            label, line, f"column(s) named twice: {', '.join(repeated)}", "name each column once"
        )
    missing = [c for c in required if c not in names]
    if missing:
        raise _row_error(label, line, f"missing column(s) {', '.join(missing)}", "add them to the header")
    return names


class _Cells:
    """One row's cells with typed, checked access; every failure names the file, line and column."""

    def __init__(self, label: str, line: int, cells: Mapping[str, str]) -> None:
        self.label, self.line, self.cells = label, line, cells

    def error(self, problem: str, fix: str) -> CatalogError:
        return _row_error(self.label, self.line, problem, fix)

    def text(self, column: str, required: bool = False) -> str | None:
        value = self.cells.get(column, "")
        if not value:
            if required:
                raise self.error(f"{column} is empty", f"every row needs a {column}")
            return None
        return value

    def number(self, column: str, *, required: bool = False) -> float | None:
        text = self.text(column, required)
        if text is None:
            return None
        try:
            value = float(text)
        except ValueError:
            raise self.error(
                f"{column} is {text!r}, not a number", f"write {column} as a plain number"
            ) from None
        if not math.isfinite(value) or value <= 0:
            raise self.error(f"{column} is {text!r}", f"{column} must be a number above 0")
        return value

    def required_text(self, column: str) -> str:
        value = self.text(column, required=True)
        assert value is not None  # text() raised otherwise
        return value

    def required_number(self, column: str) -> float:
        value = self.number(column, required=True)
        assert value is not None  # number() raised otherwise
        return value

    def whole(self, column: str, *, required: bool = False, minimum: int = 1) -> int | None:
        text = self.text(column, required)
        if text is None:
            return None
        if not (text.isascii() and text.isdigit()) or int(text) < minimum:
            raise self.error(f"{column} is {text!r}", f"{column} must be a whole number, at least {minimum}")
        return int(text)


# ---------------------------------------------------------------------------------------------------
# Instances
# ---------------------------------------------------------------------------------------------------


def _parse_instances(text: str, label: str, origin: str, specs: Sequence[GpuSpec]) -> list[Instance]:
    rows: list[Instance] = []
    seen: dict[str, int] = {}
    for line, cells in _records(text, label, INSTANCE_COLUMNS, REQUIRED_INSTANCE_COLUMNS):
        row = _instance(_Cells(label, line, cells), origin, specs)
        qualified = row.qualified_key.lower()
        if qualified in seen:
            raise _row_error(
                label,
                line,
                f"{row.qualified_key} is listed twice (first on line {seen[qualified]})",
                "keep one row per instance and region",
            )
        seen[qualified] = line
        rows.append(row)
    return rows


def _instance(c: _Cells, origin: str, specs: Sequence[GpuSpec]) -> Instance:
    provider = (c.required_text("provider")).lower()
    if not _PROVIDER.match(provider):
        raise c.error(f"provider {provider!r}", "write the provider as one lowercase word, e.g. aws")
    instance = c.required_text("instance")
    if not _INSTANCE.match(instance):
        raise c.error(
            f"instance {instance!r}",
            "write the provider's instance name, without spaces, ':' or '@' (the region has its own column)",
        )
    key = f"{provider}:{instance}"
    given_key = c.text("key")
    if given_key is not None and given_key.lower() != key.lower():
        raise c.error(
            f"key {given_key!r} does not match provider:instance {key!r}", "leave key empty or fix it"
        )
    region = c.text("region")
    if region is not None and not _INSTANCE.match(region):
        raise c.error(f"region {region!r}", "write the region as the provider names it, e.g. us-east-1")
    gpu_label = c.required_text("gpu")
    spec = match_gpu(gpu_label, specs=specs)
    on_demand = c.required_number("on_demand_usd_hr")
    vcpus = c.whole("vcpus")
    as_of = c.required_text("as_of")
    as_of_date = c.text("as_of_date")
    if as_of_date is not None:
        try:
            if len(as_of_date) != 10:
                raise ValueError(as_of_date)
            as_of_date = date.fromisoformat(as_of_date).isoformat()
        except ValueError:
            raise c.error(
                f"as_of_date is {as_of_date!r}", "write it as YYYY-MM-DD, or leave it empty"
            ) from None
    else:
        as_of_date = as_of_date_from_text(as_of)
    host = (c.text("host_included") or "yes").lower()
    if host not in ("yes", "no", "true", "false"):
        raise c.error(f"host_included is {host!r}", "write yes, or no for a GPU-only price")
    return Instance(
        key=key,
        provider=provider,
        instance=instance,
        region=region,
        gpu=spec.name if spec is not None else gpu_label,
        gpu_count=c.whole("gpu_count", required=True) or 1,
        gpu_mem_gib=c.number("gpu_mem_gib"),
        vcpus=vcpus,
        mem_gib=c.number("mem_gib"),
        on_demand_usd_per_hour=on_demand,
        spot_usd_per_hour=c.number("spot_usd_hr"),
        intra_node_link=c.text("intra_node_link") or "",
        inter_node_gbps=c.text("inter_node_gbps"),
        source=c.required_text("source"),
        as_of=as_of,
        as_of_date=as_of_date,
        doubt=c.text("doubt"),
        host_included=host in ("yes", "true"),
        origin=origin,
    )


@cache
def _packaged_text(name: str) -> str:
    return resources.files("tuneup.data").joinpath(name).read_text(encoding="utf-8")


def _read_user_file(path: str | Path) -> str:
    p = Path(path)
    fix = "pass the path of a CSV file with the columns of tuneup/data/instances.csv"
    if not p.exists():
        raise CatalogError(f"{p}: no such file; fix: {fix}", path=str(p))
    if not p.is_file():
        raise CatalogError(f"{p}: not a file (a directory?); fix: {fix}", path=str(p))
    try:
        return p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise CatalogError(
            f"{p}: not UTF-8 text ({error.reason}); fix: save it as UTF-8 CSV", path=str(p)
        ) from None
    except OSError as error:
        raise CatalogError(f"{p}: cannot be read ({error.strerror}); fix: {fix}", path=str(p)) from None


def parse_instances(
    text: str, label: str = "<catalog>", origin: str | None = None, specs: Sequence[GpuSpec] | None = None
) -> list[Instance]:
    """The rows of an instances CSV text; `label` names it in errors. Raises CatalogError.

    `specs` resolves the gpu column (the packaged GPU rows by default).
    """
    return _parse_instances(
        text, label, origin if origin is not None else label, specs if specs is not None else load_gpu_specs()
    )


def load_instances(user_catalog: str | Path | None = None) -> InstanceCatalog:
    """The packaged instances, extended and overridden by the user's CSV catalog when one is given.

    The user's file has the columns of tuneup/data/instances.csv; these are required: provider,
    instance, gpu, gpu_count, on_demand_usd_hr, source, as_of. The others (key, region, gpu_mem_gib,
    vcpus, mem_gib, spot_usd_hr, host_included, intra_node_link, inter_node_gbps, as_of_date, doubt)
    may be left out or empty. Lines starting with "#" are comments. `gpu` is a GPU row name ("H100-SXM")
    or a device name ("NVIDIA H100 80GB HBM3"); a GPU the catalog does not know keeps its label (its
    cost is still computed, its MFU is not).

    A user row replaces the packaged row with the same key and region; a user row without a region
    replaces every packaged row with its key (the user's price holds everywhere). Other rows are added.

    Raises CatalogError, naming the file and line, for a missing or unreadable file, an unknown column,
    or a bad row (a required field missing, a price that is not a number above 0, gpu_count below 1).
    """
    specs = load_gpu_specs()
    packaged = _parse_instances(
        _packaged_text(INSTANCES_FILE), _PACKAGED_LABEL.format(INSTANCES_FILE), PACKAGED, specs
    )
    if user_catalog is None:
        return InstanceCatalog(version=CATALOG_VERSION, rows=tuple(packaged))
    label = str(user_catalog)
    user = _parse_instances(_read_user_file(user_catalog), label, label, specs)
    return InstanceCatalog(version=CATALOG_VERSION, rows=tuple(_merge(packaged, user)), user_catalog=label)


def _merge(packaged: Iterable[Instance], user: Iterable[Instance]) -> list[Instance]:
    rows = list(packaged)
    for mine in user:

        def replaced(r: Instance, mine: Instance = mine) -> bool:
            if r.origin != PACKAGED or r.key.lower() != mine.key.lower():
                return False
            return mine.region is None or (r.region or "").lower() == mine.region.lower()

        at = next((i for i, r in enumerate(rows) if replaced(r)), len(rows))
        rows = [r for r in rows[:at] if not replaced(r)] + [mine] + [r for r in rows[at:] if not replaced(r)]
    return rows


# ---------------------------------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------------------------------


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
    for line, cells in _records(text, label, GPU_COLUMNS, GPU_COLUMNS[:2]):
        c = _Cells(label, line, cells)
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
    return parse_gpu_specs(_packaged_text(GPUS_FILE), _PACKAGED_LABEL.format(GPUS_FILE))


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


def _packaged_version() -> str:
    version = catalog_version_from_text(_packaged_text(INSTANCES_FILE))
    if version is None:
        raise CatalogError(
            f"{_PACKAGED_LABEL.format(INSTANCES_FILE)}:1: no '{VERSION_LINE_PREFIX}' line; "
            "fix: rebuild it with scripts/build_catalogs.py"
        )
    return version


CATALOG_VERSION: str = _packaged_version()
