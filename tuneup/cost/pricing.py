"""What the job costs per hour: the user's price choice, checked, and turned into the job's USD/hour.

A choice comes from one of three places. At run time `TuneupCallback(instance=..., price_per_hour=...)`
wins over the environment (`TUNEUP_INSTANCE`, `TUNEUP_PRICE_PER_HOUR`, `TUNEUP_PRICE_PER`, `TUNEUP_SPOT`),
and the one found is written into the run's manifest. After the fact, `tuneup report --instance ...` or
`--price-per-hour ...` replaces what the run recorded: the person asking at report time knows best (a
run recorded on one cloud, priced on another), and the report says which price it used and from where.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from tuneup.catalog import CATALOG_VERSION, Instance, InstanceCatalog, load_instances

PRICE_PER = ("node", "gpu")
ENV_INSTANCE = "TUNEUP_INSTANCE"
ENV_PRICE_PER_HOUR = "TUNEUP_PRICE_PER_HOUR"
ENV_PRICE_PER = "TUNEUP_PRICE_PER"
ENV_SPOT = "TUNEUP_SPOT"
ENV_CATALOG = "TUNEUP_CATALOG"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def usd(amount: float | None) -> str:
    """Dollars as people write them: cents from $1 up, four significant digits below."""
    if amount is None:
        return "-"
    return f"${amount:,.2f}" if abs(amount) >= 1 else f"${amount:.4g}"


def usd_per_device_hour(usd_per_hour: float | None, devices: int | None) -> float | None:
    """One device's share of the job's price (a GPU, or a rank without GPUs): what the interruptions' lost
    time and the advice's other world sizes are priced at. None where the job is not priced."""
    return usd_per_hour / devices if usd_per_hour is not None and devices else None


class PricingError(ValueError):
    """A price choice that cannot be used; the message names the option and the fix."""


@dataclass(frozen=True)
class PriceChoice:
    """What the user asked for: an instance from the catalog, or a price of their own.

    `price_per` says what `price_per_hour` is the price of: one node (the whole machine) or one GPU.
    """

    instance: str | None = None
    spot: bool = False
    price_per_hour: float | None = None
    price_per: str = "node"
    catalog: str | None = None
    source: str = "callback"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PriceChoice | None:
        """A choice recorded in a manifest; None when it holds none (or is not one this version reads)."""
        try:
            choice = cls(
                instance=data.get("instance"),
                spot=bool(data.get("spot", False)),
                price_per_hour=data.get("price_per_hour"),
                price_per=str(data.get("price_per", "node")),
                catalog=data.get("catalog"),
                source=str(data.get("source", "run record")),
            )
            return check_choice(choice, where="the run's manifest (pricing)", resolve=False)
        except (PricingError, TypeError, ValueError):
            return None


def check_choice(
    choice: PriceChoice, *, where: str, resolve: bool = True, catalog: InstanceCatalog | None = None
) -> PriceChoice | None:
    """`choice` validated (None when it names no price); with `resolve`, its instance looked up now, so
    that a typo fails before training starts. Raises PricingError (or the catalog's error, which names the
    closest instances)."""
    if choice.instance is not None and choice.price_per_hour is not None:
        raise PricingError(f"{where}: give an instance or a price per hour, not both")
    if choice.price_per not in PRICE_PER:
        raise PricingError(f"{where}: price_per must be 'node' or 'gpu', got {choice.price_per!r}")
    if choice.price_per_hour is not None:
        price = choice.price_per_hour
        if (
            isinstance(price, bool)
            or not isinstance(price, (int, float))
            or not math.isfinite(price)
            or price <= 0
        ):
            raise PricingError(f"{where}: price per hour must be a positive number of USD, got {price!r}")
        if choice.spot:
            raise PricingError(
                f"{where}: spot applies to a catalog instance; give the spot price itself instead"
            )
    if choice.instance is None and choice.price_per_hour is None:
        return None
    if choice.instance is not None:
        if not isinstance(choice.instance, str) or not choice.instance.strip():
            raise PricingError(f"{where}: instance must be a catalog key like 'aws:p4d.24xlarge'")
        if resolve:
            instance = (catalog or load_instances(choice.catalog)).lookup(choice.instance)
            if choice.spot and instance.spot_usd_per_hour is None:
                raise PricingError(
                    f"{where}: {instance.key} has no spot price in the catalog; drop spot or give "
                    "--price-per-hour"
                )
    return choice


def env_of_choice(choice: PriceChoice) -> dict[str, str]:
    """The environment that makes `choice` (what `choice_from_env` reads back): how a process that starts
    training later, such as a `tuneup tune` trial, is priced the same way."""
    env: dict[str, str] = {}
    if choice.instance is not None:
        env[ENV_INSTANCE] = choice.instance
        if choice.spot:
            env[ENV_SPOT] = "1"
    elif choice.price_per_hour is not None:
        env[ENV_PRICE_PER_HOUR] = repr(float(choice.price_per_hour))
        env[ENV_PRICE_PER] = choice.price_per
    if choice.catalog is not None:
        env[ENV_CATALOG] = choice.catalog
    return env


def choice_from_env(environ: Mapping[str, str] | None = None) -> PriceChoice | None:
    """The choice the environment makes (`TUNEUP_INSTANCE` or `TUNEUP_PRICE_PER_HOUR`), or None."""
    env = os.environ if environ is None else environ
    instance = env.get(ENV_INSTANCE) or None
    raw_price = env.get(ENV_PRICE_PER_HOUR) or None
    if instance is None and raw_price is None:
        return None
    price: float | None = None
    if raw_price is not None:
        try:
            price = float(raw_price)
        except ValueError:
            raise PricingError(
                f"{ENV_PRICE_PER_HOUR}={raw_price!r} is not a number of USD per hour"
            ) from None
    spot_text = env.get(ENV_SPOT, "").strip().lower()
    if spot_text not in _TRUE + _FALSE:
        raise PricingError(f"{ENV_SPOT}={env.get(ENV_SPOT)!r}: use 1 or 0")
    choice = PriceChoice(
        instance=instance,
        spot=spot_text in _TRUE,
        price_per_hour=price,
        price_per=env.get(ENV_PRICE_PER, "node").strip().lower() or "node",
        catalog=env.get(ENV_CATALOG) or None,
        source="environment",
    )
    return check_choice(choice, where="the environment (TUNEUP_*)")


@dataclass(frozen=True)
class JobPrice:
    """The job's price per hour, how it was reached, and what is doubtful about it."""

    usd_per_hour: float
    spot_usd_per_hour: float | None  # the same job at the catalog's spot price, where it has one
    basis: str  # one sentence: where the figure comes from
    source: str  # callback, environment, command line
    devices: int  # GPUs (or, without GPUs, ranks) priced
    nodes: int
    instance: Instance | None = None
    spot: bool = False
    doubts: list[str] = field(default_factory=list)

    @property
    def usd_per_device_hour(self) -> float | None:
        return usd_per_device_hour(self.usd_per_hour, self.devices)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["instance"] = asdict(self.instance) if self.instance is not None else None
        packaged = self.instance is not None and self.instance.origin == "packaged"
        out["catalog_version"] = CATALOG_VERSION if packaged else None
        return out


def job_price(
    choice: PriceChoice, *, devices: int, nodes: int, catalog: InstanceCatalog | None = None
) -> JobPrice:
    """The job's USD/hour for `devices` GPUs (or ranks) on `nodes` machines.

    An instance is priced per GPU used (its price over its GPU count, times the GPUs the job used): the
    job's nodes times the instance price when every node is full, and a fair share when the job used part
    of one (one GPU of an 8-GPU machine is an eighth). A price per node is charged per node; per GPU, per
    GPU.
    """
    devices, nodes = max(1, int(devices)), max(1, int(nodes))
    if choice.price_per_hour is not None:
        price = float(choice.price_per_hour)
        if choice.price_per == "gpu":
            return JobPrice(
                price * devices,
                None,
                f"{devices} x {usd(price)} per GPU-hour ({choice.source})",
                choice.source,
                devices,
                nodes,
            )
        return JobPrice(
            price * nodes,
            None,
            f"{nodes} node(s) x {usd(price)} per node-hour ({choice.source})",
            choice.source,
            devices,
            nodes,
        )
    assert choice.instance is not None
    instance = (catalog or load_instances(choice.catalog)).lookup(choice.instance)
    per_device = instance.on_demand_usd_per_hour / instance.gpu_count
    spot_per_device = (
        instance.spot_usd_per_hour / instance.gpu_count if instance.spot_usd_per_hour is not None else None
    )
    doubts = [instance.doubt] if instance.doubt else []
    if not instance.host_included:
        doubts.append("the catalog's price is for the GPUs only; the host machine is not included")
    share = ""
    if devices < instance.gpu_count * nodes:
        share = (
            f"; the job used {devices} of the {instance.gpu_count * nodes} GPUs of {nodes} {instance.key}, priced "
            f"as that share (the whole {'machine' if nodes == 1 else 'machines'}: "
            f"{usd(instance.on_demand_usd_per_hour * nodes)}/h)"
        )
    elif devices > instance.gpu_count * nodes:
        doubts.append(
            f"the job used {devices} devices on {nodes} node(s) but {instance.key} has {instance.gpu_count} "
            "GPUs per node: is this the right instance?"
        )
    on_demand = per_device * devices
    spot = spot_per_device * devices if spot_per_device is not None else None
    price_name = "spot" if choice.spot else "on-demand"
    chosen = spot if choice.spot and spot is not None else on_demand
    rate = instance.spot_usd_per_hour if choice.spot else instance.on_demand_usd_per_hour
    catalog_name = f"catalog {CATALOG_VERSION}" if instance.origin == "packaged" else instance.origin
    dated = f"as of {instance.as_of_date}" if instance.as_of_date else "undated"
    basis = (
        f"{instance.key} ({instance.region or 'any region'}) {price_name} {usd(rate)}/h for "
        f"{instance.gpu_count} x {instance.gpu} ({catalog_name}, price {dated}; {choice.source}){share}"
    )
    return JobPrice(
        chosen,
        spot,
        basis,
        choice.source,
        devices,
        nodes,
        instance=instance,
        spot=choice.spot,
        doubts=doubts,
    )


def price_for_run(
    recorded: Mapping[str, Any] | None,
    override: PriceChoice | None,
    *,
    devices: int,
    nodes: int,
    catalog_path: str | None = None,
) -> tuple[JobPrice | None, str | None, list[str]]:
    """The job's price: the report's `override` if given, else the choice the run recorded.

    Returns (price, why there is none, warnings). A recorded choice that no longer resolves (an instance
    gone from a newer catalog, a user catalog not on this machine) leaves the run unpriced with a warning;
    it never stops the report.
    """
    warnings: list[str] = []
    choice = override
    if choice is None and recorded and (recorded.get("instance") or recorded.get("price_per_hour")):
        choice = PriceChoice.from_dict(recorded)
        if choice is None:
            warnings.append("the run's recorded price choice could not be read; the report is not priced")
    if choice is None:
        reason = (
            "no price given: pass --instance (a catalog key, e.g. aws:p4d.24xlarge) or --price-per-hour to "
            "tuneup report, or TuneupCallback(instance=...), or set TUNEUP_INSTANCE"
        )
        return None, reason, warnings
    catalog_file = catalog_path if catalog_path is not None else choice.catalog
    try:
        catalog = load_instances(catalog_file) if choice.instance is not None else None
        price = job_price(choice, devices=devices, nodes=nodes, catalog=catalog)
    except (ValueError, OSError) as exc:  # CatalogError and PricingError are ValueErrors
        if override is not None:
            raise
        # The run names the catalog file, and a catalog error quotes the file: a run directory from
        # elsewhere must not pull a local file's lines into a report that may be shared. Say where only.
        why = (
            f"{type(exc).__name__} in {exc.path}, line {exc.line}" if getattr(exc, "path", None) else str(exc)
        )
        warnings.append(
            f"the run's recorded price ({choice.instance or choice.price_per_hour}) cannot be used: {why}"
        )
        return None, f"the recorded price cannot be used: {why}", warnings
    return price, None, warnings
