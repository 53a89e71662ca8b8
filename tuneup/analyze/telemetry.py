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
    mem_util_percent: Series = field(default_factory=Series)
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
    rank: int
    cpu_percent: Series = field(default_factory=Series)
    rss_bytes: Series = field(default_factory=Series)


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


def _host_telemetry(host: str | None, samples: list[tuple[float, dict[str, Any]]]) -> HostTelemetry:
    out = HostTelemetry(host=host)
    disk_r: list[tuple[float, float]] = []
    disk_w: list[tuple[float, float]] = []
    net: dict[str, dict[str, list[tuple[float, float]]]] = {}
    prev_net: tuple[float, float, float] | None = None
    for t, system in samples:
        out.cpu_percent.add(t, _num(system.get("cpu_percent")))
        out.mem_used_bytes.add(t, _num(system.get("mem_used_bytes")))
        out.mem_total_bytes = _num(system.get("mem_total_bytes")) or out.mem_total_bytes
        if (r := _num(system.get("disk_read_bytes"))) is not None:
            disk_r.append((t, r))
        if (w := _num(system.get("disk_write_bytes"))) is not None:
            disk_w.append((t, w))
        recv = sent = 0.0
        interfaces = system.get("net") if isinstance(system.get("net"), dict) else {}
        for iface, counters in interfaces.items():
            if not isinstance(counters, dict):
                continue
            for key in ("sent_bytes", "recv_bytes"):
                if (v := _num(counters.get(key))) is not None:
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


def run_telemetry(run: Run, t0_unix: float) -> RunTelemetry:
    gpus: dict[tuple[str | None, int], GpuTelemetry] = {}
    processes: list[ProcessTelemetry] = []
    hosts: list[HostTelemetry] = []
    count = 0
    for rank, rec in sorted(run.ranks.items()):
        host = rec.info.host
        proc = ProcessTelemetry(rank=rank)
        system_samples: list[tuple[float, dict[str, Any]]] = []
        for sample in rec.telemetry:
            t_unix = _num(sample.get("t"))
            if t_unix is None:
                continue
            count += 1
            t = t_unix - t0_unix
            if isinstance(p := sample.get("process"), dict):
                proc.cpu_percent.add(t, _num(p.get("cpu_percent")))
                proc.rss_bytes.add(t, _num(p.get("rss_bytes")))
            if isinstance(system := sample.get("system"), dict):
                system_samples.append((t, system))
            for g in sample.get("gpus") if isinstance(sample.get("gpus"), list) else []:
                if not isinstance(g, dict) or not isinstance(g.get("index"), int):
                    continue
                gpu = gpus.setdefault(
                    (host, g["index"]), GpuTelemetry(host=host, index=g["index"], bus_id=None)
                )
                gpu.bus_id = g.get("bus_id") if isinstance(g.get("bus_id"), str) else gpu.bus_id
                gpu.lost = gpu.lost or g.get("lost") is True
                for name in (
                    "util_percent",
                    "mem_util_percent",
                    "mem_used_bytes",
                    "power_w",
                    "temp_c",
                    "sm_clock_mhz",
                ):
                    getattr(gpu, name).add(t, _num(g.get(name)))
                gpu.mem_total_bytes = _num(g.get("mem_total_bytes")) or gpu.mem_total_bytes
                if (energy := _num(g.get("energy_j"))) is not None:
                    if gpu._energy_first is None:
                        gpu._energy_first = (t, energy)
                    gpu.energy_j = energy - gpu._energy_first[1]
                    gpu.energy_span_s = t - gpu._energy_first[0]
                    gpu.energy_source = "counter"
                throttle = g.get("throttle")
                if isinstance(throttle, list):
                    gpu.throttle.update(str(x) for x in throttle if x != "gpu_idle")
        if proc.cpu_percent.values or proc.rss_bytes.values:
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
