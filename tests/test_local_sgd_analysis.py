"""A run on TuneupDDPStrategy(local_sgd_period=H) read phase by phase: its exact warm-up (a gradient all-reduce
every step, waited for in backward) and its local steps (no collective, and every H-th one a parameter average
after the optimizer, in "other"). A local step records no communication figure; these tests hold the analysis
and the advice's observation to what such a run did, on a synthetic record whose every figure is known, and
the step-time model to a measured change on the accuracy benchmark's recorded local SGD run.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.archives import extract_all
from tuneup.advise import communication, interconnect
from tuneup.advise.context import AdviceContext
from tuneup.advise.observe import Observation, observe
from tuneup.advise.outcomes import Economics
from tuneup.advise.step_model import fit_step_model
from tuneup.analyze.model import LinkCheck, RunAnalysis
from tuneup.record import RankWriter, load_run, write_manifest
from tuneup.record.schema import MetricRecord, StepRecord
from tuneup.report import analyze
from tuneup.report.markdown import render_markdown

from synthetic import step_record

PERIOD = 4
# Exact steps before the strategy starts: over half of the run, so that the median step is an exact one.
WARMUP = 32
STEPS = 56  # 24 local steps: 6 averages
GRADIENT_BYTES = 1_000_000
# Per step: data, forward, backward's compute, optimizer, the loop's own time.
DATA_MS, FORWARD_MS, BACKWARD_MS, OPTIMIZER_MS, LOOP_MS = 0.5, 2.0, 3.0, 1.0, 0.5
# The exact steps' gradient all-reduce: 12 ms, all of it waited for after backward (gloo on a busy CPU, as
# the accuracy benchmark's run measured it).
ALLREDUCE_MS = EXPOSED_MS = 12.0
# A parameter average: its collective takes 8 ms, and with the copies into and out of its flat buffer it
# costs the step 20 ms, all in "other".
AVERAGE_COLLECTIVE_MS, AVERAGE_MS = 8.0, 20.0
COMPUTE_MS = FORWARD_MS + BACKWARD_MS


def _step(s: int) -> dict:
    local = s >= WARMUP
    averages = local and (s - WARMUP + 1) % PERIOD == 0
    backward = BACKWARD_MS + (0.0 if local else EXPOSED_MS)
    other = LOOP_MS + (AVERAGE_MS if averages else 0.0)
    record = step_record(s)
    record.update(
        data_ms=DATA_MS,
        forward_ms=FORWARD_MS,
        backward_ms=backward,
        optimizer_ms=OPTIMIZER_MS,
        other_ms=other,
        wall_ms=DATA_MS + FORWARD_MS + backward + OPTIMIZER_MS + other,
        samples=16,
    )
    if not local:
        record.update(
            comm_ms=ALLREDUCE_MS, comm_exposed_ms=EXPOSED_MS, comm_bytes=GRADIENT_BYTES, comm_count=1
        )
        record["_collectives"] = [
            {"kind": "all_reduce", "bytes": GRADIENT_BYTES, "duration_ms": ALLREDUCE_MS, "bucket": 0,
             "source": "ddp_hook", "world_size": 2, "dtype": "float32"}
        ]  # fmt: skip
    elif averages:
        # What tuneup.collect.comm records: the average's collective is exposed whole.
        record.update(
            comm_ms=AVERAGE_COLLECTIVE_MS,
            comm_exposed_ms=AVERAGE_COLLECTIVE_MS,
            comm_bytes=GRADIENT_BYTES,
            comm_count=1,
        )
        record["_collectives"] = [
            {"kind": "all_reduce", "bytes": GRADIENT_BYTES, "duration_ms": AVERAGE_COLLECTIVE_MS, "bucket": None,
             "source": "param_avg", "world_size": 2, "dtype": "float32"}
        ]  # fmt: skip
    # A local step between averages ran no collective: its record has no communication figure.
    return record


def _write_local_sgd_run(path: Path, validation_steps: tuple[int, ...] = ()) -> Path:
    write_manifest(
        path,
        {
            "run_id": "local",
            "created_unix": 1.0,
            "world_size": 2,
            "num_nodes": 1,
            "dataloader": {"batch_size": 16},
        },
    )
    label = f"local SGD, H={PERIOD}"
    described = {
        "label": label,
        "config": {"compression": "none", "local_sgd_period": PERIOD, "warmup_steps": WARMUP},
        "start_step": WARMUP,
        "hierarchical": False,
        "nodes": 1,
    }
    for rank in (0, 1):
        w = RankWriter(path, rank)
        w.open({"host": "node0"})
        w.add_event("sync_strategy", **described)
        for s in range(STEPS):
            w.add_step(_step(s))
            if s + 1 in validation_steps:  # val_loss read after s + 1 optimizer steps
                w.add_metric(MetricRecord("val_loss", 2.0 - s / 100, s + 1, 1.0 + s, "validation"))
            if s + 1 == WARMUP:
                w.add_event("sync_started", step=WARMUP, mode="local", label=label)
        w.add_event(
            "sync_summary",
            **described,
            steps=STEPS,
            started_at=WARMUP,
            mode_at_end=label,
            hook_iterations=WARMUP,
            exact_bytes=GRADIENT_BYTES * WARMUP,
            sent_bytes=GRADIENT_BYTES * WARMUP,
            check_bytes=0,
            param_avg_bytes=GRADIENT_BYTES * (STEPS - WARMUP) // PERIOD,
            checks=0,
            breached_checks=0,
            fallbacks=[],
            check_history=[],
        )
        w.close(status="completed")
    return path


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> RunAnalysis:
    return analyze(_write_local_sgd_run(tmp_path_factory.mktemp("local_sgd") / "run"))


def test_a_local_phase_communicates_its_collective_time_over_all_of_its_steps(local_run: RunAnalysis) -> None:
    # The mean over the steps that recorded a figure was the averaging steps' (8 ms, one step in 4) or,
    # with the warm-up mixed in, the exact steps' 12 ms: per step the phase spent 8 ms over 4 steps.
    comm = local_run.communication
    assert comm is not None
    assert comm.comm_ms_per_step == pytest.approx(AVERAGE_COLLECTIVE_MS / PERIOD)
    assert comm.exposed_ms_per_step == pytest.approx(AVERAGE_COLLECTIVE_MS / PERIOD)
    mean_local_step = (4 * (DATA_MS + COMPUTE_MS + OPTIMIZER_MS + LOOP_MS) + AVERAGE_MS) / PERIOD
    assert comm.share_of_step == pytest.approx(AVERAGE_COLLECTIVE_MS / PERIOD / mean_local_step, rel=1e-3)
    assert all(r.comm_ms == pytest.approx(AVERAGE_COLLECTIVE_MS / PERIOD) for r in comm.per_rank)
    assert all(r.bytes_per_step == pytest.approx(GRADIENT_BYTES / PERIOD) for r in comm.per_rank)
    sync = local_run.sync_strategy
    assert sync is not None
    # The phases side by side: the warm-up's all-reduce per exact step, the local phase's wait per local step.
    assert sync.exact_comm_ms == pytest.approx(ALLREDUCE_MS)
    assert sync.exact_exposed_comm_ms == pytest.approx(EXPOSED_MS)
    assert sync.strategy_exposed_comm_ms == pytest.approx(AVERAGE_COLLECTIVE_MS / PERIOD)


def test_compute_is_forward_and_backward_without_the_warmups_wait(local_run: RunAnalysis) -> None:
    # The exposed wait was subtracted from forward and backward whatever phase it was measured in: the
    # averages' wait (in "other") and the warm-up's (in backward, on a share of the steps) taken as every
    # step's, compute came out far below the 5 ms every step spent in forward and backward.
    o = observe(local_run)
    assert o.local_sgd_period == PERIOD
    assert o.compute_per_micro_batch_ms == pytest.approx(COMPUTE_MS)
    # The gradient all-reduce the model holds its collectives to: the exact warm-up's, per step that ran it.
    assert (o.comm_ms, o.exposed_ms, o.comm_bytes) == pytest.approx(
        (ALLREDUCE_MS, EXPOSED_MS, GRADIENT_BYTES)
    )
    sync = local_run.sync_strategy
    assert sync is not None
    assert o.synced_share == pytest.approx(
        sync.exact_steps_timed / (sync.exact_steps_timed + sync.strategy_steps_timed)
    )
    assert 0 < o.synced_share < 1


def test_the_average_costs_what_the_averaging_steps_took_over_the_other_local_steps(
    local_run: RunAnalysis,
) -> None:
    # A median over both phases is an exact step (the warm-up's are most of the steady steps and the slower
    # ones), so the strategy's mean step less it read 0 ms. An average cost the step 20 ms: 5 ms a step.
    o = observe(local_run)
    assert local_run.sync_strategy is not None and local_run.sync_strategy.averaging_ms == pytest.approx(
        AVERAGE_MS
    )
    assert o.averaging_ms == pytest.approx(AVERAGE_MS)
    assert o.averaging_per_step_ms == pytest.approx(AVERAGE_MS / PERIOD * (1 - o.synced_share))
    model = fit_step_model([o])
    local_step = model.predict(dataclasses.replace(model.setting(), local_sgd_period=PERIOD))
    assert local_step.terms_ms["averaging"] == pytest.approx(AVERAGE_MS / PERIOD)
    assert local_step.terms_ms["compute"] == pytest.approx(COMPUTE_MS)
    # The loop's own time is the loop's: the averages are not in it, to be doubled by accumulation.
    assert local_step.terms_ms["other"] == pytest.approx(LOOP_MS, abs=0.3)


def test_the_communication_advice_weighs_what_the_mean_step_waited(local_run: RunAnalysis) -> None:
    # The communication rule judged a local SGD run by its exact steps' wait, as if every step waited 12 ms
    # after backward: the mean step waited that on the warm-up's share of the steps, and 5 ms a step (an
    # average every 4) on the rest.
    o = observe(local_run)
    ctx = AdviceContext(
        analysis=local_run, observation=o, model=fit_step_model([o]),
        economics=Economics(None, None, None, o.samples_per_step), objective="samples/s",
    )  # fmt: skip
    waited = EXPOSED_MS * o.synced_share + AVERAGE_MS / PERIOD * (1 - o.synced_share)
    evidence = [e for rec in communication.recommend(ctx) for e in rec.evidence]
    assert f"{waited:.1f} ms waited a step ({waited / o.step_mean_ms:.1%} of the" in " ".join(evidence)


# -- the accuracy benchmark's local SGD run ---------------------------------------------------------------

ARCHIVE = Path(__file__).parent / "data" / "advise_accuracy.tgz"


@dataclass(frozen=True)
class Recorded:
    analysis: RunAnalysis
    observation: Observation
    local: list[StepRecord]  # both ranks' local SGD steps, from the record itself
    averaging: list[StepRecord]  # of them, those that averaged
    workload: dict  # the benchmark's measurements (results.json)


@pytest.fixture(scope="module")
def benchmark_run(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    out = tmp_path_factory.mktemp("advise_accuracy_local_sgd")
    with tarfile.open(ARCHIVE) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith("advise_accuracy/local-sgd/base-0")]
        extract_all(tar, out, [*members, tar.getmember("advise_accuracy/results.json")])
    root = out / "advise_accuracy"
    results = json.loads((root / "results.json").read_text(encoding="utf-8"))["results"]
    (workload,) = [r for r in results if r["workload"] == "local-sgd"]
    run = load_run(root / "local-sgd" / "base-0")
    analysis = analyze(root / "local-sgd" / "base-0")
    assert analysis.sync_strategy is not None and analysis.sync_strategy.started_at is not None
    # Its 100 local steps are far past the record's warm-up (which the analysis leaves out): all steady.
    started_at = analysis.sync_strategy.started_at
    local = [s for rec in run.ranks.values() for s in rec.steps if s.step >= started_at]
    averaged = {
        (r, c.step) for r, rec in run.ranks.items() for c in rec.collectives if c.source == "param_avg"
    }
    averaging = [s for r, rec in run.ranks.items() for s in rec.steps if (r, s.step) in averaged]
    return Recorded(analysis, observe(analysis), local, averaging, workload)


def test_the_benchmarks_local_sgd_run_is_read_phase_by_phase(benchmark_run: Recorded) -> None:
    # Read before: communication 14.6 ms per step (the exact steps' and the averages' own), compute 0.0 ms per
    # micro-batch, an average 0.0 ms.
    local, averaging = benchmark_run.local, benchmark_run.averaging
    assert len(local) == 200 and len(averaging) == 50  # 2 ranks, 100 local steps, every 4th averaged
    comm = benchmark_run.analysis.communication
    assert comm is not None
    assert comm.comm_ms_per_step == pytest.approx(sum(s.comm_ms or 0.0 for s in local) / len(local))
    # Compute is what forward and backward took where nothing was waited for in them: the local steps.
    o = benchmark_run.observation
    measured = statistics.fmean(s.forward_ms + s.backward_ms for s in local)
    assert o.compute_per_micro_batch_ms == pytest.approx(measured, rel=0.15)
    ids = {id(s) for s in averaging}
    between = statistics.fmean(s.wall_ms for s in local if id(s) not in ids)
    assert o.averaging_ms == pytest.approx(statistics.fmean(s.wall_ms for s in averaging) - between)
    assert o.local_sgd_period == 4 and o.averaging_ms is not None and o.averaging_ms > 10.0


def test_accumulation_on_a_local_sgd_run_is_predicted_near_what_it_measured(benchmark_run: Recorded) -> None:
    # Predicted +19.1% [+13.4, +25.0] and measured +48.6% and +50.2% (benchmarks/README.md, miss 3): compute
    # read 0 and the loop's time ("other", which held the averages) doubled with the accumulation. Now the
    # averages stay one a step; what is left is the model's (a second micro-batch cost less than the first).
    o = benchmark_run.observation
    (arm,) = [a for a in benchmark_run.workload["arms"] if a["changes"] == {"accumulate_grad_batches": "2"}]
    measured = statistics.median(arm["pair_gains"])
    model = fit_step_model([o])
    base = model.predict(model.setting()).mean_ms.value
    doubled = model.predict(dataclasses.replace(model.setting(), accumulate_grad_batches=2)).mean_ms.value
    predicted = 2 * base / doubled - 1
    assert abs((1 + predicted) / (1 + measured) - 1) < 0.10, (predicted, measured)


def test_the_report_shows_what_an_average_and_an_exact_all_reduce_cost(local_run: RunAnalysis) -> None:
    md = render_markdown(local_run, [])
    part = md[md.index("## Gradient synchronisation") :]
    all_reduce = next(
        line for line in part.splitlines() if line.startswith("| Gradient all-reduce, each exact")
    )
    average = next(line for line in part.splitlines() if line.startswith("| One parameter average"))
    assert f"{ALLREDUCE_MS:.1f} ms" in all_reduce and f"{AVERAGE_MS:.1f} ms" in average, (all_reduce, average)


def test_a_faster_link_saves_what_the_mean_step_waited_not_the_warmups_wait_at_every_step(
    local_run: RunAnalysis,
) -> None:
    # At half the reference bandwidth a link at the reference halves the collectives' wait: the mean step's
    # (the warm-up's 12 ms on its share of the steps, and the averages), not 12 ms at every step.
    o = observe(local_run)
    ctx = AdviceContext(
        analysis=local_run, observation=o, model=fit_step_model([o]),
        economics=Economics(None, None, None, o.samples_per_step), objective="samples/s",
    )  # fmt: skip
    link = LinkCheck(name="test link", reason="test", source=None, ratio=0.5)
    predicted = interconnect._scaled_exposed(ctx, link)
    assert predicted is not None
    waited_ms = EXPOSED_MS * o.synced_share + AVERAGE_MS / PERIOD * (1 - o.synced_share)
    assert predicted.step_ms.value == pytest.approx(
        ctx.current.step_ms.value * (o.step_mean_ms - waited_ms / 2) / o.step_mean_ms
    )


def test_validations_between_parameter_averages_are_named(tmp_path: Path) -> None:
    """Averages follow local steps 35, 39, ... (every PERIOD-th from the start at 32): a validation after 36
    or 40 steps reads the averaged model, one after 34 or 42 each rank's drifted own; the exact warm-up's (20)
    are the same model on every rank."""
    run = analyze(_write_local_sgd_run(tmp_path / "misaligned", validation_steps=(20, 34, 36, 42, 44)))
    assert run.convergence is not None and run.convergence.local_sgd_period == PERIOD
    assert run.convergence.validations_between_averages == [34, 42]
    (finding,) = [f for f in run.findings if f.id == "validation_between_averages"]
    assert "34, 42" in finding.evidence and f"a multiple of {PERIOD}" in finding.evidence
    aligned = analyze(_write_local_sgd_run(tmp_path / "aligned", validation_steps=(20, 36, 40, 44)))
    assert aligned.convergence is not None and aligned.convergence.validations_between_averages == []
    assert not [f for f in aligned.findings if f.id == "validation_between_averages"]
