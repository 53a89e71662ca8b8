"""Reports: a recorded run as HTML, Markdown and JSON, with plots.

`write_report(run_dir, out_dir, formats)` loads the run, analyses it, draws the plots and writes the
files. Everything is rendered into a scratch directory first and moved into place only when all of it
succeeded, one rename per file: a failure leaves the previous report (or nothing), never half a report.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuneup.analyze.model import Finding, RunAnalysis
    from tuneup.cost.options import CostOptions
    from tuneup.target import Target

FORMATS = ("html", "md", "json")
REPORT_BASENAME = "report"


class ReportError(Exception):
    """The report cannot be written (bad options, unwritable output). One line, naming the fix."""


@dataclass(slots=True)
class WrittenReport:
    out_dir: Path
    files: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def path(self, fmt: str) -> Path | None:
        suffix = {"html": ".html", "md": ".md", "json": ".json"}[fmt]
        return next((p for p in self.files if p.name == REPORT_BASENAME + suffix), None)


def parse_formats(value: str | Iterable[str]) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    formats = [f.strip().lower() for f in items if f.strip()]
    formats = ["md" if f == "markdown" else f for f in formats]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        shown = ", ".join(unknown) or "nothing"
        raise ReportError(
            f"unknown report format {shown!r}; choose one or more of {', '.join(FORMATS)} (comma-separated)"
        )
    return tuple(dict.fromkeys(formats))


def report_schema() -> dict[str, Any]:
    """The JSON schema of report.json (packaged as tuneup/report/report.schema.json)."""
    return json.loads(
        resources.files("tuneup.report").joinpath("report.schema.json").read_text(encoding="utf-8")
    )


def analyze(
    run_dir: str | os.PathLike[str], cost: CostOptions | None = None, target: Target | None = None
) -> RunAnalysis:
    """Load and analyse a run (every segment of it). `cost` prices it (or replaces the price it recorded);
    a bad price or catalog raises ReportError. `target` (`parse_target("val_acc>=0.9")`) adds the time and
    cost to reach it; a target on a metric the run did not log raises ReportError listing those it did."""
    from tuneup.analyze.analysis import analyze_run
    from tuneup.record.segments import load_segments

    segments = load_segments(run_dir)
    try:
        analysis = analyze_run(segments[-1], cost, segments, target)
    except ValueError as exc:  # the catalog's and the pricing's errors name the option and the fix
        if cost is None:
            raise
        raise ReportError(str(exc)) from None
    outcome = analysis.convergence.target if analysis.convergence is not None else None
    if target is not None and outcome is not None and outcome.status == "not_recorded":
        raise ReportError(f"{outcome.reason}; pass --target with one of those")
    return analysis


def build_report(
    run_dir: str | os.PathLike[str], cost: CostOptions | None = None, target: Target | None = None
) -> dict[str, Any]:
    """The report's JSON document (what report.json holds) for the run at `run_dir`."""
    return report_document(analyze(run_dir, cost, target))


def report_document(analysis: RunAnalysis) -> dict[str, Any]:
    """report.json's document: the analysis, and the advice on it under "recommendations" (an object, or
    a string saying why there is none). Readers of the analysis (`from_json`) skip the advice."""
    from tuneup.analyze.model import to_json
    from tuneup.report.advice import advice_for

    document = to_json(analysis)
    advice = advice_for(analysis)
    document["recommendations"] = advice if isinstance(advice, str) else to_json(advice)
    return document


def write_report(
    run_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None = None,
    formats: str | Iterable[str] = FORMATS,
    cost: CostOptions | None = None,
    target: Target | None = None,
) -> WrittenReport:
    """Write the report of the run at `run_dir` into `out_dir` (default `reports/<run id>`); `target` adds
    the time and cost to a quality target (`analyze`).

    Raises `tuneup.RunRecordError` for a run that cannot be read and `ReportError` for bad options or
    an output directory that cannot be written.
    """
    wanted = parse_formats(formats)
    return write_analysis(analyze(run_dir, cost, target), out_dir, wanted)


def write_analysis(
    analysis: RunAnalysis,
    out_dir: str | os.PathLike[str] | None = None,
    formats: str | Iterable[str] = FORMATS,
) -> WrittenReport:
    """Write the report of an analysed run (`analyze`) into `out_dir`, as `write_report` does; for a
    caller that has the analysis already and must not make it twice (the demo prints it first)."""
    wanted = parse_formats(formats)
    target = Path(out_dir) if out_dir is not None else Path("reports") / _plain_name(analysis.run.run_id)
    files = publish(target, "the report", lambda scratch: _render_into(analysis, scratch, wanted))
    return WrittenReport(out_dir=target, files=files, warnings=analysis.warnings, findings=analysis.findings)


def publish(target: Path, what: str, render: Callable[[Path], Sequence[str]]) -> list[Path]:
    """Render files into a scratch directory inside `target` (`render` returns their names), then move them
    into place: a failure leaves the previous files. ReportError names `what` and the directory."""
    try:
        target.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".tuneup-report-", dir=target))
    except OSError as exc:
        raise ReportError(
            f"cannot write {what} to {target}: {exc.strerror or exc}; pass -o with a writable directory"
        ) from None
    try:
        files = []
        for name in render(scratch):
            os.replace(scratch / name, target / name)
            files.append(target / name)
    except OSError as exc:
        raise ReportError(
            f"cannot write {what} to {target}: {exc.strerror or exc}; pass -o with a writable directory"
        ) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return files


def _plain_name(run_id: Any) -> str:
    """The run id as one plain directory name: a recorded id is data, and must not steer where files go
    (`../../x`, an absolute path)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", str(run_id)).strip("._")
    return name or "run"


def json_text(document: dict[str, Any]) -> str:
    """report.json's text: indented by 2, strict JSON (a non-finite number is already null). orjson, where
    installed (tuneup[fast]), writes the same document ten times faster than json's indenting encoder,
    which runs in Python (a 1,024-rank report holds millions of numbers)."""
    try:
        import orjson
    except ImportError:
        return json.dumps(document, indent=2, allow_nan=False) + "\n"
    return orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE).decode("utf-8")


def _render_into(analysis: RunAnalysis, scratch: Path, formats: tuple[str, ...]) -> list[str]:
    """Render every requested file into `scratch`; return their names, plots first."""
    names: list[str] = []
    plots = []
    if "html" in formats or "md" in formats:
        from tuneup.report.sections import render_plots

        plots = render_plots(analysis, scratch)
        names.extend(p.name for p in plots)
    if "json" in formats:
        (scratch / f"{REPORT_BASENAME}.json").write_text(
            json_text(report_document(analysis)), encoding="utf-8"
        )
        names.append(f"{REPORT_BASENAME}.json")
    if "md" in formats:
        from tuneup.report.markdown import render_markdown

        (scratch / f"{REPORT_BASENAME}.md").write_text(render_markdown(analysis, plots), encoding="utf-8")
        names.append(f"{REPORT_BASENAME}.md")
    if "html" in formats:
        from tuneup.report.html import render_html

        (scratch / f"{REPORT_BASENAME}.html").write_text(render_html(analysis, plots), encoding="utf-8")
        names.append(f"{REPORT_BASENAME}.html")
    return names
