"""GPUs, processes and hosts: were the GPUs busy, and did a rank's process or a host run short of CPU,
memory or network while the run trained?

Up to `PER_ROW_LIMIT` GPUs (ranks, hosts) each gets a row; beyond, the GPUs get a row per host, and
past that many hosts every table becomes the spread across them and the few at the extremes.
The figures are drawn in hardware_plots.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tuneup.analyze.model import (
    PROCESS_MEMORY_LABELS,
    PROCESS_MEMORY_NAMES,
    GpuTelemetry,
    HostTelemetry,
    ProcessTelemetry,
    RunAnalysis,
)
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, Paragraph, Table, figures, table
from tuneup.report.format import (
    MISSING,
    byte_rate,
    energy,
    is_number,
    pair,
    percent,
    plural,
    size_bytes,
    text,
    with_unit,
)
from tuneup.report.plotting import Plot
from tuneup.report.sections._scale import (
    EXTREMES,
    PER_ROW_LIMIT,
    highest,
    lowest,
    pick_extremes,
    spread,
    spread_table,
)
from tuneup.report.sections.hardware_plots import draw_gpu, draw_host

ID = "hardware"
TITLE = "GPUs, processes and hosts"
PLOTS: tuple[Plot, ...] = (Plot("gpu_utilization.png", draw_gpu), Plot("host_utilization.png", draw_host))

# How many of the least busy GPUs a large job's report names.
IDLE_GPUS_SHOWN = 5


def blocks(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]:
    tel = analysis.telemetry
    out: list[Block] = []
    if is_number(tel.samples):
        out.append(Paragraph(f"From {plural(int(tel.samples), 'telemetry sample')}."))
    if tel.gpus:
        out += _gpus(analysis)
    elif analysis.run.hardware.gpu_names:
        out.append(Paragraph("No GPU telemetry: the run's GPUs were not sampled through NVML.", True))
    else:
        out.append(Paragraph("No GPU telemetry: the run had no NVML-visible GPU.", True))
    out += _processes(analysis)
    out += _hosts(analysis)
    return out + figures(ID, plots)


# ---------------------------------------------------------------------------------------------------
# GPUs


def gpu_names(analysis: RunAnalysis) -> dict[str, str]:
    """GPU names by PCI bus id, from the manifest's NVML inventory (telemetry entries carry no name)."""
    inventory = (analysis.environment.gpus or {}).get("gpus")
    entries = [g for g in inventory if isinstance(g, dict)] if isinstance(inventory, list) else []
    return {str(g["pci_bus_id"]): text(g.get("name")) for g in entries if g.get("pci_bus_id")}


_GPU_FIGURES = (
    "Util mean / max",
    "Memory peak / total",
    "Power mean / max",
    "Energy",
    "Temp max",
    "SM clock",
)


def _gpu_figures(g: GpuTelemetry) -> tuple[str, ...]:
    return (
        pair(percent(g.util_percent_mean, 0), percent(g.util_percent_max, 0)),
        pair(size_bytes(g.mem_used_bytes_max), size_bytes(g.mem_total_bytes)),
        pair(with_unit(g.power_w_mean, "W", 0), with_unit(g.power_w_max, "W", 0)),
        energy(g.energy_j),
        with_unit(g.temp_c_max, "°C", 0),
        with_unit(g.sm_clock_mhz_mean, "MHz", 0),
        text(g.throttle_reasons) if g.throttle_reasons else "none",
    )


def _gpu_title(gpus: Sequence[GpuTelemetry], names: list[str], what: str = "GPUs") -> str:
    multi_name = len(set(names)) > 1
    title = what if multi_name or names[0] == MISSING else f"{what}: {names[0]}"
    if len({text(g.host) for g in gpus}) == 1 and gpus[0].host:
        title += f" on {text(gpus[0].host)}"
    return title


def _gpu_table(gpus: Sequence[GpuTelemetry], names: list[str], title: str) -> Table:
    # Columns that would repeat one value down every row move into the title, keeping the table narrow.
    multi_host = len({text(g.host) for g in gpus}) > 1
    multi_name = len(set(names)) > 1
    header = ["GPU"] + ["Host"] * multi_host + ["Name"] * multi_name
    rows = [
        (
            text(g.index) + (" (lost)" if g.lost else ""),
            *[text(g.host)] * multi_host,
            *[name] * multi_name,
            *_gpu_figures(g),
        )
        for g, name in zip(gpus, names, strict=True)
    ]
    first = len(header)
    header += [*_GPU_FIGURES, "Throttle reasons"]
    return table(title, header, rows, range(first, first + 6))


def _gpus(analysis: RunAnalysis) -> list[Block]:
    gpus = analysis.telemetry.gpus
    by_bus = gpu_names(analysis)
    names = [by_bus.get(str(g.bus_id), MISSING) for g in gpus]
    if len(gpus) <= PER_ROW_LIMIT:
        return [_gpu_table(gpus, names, _gpu_title(gpus, names))]
    hosts: dict[str, list[int]] = {}
    for i, g in enumerate(gpus):
        hosts.setdefault(text(g.host), []).append(i)
    if len(hosts) <= PER_ROW_LIMIT:
        return [_gpus_per_host(gpus, names, hosts)]
    return _gpus_at_scale(gpus, names, len(hosts))


def _gpus_per_host(gpus: Sequence[GpuTelemetry], names: list[str], hosts: dict[str, list[int]]) -> Table:
    """A row per host: its GPUs' figures pooled, with the least busy GPU's utilization beside the mean."""
    multi_name = len(set(names)) > 1
    rows = []
    for host, members in hosts.items():
        mine = [gpus[i] for i in members]
        utils = [g.util_percent_mean for g in mine if is_number(g.util_percent_mean)]
        lost = sum(g.lost for g in mine)
        totals = {g.mem_total_bytes for g in mine}
        energies = [g.energy_j for g in mine]
        reasons = sorted({r for g in mine for r in g.throttle_reasons})
        rows.append(
            (
                host,
                f"{len(mine)}" + (f" ({lost} lost)" if lost else ""),
                *[text(sorted({names[i] for i in members}))] * multi_name,
                pair(percent(_mean(utils), 0), percent(min(utils, default=None), 0)),
                pair(size_bytes(_max(g.mem_used_bytes_max for g in mine)), size_bytes(totals.pop()))
                if len(totals) == 1
                else size_bytes(_max(g.mem_used_bytes_max for g in mine)),
                pair(
                    with_unit(_mean(g.power_w_mean for g in mine), "W", 0),
                    with_unit(_max(g.power_w_max for g in mine), "W", 0),
                ),
                energy(sum(energies)) if all(is_number(e) for e in energies) else MISSING,
                with_unit(_max(g.temp_c_max for g in mine), "°C", 0),
                with_unit(_mean(g.sm_clock_mhz_mean for g in mine), "MHz", 0),
                text(reasons) if reasons else "none",
            )
        )
    header = [
        "Host",
        "GPUs",
        *["Names"] * multi_name,
        "Util mean / least busy GPU",
        "Memory peak / total",
        "Power mean / max",
        "Energy",
        "Temp max",
        "SM clock",
        "Throttle reasons",
    ]
    first = 2 + multi_name
    title = _gpu_title(gpus, names, "GPUs per host") + f" ({plural(len(gpus), 'GPU')})"
    return table(title, header, rows, [1, *range(first, first + 6)])


def _gpus_at_scale(gpus: Sequence[GpuTelemetry], names: list[str], n_hosts: int) -> list[Block]:
    title = (
        _gpu_title(gpus, names) + f", spread across {plural(len(gpus), 'GPU')} on {plural(n_hosts, 'host')}"
    )
    out: list[Block] = [
        spread_table(
            title,
            [
                ("Util mean", [g.util_percent_mean for g in gpus], lambda v: percent(v, 0)),
                ("Util max", [g.util_percent_max for g in gpus], lambda v: percent(v, 0)),
                ("Memory peak", [g.mem_used_bytes_max for g in gpus], size_bytes),
                ("Power mean", [g.power_w_mean for g in gpus], lambda v: with_unit(v, "W", 0)),
                ("Energy", [g.energy_j for g in gpus], energy),
                ("Temp max", [g.temp_c_max for g in gpus], lambda v: with_unit(v, "°C", 0)),
                ("SM clock", [g.sm_clock_mhz_mean for g in gpus], lambda v: with_unit(v, "MHz", 0)),
            ],
        )
    ]
    idle = lowest(list(range(len(gpus))), lambda i: gpus[i].util_percent_mean, IDLE_GPUS_SHOWN)
    if idle:
        out.append(
            _gpu_table(
                [gpus[i] for i in idle],
                [names[i] for i in idle],
                f"The {len(idle)} least busy GPUs, by mean utilization",
            )
        )
    lost = [g for g in gpus if g.lost]
    if lost:
        listed = ", ".join(f"{text(g.host)} GPU {g.index}" for g in lost[:10])
        more = f" and {len(lost) - 10:,} more" if len(lost) > 10 else ""
        out.append(Paragraph(f"{plural(len(lost), 'GPU')} stopped answering during the run: {listed}{more}."))
    reasons: dict[str, list[GpuTelemetry]] = {}
    for g in gpus:
        for reason in g.throttle_reasons:
            reasons.setdefault(reason, []).append(g)
    if reasons:
        seen = "; ".join(
            f"{reason} on {plural(len(hit), 'GPU')} ({plural(len({text(g.host) for g in hit}), 'host')})"
            for reason, hit in sorted(reasons.items(), key=lambda kv: -len(kv[1]))
        )
        out.append(Paragraph(f"Throttle reasons seen: {seen}."))
    else:
        out.append(Paragraph("No GPU reported a throttle reason."))
    return out


def _mean(values: Any) -> float | None:
    known = [v for v in values if is_number(v)]
    return sum(known) / len(known) if known else None


def _max(values: Any) -> float | None:
    return max((v for v in values if is_number(v)), default=None)


# ---------------------------------------------------------------------------------------------------
# Processes


# The memory column's header, by ProcessTelemetry.memory_measure; PROCESS_MEMORY_LABELS says what each is.
_MEMORY_HEADERS = {measure: f"Peak {name}" for measure, name in PROCESS_MEMORY_NAMES.items()}


def _processes(analysis: RunAnalysis) -> list[Block]:
    processes = analysis.telemetry.processes
    if not processes:
        return [Paragraph("No process telemetry was recorded.", True)]
    title = "Training processes (each rank with its children)"
    memory_header, memory_cell, memory_note = _memory_column(processes)
    if len(processes) <= PER_ROW_LIMIT:
        rows = [(text(p.rank), percent(p.cpu_percent_mean), memory_cell(p)) for p in processes]
        out: list[Block] = [table(title, ("Rank", "CPU mean", memory_header), rows, (1, 2))]
    else:
        out = [
            spread_table(
                f"{title}, spread across {plural(len(processes), 'rank')}",
                [
                    ("CPU mean", [p.cpu_percent_mean for p in processes], percent),
                    (memory_header, [p.memory_bytes_max for p in processes], size_bytes),
                ],
            ),
        ]
        extremes = _process_extremes(analysis, processes, memory_header, memory_cell)
        if extremes is not None:
            out.append(extremes)
    out.append(Paragraph(f"CPU % counts one fully busy core as 100%. {memory_note}"))
    return out


def _memory_column(
    processes: Sequence[ProcessTelemetry],
) -> tuple[str, Callable[[ProcessTelemetry], str], str]:
    """The memory column's header, its cell and the note that says what it measures. Every rank of a
    run normally has one measure; a rank whose host hid PSS says its own in its cell."""
    order = {m: i for i, m in enumerate(_MEMORY_HEADERS)}
    measures = sorted({p.memory_measure for p in processes}, key=lambda m: (order.get(m, len(order)), m))
    if len(measures) == 1:
        (measure,) = measures
        header = _MEMORY_HEADERS.get(measure, "Peak memory")
        return header, lambda p: size_bytes(p.memory_bytes_max), f"{header}: {_memory_label(measure)}."
    note = "; ".join(f"{text(m).upper()}: {_memory_label(m)}" for m in measures)
    return (
        "Peak memory",
        lambda p: f"{size_bytes(p.memory_bytes_max)} ({text(p.memory_measure).upper()})",
        f"Ranks differ in what their peak memory measures. {note}.",
    )


def _memory_label(measure: str) -> str:
    # A measure this version does not know (a newer writer's report.json) is named, not guessed at.
    return PROCESS_MEMORY_LABELS.get(measure, f"peak memory ({text(measure)})")


def _process_extremes(
    analysis: RunAnalysis,
    processes: Sequence[ProcessTelemetry],
    memory_header: str,
    memory_cell: Callable[[ProcessTelemetry], str],
) -> Table | None:
    # The rank that holds the others back is picked too: its process is the first place to look.
    picked = pick_extremes(
        analysis,
        processes,
        lambda p: p.rank,
        (
            ("highest CPU", lambda p: p.cpu_percent_mean, True),
            ("lowest CPU", lambda p: p.cpu_percent_mean, False),
            ("largest memory", lambda p: p.memory_bytes_max, True),
        ),
    )
    hosts = analysis.run.hosts
    rows = [
        (
            which,
            text(p.rank),
            text(hosts.get(str(p.rank))),
            percent(p.cpu_percent_mean),
            memory_cell(p),
        )
        for which, p in picked
    ]
    if not rows:
        return None
    return table(
        f"Rank processes at the extremes ({EXTREMES} each)",
        ("", "Rank", "Host", "CPU mean", memory_header),
        rows,
        (3, 4),
    )


# ---------------------------------------------------------------------------------------------------
# Hosts


_HOST_HEADER = (
    "Host",
    "CPU mean",
    "Memory peak",
    "Memory total",
    "Disk read",
    "Disk write",
    "Net received",
    "Net sent",
)


def _outside(h: HostTelemetry) -> tuple[float | None, float | None]:
    """Received and sent bytes/s over every interface but loopback (the ranks' own traffic on one host)."""
    outside = [v for k, v in h.net_bytes_per_s.items() if not str(k).startswith("lo")]
    recv = [v.recv_bytes_per_s for v in outside]
    sent = [v.sent_bytes_per_s for v in outside]
    return (
        sum(recv) if recv and all(is_number(v) for v in recv) else None,  # type: ignore[arg-type]
        sum(sent) if sent and all(is_number(v) for v in sent) else None,  # type: ignore[arg-type]
    )


def _host_row(h: HostTelemetry) -> tuple[str, ...]:
    recv, sent = _outside(h)
    return (
        text(h.host),
        percent(h.cpu_percent_mean),
        size_bytes(h.mem_used_bytes_max),
        size_bytes(h.mem_total_bytes),
        byte_rate(h.disk_read_bytes_per_s),
        byte_rate(h.disk_write_bytes_per_s),
        byte_rate(recv) if recv is not None else MISSING,
        byte_rate(sent) if sent is not None else MISSING,
    )


def _hosts(analysis: RunAnalysis) -> list[Block]:
    hosts = analysis.telemetry.hosts
    if not hosts:
        return [Paragraph("No host telemetry was recorded.", True)]
    if len(hosts) <= PER_ROW_LIMIT:
        out: list[Block] = [table("Hosts", _HOST_HEADER, [_host_row(h) for h in hosts], range(1, 8))]
    else:
        out = [
            spread_table(
                f"Hosts, spread across {plural(len(hosts), 'host')}",
                [
                    ("CPU mean", [h.cpu_percent_mean for h in hosts], percent),
                    ("Memory peak", [h.mem_used_bytes_max for h in hosts], size_bytes),
                    ("Memory total", [h.mem_total_bytes for h in hosts], size_bytes),
                    ("Disk read", [h.disk_read_bytes_per_s for h in hosts], byte_rate),
                    ("Disk write", [h.disk_write_bytes_per_s for h in hosts], byte_rate),
                    ("Net received", [_outside(h)[0] for h in hosts], byte_rate),
                    ("Net sent", [_outside(h)[1] for h in hosts], byte_rate),
                ],
            ),
        ]
        extremes = [
            *(("highest CPU", *_host_row(h)) for h in highest(hosts, lambda h: h.cpu_percent_mean)),
            *(("most memory", *_host_row(h)) for h in highest(hosts, lambda h: h.mem_used_bytes_max)),
            *(("least received", *_host_row(h)) for h in lowest(hosts, lambda h: _outside(h)[0])),
        ]
        if extremes:
            out.append(
                table(f"Hosts at the extremes ({EXTREMES} each)", ("", *_HOST_HEADER), extremes, range(2, 9))
            )
    out.append(Paragraph("Host CPU % is of all the host's cores; network excludes loopback."))
    nics = _nic_table(hosts)
    if nics is not None:
        out.append(nics)
    return out


def _nic_table(hosts: Sequence[HostTelemetry]) -> Table | None:
    if len(hosts) <= PER_ROW_LIMIT:
        rows = [
            (text(h.host), text(nic), byte_rate(v.recv_bytes_per_s), byte_rate(v.sent_bytes_per_s))
            for h in hosts
            for nic, v in h.net_bytes_per_s.items()
        ]
        if not rows:
            return None
        return table(
            "Network interfaces", ("Host", "Interface", "Received", "Sent"), rows, (2, 3), detail=True
        )
    # A row per interface name: 128 hosts x 3 interfaces would be 384 rows saying the same thing.
    by_nic: dict[str, list[Any]] = {}
    for h in hosts:
        for nic, v in h.net_bytes_per_s.items():
            by_nic.setdefault(str(nic), []).append(v)
    if not by_nic:
        return None

    def median_max(values: list[Any]) -> str:
        stats = spread(values)
        return pair(byte_rate(stats[2]), byte_rate(stats[4])) if stats else MISSING

    rows = [
        (
            text(nic),
            f"{len(rates):,}",
            median_max([v.recv_bytes_per_s for v in rates]),
            median_max([v.sent_bytes_per_s for v in rates]),
        )
        for nic, rates in sorted(by_nic.items())
    ]
    return table(
        f"Network interfaces across {plural(len(hosts), 'host')}",
        ("Interface", "Hosts", "Received median / max", "Sent median / max"),
        rows,
        (1, 2, 3),
        detail=True,
    )
