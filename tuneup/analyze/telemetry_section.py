"""The report's telemetry: each GPU, rank process and host summarised, with its series thinned for plots."""

from __future__ import annotations

from tuneup._stats import rounded as _r
from tuneup.analyze.model import (
    GpuSeries,
    GpuTelemetry,
    HostSeries,
    HostTelemetry,
    NetRate,
    ProcessSeries,
    ProcessTelemetry,
    Series,
    Telemetry,
)
from tuneup.analyze.telemetry import RunTelemetry
from tuneup.analyze.telemetry import Series as SampledSeries

MAX_SERIES_POINTS = 1000


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def series(sampled: SampledSeries) -> Series:
    """A series for the report, averaged into at most MAX_SERIES_POINTS buckets (a day at 1 Hz is 86,400)."""
    t, v = sampled.t_s, sampled.values
    if len(v) > MAX_SERIES_POINTS:
        size = -(-len(v) // MAX_SERIES_POINTS)
        t = [sum(t[i : i + size]) / len(t[i : i + size]) for i in range(0, len(t), size)]
        v = [sum(v[i : i + size]) / len(v[i : i + size]) for i in range(0, len(v), size)]
    return Series(t_s=[round(x, 3) for x in t], values=[round(x, 3) for x in v])


def telemetry(tel: RunTelemetry, gpu_allocated_peak_bytes: int | None = None) -> Telemetry:
    return Telemetry(
        samples=tel.samples,
        gpus=[
            GpuTelemetry(
                host=g.host,
                index=g.index,
                bus_id=g.bus_id,
                lost=g.lost,
                util_percent_mean=_r(g.util_percent.mean(), 1),
                util_percent_max=_r(g.util_percent.max(), 1),
                mem_used_bytes_max=_int(g.mem_used_bytes.max()),
                mem_total_bytes=_int(g.mem_total_bytes),
                power_w_mean=_r(g.power_w.mean(), 1),
                power_w_max=_r(g.power_w.max(), 1),
                energy_j=_r(g.energy_j, 1),
                energy_span_s=_r(g.energy_span_s, 3),
                energy_source=g.energy_source,
                temp_c_max=g.temp_c.max(),
                sm_clock_mhz_mean=_r(g.sm_clock_mhz.mean(), 0),
                throttle_reasons=sorted(g.throttle),
                series=GpuSeries(
                    util_percent=series(g.util_percent),
                    power_w=series(g.power_w),
                    mem_used_bytes=series(g.mem_used_bytes),
                ),
            )
            for g in tel.gpus
        ],
        processes=[
            ProcessTelemetry(
                rank=p.rank,
                cpu_percent_mean=_r(p.cpu_percent.mean(), 1),
                rss_bytes_max=_int(p.rss_bytes.max()),
                series=ProcessSeries(cpu_percent=series(p.cpu_percent), rss_bytes=series(p.rss_bytes)),
            )
            for p in tel.processes
        ],
        hosts=[
            HostTelemetry(
                host=h.host,
                cpu_percent_mean=_r(h.cpu_percent.mean(), 1),
                mem_used_bytes_max=_int(h.mem_used_bytes.max()),
                mem_total_bytes=_int(h.mem_total_bytes),
                disk_read_bytes_per_s=_r(h.disk_read_bytes_per_s, 1),
                disk_write_bytes_per_s=_r(h.disk_write_bytes_per_s, 1),
                net_bytes_per_s={
                    name: NetRate(rates.get("sent_bytes_per_s"), rates.get("recv_bytes_per_s"))
                    for name, rates in h.net_bytes_per_s.items()
                },
                series=HostSeries(
                    cpu_percent=series(h.cpu_percent),
                    mem_used_bytes=series(h.mem_used_bytes),
                    net_recv_bytes_per_s=series(h.net_recv_bytes_per_s),
                    net_sent_bytes_per_s=series(h.net_sent_bytes_per_s),
                ),
            )
            for h in tel.hosts
        ],
        gpu_allocated_peak_bytes=gpu_allocated_peak_bytes,
    )
