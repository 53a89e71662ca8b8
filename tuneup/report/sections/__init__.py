"""The report's sections, in page order: one module per section, each turning the typed analysis into
format-neutral blocks (`blocks(analysis, plots)`) and drawing its own figures (`PLOTS`).

To add a section: write `tuneup/report/sections/<name>.py` with `ID`, `TITLE`, `PLOTS` and `blocks`, and
put the module in `SECTION_MODULES` where it belongs on the page. The HTML, Markdown and terminal
serializers and the plot writer take it from here; nothing else changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from tuneup._log import logger
from tuneup.analyze.model import RunAnalysis
from tuneup.report.artifacts import PlotFile
from tuneup.report.blocks import Block, Paragraph, Section, figures
from tuneup.report.format import MISSING, plural, text, unix_time
from tuneup.report.plotting import STYLE, Plot, save
from tuneup.report.sections import (
    badput,
    communication,
    convergence,
    cost,
    data_loader,
    environment,
    hardware,
    interruptions,
    memory,
    noise_scale,
    operators,
    ranks,
    recommendations,
    run,
    step_time,
    summary,
    sync_strategy,
    throughput,
    timeline,
    timeseries,
    warnings,
)


class SectionModule(Protocol):
    ID: str  # the section's HTML id
    TITLE: str
    PLOTS: tuple[Plot, ...]

    def blocks(self, analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Block]: ...


SECTION_MODULES: tuple[SectionModule, ...] = (
    summary,
    recommendations,
    timeline,
    badput,
    run,
    throughput,
    step_time,
    operators,
    timeseries,
    convergence,
    hardware,
    memory,
    ranks,
    data_loader,
    communication,
    sync_strategy,
    noise_scale,
    cost,
    interruptions,
    environment,
    warnings,
)  # type: ignore[assignment]

# (id, title) in page order: every format keeps this order.
SECTIONS: tuple[tuple[str, str], ...] = tuple((m.ID, m.TITLE) for m in SECTION_MODULES)


def render_plots(analysis: RunAnalysis, out_dir: Path) -> list[PlotFile]:
    """Write every section's figures as PNGs into `out_dir`; one `PlotFile` per figure written, in page
    order. A figure without data is skipped; one that fails to draw is skipped with a warning: one bad
    figure must not cost the user the whole report."""
    import matplotlib  # imported here so that importing tuneup.report stays cheap
    import matplotlib.style

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[PlotFile] = []
    with matplotlib.rc_context(), matplotlib.style.context(["default", STYLE]):
        for module in SECTION_MODULES:
            for plot in module.PLOTS:
                path = out_dir / plot.name
                try:
                    drawn = plot.draw(analysis)
                    if drawn is not None:
                        save(drawn.figure, path)
                except Exception as exc:
                    logger.warning(
                        "tuneup: plot %s was not drawn: %s: %s", plot.name, type(exc).__name__, exc
                    )
                    drawn = None
                if drawn is None:
                    # A figure from an earlier report in the same folder would otherwise look current.
                    path.unlink(missing_ok=True)
                    continue
                written.append(PlotFile(plot.name, path, drawn.title, module.ID, drawn.caption))
    return written


def report_sections(analysis: RunAnalysis, plots: Sequence[PlotFile]) -> list[Section]:
    """The report as blocks, one section per module, in page order."""
    return [
        Section(
            m.ID,
            m.TITLE,
            tuple(
                m.blocks(analysis, plots) or figures(m.ID, plots) or [Paragraph("Nothing to show yet.", True)]
            ),
        )
        for m in SECTION_MODULES
    ]


def page_title(analysis: RunAnalysis) -> str:
    return f"tuneup report: {text(analysis.run.run_id)}"


def page_subtitle(analysis: RunAnalysis) -> str:
    """One line under the page title: which run, which model, when."""
    run_info = analysis.run
    return " · ".join(
        [
            f"Run {text(run_info.run_id)}",
            text(run_info.model_class),
            plural(run_info.world_size, "rank") if run_info.world_size is not None else MISSING,
            text(run_info.strategy),
            f"started {unix_time(run_info.start_unix)}",
        ]
    )


def generated_line(analysis: RunAnalysis) -> str:
    return (
        f"Generated {unix_time(analysis.generated_unix)} by tuneup {text(analysis.tuneup_version)}, "
        f"report schema {text(analysis.report_schema_version)}."
    )
