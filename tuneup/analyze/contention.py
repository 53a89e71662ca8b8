"""CPU contention: was the host's CPU taken by processes other than the training's?

A training job on a shared or oversubscribed host (another job, a stray process, a noisy VM neighbour)
gets slower and noisier steps for reasons that are not its own. The telemetry already holds what tells it:
each host's CPU busy share (the system sensor, 100 = every core busy, steal time counted as busy) and each
rank's process tree CPU (100 = one core busy, dataloader workers included, other ranks excluded). What the
host was busy with beyond the training's own trees is other processes' work:

    others % = host busy % - (sum of the host's ranks' process CPU %) / cores

Each rank samples its own tree, so on a host with several ranks their trees are summed: the other ranks
are the training, not "other processes". The host's sample comes from its local rank 0; every other rank's
is taken from its own sample nearest in time (their samplers tick on their own clocks).

A host counts as contended when, for at least CONTENDED_TIME_SHARE of the samples, it was saturated
(CONTENDED_HOST_BUSY_PERCENT) and others used CONTENDED_OTHERS_PERCENT of its cores. A busy host whose CPU
goes to the training itself is not contention (the dataloader-workers findings are about that), nor is
another process on a host with idle cores to spare.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Mapping

from tuneup._stats import finite
from tuneup.analyze.model import CpuContention
from tuneup.analyze.telemetry import HostTelemetry, ProcessTelemetry, RunTelemetry

# At or above this busy share a host has no idle core left: any thread of the training that becomes
# runnable waits for one. (A host below it has cores to spare, whoever the other processes are.)
CONTENDED_HOST_BUSY_PERCENT = 90.0
# Other processes using at least this share of the cores: well above what an idle node's daemons use (a
# few per cent), and enough to push a host into saturation that the training alone would not fill.
CONTENDED_OTHERS_PERCENT = 25.0
# For at least this share of the sampled time: a moment's spike (a log rotation, a cron job) is not worth a
# finding; a fifth of the run is enough to move its step-time figures.
CONTENDED_TIME_SHARE = 0.2
# Fewer aligned samples than this on a host cover too little of the run to speak of a share of it.
CONTENTION_MIN_SAMPLES = 5


def _nearest(times: list[float], values: list[float], t: float, tolerance_s: float) -> float | None:
    """The value sampled nearest to `t`, if within `tolerance_s`."""
    i = bisect.bisect_left(times, t)
    best: tuple[float, float] | None = None
    for j in (i - 1, i):
        if 0 <= j < len(times) and (best is None or abs(times[j] - t) < best[0]):
            best = (abs(times[j] - t), values[j])
    return best[1] if best is not None and best[0] <= tolerance_s else None


def _interval_s(times: list[float]) -> float:
    gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
    return statistics.median(gaps) if gaps else 0.0


def _host_contention(
    host: HostTelemetry, processes: list[ProcessTelemetry], cores: int
) -> CpuContention | None:
    # A rank's nearest sample is at most half its sampling interval away while its sampler keeps time; one
    # whole interval allows for jitter, and a sample from further away (the sampler stalled) is skipped.
    trees = [
        (p.cpu_percent.t_s, p.cpu_percent.values, _interval_s(p.cpu_percent.t_s))
        for p in processes
        if p.cpu_percent.values
    ]
    busy_all: list[float] = []
    training_all: list[float] = []
    others_all: list[float] = []
    contended = 0
    for t, busy in zip(host.cpu_percent.t_s, host.cpu_percent.values, strict=True):
        readings = [_nearest(times, values, t, interval) for times, values, interval in trees]
        if any(r is None for r in readings):
            continue  # a rank's CPU unknown here: its share cannot be told from others'
        training = sum(readings) / cores  # type: ignore[arg-type]
        # The two sensors read over slightly different windows: never report a negative share.
        others = max(0.0, busy - training)
        busy_all.append(busy)
        training_all.append(training)
        others_all.append(others)
        if busy >= CONTENDED_HOST_BUSY_PERCENT and others >= CONTENDED_OTHERS_PERCENT:
            contended += 1
    n = len(busy_all)
    if n == 0:
        return None
    share = contended / n
    return CpuContention(
        host=host.host,
        cores=cores,
        ranks=sorted(p.rank for p in processes),
        samples=n,
        host_busy_percent_mean=finite(statistics.fmean(busy_all)),
        training_percent_mean=finite(statistics.fmean(training_all)),
        others_percent_mean=finite(statistics.fmean(others_all)),
        contended_share=share,
        contended=n >= CONTENTION_MIN_SAMPLES and share >= CONTENDED_TIME_SHARE,
    )


def cpu_contention(
    tel: RunTelemetry, rank_hosts: Mapping[int, str | None], cores: int | None
) -> list[CpuContention]:
    """One entry per host with host telemetry and process telemetry from every rank on it.

    `cores` is the host's logical CPU count from the manifest (rank 0's host): a job's hosts are taken to
    be alike, as the manifest records one. Without it no share of the host can be told."""
    if not isinstance(cores, int) or isinstance(cores, bool) or cores <= 0:
        return []
    by_host: dict[str | None, HostTelemetry] = {}
    for h in tel.hosts:
        # Only local rank 0 samples the host; should two ranks of one host both have, keep the fuller.
        known = by_host.get(h.host)
        if known is None or len(h.cpu_percent.values) > len(known.cpu_percent.values):
            by_host[h.host] = h
    trees = {p.rank: p for p in tel.processes}
    out = []
    for name, host in by_host.items():
        ranks = [r for r, h in rank_hosts.items() if h == name]
        if not ranks or any(r not in trees or not trees[r].cpu_percent.values for r in ranks):
            # A rank of this host without process CPU would read as other processes' work: say nothing.
            continue
        found = _host_contention(host, [trees[r] for r in ranks], cores)
        if found is not None:
            out.append(found)
    return out
