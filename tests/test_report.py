"""`tuneup report` on a real recorded 2-rank DDP run, and on every kind of bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tuneup.report import report_schema, write_report
from tuneup.report.sections import SECTIONS

from synthetic import make_run


class SectionParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.images: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section" and a.get("id"):
            self.sections.append(a["id"] or "")
        if tag == "img":
            self.images.append(a.get("src") or "")
        if tag == "script":
            self.scripts += 1


@pytest.mark.slow
def test_report_of_a_real_two_rank_run_in_all_formats(ddp_straggler_run: Path, tmp_path: Path) -> None:
    import jsonschema

    written = write_report(ddp_straggler_run, tmp_path / "report")
    names = {p.name for p in written.files}
    assert {"report.html", "report.md", "report.json"} <= names
    assert {
        "step_breakdown.png",
        "rank_step_time.png",
        "step_time.png",
        "throughput.png",
        "communication.png",
    } <= names

    report = json.loads((tmp_path / "report" / "report.json").read_text())
    jsonschema.validate(report, report_schema())
    assert report["run"]["world_size"] == 2 and report["run"]["missing_ranks"] == []
    straggler = report["ranks"]["straggler"]
    assert straggler["rank"] == 1 and straggler["phase"] == "forward", straggler
    # The same straggler, seen from the collectives: rank 1 arrives late, rank 0 waits inside them.
    comm = report["communication"]
    assert comm["backend"] == "gloo" and comm["late_rank"]["rank"] == 1
    assert {r["bytes_per_step"] for r in comm["per_rank"]} == {577 * 4}
    assert {f["id"] for f in report["findings"]} >= {"straggler", "late_rank"}
    # DDP: every rank holds the whole model and its gradients (plain SGD keeps no state).
    memory = report["memory"]
    assert not memory["sharded"] and len(memory["ranks"]) == 2
    assert (memory["parameters_bytes"], memory["gradients_bytes"]) == (577 * 4, 577 * 4)

    parser = SectionParser()
    parser.feed((tmp_path / "report" / "report.html").read_text())
    assert parser.sections == [sid for sid, _ in SECTIONS]
    assert parser.images and all(src.startswith("data:image/png;base64,") for src in parser.images)
    assert parser.scripts == 0

    md = (tmp_path / "report" / "report.md").read_text()
    positions = [md.find(f"## {title}") for _, title in SECTIONS]
    assert -1 not in positions and positions == sorted(positions)
    assert "](step_breakdown.png)" in md
    for png in written.files:
        if png.suffix == ".png":
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuneup", "report", *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "nope", "does not exist"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "is empty"),
        (
            lambda p: (
                ((p / "notarun").mkdir(), (p / "notarun" / "a.txt").write_text("x"))[0] or p / "notarun"
            ),
            "not a tuneup run",
        ),
    ],
)
def test_bad_paths_one_line_exit_2_and_nothing_written(tmp_path: Path, make, message: str) -> None:
    proc = cli(str(make(tmp_path)), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_newer_schema_exit_2(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["schema_version"] = 2
    (run / "manifest.json").write_text(json.dumps(manifest))
    proc = cli(str(run), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2 and "upgrade tuneup" in proc.stderr and proc.stderr.count("\n") == 1


def test_unknown_format_exit_2(tmp_path: Path) -> None:
    proc = cli(str(make_run(tmp_path / "run")), "--format", "pdf", "-o", str(tmp_path / "out"))
    assert proc.returncode == 2 and "unknown report format 'pdf'" in proc.stderr


def test_truncated_stream_still_reports_and_says_so(tmp_path: Path) -> None:
    # A run killed mid-write must stay reportable (that is when a report is wanted most): the report is
    # written, and the cut line is named in its warnings and on stderr.
    run = make_run(tmp_path / "run", steps=30)
    steps = run / "rank-0" / "steps.jsonl"
    steps.write_bytes(steps.read_bytes()[:-25])
    proc = cli(str(run), "-o", str(tmp_path / "out"), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert "last line is incomplete" in proc.stderr and "Traceback" not in proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert any("incomplete" in w for w in report["warnings"]) and report["run"]["steps_recorded"] == 29


def test_missing_rank_report_says_so_plainly(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", world_size=3, steps=20)
    for f in (run / "rank-2").iterdir():
        f.unlink()
    (run / "rank-2").rmdir()
    proc = cli(str(run), "-o", str(tmp_path / "out"), "--format", "json,md")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["run"]["missing_ranks"] == [2]
    assert any(f["id"] == "missing_ranks" for f in report["findings"])
    assert "1 rank(s) left no record" in (tmp_path / "out" / "report.md").read_text()


def test_a_failing_render_leaves_no_half_written_report(tmp_path: Path, monkeypatch) -> None:
    import tuneup.report.html as html_module

    run = make_run(tmp_path / "run", steps=20)
    out = tmp_path / "out"
    write_report(run, out, "json")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(*args, **kwargs):
        raise RuntimeError("renderer broke")

    monkeypatch.setattr(html_module, "render_html", broken)
    with pytest.raises(RuntimeError):
        write_report(run, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old report, whole; no new PNGs


def test_the_committed_example_report_json_is_what_the_analysis_gives() -> None:
    """report.json of the committed example is exactly the analysis of its committed run: a change to the
    analysis, the model or its serialization that moves any figure shows here (regenerate the example
    with `tuneup report reports/example/run -o reports/example --price-per-hour 1.20` when it is meant)."""
    from tuneup.cost.options import CostOptions
    from tuneup.cost.pricing import PriceChoice
    from tuneup.report import build_report

    example = Path(__file__).resolve().parents[1] / "reports" / "example"
    committed = json.loads((example / "report.json").read_text())
    cwd = os.getcwd()
    os.chdir(example.parents[1])  # the run's path is recorded relative to the repository
    try:
        now = build_report(
            "reports/example/run", CostOptions(price=PriceChoice(price_per_hour=1.20, source="command line"))
        )
    finally:
        os.chdir(cwd)
    for volatile in ("generated_unix", "tuneup_version"):
        committed.pop(volatile), now.pop(volatile)
    assert now == committed


def test_report_json_text_is_the_same_document_with_or_without_orjson(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import builtins

    from tuneup.report import json_text

    document = {"a": [1e-7, 1e20, -0.0, 123456.789, None, 3], "b": {"c": "x\u2028y", "d": True}}
    fast = json_text(document)
    real_import = builtins.__import__

    def no_orjson(name: str, *args: object, **kwargs: object) -> object:
        if name == "orjson":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_orjson)
    standard = json_text(document)
    assert json.loads(fast) == json.loads(standard) == document
    assert fast.endswith("\n") and standard.endswith("\n")
