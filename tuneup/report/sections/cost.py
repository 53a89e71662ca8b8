"""The Cost section: what the job costs, what it buys, what it would take to finish, and (cost_compute.py)
how well it uses the GPUs and how much energy it draws.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tuneup.analyze.model import Cost, Money, Price, PricedInstance, RunAnalysis
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import (
    Block,
    FindingItem,
    FindingList,
    KeyValues,
    Metric,
    Metrics,
    Paragraph,
    Table,
    table,
)
from tuneup.report.format import (
    MISSING,
    count,
    duration,
    fraction_percent,
    is_number,
    large,
    number,
    plural,
    sentence,
    text,
    usd,
    usd_rate,
    with_unit,
    yes_no,
)
from tuneup.report.plotting import Plot
from tuneup.report.sections.cost_compute import NO_TOKENS, compute_blocks, energy_blocks

ID = "cost"
TITLE = "Cost"
PLOTS: tuple[Plot, ...] = ()

NOT_MEASURED = "No cost figures: this report was made by a tuneup that did not work them out."


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    cost = analysis.cost
    if cost is None:
        return [Paragraph(NOT_MEASURED, True)]
    price = cost.price
    out: list[Block] = []
    if price is not None:
        out.extend(_headline(analysis, cost, price))
        out.extend(_price_cautions(price))
        out.append(_money_table(cost, price))
        out.extend(_money_notes(cost))
    else:
        reason = cost.not_priced_reason
        out.append(
            Paragraph(
                f"Not priced: {text(reason)}." if reason else "Not priced: the run recorded no price.", True
            )
        )
    out.append(Paragraph(_epoch_line(cost), not is_number(cost.steps_per_epoch)))
    out.extend(_projections(analysis, cost, priced=price is not None))
    out.extend(compute_blocks(cost.flops))
    out.extend(energy_blocks(cost.energy))
    if price is not None and price.instance is not None:
        out.append(_instance(price.instance, price.catalog_version))
    return out


def _stop(value: object) -> str:
    """Recorded text ended with a full stop, its case kept (a catalog key starts in lower case)."""
    out = text(value).strip()
    return out if out == MISSING or out.endswith((".", "!", "?")) else out + "."


def _headline(analysis: RunAnalysis, cost: Cost, price: Price) -> list[Block]:
    figures, flops = cost.figures, cost.flops
    kind = "spot" if price.spot else "on-demand" if price.instance is not None else ""
    priced_for = plural(int(price.devices), "device") if is_number(price.devices) else ""
    detail = ", ".join(p for p in (kind, priced_for, text(price.source)) if p and p != MISSING)
    per_token = figures.usd_per_million_tokens
    if is_number(per_token) or not is_number(figures.samples_per_usd):
        yield_card = Metric(
            "Per 1M tokens", usd(per_token), "steady state" if is_number(per_token) else NO_TOKENS
        )
    else:
        yield_card = Metric("Samples per $", large(figures.samples_per_usd), "steady state")
    mfu = flops.mfu
    if is_number(mfu):
        mfu_detail = f"of the dense {text(flops.peak_precision)} peak"
    elif flops.source is None:
        mfu_detail = "FLOPs were not counted"
    else:
        mfu_detail = "not defined: see Compute below"
    return [
        Metrics(
            (
                Metric("Job price", usd_rate(price.usd_per_hour, "h"), detail),
                yield_card,
                Metric(
                    "Spent so far",
                    usd(figures.usd_so_far),
                    f"the recorded {duration(analysis.run.duration_s)}",
                ),
                Metric("MFU", fraction_percent(mfu), mfu_detail),
            )
        ),
        Paragraph(f"Priced at {usd_rate(price.usd_per_hour, 'h')} for the job: {_stop(price.basis)}"),
    ]


def _price_cautions(price: Price) -> list[Block]:
    """The price's doubts, shown where they cannot be missed, and how old the price is."""
    out: list[Block] = []
    doubts = [d for d in price.doubts if d]
    if doubts:
        out.append(
            FindingList(tuple(FindingItem("warning", "Check this price", sentence(d)) for d in doubts))
        )
    instance = price.instance
    if instance is not None:
        where = (
            f"tuneup's packaged price catalog, version {text(price.catalog_version)}"
            if instance.origin in (None, "packaged")
            else f"the user's catalog {text(instance.origin)}"
        )
        when = (
            f"dated {text(instance.as_of_date)}"
            if instance.as_of_date
            else f"undated (the source says only: {text(instance.as_of)})"
        )
        out.append(Paragraph(f"Price from {where}; the price is {when}. Source: {_stop(instance.source)}"))
    return out


_MONEY_ROWS: tuple[tuple[str, Callable[[Money], float | None], Callable[[object], str]], ...] = (
    ("Job price", lambda m: m.usd_per_hour, lambda v: usd_rate(v, "h")),
    ("Spent so far (the whole recorded run)", lambda m: m.usd_so_far, usd),
    ("Per epoch", lambda m: m.usd_per_epoch, usd),
    ("Per 1M tokens", lambda m: m.usd_per_million_tokens, usd),
    ("Tokens per $", lambda m: m.tokens_per_usd, large),
    ("Samples per $", lambda m: m.samples_per_usd, large),
)


def _money_table(cost: Cost, price: Price) -> Table:
    columns = [cost.figures]
    if price.spot:
        header = ["Figure", "Spot"]
    elif cost.figures_spot is not None:
        header = ["Figure", "On-demand", "Spot"]
        columns.append(cost.figures_spot)
    else:
        header = ["Figure", "At this price"]
    return table(
        "What the money buys",
        header,
        ((label, *(show(field(c)) for c in columns)) for label, field, show in _MONEY_ROWS),
        range(1, len(header)),
    )


def _money_notes(cost: Cost) -> list[Block]:
    figures = cost.figures
    why = []
    if not is_number(figures.usd_per_epoch):
        why.append(f"per epoch needs the epoch's length ({text(cost.steps_per_epoch_basis)})")
    if not is_number(figures.tokens_per_usd):
        why.append("token figures need a token count, and the run recorded none")
    if not is_number(figures.samples_per_usd):
        why.append("samples per $ needs a steady-state sample rate")
    if not is_number(figures.usd_so_far):
        why.append("spent so far needs the run's duration")
    rates = (
        "Rates are the steady state's (warm-up left out); spent so far is the recorded run's whole duration."
    )
    out: list[Block] = [Paragraph(rates)]
    if why:
        out.append(Paragraph(f"A dash is a figure that could not be worked out: {'; '.join(why)}.", True))
    return out


def _epoch_line(cost: Cost) -> str:
    steps, basis = cost.steps_per_epoch, text(cost.steps_per_epoch_basis)
    if not is_number(steps):
        return f"Epoch length unknown: {basis}."
    line = f"One epoch is {count(steps)} training steps ({basis})"
    if is_number(cost.epoch_s):
        line += f", {duration(cost.epoch_s)} at the steady-state rate"
        if is_number(cost.loop_overhead_share) and cost.loop_overhead_share > 0:
            line += (
                f" plus the validation, checkpoint saves and fit-loop time this run spent per step "
                f"(+{fraction_percent(cost.loop_overhead_share)})"
            )
    return line + "."


def _projections(analysis: RunAnalysis, cost: Cost, *, priced: bool) -> list[Block]:
    targets = cost.projections
    ended = cost.run_ended
    stopped = f" ({text(cost.stop_reason)})" if cost.stop_reason else ""
    if not targets:
        why = (
            f"the run has ended{stopped}, so nothing is to go; pass --target-steps or --target-tokens to "
            "price a run of another length"
            if ended
            else "the trainer had neither max_steps nor max_epochs, and no target in steps or tokens was given"
        )
        return [Paragraph(f"No projection: {why}.", True)]
    spot = priced and cost.figures_spot is not None and any(is_number(t.usd_spot) for t in targets)
    if ended:
        header = ["Target", "Total steps", "Steps", "Time"] + ["Cost"] * priced + ["At spot"] * spot
    else:
        header = ["Target", "Total steps", "Steps to go", "Time to go"]
        header += ["Cost to go"] * priced + ["At spot"] * spot
    rows = []
    for t in targets:
        remaining = t.steps_remaining
        rows.append(
            (
                text(t.target),
                count(t.total_steps),
                "none (reached)" if remaining == 0 else count(remaining),
                "0 s" if remaining == 0 and t.time_s == 0 else duration(t.time_s),
                *[usd(t.usd)] * priced,
                *[usd(t.usd_spot)] * spot,
            )
        )
    steps_per_s = analysis.throughput.steps_per_s
    rate = f" ({number(steps_per_s)} training steps/s)" if is_number(steps_per_s) else ""
    overhead = (
        f", plus the validation, saves and fit-loop time each step brought along "
        f"(+{fraction_percent(cost.loop_overhead_share)})"
        if is_number(cost.loop_overhead_share) and cost.loop_overhead_share > 0
        else ""
    )
    basis = (
        f"The run has ended{stopped}: a target is a run of that length from step 0"
        if ended
        else "From the last recorded step"
    )
    out: list[Block] = [
        table(
            "Time and cost to reach a target" if priced else "Time to reach a target",
            header,
            rows,
            range(1, len(header)),
        ),
        Paragraph(
            f"{basis}, at this run's steady-state rate{rate}{overhead}. A training step is a batch that "
            "stepped the optimizers (Lightning's max_steps counts each optimizer's steps)."
        ),
    ]
    if any(not is_number(t.total_steps) for t in targets):
        out.append(
            Paragraph(
                "A dash: the run did not record what that target needs (the epoch's length for max_epochs, a "
                "token count for a target in tokens).",
                True,
            )
        )
    if not priced:
        out.append(
            Paragraph(f"Costs{'' if ended else ' to go'} appear once the run is priced (see above).", True)
        )
    return out


def _instance(instance: PricedInstance, catalog_version: str | None) -> KeyValues:
    gpus = f"{text(instance.gpu_count)} × {text(instance.gpu)}"
    if is_number(instance.gpu_mem_gib):
        gpus += f", {number(instance.gpu_mem_gib)} GiB each"
    spot = instance.spot_usd_per_hour
    pairs = (
        ("Provider", text(instance.provider)),
        ("Instance", text(instance.instance)),
        ("Region", text(instance.region) if instance.region else "any region"),
        ("GPUs", gpus),
        ("vCPUs", count(instance.vcpus)),
        ("Host memory", with_unit(instance.mem_gib, "GiB")),
        ("On-demand", usd_rate(instance.on_demand_usd_per_hour, "h")),
        ("Spot", usd_rate(spot, "h") if is_number(spot) else "no spot quote"),
        ("Host included in the price", yes_no(instance.host_included)),
        ("GPU link", text(instance.intra_node_link)),
        ("Network between nodes (Gbit/s)", text(instance.inter_node_gbps)),
        ("Price source", text(instance.source)),
        ("As of", text(instance.as_of)),
        (
            "Catalog",
            "packaged, version " + text(catalog_version)
            if instance.origin in (None, "packaged")
            else text(instance.origin),
        ),
    )
    return KeyValues(f"Instance: {text(instance.key)}", pairs, detail=True)
