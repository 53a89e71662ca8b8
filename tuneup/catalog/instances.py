"""The packaged price catalog: what a cloud instance costs, and what hardware it has.

tuneup/data/instances.csv, written by scripts/build_catalogs.py from facts the developers gathered
(shared/data in the development checkout) and committed with the code; nothing is fetched at run time:
one row per instance type (and per region where the catalog lists several), with on-demand and spot USD
per hour, the GPUs, the links, and for every price its source and "as of". A row's `gpu` names a row of
the GPU catalog (tuneup.catalog.gpus), and the file's first line carries the catalogs' version.

A row known to be doubtful says why in `doubt`; every figure is as exact as its source, no more, and a
report shows the doubt next to the figure.

The user's catalog (`--catalog FILE`, see `load_instances`) is a CSV with the columns of instances.csv;
it adds rows and overrides packaged ones. It is read with the csv module as data, nothing else.

Instance keys are `provider:instance` (e.g. `aws:p4d.24xlarge`, `gcp:a3-ultragpu-8g`); a key listed for
several regions is told apart by `provider:instance@region` (e.g. `gcp:a3-highgpu-8g@us-east4`).

No torch here: reports are made on machines without it.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path

from tuneup.catalog.csv_text import (
    PACKAGED_LABEL,
    VERSION_LINE_PREFIX,
    CatalogError,
    Cells,
    catalog_version_from_text,
    packaged_text,
    read_records,
    row_error,
)
from tuneup.catalog.gpus import GpuSpec, load_gpu_specs, match_gpu
from tuneup.data.catalog_format import INSTANCE_COLUMNS, as_of_date_from_text

PACKAGED = "packaged"
INSTANCES_FILE = "instances.csv"

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

_PROVIDER = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_INSTANCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


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

    def with_gpu(self, name_part: str | None) -> InstanceCatalog:
        """The rows whose GPU name holds every part of `name_part` as a whole part (parts are split at
        "-" and spaces, any case: "A100" matches A100-SXM4-80GB, "L4" does not match L40S nor "A10"
        A100), as a catalog of their own, so that its length and `as_of_dates` describe those rows; the
        whole catalog when `name_part` is empty. A substring match would take one GPU for another."""
        if not name_part:
            return self
        wanted = set(_name_parts(name_part))
        return replace(self, rows=tuple(r for r in self.rows if wanted <= set(_name_parts(r.gpu))))

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


def _parse_instances(text: str, label: str, origin: str, specs: Sequence[GpuSpec]) -> list[Instance]:
    rows: list[Instance] = []
    seen: dict[str, int] = {}
    for line, cells in read_records(text, label, INSTANCE_COLUMNS, REQUIRED_INSTANCE_COLUMNS):
        row = _instance(Cells(label, line, cells), origin, specs)
        qualified = row.qualified_key.lower()
        if qualified in seen:
            raise row_error(
                label,
                line,
                f"{row.qualified_key} is listed twice (first on line {seen[qualified]})",
                "keep one row per instance and region",
            )
        seen[qualified] = line
        rows.append(row)
    return rows


def _instance(c: Cells, origin: str, specs: Sequence[GpuSpec]) -> Instance:
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
    packaged = _packaged_instances()
    if user_catalog is None:
        return InstanceCatalog(version=CATALOG_VERSION, rows=packaged)
    label = str(user_catalog)
    user = _parse_instances(_read_user_file(user_catalog), label, label, load_gpu_specs())
    return InstanceCatalog(version=CATALOG_VERSION, rows=tuple(_merge(packaged, user)), user_catalog=label)


@functools.cache
def _packaged_instances() -> tuple[Instance, ...]:
    """The packaged rows, parsed once a process: the file ships with the package, and every analysis that
    prices a run looks it up (2.6 ms a parse, a tenth of a run's analysis in `tuneup index`)."""
    return tuple(
        _parse_instances(
            packaged_text(INSTANCES_FILE), PACKAGED_LABEL.format(INSTANCES_FILE), PACKAGED, load_gpu_specs()
        )
    )


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


def _packaged_version() -> str:
    version = catalog_version_from_text(packaged_text(INSTANCES_FILE))
    if version is None:
        raise CatalogError(
            f"{PACKAGED_LABEL.format(INSTANCES_FILE)}:1: no '{VERSION_LINE_PREFIX}' line; "
            "fix: rebuild it with scripts/build_catalogs.py"
        )
    return version


CATALOG_VERSION: str = _packaged_version()


def _name_parts(name: str) -> list[str]:
    return [part for part in name.lower().replace("-", " ").split() if part]
