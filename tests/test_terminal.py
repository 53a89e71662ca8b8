"""`render_terminal`: what `tuneup show` prints, from the typed analysis of real runs.

The committed example run (reports/example/run, made by the demo) and synthetic runs written through the
real writer, reader and analysis: the figures printed must be the analysis's own, formatted, under the
report's labels.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tuneup.analyze.model import Finding, RunAnalysis
from tuneup.cost.options import CostOptions
from tuneup.cost.pricing import PriceChoice
from tuneup.record import RankWriter, write_manifest
from tuneup.report import analyze
from tuneup.report.format import duration, ms, number, usd, usd_rate
from tuneup.report.sections.badput import label, shown
from tuneup.report.terminal import LIST_EACH_UP_TO, render_terminal

EXAMPLE_RUN = Path(__file__).resolve().parents[1] / "reports" / "example" / "run"
T0 = 1_700_000_000.0


@pytest.fixture(scope="module")
def example() -> RunAnalysis:
    # As the README's demo command priced it: --price-per-hour 1.20.
    return analyze(EXAMPLE_RUN, CostOptions(price=PriceChoice(price_per_hour=1.2, source="command line")))


def test_headline_figures_are_the_analysis_figures_formatted(example: RunAnalysis) -> None:
    out = render_terminal(example)
    lines = out.splitlines()
    tp, st, cost = example.throughput, example.step_time, example.cost
    assert cost is not None and cost.price is not None and tp.samples_per_s and st.mean_ms and st.median_ms
    throughput = next(line for line in lines if line.startswith("  throughput "))
    assert throughput.startswith("  throughput (steady-state mean, all ranks): ")
    assert f"{number(tp.samples_per_s)} samples/s" in throughput
    assert f"{number(tp.tokens_per_s)} tokens/s" in throughput
    assert f"{number(tp.steps_per_s)} training steps/s" in throughput
    # The step line names each statistic; the mean is the step the throughput is made of.
    assert (
        f"  step time: mean {ms(st.mean_ms)}, median {ms(st.median_ms)}; "
        "where it goes, mean over all ranks:" in lines
    )
    for name, phase in st.phases.items():
        assert f"    {name:<10}{phase.ms:>10.2f} ms {phase.share:>7.1%}" in lines
    assert usd_rate(cost.price.usd_per_hour, "h") == "$1.20/h"
    assert (
        f"  cost: $1.20/h (command line); {usd(cost.figures.usd_per_million_tokens)} per 1M tokens" in lines
    )
    assert not out.endswith("\n") and "run record:" not in out  # the CLI adds that line


def test_layout_is_the_readmes(example: RunAnalysis) -> None:
    lines = render_terminal(example).splitlines()
    run = example.run
    assert lines[0] == f"tuneup run {run.run_id}  ({EXAMPLE_RUN})"
    assert lines[1] == (
        "  world size 2 on 1 node(s) (vm); lightning.pytorch DDPStrategy, precision 32-true, accumulate 1"
    )
    assert lines[2] == "  model TinyLM: 437,760 parameters; batch size 16 per rank"
    assert lines[3].startswith(f"  fit {duration(example.timeline.fit_wall_s)}: training steps ")
    assert (
        lines[4]
        == f"  steps recorded {run.steps_recorded} per rank (first {example.warmup.steps} left out as warm-up)"
    )
    assert lines[5] == ""
    prefixes = [
        "  throughput ",
        "  step time: ",
        *(f"    {name}" for name in example.step_time.phases),
        "  per rank median step: rank 0 ",
        "  communication: ",
        "  hardware: process CPU ",
        "  cost: ",
        # The badput ledger (issue 29): its sentence, then a table of the categories with a share.
        "",
        "  Goodput ",
        "    ledger ",
        "    -",
        *(f"    {label(c.name)} " for c in shown(example.badput)),  # type: ignore[arg-type]
        # The convergence block: the demo's target, then each logged metric (issue 28).
        "",
        "  target: val_loss<=1.55 reached at step ",
        "  metrics logged (best, when, since the best):",
        *(f"    {curve.name}: best " for curve in example.convergence.metrics),  # type: ignore[union-attr]
        "  gradient norm ",
    ]
    # The recommendations close the summary: a blank line, their header, then one line each.
    header = next(i for i, line in enumerate(lines) if line.startswith("  recommendations ("))
    assert lines[header - 1] == ""
    advice = lines[header + 1 :]
    assert advice and all(line.startswith(("    - ", "    no ")) for line in advice), advice
    lines = lines[: header - 1]
    assert len(lines) == 6 + len(prefixes)
    for line, prefix in zip(lines[6:], prefixes, strict=True):
        assert line.startswith(prefix), (line, prefix)
    comm = example.communication
    assert comm is not None and comm.comm_ms_per_step and comm.share_of_step and comm.exposed_ms_per_step
    assert lines[prefixes.index("  communication: ") + 6] == (
        f"  communication: {comm.comm_ms_per_step:,.2f} ms of collectives per step "
        f"({comm.share_of_step:.1%} of the step), {comm.exposed_ms_per_step:,.2f} ms of it waited for"
    )


def test_findings_and_warnings_come_last(example: RunAnalysis) -> None:
    finding = Finding("slow-data", "warning", "Data loading is slow", "rank 0 waited 30 ms")
    out = render_terminal(
        dataclasses.replace(example, findings=[finding], warnings=["rank 1: line 7 is damaged"])
    )
    tail = out.splitlines()[-6:]
    assert tail == [
        "",
        "  findings:",
        "    - warning: Data loading is slow. rank 0 waited 30 ms",
        "",
        "  warnings:",
        "    - rank 1: line 7 is damaged",
    ]


def test_an_unpriced_run_prints_no_cost_and_an_old_report_no_cost_either(example: RunAnalysis) -> None:
    unpriced = analyze(EXAMPLE_RUN)
    assert unpriced.cost is not None and not unpriced.cost.priced
    assert "cost:" not in render_terminal(unpriced)
    assert "cost:" not in render_terminal(dataclasses.replace(example, cost=None))


def _write_run(path: Path, world_size: int, slow_rank: int) -> Path:
    """A run of `world_size` ranks on two hosts, 20 steps each; `slow_rank` takes 50% longer per step."""
    write_manifest(
        path,
        {
            "run_id": "wide-run",
            "created_unix": T0,
            "world_size": world_size,
            "num_nodes": 2,
            "trainer": {
                "namespace": "lightning.pytorch",
                "strategy": "DDPStrategy",
                "accelerator": "CPUAccelerator",
                "precision": "32-true",
                "accumulate_grad_batches": 1,
                "max_steps": 20,
            },
            "dataloader": {"batch_size": 4},
            "model": {"class": "TinyLM", "parameters": 2_500_000},
        },
    )
    for rank in range(world_size):
        scale = 1.5 if rank == slow_rank else 1.0 + rank / 1000
        w = RankWriter(path, rank)
        w.open({"host": f"node-{rank * 2 // world_size}", "start_unix": T0, "timing": "host"})
        for s in range(20):
            parts = {
                "data_ms": 1.0,
                "forward_ms": 30.0,
                "backward_ms": 50.0,
                "optimizer_ms": 5.0,
                "other_ms": 4.0,
            }
            parts = {k: v * scale for k, v in parts.items()}
            step: dict[str, Any] = {
                "step": s,
                "epoch": 0,
                "t_end": T0 + 0.1 * (s + 1),
                "wall_ms": sum(parts.values()),
                **parts,
                "micro_batches": 1,
                "samples": 4,
                "tokens": None,
                "loss": 1.0,
                "grad_norm": None,
                "peak_mem_bytes": None,
            }
            w.add_step(step)
        w.close(status="completed")
    return path


def test_many_ranks_print_the_spread_and_the_extremes_not_every_rank(tmp_path: Path) -> None:
    world = LIST_EACH_UP_TO + 4
    analysis = analyze(_write_run(tmp_path / "run", world, slow_rank=7))
    q = analysis.ranks.median_step_ms
    assert q is not None and analysis.ranks.slowest[0].rank == 7
    lines = render_terminal(analysis).splitlines()
    assert lines[1].startswith(f"  world size {world} on 2 node(s) (node-0, node-1);")
    assert "  model TinyLM: 2.50 M parameters; batch size 4 per rank" in lines
    spread = next(line for line in lines if line.startswith("  per rank median step"))
    assert spread == (
        f"  per rank median step, over {world} ranks: min {q.min:.2f} ms, p5 {q.p5:.2f} ms, "
        f"median {q.p50:.2f} ms, p95 {q.p95:.2f} ms, max {q.max:.2f} ms"
    )
    slowest = analysis.ranks.slowest[0]
    assert any(
        line.startswith(f"    slowest: rank 7 (node-1) {slowest.median_ms:.2f} ms, ") for line in lines
    )
    assert any(line.startswith("    fastest: rank 0 (node-0) ") for line in lines)
    assert "rank 6 " not in "\n".join(lines)  # neither among the slowest nor the fastest: not listed
    assert "tokens/s" not in "\n".join(lines)  # no token count recorded: no rate shown


def test_many_gpus_print_the_mean_and_the_least_busy(example: RunAnalysis) -> None:
    from tuneup.analyze.model import GpuSeries, GpuTelemetry, Series

    empty = Series([], [])

    def gpu(index: int, util: float) -> GpuTelemetry:
        return GpuTelemetry(
            "node-a", index, None, False, util, util, None, None, None, None, None, None, None, None, None, [],
            GpuSeries(empty, empty, empty),
        )  # fmt: skip

    few = [gpu(0, 90.0), gpu(1, 40.0)]
    many = [gpu(i, 90.0 if i != 5 else 10.0) for i in range(LIST_EACH_UP_TO + 2)]
    with_few = dataclasses.replace(example, telemetry=dataclasses.replace(example.telemetry, gpus=few))
    assert ", GPU 0 utilization 90%, GPU 1 utilization 40%" in render_terminal(with_few)
    with_many = dataclasses.replace(example, telemetry=dataclasses.replace(example.telemetry, gpus=many))
    hardware = next(
        line for line in render_terminal(with_many).splitlines() if line.startswith("  hardware:")
    )
    assert hardware.endswith(", GPU utilization 82% mean over 10 GPUs, lowest 10% (GPU 5 on node-a)")
