"""Memory by kind: the parameters (held and whole), gradients and optimizer state of the fullest rank, and on
a GPU its peak and what the peak held beyond them."""

from __future__ import annotations

from collections.abc import Sequence

from tuneup.analyze.model import MemoryByKind, RunAnalysis
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, Bullets, Paragraph, Table, by_value, table
from tuneup.report.format import MISSING, is_number, share, size_bytes

ID = "memory"
TITLE = "Memory by kind"
PLOTS = ()


def _of_peak(value: int | None, peak: int | None) -> str:
    return share(value / peak) if is_number(value) and is_number(peak) and peak > 0 else MISSING


def _kinds_table(m: MemoryByKind) -> Table:
    peak = m.peak_allocated_bytes
    # (kind, held on the rank, whole): the peak's rows only where an allocator kept one.
    kinds: list[tuple[str, int | None, int | None]] = [
        ("Parameters", m.parameters_bytes, m.parameters_unsharded_bytes),
        ("Gradients", m.gradients_bytes, None),
        ("Optimizer state", m.optimizer_state_bytes, None),
        ("Held in all", m.held_bytes, None),
    ]
    header = ("Kind", f"Held on rank {m.rank}", "Whole (unsharded)")
    if peak is not None:
        header += ("Share of the peak",)
        kinds += [("Other at the peak", m.other_at_peak_bytes, None), ("Peak allocated", peak, None)]
    rows = [
        (
            label,
            size_bytes(held),
            MISSING if whole is None else size_bytes(whole),
            *(() if peak is None else (_of_peak(held, peak),)),
        )
        for label, held, whole in kinds
    ]
    return table("Memory by kind", header, rows, numeric=range(1, len(header)))


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    m = analysis.memory
    if m is None:
        return [
            Paragraph(
                "Memory by kind was not recorded: it is read once, before a rank's second optimizer step "
                "(a run of fewer steps, or one recorded by an older tuneup, has none).",
                True,
            )
        ]
    out: list[Block] = []
    if m.sharded and m.parameters_unsharded_bytes > 0:
        out.append(
            Paragraph(
                f"The parameters are sharded: rank {m.rank} holds {size_bytes(m.parameters_bytes)} of "
                f"{size_bytes(m.parameters_unsharded_bytes)} "
                f"({share(m.parameters_bytes / m.parameters_unsharded_bytes)}); each unit's all-gather "
                "materializes its part whole for its forward and backward, and the gradients and optimizer "
                "state stay sharded."
            )
        )
    else:
        out.append(
            Paragraph(
                "Every rank holds the whole model: its parameters, gradients and optimizer state "
                "(sharding them, with FSDP, would divide these by the ranks sharing them)."
                if len(m.ranks) > 1
                else "The parameters, gradients and optimizer state this process held."
            )
        )
    out.append(_kinds_table(m))
    if len(m.ranks) > 1:
        held = {
            str(r.rank): size_bytes(r.parameters_bytes + (r.gradients_bytes or 0) + r.optimizer_state_bytes)
            for r in m.ranks
        }
        out.append(Paragraph(f"Held per rank: {by_value(held)}.", True))
    if m.notes:
        out.append(Bullets(tuple(n[0].upper() + n[1:] + "." for n in m.notes)))
    return out
