"""What ran, where and for how long (the report's run section), and which leading steps were warm-up."""

from __future__ import annotations

import statistics

from tuneup._stats import finite
from tuneup.analyze.model import FsdpSettings, Hardware, RunInfo, Warmup
from tuneup.analyze.steady import DECAY_RATIO, PLATEAU_MIN_STEPS, WARMUP_FACTOR, WARMUP_MAX_SHARE
from tuneup.analyze.timeline import ENDED_REASONS, fit_span, rank_stop_reason
from tuneup.record.schema import STOP_USER_INTERRUPT, RankRecord, Run
from tuneup.tags import recorded_tags

# Spelled from steady.py's constants, so the rule the report states is the rule that ran.
WARMUP_RULE = (
    f"leading steps until the first step, and the window it starts, within {WARMUP_FACTOR:g}x the steady "
    f"step time (median of the run's second half); at most {WARMUP_MAX_SHARE:.0%} of the recorded steps, "
    f"and a slow lead of over {PLATEAU_MIN_STEPS} steps only if it falls (its first half {DECAY_RATIO:g}x "
    f"slower than its second): a flat one is a plateau, of which only the steps above {WARMUP_FACTOR:g}x its "
    "level are warm-up, the rest kept in the figures as a slow period"
)


# How a rank's fit ended, in one vocabulary for the run section, the segments and `tuneup show`, from the
# stop reason the record keeps (rank_stop_reason): the status the callback closed the record with says
# only which hook closed it ("interrupted" for a KeyboardInterrupt, "exception" for any other, Lightning's
# SIGTERM included), which contradicted the stop reason shown beside it.
STATUS_COMPLETED = "completed"
STATUS_NOT_CLOSED = "not closed"  # killed, or still running (findings.py warns of it)
_STATUS_BY_REASON = {
    STOP_USER_INTERRUPT: "stopped by the user (Ctrl-C)",
    "sigterm": "terminated (SIGTERM)",
    "exception": "failed (an exception)",
}


def rank_status(rec: RankRecord) -> str:
    """How this rank's fit ended: completed, stopped by the user, terminated, failed, or not closed."""
    if not rec.info.closed:
        return STATUS_NOT_CLOSED
    reason = rank_stop_reason(rec)
    if reason in _STATUS_BY_REASON:
        return _STATUS_BY_REASON[reason]
    raw = rec.info.raw.get("status")
    if reason in ENDED_REASONS or raw == STATUS_COMPLETED:
        return STATUS_COMPLETED
    return str(raw or "closed")


def run_span(run: Run) -> tuple[float, float]:
    """The job's start (the earliest rank's fit start) and end (the latest rank's fit end, or its last
    step's where the end was not recorded), in Unix seconds: what the job ran, and was paid, for."""
    spans = [fit_span(rec) for rec in run.ranks.values()]
    starts = [start for start, _, _ in spans if start]
    ends = [end for _, end, _ in spans if end]
    t0 = min(starts) if starts else (min(ends) if ends else run.manifest.created_unix)
    return t0, (max(ends) if ends else t0)


def _hosts(run: Run) -> dict[str, str]:
    """Each rank's host: its own record's, else (a rank that left none) the host rank 0 gathered at setup."""
    gathered = run.manifest.raw.get("hosts_by_rank")
    hosts = {}
    if isinstance(gathered, list) and len(gathered) == run.manifest.world_size:
        hosts = {str(r): str(h) for r, h in enumerate(gathered) if isinstance(h, str)}
    return {**hosts, **{str(r): h for r, h in run.rank_hosts.items()}}


def _micro_batches_per_step(run: Run) -> int:
    """Micro-batches per optimizer step as the steps counted them, for a trainer that does not say its
    accumulation (a plain loop, Fabric): the most common count of the lowest rank's steps; 1 without steps."""
    rank = min(run.ranks, default=None)
    counts = [s.micro_batches for s in run.ranks[rank].steps if s.micro_batches] if rank is not None else []
    return statistics.mode(counts) if counts else 1


def run_info(run: Run, t0: float, t_end: float) -> RunInfo:
    m = run.manifest
    t = m.trainer
    host = m.environment.get("host") or {}
    gpus = (m.gpus or {}).get("gpus") or []
    batch = m.dataloader.get("batch_size")
    accumulate = t.get("accumulate_grad_batches") or _micro_batches_per_step(run)
    return RunInfo(
        run_id=m.run_id,
        path=run.location,
        world_size=m.world_size,
        num_nodes=m.num_nodes,
        ranks_present=sorted(run.ranks),
        missing_ranks=run.missing_ranks,
        hosts=_hosts(run),
        namespace=t.get("namespace"),
        strategy=t.get("strategy"),
        accelerator=t.get("accelerator"),
        precision=t.get("precision"),
        accumulate_grad_batches=accumulate,
        batch_size_per_rank=batch,
        global_batch_size=batch * accumulate * m.world_size if isinstance(batch, int) else None,
        max_steps=t.get("max_steps"),
        max_epochs=t.get("max_epochs"),
        model_class=m.model.get("class"),
        parameters=m.model.get("parameters"),
        trainable_parameters=m.model.get("trainable_parameters"),
        hardware=Hardware(
            cpu_model=host.get("cpu_model"),
            cpu_count=host.get("cpu_count_logical"),
            ram_total_bytes=host.get("ram_total_bytes"),
            gpu_names=sorted({str(g.get("name")) for g in gpus if isinstance(g, dict)}),
            gpus_per_node=len(gpus),
            driver_version=(m.gpus or {}).get("driver_version"),
        ),
        start_unix=finite(t0),
        end_unix=finite(t_end),
        duration_s=finite(t_end - t0),
        steps_recorded=max((len(rec.steps) for rec in run.ranks.values()), default=0),
        last_step=max((rec.steps[-1].step for rec in run.ranks.values() if rec.steps), default=None),
        status={str(r): rank_status(rec) for r, rec in sorted(run.ranks.items())},
        data_timing=sorted(
            {
                str(rec.info.raw.get("data_timing"))
                for rec in run.ranks.values()
                if rec.info.raw.get("data_timing")
            }
        ),
        timing=sorted({rec.info.timing for rec in run.ranks.values() if rec.info.timing}),
        start_method=t.get("start_method") if m.world_size > 1 else None,
        **_sampling(run),
        adapter=_adapter(run),
        fsdp=_fsdp(m.model.get("fsdp")),
        tags=recorded_tags(m.raw.get("tags")),
    )


def _adapter(run: Run) -> str | None:
    """The adapter that recorded the run, as the lowest rank that says it (its info) names it; a plain loop's
    manifest names it too."""
    said = [rec.info.raw.get("adapter") for _, rec in sorted(run.ranks.items())]
    named = [name for name in [*said, run.manifest.trainer.get("adapter")] if isinstance(name, str)]
    return named[0] if named else None


def _sampling(run: Run) -> dict[str, int | None]:
    """How the record sampled the steps (tuneup.record.writer.RecordingPolicy): every step up to
    `detail_steps`, then the multiples of a stride (`sample_stride`; records written before it was kept
    used `sample_every` itself)."""
    recording = run.manifest.recording
    # A record still being written (or killed) has no steps_seen yet: its windows count every step so far.
    seen = [
        max(rec.info.steps_seen or 0, sum(w.count for w in rec.windows), len(rec.steps))
        for rec in run.ranks.values()
    ]
    stride = recording.get("sample_stride", recording.get("sample_every"))
    detail = recording.get("detail_steps")
    return {
        "steps_seen": max(seen) if seen and max(seen) else None,
        "detail_steps": detail if isinstance(detail, int) else None,
        "sample_every": stride if isinstance(stride, int) else None,
    }


# Fewer steady steps than this on every rank make no steady state: a mean of a couple of steps is those
# steps' accident, and the first steps of a fit carry its setup (and the one step whose FLOPs are counted).
MIN_STEADY_STEPS = 5


def no_steady_state(run: Run, warm: dict[int, int]) -> str | None:
    """Why the run is too short for steady-state figures, or None."""
    if run.manifest.trainer.get("fast_dev_run"):
        return "a fast_dev_run trains a single batch or a few, to test the code: too few steps to time"
    steady = max((len(rec.steps) - warm.get(r, 0) for r, rec in run.ranks.items()), default=0)
    if steady < MIN_STEADY_STEPS:
        recorded = max((len(rec.steps) for rec in run.ranks.values()), default=0)
        return (
            f"{recorded} step(s) recorded, {max(steady, 0)} after warm-up: at least {MIN_STEADY_STEPS} steady "
            "steps are needed for a throughput or step time worth quoting"
        )
    return None


def warmup(run: Run, warm: dict[int, int], first_steady_step: int | None) -> Warmup:
    recorded = max((len(rec.steps) for rec in run.ranks.values()), default=0)
    steps = max(warm.values(), default=0)
    return Warmup(
        steps=steps,
        per_rank={str(r): n for r, n in sorted(warm.items())},
        share=steps / recorded if recorded else 0.0,
        # Steady on every rank from here on: the warm-up of the rank that took longest to settle.
        first_steady_step=first_steady_step,
        no_steady_state=no_steady_state(run, warm),
        rule=WARMUP_RULE,
    )


def _fsdp(section: object) -> FsdpSettings | None:
    """The manifest's model.fsdp (tuneup/recording/describe.py), each field kept only where it has its type."""
    if not isinstance(section, dict) or not isinstance(section.get("units"), int):
        return None

    def text(key: str) -> str | None:
        value = section.get(key)
        return value if isinstance(value, str) else None

    reshard = section.get("reshard_after_forward")
    return FsdpSettings(
        units=section["units"],
        reshard_after_forward=reshard if isinstance(reshard, (bool, str)) else None,
        param_dtype=text("param_dtype"),
        reduce_dtype=text("reduce_dtype"),
        offload=text("offload"),
    )
