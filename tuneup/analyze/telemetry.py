"""Telemetry over the run: per GPU, per rank's process tree, and per host, as figures and time series.

Counters recorded cumulatively (energy, disk and network bytes) become rates here: the difference
between the first and last sample over the time between them, so a dropped sample loses nothing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from tuneup.record.schema import Run


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(slots=True)
class Series:
    """A time series: seconds since the run started, and values."""

    t_s: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, t_s: float, value: float | None) -> None:
        if value is not None:
            self.t_s.append(round(t_s, 3))
            self.values.append(value)

    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    def max(self) -> float | None:
        return max(self.values) if self.values else None


@dataclass(slots=True)
class GpuTelemetry:
    host: str | None
    index: int
    bus_id: str | None
    util_percent: Series = field(default_factory=Series)
    mem_used_bytes: Series = field(default_factory=Series)
    power_w: Series = field(default_factory=Series)
    temp_c: Series = field(default_factory=Series)
    sm_clock_mhz: Series = field(default_factory=Series)
    mem_total_bytes: float | None = None
    energy_j: float | None = None  # consumed over energy_span_s: the total-energy counter's rise, or
    energy_span_s: float | None = None  # where the GPU has no counter, its power samples integrated
    energy_source: str | None = None  # "counter" or "power samples"
    throttle: set[str] = field(default_factory=set)
    lost: bool = False
    _energy_first: tuple[float, float] | None = None  # (t_s, joules) of the counter's first sample


@dataclass(slots=True)
class ProcessTelemetry:
    """One rank's process tree. `rss_bytes` is summed over its processes, so pages that forked dataloader
    workers share with the rank count once per process; `pss_bytes` divides them among the sharers (read
    every few ticks); `uss_bytes`, where a platform has no PSS, leaves them out."""

    rank: int
    cpu_percent: Series = field(default_factory=Series)
    rss_bytes: Series = field(default_factory=Series)
    pss_bytes: Series = field(default_factory=Series)
    uss_bytes: Series = field(default_factory=Series)
    rss_peak_bytes: Series = field(default_factory=Series)  # the rank process's own high-water mark
    num_processes_max: int | None = None  # the most processes a sample found in the tree

    def memory(self) -> tuple[str, Series]:
        """The tree's memory and its measure ("hwm", "pss", "uss" or "rss").

        The kernel's high-water mark where the tree was the rank process alone and the mark rose while
        the run was recorded: the largest RSS the process ever had, reached within the run, exact. PSS is
        read every few seconds (its cost grows with memory), so its peak is the largest of a few reads,
        which lands on the true peak or not by chance (a standard deviation of 5-15% between identical
        runs on a 2-core runner, benchmarks/results/ab_trials). A mark that did not rise was set before
        the recording (an earlier fit in the same process), and forked workers' memory is not in the
        rank's mark: PSS then, RSS for a record made before PSS was, or on a host that would not let it
        be read."""
        peaks = self.rss_peak_bytes.values
        if peaks and self.num_processes_max == 1 and peaks[-1] > peaks[0]:
            return "hwm", self.rss_peak_bytes
        if self.pss_bytes.values:
            return "pss", self.pss_bytes
        if self.uss_bytes.values:
            return "uss", self.uss_bytes
        return "rss", self.rss_bytes


@dataclass(slots=True)
class HostTelemetry:
    host: str | None
    cpu_percent: Series = field(default_factory=Series)
    mem_used_bytes: Series = field(default_factory=Series)
    mem_total_bytes: float | None = None
    disk_read_bytes_per_s: float | None = None
    disk_write_bytes_per_s: float | None = None
    net_bytes_per_s: dict[str, dict[str, float]] = field(default_factory=dict)
    net_recv_bytes_per_s: Series = field(default_factory=Series)  # all interfaces but loopback
    net_sent_bytes_per_s: Series = field(default_factory=Series)


@dataclass(slots=True)
class RunTelemetry:
    gpus: list[GpuTelemetry]
    processes: list[ProcessTelemetry]
    hosts: list[HostTelemetry]
    samples: int


def _rate(first: tuple[float, float] | None, last: tuple[float, float] | None) -> float | None:
    if first is None or last is None or last[0] <= first[0]:
        return None
    return max(0.0, (last[1] - first[1]) / (last[0] - first[0]))


def _number(value: Any) -> float | None:
    # _num, quicker for the float or int that a reading nearly always is (float() of a float is itself).
    kind = type(value)
    return value if kind is float else float(value) if kind is int else _num(value)


def _host_telemetry(host: str | None, samples: list[tuple[float, dict[str, Any]]]) -> HostTelemetry:
    out = HostTelemetry(host=host)
    disk_r: list[tuple[float, float]] = []
    disk_w: list[tuple[float, float]] = []
    net: dict[str, dict[str, list[tuple[float, float]]]] = {}
    prev_net: tuple[float, float, float] | None = None
    for t, system in samples:
        t_s = round(t, 3)
        if (cpu := _number(system.get("cpu_percent"))) is not None:
            out.cpu_percent.t_s.append(t_s)
            out.cpu_percent.values.append(cpu)
        if (mem := _number(system.get("mem_used_bytes"))) is not None:
            out.mem_used_bytes.t_s.append(t_s)
            out.mem_used_bytes.values.append(mem)
        out.mem_total_bytes = _number(system.get("mem_total_bytes")) or out.mem_total_bytes
        if (r := _number(system.get("disk_read_bytes"))) is not None:
            disk_r.append((t, r))
        if (w := _number(system.get("disk_write_bytes"))) is not None:
            disk_w.append((t, w))
        recv = sent = 0.0
        interfaces = system.get("net")
        for iface, counters in interfaces.items() if isinstance(interfaces, dict) else ():
            if not isinstance(counters, dict):
                continue
            for key in ("sent_bytes", "recv_bytes"):
                if (v := _number(counters.get(key))) is not None:
                    net.setdefault(str(iface), {}).setdefault(key, []).append((t, v))
                    if iface != "lo":
                        if key == "recv_bytes":
                            recv += v
                        else:
                            sent += v
        if prev_net is not None and t > prev_net[0]:
            dt = t - prev_net[0]
            out.net_recv_bytes_per_s.add(t, max(0.0, (recv - prev_net[1]) / dt))
            out.net_sent_bytes_per_s.add(t, max(0.0, (sent - prev_net[2]) / dt))
        prev_net = (t, recv, sent)
    out.disk_read_bytes_per_s = _rate(disk_r[0] if disk_r else None, disk_r[-1] if disk_r else None)
    out.disk_write_bytes_per_s = _rate(disk_w[0] if disk_w else None, disk_w[-1] if disk_w else None)
    for iface, counters in sorted(net.items()):
        rates = {k: _rate(v[0], v[-1]) for k, v in counters.items()}
        out.net_bytes_per_s[iface] = {
            k.replace("_bytes", "_bytes_per_s"): v for k, v in rates.items() if v is not None
        }
    return out


# The GPU readings kept as series, by field name.
# (Memory-controller utilization is recorded, and not read: no figure of the report uses it.)
_GPU_SERIES = ("util_percent", "mem_used_bytes", "power_w", "temp_c", "sm_clock_mhz")


def run_telemetry(run: Run, t0_unix: float) -> RunTelemetry:
    # A large run has millions of readings (1,024 ranks, a GPU sample of 8 GPUs a second on every node):
    # the loops below fetch each field once, round each time once, and append to the series' lists.
    gpus: dict[tuple[str | None, int], GpuTelemetry] = {}
    # Per GPU: its record and, per series field, (name, times, values) of its Series.
    gpu_fields: dict[tuple[str | None, int], tuple[GpuTelemetry, list[tuple[str, list, list]]]] = {}
    processes: list[ProcessTelemetry] = []
    hosts: list[HostTelemetry] = []
    count = 0
    for rank, rec in sorted(run.ranks.items()):
        host = rec.info.host
        proc = ProcessTelemetry(rank=rank)
        cpu_t, cpu_v = proc.cpu_percent.t_s, proc.cpu_percent.values
        rss_t, rss_v = proc.rss_bytes.t_s, proc.rss_bytes.values
        system_samples: list[tuple[float, dict[str, Any]]] = []
        for sample in rec.telemetry:
            t_unix = _number(sample.get("t"))
            if t_unix is None:
                continue
            count += 1
            t = t_unix - t0_unix
            t_s = round(t, 3)
            if isinstance(p := sample.get("process"), dict):
                if (cpu := _number(p.get("cpu_percent"))) is not None:
                    cpu_t.append(t_s)
                    cpu_v.append(cpu)
                if (rss := _number(p.get("rss_bytes"))) is not None:
                    rss_t.append(t_s)
                    rss_v.append(rss)
                # Read every few ticks only (its cost grows with the tree's memory): most samples lack it.
                if (pss := p.get("pss_bytes")) is not None:
                    proc.pss_bytes.add(t, _number(pss))
                if (uss := p.get("uss_bytes")) is not None:
                    proc.uss_bytes.add(t, _number(uss))
                if (peak := p.get("rss_peak_bytes")) is not None:
                    proc.rss_peak_bytes.add(t, _number(peak))
                if isinstance(tree_size := p.get("num_processes"), int):
                    proc.num_processes_max = max(proc.num_processes_max or 0, tree_size)
            if isinstance(system := sample.get("system"), dict):
                system_samples.append((t, system))
            samples_gpus = sample.get("gpus")
            for g in samples_gpus if isinstance(samples_gpus, list) else ():
                if not isinstance(g, dict) or not isinstance(index := g.get("index"), int):
                    continue
                known = gpu_fields.get((host, index))
                if known is None:
                    gpu = gpus[(host, index)] = GpuTelemetry(host=host, index=index, bus_id=None)
                    known = gpu_fields[(host, index)] = (
                        gpu,
                        [(name, getattr(gpu, name).t_s, getattr(gpu, name).values) for name in _GPU_SERIES],
                    )
                gpu, fields = known
                if isinstance(bus_id := g.get("bus_id"), str):
                    gpu.bus_id = bus_id
                if not gpu.lost and g.get("lost") is True:
                    gpu.lost = True
                for name, times, values in fields:
                    v = g.get(name)
                    kind = type(v)  # _number inline: this loop runs for every field of every GPU sample
                    if kind is int:
                        v = float(v)
                    elif kind is not float and (v := _num(v)) is None:
                        continue
                    times.append(t_s)
                    values.append(v)
                gpu.mem_total_bytes = _number(g.get("mem_total_bytes")) or gpu.mem_total_bytes
                if (energy := _number(g.get("energy_j"))) is not None:
                    if gpu._energy_first is None:
                        gpu._energy_first = (t, energy)
                    gpu.energy_j = energy - gpu._energy_first[1]
                    gpu.energy_span_s = t - gpu._energy_first[0]
                    gpu.energy_source = "counter"
                throttle = g.get("throttle")
                if isinstance(throttle, list) and throttle:
                    gpu.throttle.update(str(x) for x in throttle if x != "gpu_idle")
        if proc.cpu_percent.values or proc.rss_bytes.values or proc.pss_bytes.values or proc.uss_bytes.values:
            processes.append(proc)
        if system_samples:
            hosts.append(_host_telemetry(host, system_samples))
    for gpu in gpus.values():
        if gpu.energy_source is None and len(gpu.power_w.values) > 1:
            t, w = gpu.power_w.t_s, gpu.power_w.values
            gpu.energy_j = sum((t[i + 1] - t[i]) * (w[i] + w[i + 1]) / 2 for i in range(len(t) - 1))
            gpu.energy_span_s = t[-1] - t[0]
            gpu.energy_source = "power samples"
    return RunTelemetry(
        gpus=[gpus[k] for k in sorted(gpus, key=lambda k: (k[0] or "", k[1]))],
        processes=processes,
        hosts=hosts,
        samples=count,
    )
