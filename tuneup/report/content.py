"""The report's content as format-neutral blocks: `report_sections(report, plots)`.

The report dict becomes paragraphs, tables, key/value lists, findings and figures, one `Section` per
entry of `artifacts.SECTIONS`, in that order. The HTML and Markdown renderers only serialise blocks, so
the two formats cannot drift apart in what they say, and each format escapes in one place.

Strings inside blocks are plain text, never markup: the renderers escape every one of them.
Section builders read the dict defensively (`_dig`, `_dicts`): a report from an older or newer tuneup,
or one with a field missing, renders with dashes, never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuneup.analyze.analysis import STALL_FACTOR_OF_MEDIAN, STALL_SHARE_OF_STEP
from tuneup.report.artifacts import SECTIONS, PlotFile
from tuneup.report.artifacts import dig as _dig
from tuneup.report.format import (
    MISSING,
    byte_rate,
    count,
    duration,
    energy,
    flop_count,
    fraction_percent,
    is_number,
    kwh,
    large,
    ms,
    number,
    pair,
    parameters,
    percent,
    plural,
    ranks_text,
    sentence,
    share,
    si,
    size_bytes,
    text,
    tflops_rate,
    unix_time,
    usd,
    usd_rate,
    with_unit,
    yes_no,
)


@dataclass(frozen=True, slots=True)
class Paragraph:
    text: str
    quiet: bool = False  # says why something is absent; styled as a note


@dataclass(frozen=True, slots=True)
class Metric:
    label: str
    value: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Metrics:
    """Headline figures, shown large."""

    items: tuple[Metric, ...]


@dataclass(frozen=True, slots=True)
class FindingItem:
    severity: str  # "warning", "info", or whatever a later version writes: renderers whitelist styles
    title: str
    evidence: str


@dataclass(frozen=True, slots=True)
class FindingList:
    items: tuple[FindingItem, ...]
    empty: str = "No findings: nothing in this run crossed a threshold."


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: frozenset[int] = frozenset()  # columns right-aligned
    detail: bool = False  # long reference tables: folded away until asked for
    total: bool = False  # the last row sums up the others


@dataclass(frozen=True, slots=True)
class KeyValues:
    title: str
    pairs: tuple[tuple[str, str], ...]
    detail: bool = False


@dataclass(frozen=True, slots=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Figure:
    plot: PlotFile


Block = Paragraph | Metrics | FindingList | Table | KeyValues | Bullets | Figure


@dataclass(frozen=True, slots=True)
class Section:
    id: str
    title: str
    blocks: tuple[Block, ...] = field(default_factory=tuple)


NOT_MEASURED = {
    "communication": "No collective was timed: the run had one rank, or communication profiling was off.",
    "cost": "No cost figures: this report was made by a tuneup that did not work them out.",
}
_TIMING = {"host": "host clock", "cuda_event": "CUDA events"}
_DATA_TIMING = {"fetch": "timed around each batch fetch", "gap": "inferred from the gap between batches"}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _mapping(value: Any) -> dict[Any, Any]:
    return value if isinstance(value, dict) else {}


# A table with a row per rank, GPU or host folds away beyond this many rows: on a large job it would
# bury the rest of the page, and overrun the size limit of a pull-request comment.
FOLD_ROWS = 16


def _table(
    title: str, header: Sequence[str], rows: Iterable[Sequence[str]], numeric: Iterable[int] = (), **kw: Any
) -> Table:
    body = tuple(tuple(r) for r in rows)
    if len(body) > FOLD_ROWS:
        kw["detail"] = True
    return Table(title, tuple(header), body, frozenset(numeric), **kw)


def _by_value(mapping: dict[Any, Any]) -> str:
    """Per-rank values, one entry per distinct value: {"0": "a", "1": "b", "2": "b"} -> "a (rank 0); b (ranks 1, 2)"."""
    groups: dict[str, list[Any]] = {}
    for key, value in mapping.items():
        groups.setdefault(text(value), []).append(key)
    if len(groups) == 1 and len(mapping) > 1:
        every = "both ranks" if len(mapping) == 2 else f"all {len(mapping):,} ranks"
        return f"{next(iter(groups))} ({every})"
    return "; ".join(f"{value} ({ranks_text(keys)})" for value, keys in groups.items()) or MISSING


def _figures(section_id: str, plots: Sequence[PlotFile]) -> list[Block]:
    return [Figure(p) for p in plots if p.section == section_id]


def _summary(report: dict[str, Any]) -> list[Block]:
    tp = _mapping(report.get("throughput"))
    st = _mapping(report.get("step_time"))
    tokens = tp.get("tokens_per_s")
    blocks: list[Block] = [
        Metrics(
            (
                Metric("Samples/s", number(tp.get("samples_per_s")), "all ranks, steady state"),
                Metric(
                    "Tokens/s",
                    number(tokens),
                    "all ranks, steady state" if is_number(tokens) else "no token count recorded",
                ),
                Metric("Optimizer steps/s", number(tp.get("steps_per_s")), "the slowest rank's"),
                Metric("Median step", ms(st.get("median_ms")), f"p95 {ms(st.get('p95_ms'))}"),
            )
        ),
        Paragraph(_steady_state(report)),
        FindingList(
            tuple(
                FindingItem(text(f.get("severity")), text(f.get("title")), sentence(f.get("evidence")))
                for f in _dicts(report.get("findings"))
            )
        ),
    ]
    warnings = report.get("warnings")
    if isinstance(warnings, list) and warnings:
        blocks.append(
            Paragraph(
                f"{plural(len(warnings), 'warning')} came up while the run was recorded or read: see Warnings."
            )
        )
    return blocks


def _steady_state(report: dict[str, Any]) -> str:
    warm = _mapping(report.get("warmup"))
    steps, recorded = warm.get("steps"), _dig(report, "run", "steps_recorded")
    of = f" of {count(recorded)} recorded" if is_number(recorded) else ""
    if is_number(steps) and steps > 0:
        rule = f" ({text(warm['rule'])})" if warm.get("rule") else ""
        first = "the first step" if steps == 1 else f"the first {count(steps)} steps"
        verb = "is" if steps == 1 else "are"
        return (
            f"Steady state: {first}{of} {verb} left out as warm-up{rule}; "
            "throughput and step times cover the steps after."
        )
    if is_number(steps):
        return f"Steady state: no step was left out as warm-up; figures cover all steps{of}."
    return "Steady state: warm-up was not determined."


def _run(report: dict[str, Any]) -> list[Block]:
    run = _mapping(report.get("run"))
    hw = _mapping(run.get("hardware"))
    params, trainable = run.get("parameters"), run.get("trainable_parameters")
    param_text = parameters(params)
    if is_number(trainable) and trainable != params:
        param_text += f" ({parameters(trainable)} trainable)"
    world, nodes = run.get("world_size"), run.get("num_nodes")
    ranks_line = plural(int(world), "rank") if is_number(world) else MISSING
    if is_number(nodes):
        ranks_line += f" on {plural(int(nodes), 'node')}"
    missing = run.get("missing_ranks")
    if isinstance(missing, list) and missing:
        ranks_line += f"; no record from {ranks_text(missing)}"
    cpu = text(hw.get("cpu_model"))
    if is_number(hw.get("cpu_count")):
        cpu += f", {plural(int(hw['cpu_count']), 'logical CPU')}"
    if is_number(hw.get("ram_total_bytes")):
        cpu += f", {size_bytes(hw['ram_total_bytes'])} RAM"
    gpu_names = hw.get("gpu_names")
    gpus = text(gpu_names) if gpu_names else "none visible to NVML"
    if is_number(hw.get("gpus_per_node")) and hw["gpus_per_node"]:
        gpus += f" ({text(hw['gpus_per_node'])} per node"
        gpus += f", driver {text(hw['driver_version'])})" if hw.get("driver_version") else ")"
    batch, accumulate, global_batch = (
        run.get("batch_size_per_rank"),
        run.get("accumulate_grad_batches"),
        run.get("global_batch_size"),
    )
    steps = count(run.get("steps_recorded"))
    if run.get("last_step") is not None:
        steps += f" (last step {text(run.get('last_step'))})"
    timing = [_TIMING.get(str(t), text(t)) for t in run.get("timing") or []]
    data_timing = [_DATA_TIMING.get(str(t), text(t)) for t in run.get("data_timing") or []]
    pairs = (
        ("Run id", text(run.get("run_id"))),
        ("Run directory", text(run.get("path"))),
        ("Model", text(run.get("model_class"))),
        ("Parameters", param_text),
        ("World size", ranks_line),
        ("Hosts", _by_value(_mapping(run.get("hosts")))),
        ("Strategy", text(run.get("strategy"))),
        ("Precision", text(run.get("precision"))),
        ("Accelerator", text(run.get("accelerator"))),
        ("Trainer package", text(run.get("namespace"))),
        ("Batch size per rank", text(batch)),
        ("Gradient accumulation", _accumulation(accumulate)),
        (
            "Global batch",
            f"{count(global_batch)} samples per optimizer step" if is_number(global_batch) else MISSING,
        ),
        ("CPU", cpu),
        ("GPUs", gpus),
        ("Started", unix_time(run.get("start_unix"))),
        ("Duration", duration(run.get("duration_s"))),
        ("Steps recorded", steps),
        ("Status", _by_value(_mapping(run.get("status")))),
        ("Step timing", text(timing) if timing else MISSING),
        ("Data wait timing", text(data_timing) if data_timing else MISSING),
    )
    return [KeyValues("", pairs)]


def _accumulation(value: Any) -> str:
    if value == 1:
        return "none (1 micro-batch per optimizer step)"
    return f"{text(value)} micro-batches per optimizer step" if is_number(value) else text(value)


def _throughput(report: dict[str, Any]) -> list[Block]:
    tp = _mapping(report.get("throughput"))
    per_rank = _dicts(tp.get("per_rank"))
    if not per_rank:
        return [Paragraph("No steady-state steps were recorded, so there is no throughput to show.", True)]

    def row(label: str, r: dict[str, Any]) -> tuple[str, ...]:
        return (
            label,
            number(r.get("samples_per_s")),
            number(r.get("tokens_per_s")),
            number(r.get("steps_per_s")),
        )

    rows = [row(text(r.get("rank")), r) for r in per_rank] + [row("All ranks", tp)]
    return [
        _table(
            "Steady-state rates per rank",
            ("Rank", "Samples/s", "Tokens/s", "Optimizer steps/s"),
            rows,
            (1, 2, 3),
            total=True,
        ),
        Paragraph(
            "Steady state, warm-up left out. For all ranks, samples and tokens add up; optimizer steps/s "
            "is the slowest rank's, since ranks step together."
        ),
    ]


def _phases(value: Any) -> list[str]:
    return [str(k) for k in _mapping(value)]


def _step_time(report: dict[str, Any], plots: Sequence[PlotFile]) -> list[Block]:
    st = _mapping(report.get("step_time"))
    phases = _mapping(st.get("phases"))
    blocks: list[Block] = []
    if not phases:
        blocks.append(Paragraph("No steady-state steps were recorded, so step time cannot be split.", True))
    else:
        blocks.append(
            Paragraph(
                f"Over all ranks' steady-state steps: median {ms(st.get('median_ms'))}, "
                f"mean {ms(st.get('mean_ms'))}, p95 {ms(st.get('p95_ms'))}."
            )
        )
        rows = [(name, ms(_dig(p, "ms")), share(_dig(p, "share"))) for name, p in phases.items()]
        rows.append(
            ("whole step", ms(st.get("mean_ms")), share(1.0) if is_number(st.get("mean_ms")) else MISSING)
        )
        blocks.append(
            _table("All ranks: mean per step", ("Phase", "Time", "Share of step"), rows, (1, 2), total=True)
        )
    per_rank = _dicts(st.get("per_rank"))
    if len(per_rank) > 1:
        names = list(dict.fromkeys(n for r in per_rank for n in _phases(r.get("phase_mean_ms"))))
        rows = []
        for r in per_rank:
            means = _mapping(r.get("phase_mean_ms"))
            values = [means.get(n) for n in names]
            total = sum(values) if values and all(is_number(v) for v in values) else None
            rows.append((text(r.get("rank")), *(ms(v) for v in values), ms(total)))
        blocks.append(
            _table(
                "Per rank: mean per step",
                ("Rank", *names, "whole step"),
                rows,
                range(1, len(names) + 2),
            )
        )
    return blocks + _figures("step-time", plots)


def _timeseries(report: dict[str, Any], plots: Sequence[PlotFile]) -> list[Block]:
    ts = _mapping(report.get("timeseries"))
    blocks: list[Block] = []
    loss = _mapping(ts.get("loss"))
    steps, values = loss.get("step"), loss.get("values")
    if isinstance(steps, list) and isinstance(values, list) and steps and len(steps) == len(values):
        blocks.append(
            Paragraph(
                f"Loss went from {number(values[0])} at step {text(steps[0])} "
                f"to {number(values[-1])} at step {text(steps[-1])}."
            )
        )
    figures = _figures("timeseries", plots)
    if not figures:
        return [*blocks, Paragraph("No plots were drawn for this section.", True)]
    source = ts.get("source")
    if source == "steps":
        blocks.append(Paragraph("The curves show every recorded step, warm-up included."))
    elif source == "windows":
        blocks.append(
            Paragraph(
                "The run was longer than the per-step record keeps, so the curves show one point per "
                "window of steps (the window's mean)."
            )
        )
    return blocks + figures


def _gpu_names(report: dict[str, Any]) -> dict[str, str]:
    """GPU names by PCI bus id, from the manifest's NVML inventory (telemetry entries carry no name)."""
    inventory = _dicts(_dig(report, "environment", "gpus", "gpus"))
    return {str(g["pci_bus_id"]): text(g.get("name")) for g in inventory if g.get("pci_bus_id")}


def _gpu_table(report: dict[str, Any], gpus: list[dict[str, Any]]) -> Table:
    by_bus = _gpu_names(report)
    names = [by_bus.get(str(g.get("bus_id")), MISSING) for g in gpus]
    # Columns that would repeat one value down every row move into the title, keeping the table narrow.
    multi_host = len({text(g.get("host")) for g in gpus}) > 1
    multi_name = len(set(names)) > 1
    header = ["GPU"] + ["Host"] * multi_host + ["Name"] * multi_name
    rows = []
    for g, name in zip(gpus, names, strict=True):
        throttle = g.get("throttle_reasons")
        rows.append(
            (
                text(g.get("index")) + (" (lost)" if g.get("lost") is True else ""),
                *[text(g.get("host"))] * multi_host,
                *[name] * multi_name,
                pair(percent(g.get("util_percent_mean"), 0), percent(g.get("util_percent_max"), 0)),
                pair(size_bytes(g.get("mem_used_bytes_max")), size_bytes(g.get("mem_total_bytes"))),
                pair(with_unit(g.get("power_w_mean"), "W", 0), with_unit(g.get("power_w_max"), "W", 0)),
                energy(g.get("energy_j")),
                with_unit(g.get("temp_c_max"), "°C", 0),
                with_unit(g.get("sm_clock_mhz_mean"), "MHz", 0),
                text(throttle) if throttle else "none",
            )
        )
    first = len(header)
    header += [
        "Util mean / max",
        "Memory peak / total",
        "Power mean / max",
        "Energy",
        "Temp max",
        "SM clock",
    ]
    header.append("Throttle reasons")
    title = "GPUs" if multi_name or names[0] == MISSING else f"GPUs: {names[0]}"
    if not multi_host and gpus[0].get("host"):
        title += f" on {text(gpus[0].get('host'))}"
    return _table(title, header, rows, range(first, first + 6))


def _hardware(report: dict[str, Any], plots: Sequence[PlotFile]) -> list[Block]:
    tel = _mapping(report.get("telemetry"))
    blocks: list[Block] = []
    if is_number(tel.get("samples")):
        blocks.append(Paragraph(f"From {plural(int(tel['samples']), 'telemetry sample')}."))
    gpus = _dicts(tel.get("gpus"))
    if gpus:
        blocks.append(_gpu_table(report, gpus))
    elif _dig(report, "run", "hardware", "gpu_names"):
        blocks.append(Paragraph("No GPU telemetry: the run's GPUs were not sampled through NVML.", True))
    else:
        blocks.append(Paragraph("No GPU telemetry: the run had no NVML-visible GPU.", True))

    processes = _dicts(tel.get("processes"))
    if processes:
        rows = [
            (text(p.get("rank")), percent(p.get("cpu_percent_mean")), size_bytes(p.get("rss_bytes_max")))
            for p in processes
        ]
        blocks.append(
            _table(
                "Training processes (each rank with its children)",
                ("Rank", "CPU mean", "Peak RSS"),
                rows,
                (1, 2),
            )
        )
        blocks.append(Paragraph("CPU % counts one fully busy core as 100%."))
    else:
        blocks.append(Paragraph("No process telemetry was recorded.", True))

    hosts = _dicts(tel.get("hosts"))
    if hosts:
        rows, nic_rows = [], []
        for h in hosts:
            nics = _mapping(h.get("net_bytes_per_s"))
            # Loopback carries the ranks' own traffic on one host; the host's network is everything else.
            outside = [v for k, v in nics.items() if not str(k).startswith("lo") and isinstance(v, dict)]
            recv = [v.get("recv_bytes_per_s") for v in outside]
            sent = [v.get("sent_bytes_per_s") for v in outside]
            rows.append(
                (
                    text(h.get("host")),
                    percent(h.get("cpu_percent_mean")),
                    size_bytes(h.get("mem_used_bytes_max")),
                    size_bytes(h.get("mem_total_bytes")),
                    byte_rate(h.get("disk_read_bytes_per_s")),
                    byte_rate(h.get("disk_write_bytes_per_s")),
                    byte_rate(sum(recv)) if recv and all(is_number(v) for v in recv) else MISSING,
                    byte_rate(sum(sent)) if sent and all(is_number(v) for v in sent) else MISSING,
                )
            )
            for nic, v in nics.items():
                v = _mapping(v)
                nic_rows.append(
                    (
                        text(h.get("host")),
                        text(nic),
                        byte_rate(v.get("recv_bytes_per_s")),
                        byte_rate(v.get("sent_bytes_per_s")),
                    )
                )
        header = (
            "Host",
            "CPU mean",
            "Memory peak",
            "Memory total",
            "Disk read",
            "Disk write",
            "Net received",
            "Net sent",
        )
        blocks.append(_table("Hosts", header, rows, range(1, 8)))
        blocks.append(Paragraph("Host CPU % is of all the host's cores; network excludes loopback."))
        if nic_rows:
            blocks.append(
                _table(
                    "Network interfaces",
                    ("Host", "Interface", "Received", "Sent"),
                    nic_rows,
                    (2, 3),
                    detail=True,
                )
            )
    else:
        blocks.append(Paragraph("No host telemetry was recorded.", True))
    return blocks + _figures("hardware", plots)


def _ranks(report: dict[str, Any], plots: Sequence[PlotFile]) -> list[Block]:
    per_rank = _dicts(_dig(report, "step_time", "per_rank"))
    hosts = _mapping(_dig(report, "run", "hosts"))
    blocks: list[Block] = []
    if per_rank:
        names = list(dict.fromkeys(n for r in per_rank for n in _phases(r.get("phase_median_ms"))))
        rows = [
            (
                text(r.get("rank")),
                text(hosts.get(str(r.get("rank")))),
                count(r.get("steps")),
                ms(r.get("median_ms")),
                ms(r.get("p95_ms")),
                *(ms(_mapping(r.get("phase_median_ms")).get(n)) for n in names),
            )
            for r in per_rank
        ]
        header = ("Rank", "Host", "Steps", "Median step", "p95 step", *names)
        blocks.append(
            _table(
                "Steady-state steps per rank; phase columns are medians",
                header,
                rows,
                range(2, 5 + len(names)),
            )
        )
    straggler = _dig(report, "ranks", "straggler")
    if isinstance(straggler, dict):
        blocks.append(
            FindingList(
                (
                    FindingItem(
                        "warning",
                        f"Straggler: rank {text(straggler.get('rank'))}, in {text(straggler.get('phase'))}",
                        sentence(straggler.get("summary")),
                    ),
                )
            )
        )
    elif len(per_rank) > 1:
        blocks.append(
            Paragraph("No straggler: no rank's own work is slower than the others' by a share that matters.")
        )
    else:
        blocks.append(
            Paragraph("Only one rank recorded steady-state steps: there is nothing to compare.", True)
        )
    return blocks + _figures("ranks", plots)


def _data_loader(report: dict[str, Any]) -> list[Block]:
    dl = _mapping(report.get("data_loader"))
    if not dl:
        return [Paragraph("The report holds no data-loader figures.", True)]
    stall_total = dl.get("stall_total_ms")
    stalls = f"{count(dl.get('stall_count'))}"
    if is_number(dl.get("stall_count")) and dl["stall_count"]:
        stalls += f", {ms(stall_total)} in all"
    pairs = (
        ("Median data wait per step", ms(dl.get("median_data_ms"))),
        (
            "Stall threshold",
            f"{ms(dl.get('stall_threshold_ms'))} (the larger of {number(STALL_FACTOR_OF_MEDIAN, 0)}× the "
            f"median data wait and {STALL_SHARE_OF_STEP:.0%} of the median step)",
        ),
        ("Stalls", stalls),
        ("Batch size", text(dl.get("batch_size"))),
        ("num_workers", text(dl.get("num_workers"))),
        ("pin_memory", text(dl.get("pin_memory"))),
        ("persistent_workers", text(dl.get("persistent_workers"))),
    )
    blocks: list[Block] = [KeyValues("", pairs)]
    worst = _dicts(dl.get("worst_stalls"))
    if worst:
        rows = [
            (text(s.get("rank")), text(s.get("step")), ms(s.get("data_ms")), ms(s.get("wall_ms")))
            for s in worst
        ]
        blocks.append(_table("Worst stalls", ("Rank", "Step", "Data wait", "Step time"), rows, (2, 3)))
    return blocks


def _communication(report: dict[str, Any], plots: Sequence[PlotFile]) -> list[Block]:
    comm = report.get("communication")
    if not isinstance(comm, dict):
        return [Paragraph(NOT_MEASURED["communication"], True)]
    blocks: list[Block] = [
        KeyValues(
            "",
            (
                ("Backend", text(comm.get("backend"))),
                ("Ranks", f"{text(comm.get('world_size'))} ({text(comm.get('ranks_per_node'))} per node)"),
                (
                    "Collectives per step",
                    ms(comm.get("comm_ms_per_step")) + f" ({share(comm.get('share_of_step'))} of the step)",
                ),
                (
                    "Waited for (exposed)",
                    ms(comm.get("exposed_ms_per_step"))
                    + f" ({share(comm.get('exposed_share_of_step'))} of the step)",
                ),
                ("Hidden behind backward", ms(comm.get("overlapped_ms_per_step"))),
            ),
        ),
        Paragraph(
            "Exposed time is what the step still waited for after its last gradient bucket was handed over, "
            "that is, after backward compute ended; the rest overlapped with backward."
        ),
    ]
    ranks = _dicts(comm.get("per_rank"))
    if ranks:
        blocks.append(
            _table(
                "Per rank, mean per step",
                ("Rank", "Collectives", "Exposed", "Bytes", "Collectives/step"),
                (
                    (
                        text(r.get("rank")),
                        ms(r.get("comm_ms")),
                        ms(r.get("exposed_ms")),
                        size_bytes(r.get("bytes_per_step")),
                        number(r.get("collectives_per_step")),
                    )
                    for r in ranks
                ),
                numeric=(1, 2, 3, 4),
            )
        )
    late = comm.get("late_rank")
    if isinstance(late, dict):
        blocks.append(Paragraph(sentence(late.get("summary"))))
    buckets = _dicts(comm.get("per_bucket"))
    if buckets:
        blocks.append(
            _table(
                "DDP gradient buckets (first rank)",
                ("Bucket", "Collective", "Size", "Dtype", "Median time", "Count"),
                (
                    (
                        text(b.get("bucket")),
                        text(b.get("kind")),
                        size_bytes(b.get("bytes")),
                        text(b.get("dtype")),
                        ms(b.get("median_ms")),
                        count(b.get("count")),
                    )
                    for b in buckets
                ),
                numeric=(2, 4, 5),
            )
        )
    sizes = _dicts(comm.get("by_size"))
    if sizes:
        blocks.append(
            _table(
                "Bandwidth by collective and size (nccl-tests convention, median time)",
                ("Collective", "Size", "Count", "Time", "algbw", "busbw"),
                (
                    (
                        text(r.get("kind")),
                        size_bytes(r.get("bytes")),
                        count(r.get("count")),
                        with_unit(r.get("median_us"), "µs"),
                        with_unit(r.get("algbw_gbytes_per_s"), "GB/s"),
                        with_unit(r.get("busbw_gbytes_per_s"), "GB/s"),
                    )
                    for r in sizes
                ),
                numeric=(1, 2, 3, 4, 5),
            )
        )
    fits = _dicts(comm.get("fits"))
    if fits:
        blocks.append(
            _table(
                "Latency-bandwidth fit (ring model)",
                ("Collective", "α (latency)", "β", "Bus bandwidth", "R²", "Sizes"),
                (
                    (
                        text(f.get("kind")),
                        with_unit(f.get("alpha_us"), "µs"),
                        with_unit(f.get("beta_ns_per_byte"), "ns/B"),
                        with_unit(f.get("busbw_gbytes_per_s"), "GB/s"),
                        number(f.get("r_squared")),
                        count(f.get("sizes")),
                    )
                    for f in fits
                ),
                numeric=(1, 2, 3, 4, 5),
            )
        )
    else:
        blocks.append(
            Paragraph(
                "No latency-bandwidth fit: the run's collectives came in fewer than two sizes. The tuneup probe-network command measures a range of sizes.",
                True,
            )
        )
    link = comm.get("link")
    if isinstance(link, dict):
        blocks.append(
            Paragraph(
                f"Link compared with: {text(link.get('name'))} ({text(link.get('reason'))}). {sentence(link.get('summary'))}"
            )
        )
    ddp = comm.get("ddp_logging")
    if isinstance(ddp, dict) and ddp:
        blocks.append(
            KeyValues(
                "Cross-check: DDP's own sampled averages",
                tuple((k.removesuffix("_ms").replace("_", " "), ms(v)) for k, v in ddp.items()),
            )
        )
    blocks.extend(_figures("communication", plots))
    return blocks


# ---------------------------------------------------------------------------------------------------
# Cost: what the job costs, what it buys, what it would take to finish, and how well it uses the GPUs.

_ENERGY_SOURCE = {
    "counter": "the GPUs' energy counters",
    "power samples": "power samples, integrated over time",
    "counter and power samples": "energy counters, and power samples where a GPU had no counter",
}
_NO_TOKENS = "no token count recorded"


def _stop(value: object) -> str:
    """Recorded text ended with a full stop, its case kept (a catalog key starts in lower case)."""
    out = text(value).strip()
    return out if out == MISSING or out.endswith((".", "!", "?")) else out + "."


def _or_why(value: str, why: str) -> str:
    """A formatted figure, or a dash that says why there is none."""
    return f"{MISSING} ({why})" if value == MISSING else value


def _cost(report: dict[str, Any]) -> list[Block]:
    cost = report.get("cost")
    if not isinstance(cost, dict):
        return [Paragraph(NOT_MEASURED["cost"], True)]
    price = cost.get("price")
    blocks: list[Block] = []
    if isinstance(price, dict):
        blocks.extend(_cost_headline(report, cost, price))
        blocks.extend(_price_cautions(price))
        blocks.append(_money_table(cost, price))
        blocks.extend(_money_notes(report, cost))
    else:
        reason = cost.get("not_priced_reason")
        blocks.append(
            Paragraph(
                f"Not priced: {text(reason)}." if reason else "Not priced: the run recorded no price.", True
            )
        )
    blocks.append(Paragraph(_epoch_line(cost), not is_number(cost.get("steps_per_epoch"))))
    blocks.extend(_projections(report, cost, priced=isinstance(price, dict)))
    blocks.extend(_compute(_mapping(cost.get("flops"))))
    blocks.extend(_energy(_mapping(cost.get("energy"))))
    if isinstance(price, dict) and isinstance(price.get("instance"), dict):
        blocks.append(_instance(price["instance"], price.get("catalog_version")))
    return blocks


def _cost_headline(report: dict[str, Any], cost: dict[str, Any], price: dict[str, Any]) -> list[Block]:
    figures = _mapping(cost.get("figures"))
    flops = _mapping(cost.get("flops"))
    kind = (
        "spot"
        if price.get("spot") is True
        else "on-demand"
        if isinstance(price.get("instance"), dict)
        else ""
    )
    devices = price.get("devices")
    priced_for = plural(int(devices), "device") if is_number(devices) else ""
    detail = ", ".join(p for p in (kind, priced_for, text(price.get("source"))) if p and p != MISSING)
    per_token = figures.get("usd_per_million_tokens")
    if is_number(per_token) or not is_number(figures.get("samples_per_usd")):
        yield_card = Metric(
            "Per 1M tokens",
            usd(per_token),
            "steady state" if is_number(per_token) else _NO_TOKENS,
        )
    else:
        yield_card = Metric("Samples per $", large(figures["samples_per_usd"]), "steady state")
    mfu = flops.get("mfu")
    if is_number(mfu):
        mfu_detail = f"of the dense {text(flops.get('peak_precision'))} peak"
    elif flops.get("source") is None:
        mfu_detail = "FLOPs were not counted"
    else:
        mfu_detail = "not defined: see Compute below"
    return [
        Metrics(
            (
                Metric("Job price", usd_rate(price.get("usd_per_hour"), "h"), detail),
                yield_card,
                Metric(
                    "Spent so far",
                    usd(figures.get("usd_so_far")),
                    f"the recorded {duration(_dig(report, 'run', 'duration_s'))}",
                ),
                Metric("MFU", fraction_percent(mfu), mfu_detail),
            )
        ),
        Paragraph(
            f"Priced at {usd_rate(price.get('usd_per_hour'), 'h')} for the job: {_stop(price.get('basis'))}"
        ),
    ]


def _price_cautions(price: dict[str, Any]) -> list[Block]:
    """The price's doubts, shown where they cannot be missed, and how old the price is."""
    blocks: list[Block] = []
    doubts = [d for d in price.get("doubts") or [] if d] if isinstance(price.get("doubts"), list) else []
    if doubts:
        blocks.append(
            FindingList(tuple(FindingItem("warning", "Check this price", sentence(d)) for d in doubts))
        )
    instance = price.get("instance")
    if isinstance(instance, dict):
        origin = instance.get("origin")
        where = (
            f"tuneup's packaged price catalog, version {text(price.get('catalog_version'))}"
            if origin in (None, "packaged")
            else f"the user's catalog {text(origin)}"
        )
        as_of_date = instance.get("as_of_date")
        when = (
            f"dated {text(as_of_date)}"
            if as_of_date
            else f"undated (the source says only: {text(instance.get('as_of'))})"
        )
        blocks.append(
            Paragraph(f"Price from {where}; the price is {when}. Source: {_stop(instance.get('source'))}")
        )
    return blocks


def _money_table(cost: dict[str, Any], price: dict[str, Any]) -> Table:
    figures = _mapping(cost.get("figures"))
    spot = cost.get("figures_spot")
    columns = [figures]
    if price.get("spot") is True:
        header = ["Figure", "Spot"]
    elif isinstance(spot, dict):
        header = ["Figure", "On-demand", "Spot"]
        columns.append(spot)
    else:
        header = ["Figure", "At this price"]
    rows = (
        ("Job price", "usd_per_hour", lambda v: usd_rate(v, "h")),
        ("Spent so far (the whole recorded run)", "usd_so_far", usd),
        ("Per epoch", "usd_per_epoch", usd),
        ("Per 1M tokens", "usd_per_million_tokens", usd),
        ("Tokens per $", "tokens_per_usd", large),
        ("Samples per $", "samples_per_usd", large),
    )
    return _table(
        "What the money buys",
        header,
        ((label, *(show(c.get(key)) for c in columns)) for label, key, show in rows),
        range(1, len(header)),
    )


def _money_notes(report: dict[str, Any], cost: dict[str, Any]) -> list[Block]:
    figures = _mapping(cost.get("figures"))
    why = []
    if not is_number(figures.get("usd_per_epoch")):
        why.append(f"per epoch needs the epoch's length ({text(cost.get('steps_per_epoch_basis'))})")
    if not is_number(figures.get("tokens_per_usd")):
        why.append("token figures need a token count, and the run recorded none")
    if not is_number(figures.get("samples_per_usd")):
        why.append("samples per $ needs a steady-state sample rate")
    if not is_number(figures.get("usd_so_far")):
        why.append("spent so far needs the run's duration")
    rates = (
        "Rates are the steady state's (warm-up left out); spent so far is the recorded run's whole duration."
    )
    blocks: list[Block] = [Paragraph(rates)]
    if why:
        blocks.append(Paragraph(f"A dash is a figure that could not be worked out: {'; '.join(why)}.", True))
    return blocks


def _epoch_line(cost: dict[str, Any]) -> str:
    steps, basis = cost.get("steps_per_epoch"), text(cost.get("steps_per_epoch_basis"))
    if not is_number(steps):
        return f"Epoch length unknown: {basis}."
    line = f"One epoch is {count(steps)} optimizer steps ({basis})"
    if is_number(cost.get("epoch_s")):
        line += f", {duration(cost['epoch_s'])} at the steady-state rate"
    return line + "."


def _projections(report: dict[str, Any], cost: dict[str, Any], *, priced: bool) -> list[Block]:
    targets = _dicts(cost.get("projections"))
    if not targets:
        return [
            Paragraph(
                "No projection: the trainer had neither max_steps nor max_epochs, and no target in steps or "
                "tokens was given.",
                True,
            )
        ]
    spot = (
        priced and cost.get("figures_spot") is not None and any(is_number(t.get("usd_spot")) for t in targets)
    )
    header = ["Target", "Total steps", "Steps to go", "Time to go"]
    header += ["Cost to go"] * priced + ["At spot"] * spot
    rows = []
    for t in targets:
        remaining = t.get("steps_remaining")
        rows.append(
            (
                text(t.get("target")),
                count(t.get("total_steps")),
                "none (reached)" if remaining == 0 else count(remaining),
                "0 s" if remaining == 0 and t.get("time_s") == 0 else duration(t.get("time_s")),
                *[usd(t.get("usd"))] * priced,
                *[usd(t.get("usd_spot"))] * spot,
            )
        )
    steps_per_s = _dig(report, "throughput", "steps_per_s")
    rate = f" ({number(steps_per_s)} optimizer steps/s)" if is_number(steps_per_s) else ""
    blocks: list[Block] = [
        _table(
            "Time and cost to reach a target" if priced else "Time to reach a target",
            header,
            rows,
            range(1, len(header)),
        ),
        Paragraph(f"From the last recorded step, at this run's steady-state rate{rate}."),
    ]
    if any(not is_number(t.get("total_steps")) for t in targets):
        blocks.append(
            Paragraph(
                "A dash: the run did not record what that target needs (the epoch's length for max_epochs, a "
                "token count for a target in tokens).",
                True,
            )
        )
    if not priced:
        blocks.append(Paragraph("Costs to go appear once the run is priced (see above).", True))
    return blocks


def _compute(flops: dict[str, Any]) -> list[Block]:
    note = flops.get("note")
    if flops.get("source") is None:
        return [Paragraph(f"Compute: {text(note) if note else 'FLOPs were not counted'}.", True)]
    mfu = flops.get("mfu")
    pairs = [
        ("FLOPs from", text(flops.get("source"))),
        ("Per optimizer step", _or_why(flop_count(flops.get("flops_per_step")), "not counted per step")),
        ("Per sample", flop_count(flops.get("flops_per_sample"))),
        ("Achieved, all devices", tflops_rate(flops.get("achieved_tflops_per_s"))),
        ("Achieved per device", tflops_rate(flops.get("achieved_tflops_per_s_per_device"))),
    ]
    if "gpu" in flops:
        pairs.append(("GPU in the catalog", text(flops.get("gpu"))))
    if "peak_precision" in flops:
        peak = tflops_rate(flops.get("peak_tflops_per_device"))
        column = text(flops.get("peak_precision"))
        pairs.append(
            (
                "Peak per device",
                f"{peak} (dense {column})" if peak != MISSING else f"{MISSING} (no dense {column} peak)",
            )
        )
    pairs.append(
        (
            "MFU (model FLOPs utilization)",
            _or_why(fraction_percent(mfu), "not defined; see below" if note else "not worked out"),
        )
    )
    blocks: list[Block] = [KeyValues("Compute", tuple(pairs))]
    if note:
        blocks.append(Paragraph(sentence(note), not is_number(mfu)))
    if flops.get("gpu_doubt"):
        blocks.append(
            FindingList((FindingItem("warning", "Check this peak", sentence(flops.get("gpu_doubt"))),))
        )
    return blocks


def _energy(energy: dict[str, Any]) -> list[Block]:
    note = energy.get("note")
    if energy.get("source") is None:
        return [Paragraph(f"Energy: {text(note) if note else 'not recorded'}.", True)]
    source = energy.get("source")
    electricity = energy.get("electricity_usd_per_kwh")
    no_price = "no electricity price given"
    pairs = (
        ("Measured from", _ENERGY_SOURCE.get(str(source), text(source))),
        ("GPUs", count(energy.get("gpus"))),
        ("Measured span", duration(energy.get("span_s"))),
        ("Energy over the span", kwh(energy.get("energy_kwh"))),
        ("Mean power, all GPUs", with_unit(energy.get("mean_power_w"), "W", 0)),
        ("Per optimizer step", _si_or_dash(energy.get("j_per_step"), "J")),
        ("Per 1M tokens", _or_why(kwh(energy.get("kwh_per_million_tokens")), _NO_TOKENS)),
        ("Electricity price", usd_rate(electricity, "kWh") if is_number(electricity) else "not given"),
        (
            "Electricity over the span",
            _or_why(
                usd(energy.get("electricity_usd")),
                no_price if not is_number(electricity) else "not worked out",
            ),
        ),
        (
            "Electricity per 1M tokens",
            _or_why(
                usd(energy.get("electricity_usd_per_million_tokens")),
                no_price if not is_number(electricity) else _NO_TOKENS,
            ),
        ),
    )
    blocks: list[Block] = [KeyValues("Energy", pairs)]
    if note:
        blocks.append(Paragraph(sentence(note)))
    return blocks


def _si_or_dash(value: Any, unit: str) -> str:
    return si(value, unit) if is_number(value) else text(value)


def _instance(instance: dict[str, Any], catalog_version: Any) -> KeyValues:
    gpus = f"{text(instance.get('gpu_count'))} × {text(instance.get('gpu'))}"
    if is_number(instance.get("gpu_mem_gib")):
        gpus += f", {number(instance['gpu_mem_gib'])} GiB each"
    spot = instance.get("spot_usd_per_hour")
    origin = instance.get("origin")
    pairs = (
        ("Provider", text(instance.get("provider"))),
        ("Instance", text(instance.get("instance"))),
        ("Region", text(instance.get("region")) if instance.get("region") else "any region"),
        ("GPUs", gpus),
        ("vCPUs", count(instance.get("vcpus"))),
        ("Host memory", with_unit(instance.get("mem_gib"), "GiB")),
        ("On-demand", usd_rate(instance.get("on_demand_usd_per_hour"), "h")),
        ("Spot", usd_rate(spot, "h") if is_number(spot) else "no spot quote"),
        ("Host included in the price", yes_no(instance.get("host_included"))),
        ("GPU link", text(instance.get("intra_node_link"))),
        ("Network between nodes (Gbit/s)", text(instance.get("inter_node_gbps"))),
        ("Price source", text(instance.get("source"))),
        ("As of", text(instance.get("as_of"))),
        (
            "Catalog",
            "packaged, version " + text(catalog_version) if origin in (None, "packaged") else text(origin),
        ),
    )
    return KeyValues(f"Instance: {text(instance.get('key'))}", pairs, detail=True)


def by_name(key: object, value: object) -> str:
    """A value shown by what its name says it is: the report's names end in their unit."""
    name = str(key)
    if name.endswith("_bytes"):
        return size_bytes(value)
    if name.endswith("_bytes_per_s"):
        return byte_rate(value)
    if name.endswith("_unix"):
        return unix_time(value)
    if name.endswith("_ms"):
        return ms(value)
    if name.endswith("_s"):
        return duration(value)
    return text(value)


def _kv(title: str, value: Any, detail: bool = False) -> KeyValues | Paragraph:
    mapping = _mapping(value)
    if not mapping:
        return Paragraph(f"{title}: not recorded.", True)
    return KeyValues(title, tuple((str(k), by_name(k, v)) for k, v in mapping.items()), detail)


def _environment(report: dict[str, Any]) -> list[Block]:
    env = _mapping(report.get("environment"))
    blocks: list[Block] = [_kv("Versions", env.get("versions"))]
    git = env.get("git")
    if isinstance(git, dict):
        blocks.append(
            KeyValues(
                "Git",
                (
                    ("Commit", text(git.get("commit"))),
                    ("Branch", text(git.get("branch"))),
                    ("Uncommitted changes", yes_no(git.get("dirty"))),
                    ("Remote", text(git.get("remote"))),
                ),
            )
        )
    else:
        blocks.append(Paragraph("Git: the training script was not in a git checkout.", True))
    blocks.append(_kv("Seeds", env.get("seeds")))
    blocks.append(_kv("Host", env.get("host")))
    inventory = _dicts(_dig(env, "gpus", "gpus"))
    if inventory:
        rows = [
            (
                text(g.get("index")),
                text(g.get("name")),
                text(g.get("pci_bus_id")),
                size_bytes(g.get("memory_total_bytes")),
            )
            for g in inventory
        ]
        gpus = _mapping(env.get("gpus"))
        title = f"GPUs (driver {text(gpus.get('driver_version'))}, CUDA driver {text(gpus.get('cuda_driver_version'))})"
        blocks.append(_table(title, ("Index", "Name", "PCI bus id", "Memory"), rows, (3,)))
    variables = _mapping(env.get("env"))
    if variables:
        rows = [(str(k), text(v)) for k, v in sorted(variables.items(), key=lambda kv: str(kv[0]))]
        blocks.append(
            _table(
                "Environment variables (allow-listed, secrets redacted)",
                ("Variable", "Value"),
                rows,
                detail=True,
            )
        )
    else:
        blocks.append(Paragraph("Environment variables: none captured.", True))
    blocks.append(_kv("Trainer configuration", env.get("trainer"), detail=True))
    blocks.append(_kv("Data loader configuration", env.get("dataloader"), detail=True))
    return blocks


def _warnings(report: dict[str, Any]) -> list[Block]:
    warnings = report.get("warnings")
    if isinstance(warnings, list) and warnings:
        return [Bullets(tuple(text(w) for w in warnings))]
    return [Paragraph("No warnings were recorded.", True)]


def report_sections(report: dict[str, Any], plots: Sequence[PlotFile]) -> list[Section]:
    """The report as blocks, one section per `artifacts.SECTIONS` entry, in page order."""
    from tuneup.report.interruptions import interruptions_blocks  # it builds on this module's blocks

    report = _mapping(report)
    built: dict[str, list[Block]] = {
        "summary": _summary(report),
        "run": _run(report),
        "throughput": _throughput(report),
        "step-time": _step_time(report, plots),
        "timeseries": _timeseries(report, plots),
        "hardware": _hardware(report, plots),
        "ranks": _ranks(report, plots),
        "data-loader": _data_loader(report),
        "communication": _communication(report, plots),
        "cost": _cost(report),
        "interruptions": interruptions_blocks(report),
        "environment": _environment(report),
        "warnings": _warnings(report),
    }
    # A section added to SECTIONS before it has a builder still appears, with its plots.
    return [
        Section(
            sid,
            title,
            tuple(built.get(sid) or _figures(sid, plots) or [Paragraph("Nothing to show yet.", True)]),
        )
        for sid, title in SECTIONS
    ]


def page_title(report: dict[str, Any]) -> str:
    return f"tuneup report: {text(_dig(report, 'run', 'run_id'))}"


def page_subtitle(report: dict[str, Any]) -> str:
    """One line under the page title: which run, which model, when."""
    run = _mapping(_mapping(report).get("run"))
    parts = [
        f"Run {text(run.get('run_id'))}",
        text(run.get("model_class")),
        f"{plural(run['world_size'], 'rank')}" if is_number(run.get("world_size")) else MISSING,
        text(run.get("strategy")),
        f"started {unix_time(run.get('start_unix'))}",
    ]
    return " · ".join(parts)


def generated_line(report: dict[str, Any]) -> str:
    report = _mapping(report)
    return (
        f"Generated {unix_time(report.get('generated_unix'))} by tuneup {text(report.get('tuneup_version'))}, "
        f"report schema {text(report.get('report_schema_version'))}."
    )
