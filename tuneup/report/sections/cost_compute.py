"""The Cost section's two sub-answers that need no price: how well the run used the GPUs' compute (achieved
FLOP/s and MFU) and how much energy it drew. Split from cost.py so that each module answers one question;
only cost.py imports it.
"""

from __future__ import annotations

from tuneup.analyze.model import Compute, Energy
from tuneup.report.blocks import Block, FindingItem, FindingList, KeyValues, Paragraph
from tuneup.report.format import (
    MISSING,
    count,
    duration,
    flop_count,
    fraction_percent,
    is_number,
    kwh,
    sentence,
    si,
    text,
    tflops_rate,
    usd,
    usd_rate,
    with_unit,
)

ENERGY_SOURCE = {
    "counter": "the GPUs' energy counters",
    "power samples": "power samples, integrated over time",
    "counter and power samples": "energy counters, and power samples where a GPU had no counter",
}
NO_TOKENS = "no token count recorded"


def or_why(value: str, why: str) -> str:
    """A formatted figure, or a dash that says why there is none."""
    return f"{MISSING} ({why})" if value == MISSING else value


def compute_blocks(flops: Compute) -> list[Block]:
    note = flops.note
    if flops.source is None:
        return [Paragraph(f"Compute: {text(note) if note else 'FLOPs were not counted'}.", True)]
    pairs = [
        ("FLOPs from", text(flops.source)),
        ("Per training step", or_why(flop_count(flops.flops_per_step), "not counted per step")),
        ("Per sample", flop_count(flops.flops_per_sample)),
        ("Achieved, all devices", tflops_rate(flops.achieved_tflops_per_s)),
        ("Achieved per device", tflops_rate(flops.achieved_tflops_per_s_per_device)),
    ]
    # The GPU and its peak are only worked out when the run had GPUs the catalog could be asked about;
    # on a CPU run the rows would be dashes that say nothing.
    if flops.gpu is not None or flops.peak_precision is not None:
        pairs.append(("GPU in the catalog", text(flops.gpu)))
    if flops.peak_precision is not None:
        peak = tflops_rate(flops.peak_tflops_per_device)
        column = text(flops.peak_precision)
        pairs.append(
            (
                "Peak per device",
                f"{peak} (dense {column})" if peak != MISSING else f"{MISSING} (no dense {column} peak)",
            )
        )
    pairs.append(
        (
            "MFU (model FLOPs utilization)",
            or_why(fraction_percent(flops.mfu), "not defined; see below" if note else "not worked out"),
        )
    )
    blocks: list[Block] = [KeyValues("Compute", tuple(pairs))]
    if note:
        blocks.append(Paragraph(sentence(note), not is_number(flops.mfu)))
    if flops.gpu_doubt:
        blocks.append(FindingList((FindingItem("warning", "Check this peak", sentence(flops.gpu_doubt)),)))
    return blocks


def _si_or_dash(value: float | None, unit: str) -> str:
    return si(value, unit) if is_number(value) else text(value)


def energy_blocks(energy: Energy) -> list[Block]:
    note = energy.note
    if energy.source is None:
        return [Paragraph(f"Energy: {text(note) if note else 'not recorded'}.", True)]
    electricity = energy.electricity_usd_per_kwh
    no_price = "no electricity price given"
    pairs = (
        ("Measured from", ENERGY_SOURCE.get(energy.source, text(energy.source))),
        ("GPUs", count(energy.gpus)),
        ("Measured span", duration(energy.span_s)),
        ("Energy over the span", kwh(energy.energy_kwh)),
        ("Mean power, all GPUs", with_unit(energy.mean_power_w, "W", 0)),
        ("Per training step", _si_or_dash(energy.j_per_step, "J")),
        ("Per 1M tokens", or_why(kwh(energy.kwh_per_million_tokens), NO_TOKENS)),
        ("Electricity price", usd_rate(electricity, "kWh") if is_number(electricity) else "not given"),
        (
            "Electricity over the span",
            or_why(
                usd(energy.electricity_usd),
                no_price if not is_number(electricity) else "not worked out",
            ),
        ),
        (
            "Electricity per 1M tokens",
            or_why(
                usd(energy.electricity_usd_per_million_tokens),
                no_price if not is_number(electricity) else NO_TOKENS,
            ),
        ),
    )
    blocks: list[Block] = [KeyValues("Energy", pairs)]
    if note:
        blocks.append(Paragraph(sentence(note)))
    return blocks
