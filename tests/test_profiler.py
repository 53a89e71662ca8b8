"""The operator drill-down: StepProfiler driven by a plain torch loop on CPU, its trace and summary, the
reader, the analysis and the report section that read them, and a profiler that fails."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.synthetic import make_run
from tuneup.analyze.analysis import analyze_run
from tuneup.analyze.model import from_json, to_json
from tuneup.collect.profiler import PHASE_TRACK_NAME, PHASES, StepProfiler, summarize_trace
from tuneup.record import load_run
from tuneup.record.schema import OPERATORS_FILE, TRACE_FILE
from tuneup.report.html import render_html
from tuneup.report.markdown import render_markdown
from tuneup.report.sections import SECTIONS
from tuneup.report.sections import operators as operators_section

PARAMETERS = 4  # two Linear layers: weight and bias each


def _strict_json(path: Path) -> Any:
    def refuse(literal: str) -> Any:
        raise AssertionError(f"{path} holds {literal}, which is not JSON")

    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def _train(
    profiler: StepProfiler | None,
    steps: int = 8,
    accumulate: int = 1,
    fetch_marks: bool = False,
    optimizer_range: bool = False,
) -> int:
    """A plain training loop that marks the profiler where a trainer's hooks would; returns the steps run.

    With `optimizer_range`, a range opens after the batch starts and closes after the optimizer step, as
    Lightning's "Optimizer.step#..." does around its closure: it overlaps tuneup's phases without nesting."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(accumulate)]
    done = 0
    for step in range(steps):
        for micro, (x, y) in enumerate(batches):
            if profiler is not None and fetch_marks:
                profiler.phase("data")
            x = x.clone()  # the "fetch": one operator in the data phase
            if profiler is not None:
                if fetch_marks:
                    profiler.phase("other")
                profiler.batch_start(step)
            if micro == 0:
                optimizer.zero_grad()
            closure = torch.autograd.profiler.record_function("Optimizer.step#SGD.step")
            if optimizer_range:
                closure.__enter__()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if profiler is not None:
                profiler.phase("backward")
            loss.backward()
            if profiler is not None:
                profiler.phase("other")
            if micro < accumulate - 1:
                if profiler is not None:
                    profiler.batch_end()
                continue
            if profiler is not None:
                profiler.phase("optimizer")
            optimizer.step()
            if optimizer_range:
                closure.__exit__(None, None, None)
            if profiler is not None:
                profiler.step_end(step)
        done += 1
    if profiler is not None:
        profiler.close()
    return done


def _top(summary: dict[str, Any], phase: str) -> dict[str, dict[str, Any]]:
    return {op["name"]: op for op in summary["phases"][phase]["top"]}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """rank-0 of a run whose steps 2-4 were profiled, with a trainer's optimizer range around each step."""
    rank_dir = tmp_path_factory.mktemp("profiled") / "rank-0"
    profiler = StepProfiler(rank_dir, steps=3, start_step=2, rank=0)
    assert _train(profiler, optimizer_range=True) == 8
    assert profiler.state == "done" and profiler.profiled_steps == [2, 3, 4]
    return rank_dir


# ---------------------------------------------------------------------------------------------------
# The profiler


def test_trace_is_json_with_the_steps_operators_and_a_phase_track(profiled: Path) -> None:
    trace = _strict_json(profiled / TRACE_FILE)
    events = trace["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"aten::addmm", "aten::mm", "aten::add_"} <= names
    assert any("Backward" in str(n) for n in names)
    ranges = [e for e in events if e.get("ph") == "X" and str(e.get("name")).startswith("tuneup/")]
    assert {e["name"] for e in ranges} >= {
        f"tuneup/{p}" for p in ("data", "forward", "backward", "optimizer")
    }
    assert {e["name"] for e in ranges if e["name"].startswith("tuneup/step#")} == {
        "tuneup/step#2",
        "tuneup/step#3",
        "tuneup/step#4",
    }
    # The ranges have a track of their own, named, apart from the operators' thread.
    tracks = {e["tid"] for e in ranges}
    assert len(tracks) == 1
    named = [e for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"]
    assert any(e["tid"] in tracks and e["args"]["name"] == PHASE_TRACK_NAME for e in named)
    assert not tracks & {e["tid"] for e in events if e.get("cat") == "cpu_op"}
    assert trace["tuneup"]["steps"] == [2, 3, 4]
    # Perfetto drops slices that overlap without nesting on one track: every track nests.
    tracks: dict[Any, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("ph") == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for slices in tracks.values():
        open_ends: list[float] = []
        for start, end in sorted(slices, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + 1e-3
            open_ends.append(end)
    assert "Optimizer.step#SGD.step" in names
    # Nothing outside the window: the trace spans the three steps only.
    assert sum(e["name"] == "aten::addmm" for e in events) == 2 * 3


def test_operators_json_puts_each_operator_in_its_phase(profiled: Path) -> None:
    summary = _strict_json(profiled / OPERATORS_FILE)
    assert summary["steps"] == [2, 3, 4] and summary["rank"] == 0 and summary["device"] is None
    assert summary["trace"] == TRACE_FILE
    assert set(summary["phases"]) == set(PHASES)
    forward, backward, optimizer = (_top(summary, p) for p in ("forward", "backward", "optimizer"))
    assert forward["aten::addmm"]["calls"] == 2 * 3
    assert "aten::mm" in backward and any("Backward" in name for name in backward)
    assert "aten::addmm" not in backward and "aten::mm" not in forward
    assert optimizer["aten::add_"]["calls"] == PARAMETERS * 3  # SGD on CPU: one add_ per parameter
    assert not any("Backward" in name for name in forward | optimizer)
    # The data phase holds the loop's clone; nothing else ran there.
    assert "aten::clone" in _top(summary, "data")
    for name, phase in summary["phases"].items():
        assert phase["device_ms"] is None
        assert phase["self_cpu_ms"] <= phase["wall_ms"] + 1e-3, name
        for op in phase["top"]:
            assert 0 <= op["self_cpu_ms"] <= op["total_cpu_ms"] + 1e-9 and op["self_device_ms"] is None
    # A composite operator's own time is less than its whole: aten::linear calls addmm.
    assert forward["aten::linear"]["self_cpu_ms"] < forward["aten::linear"]["total_cpu_ms"]
    assert summary["unattributed"]["calls"] == 0
    phase_walls = sum(p["wall_ms"] for p in summary["phases"].values())
    # The phase ranges tile the step but for the profiler's own cost of closing one range and opening the
    # next, which grows on a loaded machine.
    assert phase_walls == pytest.approx(summary["step_wall_ms"], rel=0.15)
    assert summary["cost_s"]["total_s"] > 0 and "overhead_note" in summary


def test_gradient_accumulation_and_fetch_marks(tmp_path: Path) -> None:
    profiler = StepProfiler(tmp_path / "rank-0", steps=2, start_step=1, rank=0)
    _train(profiler, steps=4, accumulate=2, fetch_marks=True)
    assert profiler.profiled_steps == [1, 2]
    summary = _strict_json(tmp_path / "rank-0" / OPERATORS_FILE)
    assert _top(summary, "forward")["aten::addmm"]["calls"] == 2 * 2 * 2  # 2 layers, 2 micro-batches, 2 steps
    assert _top(summary, "optimizer")["aten::add_"]["calls"] == PARAMETERS * 2
    # With fetches marked, only the fetch is data (one clone per micro-batch); the rest of the gap is other.
    assert _top(summary, "data")["aten::clone"]["calls"] == 2 * 2
    assert "aten::clone" not in _top(summary, "other")


def test_window_cut_short_is_written_on_close_and_nothing_before_start(tmp_path: Path) -> None:
    profiler = StepProfiler(tmp_path / "rank-0", steps=50, start_step=3, rank=0)
    profiler.batch_start(0)
    profiler.step_end(0)
    assert profiler.state == "waiting" and profiler._prof is None  # nothing made before the window
    _train(profiler, steps=6)
    assert profiler.state == "done" and profiler.profiled_steps == [3, 4, 5]
    assert _strict_json(tmp_path / "rank-0" / OPERATORS_FILE)["steps"] == [3, 4, 5]
    # After the window every call returns at once.
    profiler.batch_start(10)
    profiler.phase("backward")
    profiler.step_end(10)
    assert profiler.profiled_steps == [3, 4, 5]


def test_a_step_cut_short_by_close_is_left_out(tmp_path: Path) -> None:
    profiler = StepProfiler(tmp_path / "rank-0", steps=10, start_step=1, rank=0)
    _train(profiler, steps=3)  # closes between steps, after steps 1 and 2: ...
    assert profiler.state == "done" and profiler.profiled_steps == [1, 2]
    summary = _strict_json(tmp_path / "rank-0" / OPERATORS_FILE)
    assert _top(summary, "forward")["aten::addmm"]["calls"] == 2 * 2
    # ... or in the middle of one: the forward of a step that never ended counts in no phase.
    profiler = StepProfiler(tmp_path / "rank-1", steps=10, start_step=0, rank=1)
    profiler.batch_start(0)
    profiler.step_end(0)
    profiler.batch_start(1)
    torch.nn.Linear(4, 4)(torch.ones(2, 4))
    profiler.close()
    summary = _strict_json(tmp_path / "rank-1" / OPERATORS_FILE)
    assert summary["steps"] == [0]
    assert "aten::addmm" not in _top(summary, "forward") and summary["unattributed"]["calls"] > 0


def test_missing_step_ends_stop_the_profiler_after_the_window(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    profiler = StepProfiler(tmp_path / "rank-0", steps=2, start_step=1, rank=0)
    for step in range(6):  # a caller that never calls step_end
        profiler.batch_start(step)
        torch.ones(2) + 1
    assert profiler.state == "done" and not torch.autograd.profiler._is_profiler_enabled
    assert any("without the steps' ends" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "rank-0" / OPERATORS_FILE).exists()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="steps"):
        StepProfiler(Path("x"), steps=0, start_step=1)
    with pytest.raises(ValueError, match="start_step"):
        StepProfiler(Path("x"), steps=2, start_step=-1)


# ---------------------------------------------------------------------------------------------------
# Failure: warn once, stop, train on


def _profiler_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "tuneup" and "step profiler failed" in r.getMessage()]


def test_profiler_that_cannot_start_warns_once_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("profiler unavailable")

    monkeypatch.setattr(torch.profiler, "profile", refuse)
    profiler = StepProfiler(tmp_path / "rank-0", steps=2, start_step=1, rank=0)
    assert _train(profiler, steps=6) == 6
    assert profiler.state == "disabled"
    assert len(_profiler_warnings(caplog)) == 1
    assert "profiler unavailable" in _profiler_warnings(caplog)[0].getMessage()
    assert not (tmp_path / "rank-0" / OPERATORS_FILE).exists()


def test_profiler_that_fails_mid_window_stops_torch_profiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import tuneup.collect.profiler as profiler_module

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("summary broke")

    monkeypatch.setattr(profiler_module, "summarize_trace", broken)
    profiler = StepProfiler(tmp_path / "rank-0", steps=2, start_step=1, rank=0)
    assert _train(profiler, steps=5) == 5
    assert profiler.state == "disabled" and len(_profiler_warnings(caplog)) == 1
    assert not torch.autograd.profiler._is_profiler_enabled
    assert not any(tmp_path.joinpath("rank-0").glob(".*"))  # no temporary file left behind
    # torch's profiler is free again: a later profile starts.
    with torch.profiler.profile() as prof:
        torch.ones(2) + 1
    assert any(e.name == "aten::add" for e in prof.events())


def test_an_unknown_phase_disables_the_profiler(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    profiler = StepProfiler(tmp_path / "rank-0", steps=2, start_step=0, rank=0)
    profiler.batch_start(0)
    profiler.phase("lunch")
    assert profiler.state == "disabled" and len(_profiler_warnings(caplog)) == 1
    assert not torch.autograd.profiler._is_profiler_enabled


# ---------------------------------------------------------------------------------------------------
# The summary, on a hand-made trace: nesting, threads and device time


def _x(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op", **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_summary_self_time_thread_attribution_and_device_time() -> None:
    annotation = "user_annotation"
    events = [
        _x("tuneup/step#7", 0, 100, cat=annotation),
        _x("tuneup/forward", 0, 40, cat=annotation),
        _x("tuneup/backward", 40, 50, cat=annotation),
        _x("tuneup/optimizer", 90, 10, cat=annotation),
        # forward: linear (10 us) calls addmm (25 us), which calls a copy (5 us)
        _x("aten::linear", 1, 35, **{"External id": 1}),
        _x("aten::addmm", 5, 25, **{"External id": 2}),
        _x("aten::copy_", 10, 5, **{"External id": 3}),
        # backward: the training thread waits; the work runs on another thread, by time inside backward
        _x("autograd::engine::evaluate_function: AddmmBackward0", 45, 30, tid=2, **{"External id": 4}),
        _x("aten::mm", 50, 20, tid=2, **{"External id": 5}),
        _x("aten::add_", 92, 4, **{"External id": 6}),
        _x("aten::empty", 150, 1, **{"External id": 7}),  # after the last range: unattributed
        # device work: a kernel charged to addmm, one to mm, one launched outside any operator
        _x("gemm_kernel", 60, 8, tid=7, cat="kernel", **{"External id": 2, "correlation": 11}),
        _x("mm_kernel", 80, 12, tid=7, cat="kernel", **{"External id": 5, "correlation": 12}),
        _x("cudaLaunchKernel", 93, 1, cat="cuda_runtime", **{"External id": 0, "correlation": 13}),
        _x("stray_kernel", 95, 3, tid=7, cat="kernel", **{"External id": 0, "correlation": 13}),
    ]
    summary = summarize_trace({"traceEvents": events}, device="cuda", top=2)
    forward, backward, optimizer = (summary["phases"][p] for p in ("forward", "backward", "optimizer"))
    ops = {op["name"]: op for op in forward["top"]}
    assert ops["aten::addmm"]["self_cpu_ms"] == pytest.approx(0.020)  # 25 - 5
    assert ops["aten::addmm"]["total_cpu_ms"] == pytest.approx(0.025)
    assert ops["aten::linear"]["self_cpu_ms"] == pytest.approx(0.010)  # 35 - 25
    assert ops["aten::addmm"]["self_device_ms"] == pytest.approx(0.008)
    assert forward["self_cpu_ms"] == pytest.approx(0.035) and forward["calls"] == 3
    assert forward["operators"] == 3 and len(forward["top"]) == 2  # top=2: copy_ left out of the list
    assert forward["wall_ms"] == pytest.approx(0.040) and forward["device_ms"] == pytest.approx(0.008)
    bops = {op["name"]: op for op in backward["top"]}
    assert bops["aten::mm"]["self_device_ms"] == pytest.approx(0.012)
    assert bops["autograd::engine::evaluate_function: AddmmBackward0"]["self_cpu_ms"] == pytest.approx(0.010)
    # A kernel no operator launched goes to the phase its launch was in.
    assert optimizer["device_ms"] == pytest.approx(0.003)
    assert summary["unattributed"] == {"calls": 1, "self_cpu_ms": pytest.approx(0.001), "device_ms": 0.0}
    assert summary["step_wall_ms"] == pytest.approx(0.100)
    assert summary["phases"]["data"]["calls"] == 0


# ---------------------------------------------------------------------------------------------------
# Record, analysis, report


def _profiled_run(tmp_path: Path, profiled: Path, ranks: int = 2) -> Path:
    run = make_run(tmp_path / "run", world_size=ranks, steps=20)
    for rank in range(ranks):
        summary = json.loads((profiled / OPERATORS_FILE).read_text())
        summary["rank"] = rank
        if rank == 1:  # rank 1 spends twice as long in every forward operator
            for op in summary["phases"]["forward"]["top"]:
                op["self_cpu_ms"] *= 2
        (run / f"rank-{rank}" / OPERATORS_FILE).write_text(json.dumps(summary))
        (run / f"rank-{rank}" / TRACE_FILE).write_bytes((profiled / TRACE_FILE).read_bytes())
    return run


def test_reader_analysis_and_report_section(tmp_path: Path, profiled: Path) -> None:
    run = load_run(_profiled_run(tmp_path, profiled))
    assert run.ranks[0].operators is not None and run.ranks[1].operators is not None
    assert not [w for w in run.warnings if "operator" in w]
    analysis = analyze_run(run)
    profile = analysis.operators
    assert profile is not None
    assert profile.ranks == [0, 1] and profile.steps == [2, 3, 4] and profile.device is None
    assert profile.traces == ["rank-0/trace.json", "rank-1/trace.json"]
    phases = {p.phase: p for p in profile.phases}
    assert {"forward", "backward", "optimizer"} <= set(phases)
    forward = {op.name: op for op in phases["forward"].operators}
    addmm = forward["aten::addmm"]
    assert addmm.calls_per_step == pytest.approx(2.0) and addmm.ranks == 2
    assert addmm.slowest_rank == 1
    assert addmm.self_cpu_ms_per_step_max == pytest.approx(2 * addmm.self_cpu_ms_per_step_min)
    assert addmm.device_ms_per_step is None and addmm.share_of_phase is not None
    assert {op.name for op in phases["optimizer"].operators} == {"aten::add_"}
    assert phases["optimizer"].operators[0].calls_per_step == pytest.approx(PARAMETERS)
    assert phases["backward"].steady_ms_per_step == pytest.approx(4.0)  # tests/synthetic.py's backward_ms
    total_share = sum(p.share_of_step or 0.0 for p in profile.phases)
    # Less the profiler's own cost between one phase's range and the next (see above): 0.95 on a quiet
    # 2-core machine, 0.877 once in CI on a loaded one. Each phase's presence is checked above; this bound
    # only says that the phases make up the step.
    assert total_share == pytest.approx(1.0, abs=0.15)

    # report.json carries it and reads back; one written before the section existed reads back without.
    document = json.loads(json.dumps(to_json(analysis)))
    assert from_json(document).operators == from_json(json.loads(json.dumps(to_json(analysis)))).operators
    assert from_json(document).operators is not None
    document.pop("operators")
    assert from_json(document).operators is None

    # The section: after step time, in every format.
    ids = [sid for sid, _ in SECTIONS]
    assert ids.index(operators_section.ID) == ids.index("step-time") + 1
    html, markdown = render_html(analysis, []), render_markdown(analysis, [])
    for page in (html, markdown.replace("\\_", "_")):  # Markdown escapes a name's trailing "_"
        assert operators_section.TITLE in page
        assert "aten::addmm" in page and "AddmmBackward0" in page and "aten::add_" in page
        assert "rank-0/trace.json" in page and "Self CPU across ranks" in page
        section = page.split(operators_section.TITLE, 1)[1]
        assert "None" not in section and "nan" not in section


def test_section_without_a_profile_says_how_to_make_one(tmp_path: Path) -> None:
    analysis = analyze_run(load_run(make_run(tmp_path / "run", steps=20)))
    assert analysis.operators is None
    blocks = operators_section.blocks(analysis, [])
    assert len(blocks) == 1 and blocks[0].quiet  # type: ignore[union-attr]
    assert "TuneupCallback(profile_steps=N)" in blocks[0].text  # type: ignore[union-attr]
    assert "TuneupCallback(profile_steps=N)" in render_markdown(analysis, [])


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[1, 2]", b'{"phases": []}', b'{"phases": {"forward": {"top": "x"}}, "steps": "x"}'],
)
def test_damaged_operators_file_is_a_warning_not_a_crash(tmp_path: Path, content: bytes) -> None:
    run_dir = make_run(tmp_path / "run", steps=20)
    (run_dir / "rank-0" / OPERATORS_FILE).write_bytes(content)
    run = load_run(run_dir)
    analysis = analyze_run(run)  # never raises
    if run.ranks[0].operators is None:
        assert any(OPERATORS_FILE in w for w in run.warnings)
    assert analysis.operators is None
    render_html(analysis, [])


def test_section_with_one_rank_and_many_operators(tmp_path: Path, profiled: Path) -> None:
    analysis = analyze_run(load_run(_profiled_run(tmp_path, profiled, ranks=1)))
    assert analysis.operators is not None
    markdown = render_markdown(analysis, [])
    assert "Self CPU across ranks" not in markdown  # one rank: no spread column
    backward = next(p for p in analysis.operators.phases if p.phase == "backward")
    if backward.other_operators or len(backward.operators) > operators_section.SHOWN_PER_PHASE:
        assert "other operator" in markdown


def test_operator_names_reach_the_page_escaped(tmp_path: Path, profiled: Path) -> None:
    hostile = "<script>alert(1)</script>|x"
    run_dir = _profiled_run(tmp_path, profiled, ranks=1)
    path = run_dir / "rank-0" / OPERATORS_FILE
    summary = json.loads(path.read_text())
    summary["phases"]["backward"]["top"][0]["name"] = hostile
    path.write_text(json.dumps(summary))
    analysis = analyze_run(load_run(run_dir))
    html = render_html(analysis, [])
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    markdown = render_markdown(analysis, [])
    assert "<script>" not in markdown and "\\|x" in markdown
