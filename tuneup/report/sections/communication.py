"""Communication: how long the collectives took, how much of it the step waited for, which rank arrives
late, and how the measured bandwidth compares with the link.

Up to `PER_ROW_LIMIT` ranks a row per rank; beyond, the spread across the ranks and the ranks at the
extremes, and the figure draws the ranks in order as an area rather than a bar each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuneup.analyze.model import Communication, RankComm, RunAnalysis
from tuneup.analyze.sharding import sharding
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, KeyValues, Paragraph, Table, figures, table
from tuneup.report.format import count, ms, number, plural, sentence, share, size_bytes, text, with_unit
from tuneup.report.plotting import (
    DPI,
    HEIGHT_PX,
    PHASE_COLORS,
    STRAGGLER_COLOR,
    WIDTH_PX,
    Drawn,
    Plot,
    fmt,
    num,
)
from tuneup.report.sections._scale import (
    EXTREMES,
    PER_ROW_LIMIT,
    every,
    pick_extremes,
    spread_table,
)

ID = "communication"
TITLE = "Communication"
NOT_MEASURED = "No collective was timed: the run had one rank, or communication profiling was off."

_RANK_HEADER = ("Rank", "Collectives", "Exposed", "Bytes", "Collectives/step")
_FSDP_EXPOSED = Paragraph(
    "Exposed time is what the training thread waited for FSDP's collectives: the forward's all-gathers of "
    "each unit's parameters, the backward's re-gathers (after the forward resharded them) and the gradients' "
    "reduce-scatters. Each is counted in the phase it held up; the rest of the phase is its compute. On CPU "
    "FSDP2 runs each collective synchronously, so the step waits for all of it; an asynchronous gather "
    "(`unshard(async_op=True)`) counts from its wait."
)


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    comm = analysis.communication
    if comm is None:
        return [Paragraph(NOT_MEASURED, True)]
    out: list[Block] = [
        KeyValues(
            "",
            (
                ("Backend", text(comm.backend)),
                ("Ranks", f"{text(comm.world_size)} ({text(comm.ranks_per_node)} per node)"),
                (
                    "Collectives per step",
                    ms(comm.comm_ms_per_step) + f" ({share(comm.share_of_step)} of the step)",
                ),
                (
                    "Waited for (exposed)",
                    ms(comm.exposed_ms_per_step) + f" ({share(comm.exposed_share_of_step)} of the step)",
                ),
                (
                    "Overlapped with forward and backward (not free)"
                    if comm.exposed_by_phase
                    else "Overlapped with backward (not free)",
                    ms(comm.overlapped_ms_per_step),
                ),
            ),
        ),
        _FSDP_EXPOSED
        if comm.exposed_by_phase
        else Paragraph(
            "Exposed time is what the step still waited for after its last gradient bucket was handed over, "
            "that is, after backward compute ended; the rest overlapped with backward. Overlapped is not free: "
            "collectives running beside backward slow it down (on CPU they share its cores; on GPUs NCCL's "
            "kernels share the SMs and memory). What communication cost the step in total is the exposed wait "
            "plus that slowdown, which a run at one rank of the same batch size measures: "
            "`tuneup advise RUN_DIR ONE_RANK_RUN_DIR` reports it as the model's interference, and the "
            "Recommendations section shows it where it is known."
        ),
    ]
    if comm.exposed_by_phase:
        out.append(
            table(
                "FSDP: what each phase waited for, mean per step",
                ("Phase", "Time", "Waited on all-gathers", "Waited on reduce-scatters", "Waited", "Compute"),
                (
                    (
                        text(w.phase),
                        ms(w.phase_ms),
                        ms(w.gathers_ms),
                        "" if w.reduces_ms is None else ms(w.reduces_ms),
                        ms(w.waited_ms) + f" ({share(w.waited_share)})",
                        ms(w.compute_ms),
                    )
                    for w in comm.exposed_by_phase
                ),
                numeric=(1, 2, 3, 4, 5),
            )
        )
    if comm.per_rank:
        out += _per_rank(analysis, comm.per_rank)
    if comm.late_rank is not None:
        out.append(Paragraph(sentence(comm.late_rank.summary)))
    if comm.per_bucket:
        out.append(
            table(
                "DDP gradient buckets (first rank)",
                ("Bucket", "Collective", "Size", "Dtype", "Median time", "Count"),
                (
                    (
                        text(b.bucket),
                        text(b.kind),
                        size_bytes(b.bytes),
                        text(b.dtype),
                        ms(b.median_ms),
                        count(b.count),
                    )
                    for b in comm.per_bucket
                ),
                numeric=(2, 4, 5),
            )
        )
    if comm.by_size:
        out.append(
            table(
                "Bandwidth by collective and size (nccl-tests convention, median time)",
                ("Collective", "Size", "Count", "Time", "algbw", "busbw"),
                (
                    (
                        text(r.kind),
                        size_bytes(r.bytes),
                        count(r.count),
                        with_unit(r.median_us, "µs"),
                        with_unit(r.algbw_gbytes_per_s, "GB/s"),
                        with_unit(r.busbw_gbytes_per_s, "GB/s"),
                    )
                    for r in comm.by_size
                ),
                numeric=(1, 2, 3, 4, 5),
            )
        )
    out.append(_fits(comm))
    if comm.link is not None:
        link = comm.link
        out.append(
            Paragraph(
                f"Link compared with: {text(link.name)} ({text(link.reason)}). {sentence(link.summary)}"
            )
        )
    if comm.ddp_logging:
        out.append(
            KeyValues(
                "Cross-check: DDP's own sampled averages",
                tuple((k.removesuffix("_ms").replace("_", " "), ms(v)) for k, v in comm.ddp_logging.items()),
            )
        )
    return out + figures(ID, plots)


def _rank_row(r: RankComm) -> tuple[str, ...]:
    return (
        text(r.rank),
        ms(r.comm_ms),
        ms(r.exposed_ms),
        size_bytes(r.bytes_per_step),
        number(r.collectives_per_step),
    )


def _per_rank(analysis: RunAnalysis, ranks: list[RankComm]) -> list[Block]:
    if len(ranks) <= PER_ROW_LIMIT:
        return [
            table(
                "Per rank, mean per step", _RANK_HEADER, (_rank_row(r) for r in ranks), numeric=(1, 2, 3, 4)
            )
        ]
    spread = spread_table(
        f"Per rank, mean per step: spread across {plural(len(ranks), 'rank')}",
        [
            ("Collectives", [r.comm_ms for r in ranks], ms),
            ("Exposed", [r.exposed_ms for r in ranks], ms),
            ("Bytes", [r.bytes_per_step for r in ranks], size_bytes),
            ("Collectives/step", [r.collectives_per_step for r in ranks], number),
        ],
    )
    extremes = _extremes(analysis, ranks)
    return [spread] if extremes is None else [spread, extremes]


def _extremes(analysis: RunAnalysis, ranks: list[RankComm]) -> Table | None:
    # A rank that spends the least time in collectives is the one the others wait for there.
    picked = pick_extremes(
        analysis,
        ranks,
        lambda r: r.rank,
        (
            ("least time", lambda r: r.comm_ms, False),
            ("most time", lambda r: r.comm_ms, True),
            ("most exposed", lambda r: r.exposed_ms, True),
        ),
    )
    hosts = analysis.run.hosts
    rows = []
    for which, r in picked:
        rank, *cells = _rank_row(r)
        rows.append((which, rank, text(hosts.get(str(r.rank))), *cells))
    if not rows:
        return None
    return table(
        f"Ranks at the extremes of collective time ({EXTREMES} each), mean per step",
        ("", "Rank", "Host", *_RANK_HEADER[1:]),
        rows,
        numeric=(3, 4, 5, 6),
    )


def _fits(comm: Communication) -> Block:
    if not comm.fits:
        return Paragraph(
            "No latency-bandwidth fit: the run's collectives came in fewer than two sizes. The tuneup probe-network command measures a range of sizes.",
            True,
        )
    return table(
        "Latency-bandwidth fit (ring model)",
        ("Collective", "α (latency)", "β", "Bus bandwidth", "R²", "Sizes"),
        (
            (
                text(f.kind),
                with_unit(f.alpha_us, "µs"),
                with_unit(f.beta_ns_per_byte, "ns/B"),
                with_unit(f.busbw_gbytes_per_s, "GB/s"),
                number(f.r_squared),
                count(f.sizes),
            )
            for f in comm.fits
        ),
        numeric=(1, 2, 3, 4, 5),
    )


# ---------------------------------------------------------------------------------------------------
# communication.png


def size_label(nbytes: float) -> str:
    return f"{fmt(nbytes / 2**20)} MiB" if nbytes >= 2**20 else f"{fmt(nbytes / 2**10)} KiB"


# A rank's collective time whose exposed part was not measured is drawn in neither exposed nor overlapped
# colour: grey, hatched.
UNKNOWN_COLOR = "#B0B0B0"
UNKNOWN_LABEL = "not known how much was waited for"
# One rank: (rank, collective ms per step, of it exposed ms; None where not measured).
_Rank = tuple[int, float, float | None]


def _overlapped_label(sharded: bool) -> str:
    return "overlapped with forward and backward" if sharded else "overlapped with backward"


def _split_text(ranks: list[_Rank], sharded: bool) -> str:
    """How the per-rank panel splits each rank's time, as drawn: by measured exposure, or as unknown."""
    measured = [e is not None for _, _, e in ranks]
    split = (
        "split into what compute waited for (exposed) and what overlapped with forward and backward"
        if sharded
        else "split into what the step waited for after backward compute ended and what overlapped with it"
    )
    if all(measured):
        return split
    unknown = "drawn as unknown (hatched grey): how much of it the step waited for was not measured"
    if not any(measured):
        return unknown
    return f"{split} where measured, and drawn as unknown (hatched grey) on the ranks where it was not"


def _draw_communication(analysis: RunAnalysis) -> Drawn | None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    comm = analysis.communication
    if comm is None:
        return None
    ranks: list[_Rank] = []
    for entry in comm.per_rank:
        total, exposed = num(entry.comm_ms), num(entry.exposed_ms)
        if total is not None:
            ranks.append((entry.rank, total, min(total, exposed) if exposed is not None else None))
    sharded = sharding(analysis.run) is not None
    buckets = [
        (b.bucket, num(b.median_ms), num(b.bytes)) for b in comm.per_bucket if num(b.median_ms) is not None
    ]
    if not ranks:
        return None
    fig = Figure(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, squeeze=True) if buckets else (fig.subplots(1, 1), None)
    many = len(ranks) > PER_ROW_LIMIT
    if many:
        _ranks_as_area(left, sorted(ranks), sharded)
    else:
        _ranks_as_bars(left, ranks, sharded)
    if right is not None:
        xs = list(range(len(buckets)))
        right.bar(xs, [t for _, t, _ in buckets], color=PHASE_COLORS["backward"], width=0.6)
        labels = [f"{b}\n{size_label(n or 0)}" for b, _, n in buckets]
        step = every(len(buckets), 5)  # a label is about 60 px wide, the panel under 400
        right.set_xticks(xs[::step], labels[::step], fontsize=8)
        right.set_xlabel("DDP gradient bucket (size)")
        right.set_ylabel("median time (ms)")
        right.set_title("Per gradient bucket")
    title = "Communication per step"
    fig.suptitle(title, fontweight="bold")
    how = (
        f"each of {len(ranks):,} ranks' collective time per step, in rank order,"
        if many
        else "each rank's collective time per step,"
    )
    if sharded:
        how = how.replace("per step", "per step (all-gathers and reduce-scatters)")
    late = "(a rank with far less than the others arrives late and makes them wait)"
    ranks_text = f"{how} {_split_text(ranks, sharded)} {late}"
    return Drawn(
        fig,
        title,
        f"Left: {ranks_text}; right: the median time of each DDP gradient bucket's collective."
        if right is not None
        else f"{ranks_text[0].upper()}{ranks_text[1:]}.",
    )


def _ranks_as_bars(ax: Any, ranks: list[_Rank], sharded: bool) -> None:
    ys = list(range(len(ranks)))
    exposed = [e or 0.0 for _, _, e in ranks]
    overlapped = [c - e if e is not None else 0.0 for _, c, e in ranks]
    unknown = [c if e is None else 0.0 for _, c, e in ranks]
    if any(e is not None for _, _, e in ranks):
        ax.barh(ys, exposed, height=0.6, color=PHASE_COLORS["backward"], label="waited for (exposed)")
        ax.barh(
            ys,
            overlapped,
            left=exposed,
            height=0.6,
            color=PHASE_COLORS["forward"],
            label=_overlapped_label(sharded),
        )
    if any(unknown):
        ax.barh(
            ys, unknown, height=0.6, color=UNKNOWN_COLOR, hatch="//", edgecolor="white", label=UNKNOWN_LABEL
        )
    ax.set_yticks(ys, [f"rank {r}" for r, _, _ in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("collective time per step (ms)")
    ax.set_title("Per rank")
    ax.legend(loc="lower right", fontsize=8)


def _ranks_as_area(ax: Any, ranks: list[_Rank], sharded: bool) -> None:
    """Ranks along x, stacked exposed and overlapped time as steps: a bar each would be thinner than a pixel.
    A rank whose exposed time was not measured has all its time drawn as unknown."""
    xs = [r for r, _, _ in ranks]
    known = [e is not None for _, _, e in ranks]
    exposed = [e if e is not None else 0.0 for _, _, e in ranks]
    total = [c for _, c, _ in ranks]
    if any(known):
        measured = [c if k else 0.0 for c, k in zip(total, known, strict=True)]
        ax.fill_between(
            xs, 0, exposed, step="mid", color=PHASE_COLORS["backward"], lw=0, label="waited for (exposed)"
        )
        ax.fill_between(
            xs,
            exposed,
            measured,
            step="mid",
            color=PHASE_COLORS["forward"],
            lw=0,
            label=_overlapped_label(sharded),
        )
    if not all(known):
        unknown = [0.0 if k else c for c, k in zip(total, known, strict=True)]
        ax.fill_between(
            xs,
            0,
            unknown,
            step="mid",
            color=UNKNOWN_COLOR,
            hatch="//",
            edgecolor="white",
            lw=0,
            label=UNKNOWN_LABEL,
        )
    least = min(ranks, key=lambda r: r[1])
    peak = max(total)
    # Headroom above the ranks for the legend and the name of the rank the others wait for.
    ax.set_ylim(0, peak * 1.45 if peak > 0 else 1.0)
    # Text that starts, centres or ends at the rank, whichever keeps it inside the panel.
    where = (least[0] - xs[0]) / max(1, xs[-1] - xs[0])
    ax.annotate(
        f"rank {least[0]}: least time",
        (least[0], least[1]),
        xytext=(least[0], peak * 1.12 if peak > 0 else 0.8),
        textcoords="data",
        ha="left" if where < 0.25 else "right" if where > 0.75 else "center",
        va="bottom",
        fontsize=8,
        color=STRAGGLER_COLOR,
        arrowprops={"arrowstyle": "-", "color": STRAGGLER_COLOR, "lw": 0.8},
    )
    ax.set_xlim(min(xs) - 0.5, max(xs) + 0.5)
    ax.set_xlabel("rank")
    ax.set_ylabel("collective time per step (ms)")
    ax.set_title("Per rank")
    ax.legend(loc="upper center", ncols=2, fontsize=8)


PLOTS: tuple[Plot, ...] = (Plot("communication.png", _draw_communication),)
