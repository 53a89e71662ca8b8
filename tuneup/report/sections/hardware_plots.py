"""The hardware section's figures: each GPU over the run (gpu_utilization.png), and each rank's process
and each host's network (host_utilization.png).

A line per GPU, rank or host while they stay readable; beyond (`PER_ROW_LIMIT` GPUs or ranks,
`MAX_LINES` hosts) the median and the p5–p95 band across them, with the one that stands out drawn on
top: the least busy GPU, the straggler's (or slowest rank's) process.
"""

from __future__ import annotations

from typing import Any

from tuneup.analyze.model import GpuTelemetry, RunAnalysis, Series
from tuneup.report.plotting import (
    IDLE_NETWORK_MB_S,
    MAX_LEGEND_ENTRIES,
    PANEL_HEIGHT_PX,
    SAMPLES_COLOR,
    SENT_COLOR,
    STRAGGLER_COLOR,
    Drawn,
    bottom_legend,
    enough,
    figure,
    num,
    palette,
    proxy,
    rank_colors,
    rank_colour_bar,
    run_ranks,
)
from tuneup.report.sections._scale import MAX_LINES, PER_ROW_LIMIT, band_over_time, draw_band, rank_to_watch

# The many drawn as one grey band, so that the one drawn on its own (orange) stands out.
BAND_COLOR = "#4D4D4D"
GIB = 2**30


def _series(s: Series, scale: float = 1.0) -> tuple[list[float], list[float]]:
    """The points where both time and value are finite numbers, the value times `scale`."""
    xs: list[float] = []
    ys: list[float] = []
    for t, v in zip(s.t_s, s.values, strict=False):
        ft, fv = num(t), num(v)
        if ft is not None and fv is not None:
            xs.append(ft)
            ys.append(fv * scale)
    return xs, ys


def gpu_label(gpu: GpuTelemetry, multi_host: bool) -> str:
    name = f"GPU {gpu.index}" if isinstance(gpu.index, int) else "GPU"
    return f"{gpu.host} {name}" if multi_host and isinstance(gpu.host, str) else name


# ---------------------------------------------------------------------------------------------------
# gpu_utilization.png


_GPU_PANELS = (
    ("util_percent", 1.0, "utilization (%)"),
    ("power_w", 1.0, "power (W)"),
    ("mem_used_bytes", 1 / GIB, "memory used (GiB)"),
)


def draw_gpu(analysis: RunAnalysis) -> Drawn | None:
    gpus = analysis.telemetry.gpus
    if not gpus:
        return None
    data = {
        name: [(g, _series(getattr(g.series, name), scale)) for g in gpus] for name, scale, _ in _GPU_PANELS
    }
    shown = [p for p in _GPU_PANELS if any(enough(xs) for _, (xs, _) in data[p[0]])]
    if not shown:
        return None
    multi_host = len({g.host for g in gpus}) > 1
    hosts = len({g.host for g in gpus})
    banded = len(gpus) > PER_ROW_LIMIT or hosts > MAX_LINES
    colors = palette(len(gpus))
    fig, axes = figure(rows=len(shown), height_px=90 + PANEL_HEIGHT_PX * len(shown))
    thin = len(gpus) > 4
    idle = min(
        (g for g in gpus if num(g.util_percent_mean) is not None),
        key=lambda g: g.util_percent_mean,  # type: ignore[arg-type, return-value]
        default=None,
    )
    band_handles: list[Any] = []
    for ax, (name, scale, label) in zip(axes, shown, strict=True):
        if banded:
            band = band_over_time([xy_ for _, xy_ in data[name]])
            if band is not None:
                band_handles = draw_band(ax, band, BAND_COLOR, "all GPUs")
            if idle is not None:
                xs, ys = next(s for g, s in data[name] if g is idle)
                if xs:
                    ax.plot(xs, ys, color=STRAGGLER_COLOR, lw=0.9, label="least busy")
        else:
            for color, (gpu, (xs, ys)) in zip(colors, data[name], strict=True):
                if xs:
                    ax.plot(xs, ys, color=color, lw=0.8 if thin else 1.2, label=gpu_label(gpu, multi_host))
        ax.set_ylabel(label)
        if name == "util_percent":
            ax.set_ylim(0, 105)
        else:
            ax.set_ylim(bottom=0)
        if name == "mem_used_bytes":
            _capacity(ax, gpus, data[name], scale)
    axes[-1].set_xlabel("time since the run started (s)")
    title = "GPU utilization, power and memory"
    fig.suptitle(title)
    what = ", ".join(label.split(" (")[0] for _, _, label in shown)
    if banded:
        idle_note = ""
        handles = list(band_handles)
        if idle is not None:
            who = gpu_label(idle, multi_host)
            handles.append(proxy(STRAGGLER_COLOR, f"least busy: {who}"))
            idle_note = f", and the least busy GPU ({who}) is drawn on its own"
        if handles:
            bottom_legend(fig, handles)
        return Drawn(
            fig,
            title,
            f"Across {len(gpus):,} GPUs on {hosts:,} hosts over the run ({what}, sampled in the background): "
            f"the line is the median GPU and the band spans the 5th to 95th percentile{idle_note}; low "
            "utilization while training means the GPUs wait on data, the host or communication.",
        )
    key_note = ""
    if 1 < len(gpus) <= MAX_LEGEND_ENTRIES:
        # One entry per GPU, whichever panels it has data in.
        bottom_legend(fig, [proxy(c, gpu_label(g, multi_host)) for c, g in zip(colors, gpus, strict=True)])
    elif len(gpus) == 1:
        title = f"{title}: {gpu_label(gpus[0], True)}"
        fig.suptitle(title)
    else:
        key_note = f" ({len(gpus)} GPUs, one line each, too many to label)"
    return Drawn(
        fig,
        title,
        f"Per GPU over the run{key_note} ({what}, sampled in the background): low utilization while "
        "training means the GPU waits on data, the host or communication.",
    )


def _capacity(ax: Any, gpus: list[GpuTelemetry], data: list[Any], scale: float) -> None:
    totals = {t for g in gpus if (t := num(g.mem_total_bytes)) is not None}
    # One capacity line when the GPUs agree; mixed GPUs would need one per GPU, which clutters.
    if len(totals) != 1:
        return
    cap = totals.pop() * scale
    peak = max((y for _, (_, ys) in data for y in ys), default=0.0)
    ax.axhline(cap, color="black", ls="--", lw=1.0, alpha=0.7)
    ax.annotate(
        f"capacity {cap:.0f} GiB",
        (1.0, cap),
        xycoords=("axes fraction", "data"),
        xytext=(-4, -3),
        textcoords="offset points",
        ha="right",
        va="top",
        fontsize=8,
    )
    ax.set_ylim(0, max(cap, peak) * 1.08)


# ---------------------------------------------------------------------------------------------------
# host_utilization.png


Xy = tuple[list[float], list[float]]


def draw_host(analysis: RunAnalysis) -> Drawn | None:
    per_rank: dict[str, dict[int, Xy]] = {"cpu": {}, "rss": {}}
    for proc in analysis.telemetry.processes:
        for key, s, scale in (("cpu", proc.series.cpu_percent, 1.0), ("rss", proc.series.rss_bytes, 1 / GIB)):
            xs, ys = _series(s, scale)
            if enough(xs):
                per_rank[key][proc.rank] = (xs, ys)
    net: list[tuple[str, Xy, Xy]] = []
    for i, host in enumerate(analysis.telemetry.hosts):
        recv = _series(host.series.net_recv_bytes_per_s, 1e-6)
        sent = _series(host.series.net_sent_bytes_per_s, 1e-6)
        if enough(recv[0]) or enough(sent[0]):
            net.append((host.host if isinstance(host.host, str) else f"host {i}", recv, sent))
    net_peak = max((y for _, (_, ry), (_, sy) in net for y in (*ry, *sy)), default=0.0)
    idle_network = bool(net) and net_peak < IDLE_NETWORK_MB_S
    shown = [k for k in ("cpu", "rss") if per_rank[k]] + (["net"] if net and not idle_network else [])
    if not shown:
        return None
    ranks = sorted(set(per_rank["cpu"]) | set(per_rank["rss"]))
    rank_band = len(ranks) > PER_ROW_LIMIT
    host_band = len(net) > MAX_LINES // 2  # two lines a host: receive and send
    highlight = rank_to_watch(analysis) if rank_band else None
    colors = rank_colors(run_ranks(analysis) or ranks)
    fig, axes = figure(rows=len(shown), height_px=90 + PANEL_HEIGHT_PX * len(shown))
    many = len(ranks) > 4
    handles: list[Any] = []
    for ax, kind in zip(axes, shown, strict=True):
        if kind in ("cpu", "rss"):
            if rank_band:
                band = band_over_time(list(per_rank[kind].values()))
                if band is not None:
                    drawn = draw_band(ax, band, BAND_COLOR, "all ranks")
                    handles = handles or drawn
                if highlight is not None and highlight[0] in per_rank[kind]:
                    xs, ys = per_rank[kind][highlight[0]]
                    ax.plot(xs, ys, color=STRAGGLER_COLOR, lw=1.0, label=f"rank {highlight[0]}")
            else:
                for rank, (xs, ys) in sorted(per_rank[kind].items()):
                    ax.plot(
                        xs,
                        ys,
                        color=colors.get(rank, "grey"),
                        lw=0.8 if many else 1.2,
                        label=f"rank {rank}",
                        gid=str(rank),
                    )
            ax.set_ylim(bottom=0)
            ax.set_ylabel("CPU (%)" if kind == "cpu" else "RSS (GiB)")
            note = (
                "each rank's process tree: CPU, 100% = one busy core"
                if kind == "cpu"
                else "each rank's process tree: RSS summed over processes, an upper bound"
            )
            ax.set_title(note, loc="left", fontsize=9, fontweight="normal")
        else:
            _draw_network(ax, net, net_peak, host_band)
    axes[-1].set_xlabel("time since the run started (s)")
    title = "Rank processes" + (" and host network" if "net" in shown else "") + " over the run"
    fig.suptitle(title)
    rank_axes = [ax for ax, kind in zip(axes, shown, strict=True) if kind != "net"]
    colour_bar = bool(rank_axes) and not rank_band and len(ranks) > MAX_LEGEND_ENTRIES
    if colour_bar:
        # Beside every panel, the network's too, so that the panels stay aligned.
        rank_colour_bar(fig, axes, colors, ranks)
    elif rank_axes and rank_band:
        if highlight is not None:
            handles = [*handles, proxy(STRAGGLER_COLOR, f"rank {highlight[0]} ({highlight[1]})")]
    elif rank_axes and len(ranks) > 1:
        handles = [proxy(colors.get(r, "grey"), f"rank {r}") for r in ranks]
    if "net" in shown:
        handles += _network_handles(axes[shown.index("net")], host_band)
    if len(handles) > 1:
        bottom_legend(fig, handles)
    return Drawn(
        fig,
        title,
        _host_caption(shown, idle_network, colour_bar, rank_band, host_band, len(ranks), len(net), highlight),
    )


def _draw_network(ax: Any, net: list[tuple[str, Xy, Xy]], net_peak: float, host_band: bool) -> None:
    if host_band:
        for i, (color, ls, what) in enumerate(((SAMPLES_COLOR, "-", "receive"), (SENT_COLOR, "--", "send"))):
            band = band_over_time([entry[1 + i] for entry in net])
            if band is not None:
                draw_band(ax, band, color, f"hosts {what}", ls=ls)
    else:
        host_colors = rank_colors(list(range(len(net))))
        for i, (name, (rx, ry), (sx, sy)) in enumerate(net):
            who = name if len(net) > 1 else "network"
            # One host: a colour per direction. Several: a colour per host, a line style per direction.
            recv_color, sent_color = (
                (SAMPLES_COLOR, SENT_COLOR) if len(net) == 1 else (host_colors[i], host_colors[i])
            )
            if rx:
                ax.plot(rx, ry, color=recv_color, lw=1.1, label=f"{who} receive")
            if sx:
                ax.plot(sx, sy, color=sent_color, lw=1.1, ls="--", label=f"{who} send")
    ax.set_ylim(0, net_peak * 1.15)
    ax.set_ylabel("network (MB/s)")
    where = f"host {net[0][0]}" if len(net) == 1 else "each host" if not host_band else f"{len(net):,} hosts"
    ax.set_title(f"{where}: all interfaces but loopback", loc="left", fontsize=9, fontweight="normal")


def _network_handles(ax: Any, host_band: bool) -> list[Any]:
    if not host_band:
        return list(ax.get_lines())
    from matplotlib.patches import Patch

    # Bands of both directions overlap: one entry per line, one for the bands.
    return [*ax.get_lines(), Patch(facecolor="0.6", alpha=0.3, label="bands: p5 to p95 across hosts")]


def _host_caption(
    shown: list[str],
    idle_network: bool,
    colour_bar: bool,
    rank_band: bool,
    host_band: bool,
    n_ranks: int,
    n_hosts: int,
    highlight: tuple[int, str] | None,
) -> str:
    parts = []
    if "cpu" in shown:
        parts.append("each rank's CPU use (100% is one busy core)")
    if "rss" in shown:
        # The table's peak is PSS where recorded; this curve is the RSS sum, every tick, and says so.
        parts.append("its resident memory in GiB summed over its processes (an upper bound)")
    if "net" in shown:
        parts.append("each host's network traffic in MB/s outside loopback")
    notes = [
        "a rank pinned near 100% CPU on a data-bound step is short of data-loader workers",
        "memory that keeps climbing is a leak",
    ]
    if idle_network:
        notes.append(
            f"network traffic outside loopback stayed under {IDLE_NETWORK_MB_S} MB/s and is not drawn"
        )
    if colour_bar:
        notes.append("the colour bar maps colours to ranks")
    if rank_band:
        who = f", with rank {highlight[0]} ({highlight[1]}) drawn on its own" if highlight else ""
        notes.append(f"the {n_ranks:,} ranks are drawn as their median and p5 to p95 band{who}")
    if host_band and "net" in shown:
        notes.append(f"the {n_hosts:,} hosts' network as its median and p5 to p95 band")
    listed = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    return f"Over the run, {listed}: {'; '.join(notes)}."
