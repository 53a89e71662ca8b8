"""The report's gradient synchronisation section, from real TuneupDDPStrategy runs (tests/data/sync_runs.tgz:
2 gloo ranks, the demo transformer, 20 exact warm-up steps, then fp16, PowerSGD rank 4, local SGD with H=4,
and PowerSGD with an injected fault that makes the safeguard fall back at step 50) and from synthetic
records for what those runs cannot show (a hierarchical job over two nodes, a strategy that never started).
"""

from __future__ import annotations

import json
import re
import tarfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.archives import extract_all
from tuneup.analyze.analysis import analyze_run
from tuneup.analyze.model import RunAnalysis, SyncStrategy, from_json
from tuneup.record import RankWriter, load_run, write_manifest
from tuneup.report import report_schema, write_analysis
from tuneup.report.sections import sync_strategy as section

from synthetic import make_run, step_record

RUNS = Path(__file__).parent / "data" / "sync_runs.tgz"
# The demo transformer's gradient: 437,760 float32 parameters in two DDP buckets.
EXACT_BYTES = 437_760 * 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunAnalysis]:
    out = tmp_path_factory.mktemp("sync_runs")
    with tarfile.open(RUNS) as tar:
        extract_all(tar, out)
    return {
        name: analyze_run(load_run(out / name)) for name in ("fp16", "local4", "powersgd", "powersgd_fault")
    }


def sync_of(analysis: RunAnalysis) -> SyncStrategy:
    assert analysis.sync_strategy is not None
    return analysis.sync_strategy


def test_powersgd_sends_over_ten_times_fewer_bytes_than_exact(runs: dict[str, RunAnalysis]) -> None:
    sync = sync_of(runs["powersgd"])
    assert sync.label == "PowerSGD rank 4" and sync.mode_at_end == "PowerSGD rank 4"
    assert (sync.start_step, sync.started_at, sync.end_step, sync.steps) == (20, 20, None, 120)
    assert sync.exact_bytes_per_step == EXACT_BYTES
    assert sync.bytes_ratio is not None and sync.bytes_ratio >= 10
    # Rank-4 factors of both buckets: the records and the strategy's own count agree to the byte.
    assert sync.sent_bytes_per_step == sync.counted_bytes_per_step == 118_784
    assert sync.strategy_steps == 100  # steps 20-119
    assert sync.cross_node_ratio is None and not sync.hierarchical and sync.nodes == 1
    # Each check all-reduces a slice of one bucket exactly: a few percent of what PowerSGD itself sent
    # (whole buckets cost half as much again as the compressed traffic).
    assert sync.check_bytes is not None and sync.check_bytes > 0
    assert sync.check_overhead_share == pytest.approx(sync.check_bytes / (118_784 * 100))
    assert sync.check_overhead_share < 0.05
    # Every 10 steps from the start, every 20 after five clean checks in a row.
    assert [c.step for c in sync.checks] == [30, 40, 50, 60, 70, 90, 110]
    assert all(c.error is not None for c in sync.checks)
    assert not sync.fallbacks and not any(c.breached for c in sync.checks)
    assert section.ratio_text(sync.bytes_ratio) == "14.7× fewer"


def test_the_fault_falls_back_at_step_50_and_only_the_steps_before_count(
    runs: dict[str, RunAnalysis],
) -> None:
    sync = sync_of(runs["powersgd_fault"])
    (fallback,) = sync.fallbacks
    assert (fallback.step, fallback.from_mode, fallback.to_mode) == (
        50,
        "PowerSGD rank 4",
        "exact all-reduce",
    )
    assert re.fullmatch(r"compression error 1\.\d\d above its bound 0\.95", fallback.reasons[0])
    assert "mean loss 19.47 is +266%" in fallback.reasons[1]
    assert sync.end_step == 50 and sync.mode_at_end == "exact all-reduce"
    # Steps 20-49 of both ranks: the exact steps after the fallback would pull the mean up 15-fold.
    assert sync.strategy_steps == 30
    assert sync.sent_bytes_per_step == sync.counted_bytes_per_step == 118_784
    assert [c.breached for c in sync.checks] == [True, True, True]
    assert all(c.error is not None and c.error > c.error_bound for c in sync.checks[1:])  # type: ignore[operator]
    assert sync.notes[0].startswith("The safeguard fell back at step 50")
    # Times: the steady exact steps before the start (steps 1-19: step 0 is warm-up) against steps 20-49.
    assert (sync.exact_steps_timed, sync.strategy_steps_timed) == (19, 30)
    assert sync.time_saved_ms_per_step == pytest.approx(sync.exact_step_ms - sync.strategy_step_ms)  # type: ignore[operator]


def test_fp16_halves_the_bytes_and_keeps_the_errors_the_events_round_away(
    runs: dict[str, RunAnalysis],
) -> None:
    sync = sync_of(runs["fp16"])
    assert sync.bytes_ratio == pytest.approx(2.0)
    assert sync.sent_bytes_per_step == EXACT_BYTES / 2
    # The sync_check events write the error as 0.0; the summary's history keeps 2.9e-4.
    errors = [c.error for c in sync.checks if c.error is not None]
    assert len(errors) == 7 and all(2e-4 < e < 4e-4 for e in errors)
    assert sync.error_name == "compression error"
    assert sync.time_saved_ms_per_step is not None
    assert any("early training" in n for n in sync.notes)


def test_local_sgd_every_4_steps_sends_a_quarter_by_its_own_count(runs: dict[str, RunAnalysis]) -> None:
    sync = sync_of(runs["local4"])
    assert sync.label == "local SGD, H=4" and sync.error_name == "parameter divergence"
    # One model's parameters every 4 steps, nothing in between.
    assert sync.counted_bytes_per_step == EXACT_BYTES / 4 and sync.counted_bytes_ratio == pytest.approx(4.0)
    assert sync.check_bytes == 0
    # A local step records no collective (it sent nothing): the records agree with the strategy's count,
    # and no note says they differ.
    assert sync.sent_bytes_per_step == EXACT_BYTES / 4
    assert not any(n.startswith("The step records count") for n in sync.notes)
    assert sync.cross_node_ratio is None  # one node: nothing crosses
    assert sync.checks and all(c.error is not None and 0.3 < c.error < 0.7 for c in sync.checks)


def _write_hierarchical_run(path: Path, steps: int = 50, warmup: int = 10, period: int = 4) -> Path:
    """4 ranks on 2 nodes of 2, local SGD over nodes: exact all-reduce of a 1,000-byte gradient for
    `warmup` steps, then a node-local all-reduce every step and a cross-node parameter average every
    `period` steps."""
    write_manifest(path, {"run_id": "h", "created_unix": 1.0, "world_size": 4, "num_nodes": 2})
    config = {"compression": "none", "local_sgd_period": period, "warmup_steps": warmup, "hierarchical": None}
    described = {
        "label": f"local SGD, H={period}, hierarchical",
        "config": config,
        "start_step": warmup,
        "hierarchical": True,
        "nodes": 2,
        "ranks_per_node": 2,
    }
    averages = (steps - warmup) // period
    for rank in range(4):
        w = RankWriter(path, rank)
        w.open({"host": f"node{rank // 2}"})
        w.add_event("sync_strategy", **described)
        for s in range(steps):
            local = s >= warmup
            averaged = local and (s - warmup + 1) % period == 0
            record = step_record(s, wall_ms=12.0 if not local else 10.0)
            record.update(comm_ms=3.0, comm_exposed_ms=2.0 if not local else 0.5, comm_count=1)
            record["comm_bytes"] = 1000 + (1000 if averaged else 0)
            if local:
                record["comm_node_bytes"] = 1000
            w.add_step(record)
            if s + 1 == warmup:
                w.add_event("sync_started", step=warmup, mode="local", label=described["label"])
        w.add_event(
            "sync_summary",
            **described,
            steps=steps,
            started_at=warmup,
            mode_at_end=f"local SGD, H={period} (hierarchical)",
            hook_iterations=steps,
            exact_bytes=1000 * steps,
            sent_bytes=1000 * steps,
            check_bytes=0,
            param_avg_bytes=1000 * averages,
            checks=0,
            breached_checks=0,
            fallbacks=[],
            check_history=[],
        )
        w.close(status="completed")
    return path


def test_hierarchical_local_sgd_crosses_nodes_once_every_period(tmp_path: Path) -> None:
    analysis = analyze_run(load_run(_write_hierarchical_run(tmp_path / "run")))
    sync = sync_of(analysis)
    assert sync.hierarchical and sync.nodes == 2 and sync.ranks_per_node == 2
    # Every step: the node's all-reduce (1,000 bytes); every 4th: the cross-node average too.
    assert sync.sent_bytes_per_step == pytest.approx(1250.0)
    assert sync.counted_bytes_per_step == pytest.approx(1250.0)
    assert (sync.cross_node_exact_bytes_per_step, sync.cross_node_sent_bytes_per_step) == (1000.0, 250.0)
    assert sync.cross_node_ratio == pytest.approx(4.0)
    assert sync.exact_step_ms == pytest.approx(12.0) and sync.strategy_step_ms == pytest.approx(10.0)
    assert sync.time_saved_ms_per_step == pytest.approx(2.0)
    assert sync.exact_exposed_comm_ms == pytest.approx(2.0)
    assert sync.strategy_exposed_comm_ms == pytest.approx(0.5)
    blocks = section.blocks(analysis, [])
    table = next(b for b in blocks if getattr(b, "title", "").startswith("Exact all-reduce against"))
    rows = {row[0]: row[1:] for row in table.rows}  # type: ignore[attr-defined]
    assert rows["Cross-node bytes per step"] == ("1,000 B", "250 B", "4.0× fewer")
    assert rows["Step time"][2] == "-2.00 ms"


def test_a_strategy_that_never_started_says_so(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", world_size=2, steps=12)
    for rank in (0, 1):
        with (run / f"rank-{rank}" / "events.jsonl").open("a") as f:
            f.write(
                json.dumps({"t": 1.0, "kind": "sync_strategy", "label": "fp16 compression", "start_step": 50})
                + "\n"
            )
    analysis = analyze_run(load_run(run))
    sync = sync_of(analysis)
    assert sync.started_at is None and sync.sent_bytes_per_step is None and sync.bytes_ratio is None
    assert sync.notes == [
        "The strategy never started: the run ended within its 50 exact warm-up steps, so every step used DDP's "
        "exact all-reduce."
    ]
    assert section._draw(analysis) is None
    said, _ = section.blocks(analysis, [])
    assert said.text == "fp16 compression, after 50 exact steps: it never started."  # type: ignore[union-attr]


def test_a_run_without_the_strategy_has_no_figures_and_one_quiet_line(tmp_path: Path) -> None:
    import jsonschema

    analysis = analyze_run(load_run(make_run(tmp_path / "run", world_size=2, steps=30)))
    assert analysis.sync_strategy is None
    written = write_analysis(analysis, tmp_path / "report")
    assert "sync_strategy.png" not in {p.name for p in written.files}
    document = json.loads((tmp_path / "report" / "report.json").read_text())
    assert document["sync_strategy"] is None
    jsonschema.validate(document, report_schema())
    html = _section_text((tmp_path / "report" / "report.html").read_text(), section.ID)
    assert html.strip() == f"{section.TITLE} {section.NOT_USED}"


class _SectionText(HTMLParser):
    """The text of one <section id=...>, and the images in it."""

    def __init__(self, wanted: str) -> None:
        super().__init__()
        self.wanted, self.depth = wanted, 0
        self.text: list[str] = []
        self.images: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "section" and dict(attrs).get("id") == self.wanted:
            self.depth = 1
        elif self.depth and tag == "section":
            self.depth += 1
        elif self.depth and tag == "img":
            self.images.append(dict(attrs).get("src") or "")

    def handle_endtag(self, tag: str) -> None:
        if self.depth and tag == "section":
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.text.append(data)


def _section_text(html: str, section_id: str, images: list[str] | None = None) -> str:
    parser = _SectionText(section_id)
    parser.feed(html)
    if images is not None:
        images.extend(parser.images)
    return " ".join(" ".join(parser.text).split())


def test_the_section_in_html_markdown_and_json(runs: dict[str, RunAnalysis], tmp_path: Path) -> None:
    import jsonschema

    analysis = runs["powersgd_fault"]
    written = write_analysis(analysis, tmp_path / "report")
    png = tmp_path / "report" / "sync_strategy.png"
    assert png in written.files and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    images: list[str] = []
    html = _section_text((tmp_path / "report" / "report.html").read_text(), section.ID, images)
    assert "then the strategy until step 50. At the end: exact all-reduce." in html
    assert "Bytes sent per step 1.67 MiB 116.0 KiB 14.7× fewer" in html
    assert re.search(
        r"Step 50: PowerSGD rank 4 → exact all-reduce compression error 1\.\d\d above its bound", html
    )
    assert "Time saved per step" in html and "it cost time" in html
    assert len(images) == 1 and images[0].startswith("data:image/png;base64,")

    md = (tmp_path / "report" / "report.md").read_text()
    part = md[md.index(f"## {section.TITLE}") :]
    part = part[: part.index("\n## ", 1)]
    assert "| Bytes sent per step | 1.67 MiB | 116.0 KiB | 14.7× fewer |" in part
    assert "](sync_strategy.png)" in part

    document = json.loads((tmp_path / "report" / "report.json").read_text())
    jsonschema.validate(document, report_schema())
    sync: dict[str, Any] = document["sync_strategy"]
    assert sync["bytes_ratio"] == round(EXACT_BYTES / 118_784, 3)
    assert sync["fallbacks"][0]["step"] == 50 and sync["end_step"] == 50
    read = from_json(document).sync_strategy
    assert read is not None and read.fallbacks == sync_of(analysis).fallbacks
    assert [c.step for c in read.checks] == [c.step for c in sync_of(analysis).checks]


def test_error_far_below_its_bound_is_drawn_on_a_log_scale(runs: dict[str, RunAnalysis]) -> None:
    scales = {}
    for name in ("fp16", "powersgd"):
        drawn = section._draw(runs[name])
        assert drawn is not None
        scales[name] = drawn.figure.axes[0].get_yscale()
        drawn.figure.clear()
    # fp16's 3e-4 under a bound of 0.95 would sit on the axis; PowerSGD's 0.3-0.9 reads on a linear one.
    assert scales == {"fp16": "log", "powersgd": "linear"}
