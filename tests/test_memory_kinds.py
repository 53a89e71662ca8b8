"""Memory by kind: counted from the tensors (exact bytes), read from the record, and reported. The live
2-rank runs are checked where they are already recorded: FSDP2 in tests/test_comm.py, DDP in
tests/test_report.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.synthetic import step_record
from tuneup import load_run
from tuneup.analyze.memory_kinds import memory_section
from tuneup.record import RankWriter, write_manifest
from tuneup.recording.memory_kinds import memory_by_kind
from tuneup.report import write_report


def test_each_kind_is_the_bytes_its_tensors_hold() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 10)).sum().backward()
    before_step = memory_by_kind(model.parameters(), [optimizer])
    params = (10 * 4 + 4 + 4 * 2 + 2) * 4  # float32
    assert before_step == {
        "parameters_bytes": params,
        "parameters_unsharded_bytes": params,
        "sharded_parameters": 0,
        "gradients_bytes": params,
        "optimizer_state_bytes": 0,  # Adam creates its moments at the first step
    }
    optimizer.step()
    after = memory_by_kind(model.parameters(), [optimizer, optimizer])  # one optimizer named twice: once
    # exp_avg and exp_avg_sq are parameter-sized; each parameter's `step` is a float32 scalar tensor.
    assert after["optimizer_state_bytes"] == 2 * params + 4 * 4
    optimizer.zero_grad(set_to_none=True)
    assert memory_by_kind(model.parameters(), [])["gradients_bytes"] is None  # unknown, not zero


def test_a_tied_weight_is_counted_once() -> None:
    embed = torch.nn.Embedding(7, 3)
    head = torch.nn.Linear(3, 7, bias=False)
    head.weight = embed.weight
    kinds = memory_by_kind([embed.weight, head.weight], [])
    assert kinds["parameters_bytes"] == 7 * 3 * 4


def _write_run(tmp_path: Path, events: dict[int, list[dict]]) -> Path:
    """A synthetic record (tests/synthetic.py, through the real writer) whose ranks carry `events`."""
    path = tmp_path / "run"
    write_manifest(path, {"run_id": "r1", "created_unix": 1.0, "world_size": len(events), "num_nodes": 1})
    for rank, evs in events.items():
        w = RankWriter(path, rank)
        w.open({"host": "node0"})
        for s in range(20):
            w.add_step(step_record(s))
        for e in evs:
            w.add_event(**e)
        w.close(status="completed")
    return path


SHARD = {
    "kind": "memory_kinds",
    "step": 1,
    "parameters_bytes": 600,
    "parameters_unsharded_bytes": 1200,
    "sharded_parameters": 4,
    "gradients_bytes": 600,
    "optimizer_state_bytes": 1200,
}


def test_the_fullest_rank_heads_the_figures_and_a_damaged_event_is_unknown(tmp_path: Path) -> None:
    fuller = {**SHARD, "parameters_bytes": 700, "gradients_bytes": 700}
    damaged = {**SHARD, "optimizer_state_bytes": "lots"}
    run = load_run(_write_run(tmp_path, {0: [SHARD], 1: [fuller], 2: [damaged]}))
    m = memory_section(run)
    assert m is not None and m.sharded
    assert [r.rank for r in m.ranks] == [0, 1]  # rank 2's event is damaged: unknown, not zero
    assert (m.rank, m.held_bytes) == (1, 700 + 700 + 1200)
    assert m.peak_allocated_bytes is None and any("rank(s) 2" in n for n in m.notes)
    assert any("on CPU" in n for n in m.notes)


def test_a_run_without_the_event_has_no_memory_section_and_says_why(tmp_path: Path) -> None:
    run_dir = _write_run(tmp_path, {0: []})
    assert memory_section(load_run(run_dir)) is None
    written = write_report(run_dir, tmp_path / "report", formats=("md",))
    md = next(p for p in written.files if p.name == "report.md").read_text()
    assert "Memory by kind was not recorded" in md


@pytest.mark.parametrize("peak", [None, 5000])
def test_the_section_shows_held_and_whole_and_the_peak_only_where_measured(
    tmp_path: Path, peak: int | None
) -> None:
    event = (
        dict(SHARD) if peak is None else {**SHARD, "peak_allocated_bytes": peak, "other_at_peak_bytes": 2000}
    )
    run_dir = _write_run(tmp_path, {0: [event], 1: [event]})
    written = write_report(run_dir, tmp_path / "report", formats=("md", "json"))
    md = next(p for p in written.files if p.name == "report.md").read_text()
    section = md.split("## Memory by kind", 1)[1].split("\n## ", 1)[0]
    assert "rank 0 holds 600 B of 1.17 KiB (50.0%)" in section
    assert "| Optimizer state | 1.17 KiB |" in section
    assert ("Peak allocated" in section) == (peak is not None)
    assert ("| Other at the peak | 1.95 KiB | — | 40.0% |" in section) == (peak is not None)
    report = json.loads(next(p for p in written.files if p.name == "report.json").read_text())
    assert report["memory"]["held_bytes"] == 600 + 600 + 1200
