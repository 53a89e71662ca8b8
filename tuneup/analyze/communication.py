"""Communication of a recorded run: its share of the step, how much of it the step waited for, the
bandwidth the collectives reached against what the link should give, and which rank the others wait for.

A rank that arrives late at a collective finds the others already waiting in it: its own collective is
short and theirs are long. A slow link makes every rank's collectives long alike. Per-rank collective
time is what tells the two apart.

Under a TuneupDDPStrategy the per-step figures are of the strategy's phase, the run's setting: its exact
warm-up is another setting, and mixing the two says neither. A local SGD step between averages runs no
collective and counts as zero, so that the phase's figure is its collective time over all of its steps, not
the mean of the one step in H that averaged (which overstated the per-step time H-fold).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from tuneup._stats import finite, mean
from tuneup.analyze.interconnect import GB, collective_table, fit_alpha_beta, link_verdict
from tuneup.analyze.model import (
    BucketTime,
    CollectiveFit,
    Communication,
    LateRank,
    LinkCheck,
    PhaseWait,
    RankComm,
    SizeTime,
)
from tuneup.analyze.sync_strategy import StrategyPhases, strategy_phases
from tuneup.catalog.interconnects import expected_link, gpu_link_from_inventory
from tuneup.record.schema import CollectiveRecord, Run, StepRecord

# A rank whose collectives take under this share of the others' median arrives late at them.
LATE_ARRIVAL_RATIO = 0.5
LATE_ARRIVAL_MIN_MS = 1.0


def _late_rank(per_rank: list[RankComm]) -> LateRank | None:
    timed = [(r.rank, r.comm_ms) for r in per_rank if r.comm_ms is not None]
    if len(timed) < 2:
        return None
    rank, comm_ms = min(timed, key=lambda r: r[1])
    others = statistics.median(ms for r, ms in timed if r != rank)
    if others - comm_ms < LATE_ARRIVAL_MIN_MS or comm_ms > LATE_ARRIVAL_RATIO * others:
        return None
    return LateRank(
        rank=rank,
        comm_ms=finite(comm_ms),
        others_comm_ms=finite(others),
        summary=(
            f"rank {rank} arrives late at the collectives: its collectives take "
            f"{comm_ms:.1f} ms per step against {others:.1f} ms on the other ranks, which wait "
            "inside them for it. The link is not what is slow; what rank "
            f"{rank} does before each collective is."
        ),
    )


def _fits(records: list[CollectiveRecord], world_size: int) -> list[CollectiveFit]:
    by_kind: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for c in records:
        # Collectives over every rank only: a subgroup's (one node's, one rank per node's) run over another
        # link with another ring, and would bend one line through both.
        if c.bytes > 0 and c.duration_ms > 0 and c.scope is None:
            by_kind[c.kind].append((c.bytes, c.duration_ms / 1000.0))
    out = []
    for kind, samples in sorted(by_kind.items()):
        if len({b for b, _ in samples}) < 2:
            continue  # one size (one DDP bucket): no line to fit; the table still gives its bandwidth
        try:
            fit = fit_alpha_beta(samples, kind, world_size)
        except ValueError:
            continue
        out.append(
            CollectiveFit(
                kind=kind,
                alpha_us=finite(fit.alpha_s * 1e6),
                beta_ns_per_byte=finite(fit.beta_s_per_byte * 1e9),
                busbw_gbytes_per_s=finite(fit.busbw_bytes_per_s / GB if fit.busbw_bytes_per_s else None),
                r_squared=finite(fit.r_squared),
                points=fit.points,
                sizes=fit.sizes,
                notes=list(fit.notes),
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class _StepComm:
    wall_ms: float
    comm_ms: float
    exposed_ms: float | None
    bytes: int | None
    count: int | None


def _known(steps: list[StepRecord], phases: StrategyPhases | None) -> list[_StepComm]:
    """The communication of each step where it is known: the step's own figures, or zeros where the
    strategy ran no collective in it (a local SGD step between averages: no figure, but not an unknown)."""
    out = []
    for s in steps:
        if s.comm_ms is not None:
            out.append(_StepComm(s.wall_ms, s.comm_ms, s.comm_exposed_ms, s.comm_bytes, s.comm_count))
        elif phases is not None and phases.sent_nothing(s):
            out.append(_StepComm(s.wall_ms, 0.0, 0.0, 0, 0))
    return out


def _setting_steps(
    steady: dict[int, list[StepRecord]], phases: StrategyPhases | None
) -> dict[int, list[StepRecord]]:
    """The steady steps the per-step figures are means over: under a TuneupDDPStrategy that started, its
    phase's (the run's setting; the exact warm-up is another, whose figures the sync section holds), else
    all of them."""
    if phases is None or phases.started_at is None:
        return steady
    in_phase = {rank: [s for s in steps if phases.in_strategy(s.step)] for rank, steps in steady.items()}
    return in_phase if any(in_phase.values()) else steady


def _exposed_by_phase(steps: list[StepRecord]) -> list[PhaseWait]:
    """FSDP's waits by phase over the steps that recorded them (every rank's): the forward's all-gathers;
    the backward's re-gathers and gradient reductions. Empty where no step did (DDP, a GPU, older runs)."""
    timed = [s for s in steps if s.comm_exposed_forward_gather_ms is not None]
    if not timed:
        return []

    def wait(name: str) -> float:
        return statistics.fmean(getattr(s, name) or 0.0 for s in timed)

    out = []
    for phase, phase_ms, gathers, reduces in (
        (
            "forward",
            statistics.fmean(s.forward_ms for s in timed),
            wait("comm_exposed_forward_gather_ms"),
            None,
        ),
        (
            "backward",
            statistics.fmean(s.backward_ms for s in timed),
            wait("comm_exposed_backward_gather_ms"),
            wait("comm_exposed_reduce_ms"),
        ),
    ):
        waited = gathers + (reduces or 0.0)
        out.append(
            PhaseWait(
                phase=phase,
                phase_ms=finite(phase_ms),
                waited_ms=finite(waited),
                gathers_ms=finite(gathers),
                reduces_ms=finite(reduces),
                # A wait timed a little past its phase's marks (clock reads apart) is no negative compute.
                compute_ms=finite(max(0.0, phase_ms - waited)),
                waited_share=finite(min(1.0, waited / phase_ms) if phase_ms > 0 else None),
            )
        )
    return out


def communication_section(run: Run, steady: dict[int, list[StepRecord]]) -> Communication | None:
    """The report's communication section, or None when the run timed no collective."""
    phases = strategy_phases(run)
    setting = _setting_steps(steady, phases)
    per_rank = []
    for rank, steps in sorted(setting.items()):
        known = _known(steps, phases)
        per_rank.append(
            RankComm(
                rank=rank,
                steps_with_comm=sum(1 for s in steps if s.comm_ms is not None),
                comm_ms=finite(mean([k.comm_ms for k in known])),
                exposed_ms=finite(mean([k.exposed_ms for k in known if k.exposed_ms is not None])),
                bytes_per_step=finite(mean([k.bytes for k in known if k.bytes is not None])),
                collectives_per_step=finite(mean([k.count for k in known if k.count is not None])),
            )
        )
    records = [c for rec in run.ranks.values() for c in rec.collectives]
    if not records and not any(r.steps_with_comm for r in per_rank):
        return None
    # A network probe's run has collectives and no training steps: its section is the tables and fits.
    known = [k for steps in setting.values() for k in _known(steps, phases)]
    wall = statistics.fmean(k.wall_ms for k in known) if known else None
    comm = statistics.fmean(k.comm_ms for k in known) if known else None
    exposed_values = [k.exposed_ms for k in known if k.exposed_ms is not None]
    exposed = statistics.fmean(exposed_values) if exposed_values else None
    world = run.world_size
    table = collective_table(records, world)
    first_rank = min(run.ranks, default=0)
    buckets: dict[tuple[int, str, int], list[float]] = defaultdict(list)
    dtypes: dict[tuple[int, str, int], str | None] = {}
    for c in run.ranks[first_rank].collectives if first_rank in run.ranks else []:
        if c.bucket is not None:
            buckets[(c.bucket, c.kind, c.bytes)].append(c.duration_ms)
            dtypes[(c.bucket, c.kind, c.bytes)] = c.dtype
    comm_env = (
        run.manifest.raw.get("communication")
        if isinstance(run.manifest.raw.get("communication"), dict)
        else {}
    )
    backend = comm_env.get("backend")
    on_gpu = bool((run.manifest.gpus or {}).get("gpus"))
    gpu0 = ((run.manifest.gpus or {}).get("gpus") or [{}])[0]
    choice = expected_link(
        backend=str(backend or ("nccl" if on_gpu else "gloo")),
        device="cuda" if on_gpu else "cpu",
        num_nodes=run.manifest.num_nodes,
        gpu_link=gpu_link_from_inventory(gpu0) or None,
    )
    # Bandwidth-bound figure for the verdict: the biggest collective's bus bandwidth.
    biggest = max(
        (row for row in table if row.busbw_gbytes_per_s), key=lambda row: row.size_bytes, default=None
    )
    link: LinkCheck | None = None
    if choice.link is not None:
        link = LinkCheck(name=choice.link.name, reason=choice.reason, source=choice.link.source)
        if biggest is not None:
            verdict = link_verdict(biggest.busbw_gbytes_per_s * GB, choice.link)  # type: ignore[operator]
            link = LinkCheck(
                name=link.name,
                reason=link.reason,
                source=link.source,
                measured_busbw_gbytes_per_s=finite(biggest.busbw_gbytes_per_s),
                reference=verdict.reference,
                reference_gbytes_per_s=finite(
                    verdict.reference_bytes_per_s / GB if verdict.reference_bytes_per_s else None
                ),
                ratio=finite(verdict.ratio),
                far_below=verdict.far_below,
                summary=verdict.sentence,
            )
    ddp = next((e for rec in run.ranks.values() for e in rec.events if e.get("kind") == "ddp_logging"), None)
    return Communication(
        backend=backend,
        world_size=world,
        ranks_per_node=comm_env.get("ranks_per_node"),
        nccl_version=comm_env.get("nccl_version"),
        comm_ms_per_step=finite(comm),
        share_of_step=finite(comm / wall if comm is not None and wall else None),
        exposed_ms_per_step=finite(exposed),
        overlapped_ms_per_step=finite(comm - exposed if comm is not None and exposed is not None else None),
        exposed_share_of_step=finite(exposed / wall if exposed is not None and wall else None),
        per_rank=per_rank,
        per_bucket=[
            BucketTime(
                bucket=bucket,
                kind=kind,
                bytes=nbytes,
                dtype=dtypes[(bucket, kind, nbytes)],
                median_ms=finite(statistics.median(times)),
                count=len(times),
            )
            for (bucket, kind, nbytes), times in sorted(buckets.items())
        ],
        by_size=[
            SizeTime(
                kind=row.kind,
                bytes=row.size_bytes,
                count=row.count,
                median_us=finite(row.median_time_us),
                algbw_gbytes_per_s=finite(row.algbw_gbytes_per_s),
                busbw_gbytes_per_s=finite(row.busbw_gbytes_per_s),
            )
            for row in table
        ],
        fits=_fits(records, world),
        link=link,
        late_rank=_late_rank(per_rank),
        ddp_logging=None
        if ddp is None
        else {
            f"{k}_ms": finite(ddp[k] / 1e6)  # type: ignore[misc]  # DDP reports nanoseconds
            for k in (
                "avg_backward_comm_time",
                "avg_backward_compute_comm_overlap_time",
                "avg_backward_compute_time",
            )
            if isinstance(ddp.get(k), (int, float))
        },
        exposed_by_phase=_exposed_by_phase([s for steps in setting.values() for s in steps]),
    )
