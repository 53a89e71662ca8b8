"""The report's telemetry: each GPU, rank process and host summarised, with its series thinned for plots."""

from __future__ import annotations

from tuneup._stats import finite
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
from tuneup.analyze.telemetry import ProcessTelemetry as SampledProcess
from tuneup.analyze.telemetry import RunTelemetry
from tuneup.analyze.telemetry import Series as SampledSeries

MAX_SERIES_POINTS = 1000
# All series of one kind together (every rank's process CPU, say) keep at most this many points, each at
# least MIN_SERIES_POINTS: 2 ranks keep 1,000 points a series, 1,024 ranks 100 each (a readable curve) instead
# of megabytes of JSON that no plot of 1,024 lines can show.
MAX_POINTS_PER_KIND = 100_000
MIN_SERIES_POINTS = 100


def _limit(n_series: int) -> int:
    return max(MIN_SERIES_POINTS, min(MAX_SERIES_POINTS, MAX_POINTS_PER_KIND // max(1, n_series)))


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def series(sampled: SampledSeries, limit: int = MAX_SERIES_POINTS) -> Series:
    """A series for the report, averaged into at most `limit` buckets (a day at 1 Hz is 86,400)."""
    t, v = sampled.t_s, sampled.values
    if len(v) > limit:
        size = -(-len(v) // limit)
        t = [sum(t[i : i + size]) / len(t[i : i + size]) for i in range(0, len(t), size)]
        v = [sum(v[i : i + size]) / len(v[i : i + size]) for i in range(0, len(v), size)]
    return Series(t_s=list(t), values=list(v))


def telemetry(tel: RunTelemetry, gpu_allocated_peak_bytes: int | None = None) -> Telemetry:
    gpu_points, process_points, host_points = (
        _limit(len(tel.gpus)),
        _limit(len(tel.processes)),
        _limit(len(tel.hosts)),
    )
    return Telemetry(
        samples=tel.samples,
        gpus=[
            GpuTelemetry(
                host=g.host,
                index=g.index,
                bus_id=g.bus_id,
                lost=g.lost,
                util_percent_mean=finite(g.util_percent.mean()),
                util_percent_max=finite(g.util_percent.max()),
                mem_used_bytes_max=_int(g.mem_used_bytes.max()),
                mem_total_bytes=_int(g.mem_total_bytes),
                power_w_mean=finite(g.power_w.mean()),
                power_w_max=finite(g.power_w.max()),
                energy_j=finite(g.energy_j),
                energy_span_s=finite(g.energy_span_s),
                energy_source=g.energy_source,
                temp_c_max=g.temp_c.max(),
                sm_clock_mhz_mean=finite(g.sm_clock_mhz.mean()),
                throttle_reasons=sorted(g.throttle),
                series=GpuSeries(
                    util_percent=series(g.util_percent, gpu_points),
                    power_w=series(g.power_w, gpu_points),
                    mem_used_bytes=series(g.mem_used_bytes, gpu_points),
                ),
            )
            for g in tel.gpus
        ],
        processes=[_process(p, process_points) for p in tel.processes],
        hosts=[
            HostTelemetry(
                host=h.host,
                cpu_percent_mean=finite(h.cpu_percent.mean()),
                mem_used_bytes_max=_int(h.mem_used_bytes.max()),
                mem_total_bytes=_int(h.mem_total_bytes),
                disk_read_bytes_per_s=finite(h.disk_read_bytes_per_s),
                disk_write_bytes_per_s=finite(h.disk_write_bytes_per_s),
                net_bytes_per_s={
                    name: NetRate(rates.get("sent_bytes_per_s"), rates.get("recv_bytes_per_s"))
                    for name, rates in h.net_bytes_per_s.items()
                },
                series=HostSeries(
                    cpu_percent=series(h.cpu_percent, host_points),
                    mem_used_bytes=series(h.mem_used_bytes, host_points),
                    net_recv_bytes_per_s=series(h.net_recv_bytes_per_s, host_points),
                    net_sent_bytes_per_s=series(h.net_sent_bytes_per_s, host_points),
                ),
            )
            for h in tel.hosts
        ],
        gpu_allocated_peak_bytes=gpu_allocated_peak_bytes,
    )


def _process(p: SampledProcess, points: int) -> ProcessTelemetry:
    measure, memory = p.memory()
    return ProcessTelemetry(
        rank=p.rank,
        cpu_percent_mean=finite(p.cpu_percent.mean()),
        rss_bytes_max=_int(p.rss_bytes.max()),
        series=ProcessSeries(
            cpu_percent=series(p.cpu_percent, points),
            rss_bytes=series(p.rss_bytes, points),
        ),
        memory_bytes_max=_int(memory.max()),
        memory_measure=measure,
    )
