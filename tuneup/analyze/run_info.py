"""What ran, where and for how long (the report's run section), and which leading steps were warm-up."""

from __future__ import annotations

from tuneup._stats import finite
from tuneup.analyze.model import Hardware, RunInfo, Warmup
from tuneup.record.schema import Run

WARMUP_RULE = (
    "leading steps until the first step, and the window it starts, within 1.5x the steady step time "
    "(median of the run's second half)"
)


def run_span(run: Run) -> tuple[float, float]:
    """The run's start (the earliest rank start) and end (the last kept step's end), in Unix seconds."""
    starts = [rec.info.start_unix for rec in run.ranks.values() if rec.info.start_unix]
    ends = [rec.steps[-1].t_end for rec in run.ranks.values() if rec.steps]
    t0 = min(starts) if starts else (min(ends) if ends else run.manifest.created_unix)
    return t0, (max(ends) if ends else t0)


def run_info(run: Run, t0: float, t_end: float) -> RunInfo:
    m = run.manifest
    t = m.trainer
    host = m.environment.get("host") or {}
    gpus = (m.gpus or {}).get("gpus") or []
    batch = m.dataloader.get("batch_size")
    accumulate = t.get("accumulate_grad_batches") or 1
    return RunInfo(
        run_id=m.run_id,
        path=str(run.path),
        world_size=m.world_size,
        num_nodes=m.num_nodes,
        ranks_present=sorted(run.ranks),
        missing_ranks=run.missing_ranks,
        hosts={str(r): h for r, h in run.rank_hosts.items()},
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
        status={
            str(r): rec.info.raw.get("status") or ("not closed" if not rec.info.closed else "closed")
            for r, rec in sorted(run.ranks.items())
        },
        data_timing=sorted(
            {
                str(rec.info.raw.get("data_timing"))
                for rec in run.ranks.values()
                if rec.info.raw.get("data_timing")
            }
        ),
        timing=sorted({rec.info.timing for rec in run.ranks.values() if rec.info.timing}),
    )


def warmup(run: Run, warm: dict[int, int], first_steady_step: int | None) -> Warmup:
    recorded = max((len(rec.steps) for rec in run.ranks.values()), default=0)
    steps = max(warm.values(), default=0)
    return Warmup(
        steps=steps,
        per_rank={str(r): n for r, n in sorted(warm.items())},
        share=steps / recorded if recorded else 0.0,
        # Steady on every rank from here on: the warm-up of the rank that took longest to settle.
        first_steady_step=first_steady_step,
        rule=WARMUP_RULE,
    )
