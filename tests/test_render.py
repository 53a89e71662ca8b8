"""The HTML and Markdown renderers, on reports that `analyze_run` made from synthetic runs.

Reports come from real run records (writer, reader, analysis), so a renamed key in the analysis shows
up here as a dash where a figure should be, not as a silently passing test.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import struct
import typing
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tuneup.analyze import model
from tuneup.analyze.analysis import analyze_run
from tuneup.analyze.model import AnalysisFormatError, RunAnalysis, from_json, to_json
from tuneup.record import RankWriter, load_run, write_manifest
from tuneup.report import format as fmt
from tuneup.report.artifacts import PlotFile
from tuneup.report.html import render_html
from tuneup.report.markdown import _md, render_markdown
from tuneup.report.sections import SECTIONS
from tuneup.report.sections import communication as communication_section
from tuneup.report.sections import cost as cost_section
from tuneup.report.sections import environment as environment_section

SECTION_IDS = [sid for sid, _ in SECTIONS]
SECTION_TITLES = [title for _, title in SECTIONS]
HOSTILE = "<script>alert(1)</script>"
GIB = 2**30

# ---------------------------------------------------------------------------------------------------
# Synthetic runs


def _manifest(world_size: int, *, gpus: bool) -> dict[str, Any]:
    inventory = {
        "driver_version": "570.86.15",
        "cuda_driver_version": "12.8",
        "gpus": [
            {
                "index": i,
                "name": "NVIDIA H200",
                "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0",
                "memory_total_bytes": 141 * GIB,
            }
            for i in range(world_size)
        ],
    }
    return {
        "run_id": "run-2024-06-01",
        "created_unix": 1_700_000_000.0,
        "world_size": world_size,
        "num_nodes": 1,
        "trainer": {
            "namespace": "lightning.pytorch",
            "strategy": "DDPStrategy",
            "accelerator": "CUDAAccelerator" if gpus else "CPUAccelerator",
            "precision": "bf16-mixed",
            "accumulate_grad_batches": 2,
            "max_steps": 40,
            "gradient_clip_val": None,
        },
        "dataloader": {"batch_size": 8, "num_workers": 4, "pin_memory": True, "persistent_workers": False},
        "model": {"class": "TinyLM", "parameters": 124_439_808, "trainable_parameters": 124_439_808},
        "environment": {
            "versions": {"tuneup": "0.1.0", "torch": "2.13.0", "cuda": None},
            "host": {
                "hostname": "node-a",
                "cpu_model": "AMD EPYC 9654",
                "cpu_count_logical": 192,
                "ram_total_bytes": 1536 * GIB,
            },
            "git": {"commit": "2d59d13", "branch": "main", "dirty": True, "remote": None},
            "seeds": {"pl_global_seed": 0},
            "env": {"OMP_NUM_THREADS": "1", "NCCL_DEBUG": "WARN"},
        },
        "gpus": inventory if gpus else None,
    }


def _step(step: int, rank: int, *, straggler: bool) -> dict[str, Any]:
    # Rank 1 of the straggler run is slow in forward; the other rank waits for it in backward.
    forward = 40.0 if straggler and rank == 1 else 10.0
    backward = 10.0 if straggler and rank == 1 else (40.0 if straggler else 20.0)
    data = 30.0 if step == 25 and rank == 0 else 1.0  # one data-loader stall
    parts = {
        "data_ms": data,
        "forward_ms": forward,
        "backward_ms": backward,
        "optimizer_ms": 3.0,
        "other_ms": 2.0,
    }
    if step == 0:
        parts["forward_ms"] += 300.0  # warm-up
    wall = sum(parts.values())
    return {
        "step": step,
        "epoch": 0,
        "t_end": 1_700_000_001.0 + step * 0.06,
        "wall_ms": wall,
        **parts,
        "micro_batches": 2,
        "samples": 16,
        "tokens": 16 * 512,
        "loss": 4.0 - step * 0.05,
        "grad_norm": None,
        "peak_mem_bytes": None,
    }


def _telemetry(rank: int, i: int, *, gpus: bool) -> dict[str, Any]:
    t = 1_700_000_001.0 + i * 0.5
    sample: dict[str, Any] = {
        "t": t,
        "process": {"cpu_percent": 95.0 + i, "rss_bytes": (3 + i) * GIB},
        "system": {
            "cpu_percent": 60.0,
            "mem_used_bytes": 100 * GIB,
            "mem_total_bytes": 1536 * GIB,
            "disk_read_bytes": i * 10e6,
            "disk_write_bytes": i * 1e6,
            "net": {
                "lo": {"sent_bytes": i * 5e6, "recv_bytes": i * 5e6},
                "eth0": {"sent_bytes": i * 1e3, "recv_bytes": i * 2e3},
            },
        },
    }
    if gpus:
        sample["gpus"] = [
            {
                "index": rank,
                "bus_id": f"00000000:{0x18 + rank:02X}:00.0",
                "util_percent": 30.0 + 5 * i,
                "mem_used_bytes": 120 * GIB,
                "mem_total_bytes": 141 * GIB,
                "power_w": 400.0 + i,
                "temp_c": 60 + i,
                "sm_clock_mhz": 1980,
                "energy_j": 1000.0 * i,
                "throttle": ["sw_power_cap"],
            }
        ]
    return sample


def _report(tmp: Path, *, straggler: bool = False, gpus: bool = False) -> dict[str, Any]:
    path = tmp / "run"
    write_manifest(path, _manifest(2, gpus=gpus))
    for rank in range(2):
        w = RankWriter(path, rank)
        w.open({"host": "node-a", "start_unix": 1_700_000_000.9, "timing": "host"})
        for s in range(40):
            w.add_step(_step(s, rank, straggler=straggler))
        for i in range(6):
            if not (i == 0 and rank == 0):  # host telemetry comes from one rank per host
                w.add_telemetry(_telemetry(rank, i, gpus=gpus))
        w.close(status="completed", data_timing="fetch")
    return analyze_run(load_run(path))


def _png(width: int = 4, height: int = 3) -> bytes:
    """A valid RGB PNG, written by hand so the tests need no plotting library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x20\x60\xa0" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _plots(tmp: Path) -> list[PlotFile]:
    specs = [
        ("throughput.png", "timeseries", "Throughput over the run"),
        ("step_breakdown.png", "step-time", "Where step time goes"),
        ("rank_step_time.png", "ranks", "Step time per rank"),
        ("host_utilization.png", "hardware", "Hosts over the run"),
    ]
    out = []
    for name, section, title in specs:
        path = tmp / name
        path.write_bytes(_png())
        out.append(PlotFile(name, path, title, section, f"How to read {title.lower()}."))
    return out


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {
        "demo": _report(tmp_path_factory.mktemp("demo")),
        "straggler": _report(tmp_path_factory.mktemp("straggler"), straggler=True),
        "gpu": _report(tmp_path_factory.mktemp("gpu"), gpus=True),
    }


@pytest.fixture(scope="module")
def plots(tmp_path_factory: pytest.TempPathFactory) -> list[PlotFile]:
    return _plots(tmp_path_factory.mktemp("plots"))


# ---------------------------------------------------------------------------------------------------
# Reading the output back


class PageParser(HTMLParser):
    """Section ids in order, <h2> text per section, img sources, text per section, and tag balance."""

    VOID = frozenset({"meta", "img", "br", "hr", "link", "input", "source", "wbr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[str] = []
        self.headings: dict[str, str] = {}
        self.images: list[dict[str, str | None]] = []
        self.text: dict[str, str] = {}
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.start_tags: set[str] = set()
        self._in_h2 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.start_tags.add(tag)
        a = dict(attrs)
        if tag == "section":
            self.sections.append(a.get("id") or "")
        if tag == "img":
            self.images.append(a)
        if tag == "h2":
            self._in_h2 = True
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2":
            self._in_h2 = False
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else 'nothing'}>")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        current = self.sections[-1] if self.sections and "section" in self.stack else None
        if current is None:
            return
        if self._in_h2:
            self.headings[current] = self.headings.get(current, "") + data
        self.text[current] = self.text.get(current, "") + data


def parse(page: str) -> PageParser:
    parser = PageParser()
    parser.feed(page)
    parser.close()
    assert not parser.errors, parser.errors[:5]
    assert parser.stack == [], f"unclosed tags: {parser.stack}"
    return parser


def md_headings(md: str) -> list[str]:
    return [line[3:] for line in md.splitlines() if line.startswith("## ")]


def md_section(md: str, title: str) -> str:
    return md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def md_table_cells(line: str) -> int:
    # Cells are separated by pipes that are not escaped.
    return len(re.findall(r"(?<!\\)\|", line)) - 1


def _plant(value: Any, payload: str) -> Any:
    """Every string in the report, and every key of a free-form mapping, with `payload` appended."""
    if isinstance(value, str):
        return value + payload
    if isinstance(value, list):
        return [_plant(v, payload) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            # Keys the renderers look up stay; keys the run supplied (env vars, interfaces, config) get it.
            free_form = not re.fullmatch(r"[a-z0-9_]+", k) or k in {
                "OMP_NUM_THREADS",
                "NCCL_DEBUG",
                "eth0",
                "lo",
            }
            out[k + payload if free_form else k] = _plant(v, payload)
        return out
    return value


def _nones(value: Any, *, empty: bool = False) -> Any:
    """Every figure the analysis may lack (an Optional field) set to None, containers kept (or emptied)."""
    if isinstance(value, list):
        return [] if empty else [_nones(v, empty=empty) for v in value]
    if isinstance(value, dict):
        return {} if empty else {k: _nones(v, empty=empty) for k, v in value.items()}
    if not dataclasses.is_dataclass(value):
        return value
    hints = typing.get_type_hints(type(value), vars(model))
    changes = {}
    for f in dataclasses.fields(value):
        if type(None) in typing.get_args(hints[f.name]):
            changes[f.name] = None
        else:
            changes[f.name] = _nones(getattr(value, f.name), empty=empty)
    return dataclasses.replace(value, **changes)


# ---------------------------------------------------------------------------------------------------
# HTML


@pytest.mark.parametrize("name", ["demo", "straggler", "gpu"])
def test_html_sections_in_order_images_inline_and_no_network(
    name: str, reports: dict[str, dict[str, Any]], plots: list[PlotFile]
) -> None:
    page = render_html(reports[name], plots)
    parsed = parse(page)
    assert page.startswith("<!DOCTYPE html>")
    assert parsed.sections == SECTION_IDS
    assert [parsed.headings[s] for s in SECTION_IDS] == SECTION_TITLES
    assert len(parsed.images) == len(plots)
    for img in parsed.images:
        src = img["src"] or ""
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]) == _png()
        assert img["alt"] and img["alt"].startswith("How to read")
    for forbidden in ("http://", "https://", "<script", "<link", "@import", "url("):
        assert forbidden not in page.lower(), forbidden
    assert "script" not in parsed.start_tags


def test_html_shows_the_figures_a_reader_looks_for(
    reports: dict[str, dict[str, Any]], plots: list[PlotFile]
) -> None:
    parsed = parse(render_html(reports["demo"], plots))
    summary = parsed.text["summary"]
    samples = reports["demo"].throughput.samples_per_s
    assert fmt.number(samples) in summary and "Samples/s" in summary
    assert "the first step of 40 recorded is left out as warm-up" in summary
    # Throughput is mean-based: the step beside it is the mean step, the median is labelled as such.
    step_time = reports["demo"].step_time
    assert "Mean step" in summary and fmt.ms(step_time.mean_ms) in summary
    assert f"median {fmt.ms(step_time.median_ms)}" in summary and "steady-state mean" in summary
    run = parsed.text["run"]
    for expected in (
        "TinyLM",
        "124.4 M",
        "2 ranks on 1 node",
        "DDPStrategy",
        "bf16-mixed",
        "node-a (both ranks)",
    ):
        assert expected in run, expected
    assert "All ranks" in parsed.text["throughput"]
    assert "steady-state mean" in parsed.text["throughput"]
    assert "whole step" in parsed.text["step-time"]
    assert "No GPU telemetry: the run had no NVML-visible GPU." in parsed.text["hardware"]
    assert "8.00 GiB" in parsed.text["hardware"]  # peak RSS of the last sample
    data = parsed.text["data-loader"]
    assert "Worst stalls" in data and "30.0 ms" in data
    env = parsed.text["environment"]
    assert "NCCL_DEBUG" in env and "1.50 TiB" in env and "2d59d13" in env
    assert "No warnings were recorded." in parsed.text["warnings"]


def test_html_gpu_table_names_the_gpus(reports: dict[str, dict[str, Any]], plots: list[PlotFile]) -> None:
    hardware = parse(render_html(reports["gpu"], plots)).text["hardware"]
    assert "GPUs: NVIDIA H200 on node-a" in hardware
    assert "120.0 / 141.0 GiB" in hardware and "sw_power_cap" in hardware
    assert "No GPU telemetry" not in hardware


def test_straggler_is_named_with_rank_and_phase(
    reports: dict[str, dict[str, Any]], plots: list[PlotFile]
) -> None:
    straggler = reports["straggler"].ranks.straggler
    assert straggler is not None and straggler.rank == 1
    ranks = parse(render_html(reports["straggler"], plots)).text["ranks"]
    assert "Straggler: rank 1, in forward" in ranks
    md = md_section(render_markdown(reports["straggler"], plots), "Ranks side by side")
    assert "Straggler: rank 1, in forward" in md
    calm = parse(render_html(reports["demo"], plots)).text["ranks"]
    assert "No straggler" in calm


def test_missing_unreadable_and_non_png_plots(tmp_path: Path, reports: dict[str, dict[str, Any]]) -> None:
    good = tmp_path / "loss.png"
    good.write_bytes(_png())
    svg = tmp_path / "evil.png"
    svg.write_text('<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>')
    plots = [
        PlotFile("loss.png", good, "Loss", "timeseries", "Loss per step."),
        PlotFile("gone.png", tmp_path / "gone.png", "Gone", "timeseries", "Was deleted."),
        PlotFile("evil.png", svg, "Evil", "hardware", "Not an image."),
    ]
    page = render_html(reports["demo"], plots)
    parsed = parse(page)
    assert len(parsed.images) == 1
    assert "“Gone” could not be read" in parsed.text["timeseries"]
    assert "“Evil” is not a PNG" in parsed.text["hardware"]
    assert "<svg" not in page and "http://" not in page
    # No plots at all: the sections still appear, and nothing points at a missing image.
    bare = parse(render_html(reports["demo"], []))
    assert bare.sections == SECTION_IDS and bare.images == []


# ---------------------------------------------------------------------------------------------------
# Markdown


@pytest.mark.parametrize("name", ["demo", "straggler", "gpu"])
def test_markdown_sections_in_order_with_image_links(
    name: str, reports: dict[str, dict[str, Any]], plots: list[PlotFile]
) -> None:
    md = render_markdown(reports[name], plots, image_prefix="plots/")
    assert md_headings(md) == SECTION_TITLES
    assert md.startswith("# tuneup report: run-2024-06-01\n")
    links = re.findall(r"!\[([^\]]*)\]\(([^)]*)\)", md)
    assert [url for _, url in links] == [f"plots/{p.name}" for p in _page_order(plots)]
    assert all(alt.startswith("How to read") for alt, _ in links)
    for line in md.splitlines():
        if line.startswith("|"):
            assert line.endswith("|"), line


def _page_order(plots: list[PlotFile]) -> list[PlotFile]:
    return sorted(plots, key=lambda p: SECTION_IDS.index(p.section))


def test_markdown_puts_findings_first(reports: dict[str, dict[str, Any]], plots: list[PlotFile]) -> None:
    report = reports["straggler"]
    assert report.findings, "the straggler run should produce findings"
    summary = md_section(render_markdown(report, plots), "Summary and findings")
    first_finding = summary.index(report.findings[0].title)
    assert first_finding < summary.index("| Samples/s")
    assert summary.lstrip().startswith("- ⚠️")


def test_markdown_keeps_code_spans_as_code_and_escapes_the_rest() -> None:
    """report.md showed `compare the runs with \\`tuneup compare\\``: escaped backticks render as literal
    backticks on GitHub. A span is code, as in the HTML; one whose inside could act is escaped whole."""
    assert _md("compare the runs with `tuneup compare`") == "compare the runs with `tuneup compare`"
    assert (
        _md("run `tuneup advise --measure -- COMMAND` *now*")
        == r"run `tuneup advise --measure -- COMMAND` \*now\*"
    )
    assert _md("`DataLoader(num_workers=1)` and `a_b_`") == "`DataLoader(num_workers=1)` and `a_b_`"
    assert _md("`<script>alert(1)</script>`") == r"\`&lt;script&gt;alert(1)&lt;/script&gt;\`"
    assert _md("`a|b` | `$x`") == r"\`a\|b\` \| \`\$x\`"
    assert _md("one ` alone") == r"one \` alone"


def test_markdown_escape() -> None:
    assert _md("a|b") == r"a\|b"
    assert _md("line1\nline2\r\nline3") == "line1 line2 line3"
    assert _md("<img src=x onerror=alert(1)>") == "&lt;img src=x onerror=alert(1)&gt;"
    assert _md("[click](javascript:x)") == r"\[click\](javascript:x)"
    assert _md("*bold* `code` ~~gone~~") == r"\*bold\* `code` \~\~gone\~\~"  # a code span stays code
    assert _md("OMP_NUM_THREADS") == "OMP_NUM_THREADS"  # intraword underscores cannot emphasise
    assert _md("_private_") == r"\_private\_"


# ---------------------------------------------------------------------------------------------------
# Hostile input, missing input


@pytest.mark.parametrize("name", ["demo", "straggler", "gpu"])
def test_hostile_strings_are_escaped_everywhere(
    name: str, reports: dict[str, dict[str, Any]], plots: list[PlotFile]
) -> None:
    payload = HOSTILE + "|x\ny<b>"
    planted = _plant(to_json(reports[name]), payload)
    planted["warnings"] = ["disk full" + payload]
    report = from_json(planted)
    hostile_plots = [
        PlotFile(p.name, p.path, p.title + payload, p.section, p.caption + payload) for p in plots
    ]
    page = render_html(report, hostile_plots)
    md = render_markdown(report, hostile_plots)
    for out in (page, md):
        assert "<script" not in out.lower()
        assert "<b>" not in out
    # The strings are shown, escaped, not dropped: the run id, a host, an env var name, a warning.
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") > 20
    assert md.count("&lt;script&gt;alert(1)&lt;/script&gt;") > 20
    parsed = parse(page)
    assert parsed.sections == SECTION_IDS
    assert "script" not in parsed.start_tags and "b" not in parsed.start_tags
    # Every Markdown table row keeps its header's column count, whatever the cells hold.
    table: list[str] = []
    for line in [*md.splitlines(), ""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            assert {md_table_cells(row) for row in table} == {md_table_cells(table[0])}, table
            table = []
    assert md_headings(md) == SECTION_TITLES


@pytest.mark.parametrize("name", ["demo", "gpu"])
def test_none_values_render_as_dashes(
    name: str, reports: dict[str, dict[str, Any]], plots: list[PlotFile]
) -> None:
    report = _nones(reports[name])
    page = render_html(report, plots)
    md = render_markdown(report, plots)
    for out in (page, md):
        assert not re.search(r"\bNone\b", out), re.search(r".{40}\bNone\b.{40}", out)
        assert not re.search(r"\bnan\b|\bNaN\b", out)
        assert fmt.MISSING in out
    parsed = parse(page)
    assert parsed.sections == SECTION_IDS
    assert re.search(r"Model\s*—", parsed.text["run"])


def test_empty_report_still_renders_every_section(reports: dict[str, RunAnalysis]) -> None:
    # An analysis with every optional figure missing and every list and mapping empty.
    report = _nones(reports["gpu"], empty=True)
    parsed = parse(render_html(report, []))
    assert parsed.sections == SECTION_IDS
    assert md_headings(render_markdown(report, [])) == SECTION_TITLES
    # A document that is not a report is refused with the field that does not fit, not half-rendered.
    for document in ({}, {**to_json(report), "run": None}, {**to_json(report), "findings": "oops"}):
        with pytest.raises(AnalysisFormatError, match=r"report\.(run|findings|report_schema_version)"):
            from_json(document)


def test_communication_and_cost_placeholders(
    reports: dict[str, dict[str, Any]], plots: list[PlotFile]
) -> None:
    report = reports["demo"]
    assert report.communication is None and report.cost is not None and report.cost.priced is False
    parsed = parse(render_html(report, plots))
    md = render_markdown(report, plots)
    assert parsed.text["communication"].strip().endswith(communication_section.NOT_MEASURED)
    assert communication_section.NOT_MEASURED in md_section(md, "Communication")
    assert "No collective was timed" in parsed.text["communication"]
    # An unpriced run says why and how to price it; no money figure shows.
    assert "Not priced: no price given: pass --instance" in parsed.text["cost"]
    assert "$" not in parsed.text["cost"].replace("per $", "")
    # A version-1 report written before cost figures existed holds null: the section says so.
    old = dataclasses.replace(report, cost=None)
    parsed = parse(render_html(old, plots))
    assert parsed.text["cost"].strip().endswith(cost_section.NOT_MEASURED)
    assert cost_section.NOT_MEASURED in md_section(render_markdown(old, plots), "Cost")


def test_communication_section_shows_its_figures(
    reports: dict[str, dict[str, Any]], plots: list[PlotFile]
) -> None:
    comm = {
        "backend": "gloo",
        "world_size": 2,
        "ranks_per_node": 2,
        "comm_ms_per_step": 13.0,
        "share_of_step": 0.45,
        "exposed_ms_per_step": 12.0,
        "overlapped_ms_per_step": 1.0,
        "exposed_share_of_step": 0.41,
        "per_rank": [
            {
                "rank": 0,
                "steps_with_comm": 30,
                "comm_ms": 23.6,
                "exposed_ms": 23.0,
                "bytes_per_step": 2308,
                "collectives_per_step": 1,
            }
        ],
        "per_bucket": [
            {
                "bucket": 0,
                "kind": "all_reduce",
                "bytes": 2308,
                "dtype": "float32",
                "median_ms": 23.2,
                "count": 30,
            }
        ],
        "by_size": [],
        "fits": [],
        "link": None,
        "late_rank": {"rank": 1, "summary": "rank 1 arrives late at the collectives"},
        "ddp_logging": {"avg_backward_comm_time_ms": 24.0},
    }
    report = from_json({**to_json(reports["demo"]), "communication": comm})
    parsed = parse(render_html(report, plots))
    text = parsed.text["communication"]
    assert "gloo" in text and "13.0 ms" in text and "Rank 1 arrives late at the collectives." in text
    assert "all_reduce" in text and "23.2 ms" in text and "No latency-bandwidth fit" in text
    assert "Gradient" not in md_section(render_markdown(report, plots), "Cost")


def test_warnings_are_listed(reports: dict[str, dict[str, Any]], plots: list[PlotFile]) -> None:
    report = dataclasses.replace(
        reports["demo"], warnings=["rank 1: steps.jsonl line 7 is damaged", "second"]
    )
    parsed = parse(render_html(report, plots))
    assert "rank 1: steps.jsonl line 7 is damaged" in parsed.text["warnings"]
    assert "2 warnings came up" in parsed.text["summary"]
    assert "- rank 1: steps.jsonl line 7 is damaged" in md_section(render_markdown(report, plots), "Warnings")


# ---------------------------------------------------------------------------------------------------
# Formatting


def test_value_formatters() -> None:
    assert fmt.number(214.406) == "214.4"
    assert fmt.number(13721.956) == "13,722"
    assert fmt.number(6.7) == "6.70"
    assert fmt.number(-0.0001) == "0.00"
    assert fmt.number(1234) == "1,234"
    assert fmt.number(None) == fmt.MISSING == fmt.ms(None) == fmt.size_bytes(None) == fmt.share(None)
    assert fmt.number(float("nan")) == fmt.MISSING
    assert fmt.number(True) == "yes"  # a bool is never a figure
    assert fmt.ms(148.78) == "148.8 ms" and fmt.ms(0.596) == "0.60 ms"
    assert fmt.size_bytes(890888192) == "849.6 MiB"
    assert fmt.size_bytes(25276514304) == "23.5 GiB"
    assert fmt.size_bytes(512) == "512 B"
    assert fmt.byte_rate(161106.4) == "157.3 KiB/s"
    assert fmt.share(0.3172) == "31.7%" and fmt.percent(100.8) == "100.8%" and fmt.percent(40, 0) == "40%"
    assert fmt.parameters(437760) == "0.44 M" and fmt.parameters(577) == "577"
    assert fmt.parameters(7_241_732_096) == "7.24 B"
    assert fmt.duration(44.844) == "44.8 s" and fmt.duration(725) == "12 min 05 s"
    assert fmt.duration(7260) == "2 h 01 min"
    assert fmt.energy(1.2e6) == "333.3 Wh" and fmt.energy(7.2e6) == "2.00 kWh"
    assert fmt.unix_time(0) == "1970-01-01 00:00:00 UTC"
    assert fmt.text([0, 1]) == "0, 1" and fmt.text([]) == "none" and fmt.text(False) == "no"
    assert fmt.text(1.0) == "1.0" and fmt.text(13969487348482715764) == "13969487348482715764"
    assert fmt.pair("120.0 GiB", "141.0 GiB") == "120.0 / 141.0 GiB"
    assert fmt.pair("40%", "100%") == "40% / 100%"
    assert fmt.ranks_text([3]) == "rank 3" and fmt.ranks_text(["0", "1"]) == "ranks 0, 1"
    assert fmt.ranks_text([*range(8), 16, 17, 18, 20]) == "ranks 0–7, 16–18, 20"
    assert fmt.sentence("rank 1 is slow") == "Rank 1 is slow."
    assert environment_section.by_name("ram_total_bytes", 1536 * GIB) == "1.50 TiB"
    assert environment_section.by_name("allreduce_ms", 12.5) == "12.5 ms"


def test_tables_for_large_jobs_fold_away(reports: dict[str, dict[str, Any]], plots: list[PlotFile]) -> None:
    from tuneup.report.blocks import FOLD_ROWS

    demo = reports["demo"]
    row = demo.throughput.per_rank[0]
    rows = [dataclasses.replace(row, rank=r) for r in range(FOLD_ROWS + 1)]
    report = dataclasses.replace(demo, throughput=dataclasses.replace(demo.throughput, per_rank=rows))
    page = render_html(report, plots)
    throughput = page.split('<section id="throughput">', 1)[1].split("</section>", 1)[0]
    assert "<details><summary>Steady-state rates per rank</summary>" in throughput
    md = md_section(render_markdown(report, plots), "Throughput")
    assert md.lstrip().startswith("<details><summary>Steady-state rates per rank</summary>")
    # Below the limit the table stays open.
    small = render_html(reports["demo"], plots).split('<section id="throughput">', 1)[1]
    assert not small.split("</section>", 1)[0].count("<details>")


# ---------------------------------------------------------------------------------------------------
# Scale: 2 ranks keep a row per rank; 1,024 ranks on 128 hosts read in a few dozen rows.

RANKS_PER_HOST = 8
LARGE_STRAGGLER = 517
IDLE_GPU_RANK = 264  # local rank 0 of node-033, which samples that host's GPUs


def _write_large_run(path: Path, ranks: int = 1024) -> Path:
    """A synchronous job on hosts of 8 GPUs: rank 517 is slow in forward and the other ranks wait for it
    in backward; GPU 2 of node-033 idles at half the others' utilization."""
    t0 = 1_700_000_000.0
    write_manifest(
        path,
        {
            "run_id": "large",
            "created_unix": t0,
            "world_size": ranks,
            "num_nodes": ranks // RANKS_PER_HOST,
            "trainer": {"max_steps": 12, "accumulate_grad_batches": 1},
            "dataloader": {"batch_size": 8},
            "model": {"class": "Large"},
        },
    )
    for rank in range(ranks):
        w = RankWriter(path, rank)
        w.open({"host": f"node-{rank // RANKS_PER_HOST:03d}", "start_unix": t0 + 0.9, "timing": "host"})
        slow = rank == LARGE_STRAGGLER
        t = t0 + 1.0
        for s in range(12):
            jitter = (rank * 7919 + s) % 13 / 10
            parts = {
                "data_ms": 1.0,
                "forward_ms": 15.0 + (20.0 if slow else 0.0) + (300.0 if s == 0 else 0.0),
                "backward_ms": 25.0 + (0.0 if slow else 20.0) + jitter,
                "optimizer_ms": 2.0,
                "other_ms": 3.0,
            }
            wall = sum(parts.values())
            t += wall / 1000
            w.add_step(
                {
                    "step": s,
                    "epoch": 0,
                    "t_end": t,
                    "wall_ms": wall,
                    **parts,
                    "micro_batches": 1,
                    "samples": 8,
                    "tokens": None,
                    "loss": 1.0,
                    "grad_norm": None,
                    "peak_mem_bytes": None,
                }
            )
        for i in range(3):
            sample: dict[str, Any] = {
                "t": t0 + 1.0 + 0.3 * i,
                "process": {"cpu_percent": 90.0 + rank % 7, "rss_bytes": GIB + rank * 2**20},
            }
            if rank % RANKS_PER_HOST == 0:
                sample["system"] = {
                    "cpu_percent": 50.0,
                    "mem_used_bytes": 100 * GIB,
                    "mem_total_bytes": 1024 * GIB,
                    "net": {
                        "lo": {"sent_bytes": i * 1e6, "recv_bytes": i * 1e6},
                        "eth0": {"sent_bytes": i * 1e8, "recv_bytes": i * 1e8},
                    },
                }
                sample["gpus"] = [
                    {
                        "index": g,
                        "util_percent": 45.0 if (rank, g) == (IDLE_GPU_RANK, 2) else 90.0,
                        "mem_used_bytes": 70 * GIB,
                        "mem_total_bytes": 80 * GIB,
                        "power_w": 600.0,
                    }
                    for g in range(RANKS_PER_HOST)
                ]
            w.add_telemetry(sample)
        w.close(status="completed")
    return path


def _communication(ranks: int, late: int) -> model.Communication:
    """Collectives of `ranks` ranks; rank `late` spends the least time in them (the others wait for it)."""
    return model.Communication(
        backend="nccl",
        world_size=ranks,
        ranks_per_node=RANKS_PER_HOST,
        nccl_version=None,
        comm_ms_per_step=30.0,
        share_of_step=0.4,
        exposed_ms_per_step=10.0,
        overlapped_ms_per_step=20.0,
        exposed_share_of_step=0.14,
        per_rank=[
            model.RankComm(
                rank=r,
                steps_with_comm=11,
                comm_ms=10.0 if r == late else 30.0 + r % 5,
                exposed_ms=5.0 if r == late else 10.0 + r % 3,
                bytes_per_step=5e8,
                collectives_per_step=14.0,
            )
            for r in range(ranks)
        ],
        per_bucket=[],
        by_size=[],
        fits=[],
        link=None,
        late_rank=None,
        ddp_logging=None,
    )


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> RunAnalysis:
    report = analyze_run(load_run(_write_large_run(tmp_path_factory.mktemp("large") / "run")))
    return dataclasses.replace(report, communication=_communication(1024, late=LARGE_STRAGGLER))


def _section_tables(report: RunAnalysis, section_id: str) -> dict[str, Any]:
    from tuneup.report.blocks import Table
    from tuneup.report.sections import report_sections

    (section,) = [s for s in report_sections(report, []) if s.id == section_id]
    return {b.title: b for b in section.blocks if isinstance(b, Table)}


def test_at_1024_ranks_no_table_has_a_row_per_rank_or_host(large: RunAnalysis) -> None:
    assert len(large.step_time.per_rank) == 1024 and len(large.telemetry.hosts) == 128
    assert len(large.telemetry.gpus) == 1024
    for section_id in ("hardware", "ranks", "communication"):
        tables = _section_tables(large, section_id)
        assert tables, section_id
        for title, table in tables.items():
            assert len(table.rows) <= 40, (section_id, title, len(table.rows))
    statistics = ("", "min", "p5", "median", "p95", "max")
    ranks = _section_tables(large, "ranks")
    assert ranks["Median steady step, spread across 1,024 ranks"].header == statistics
    assert len(ranks["The 5 slowest and 5 fastest ranks, by median steady step"].rows) == 10
    hosts = ranks["The 10 slowest and 5 fastest of 128 hosts, by the median steady step of their ranks"]
    assert len(hosts.rows) == 15
    hardware = _section_tables(large, "hardware")
    for title in (
        "GPUs, spread across 1,024 GPUs on 128 hosts",
        "Training processes (each rank with its children), spread across 1,024 ranks",
        "Hosts, spread across 128 hosts",
    ):
        assert hardware[title].header == statistics, title
    assert [r[0] for r in hardware["Network interfaces across 128 hosts"].rows] == ["eth0", "lo"]
    comm = _section_tables(large, "communication")
    assert comm["Per rank, mean per step: spread across 1,024 ranks"].header == statistics


def test_at_1024_ranks_the_rank_that_holds_the_others_back_is_named(
    large: RunAnalysis, plots: list[PlotFile]
) -> None:
    straggler, slowest = large.ranks.straggler, large.ranks.slowest[0]
    assert straggler is not None and straggler.rank == LARGE_STRAGGLER
    parsed = parse(render_html(large, plots))
    ranks = parsed.text["ranks"]
    assert f"The slowest of 1,024 ranks is rank {slowest.rank} on {slowest.host}" in ranks
    assert f"Straggler: rank {LARGE_STRAGGLER}, in forward" in ranks
    hardware = _section_tables(large, "hardware")
    processes = hardware["Rank processes at the extremes (3 each)"].rows
    assert processes[-1][:3] == ("straggler", str(LARGE_STRAGGLER), "node-064")
    idle = hardware["The 5 least busy GPUs, by mean utilization"].rows
    assert idle[0][:3] == ("2", "node-033", "45% / 45%")
    extremes = "Ranks at the extremes of collective time (3 each), mean per step"
    comm = _section_tables(large, "communication")[extremes]
    assert comm.rows[0][:3] == ("least time", str(LARGE_STRAGGLER), "node-064")
    assert comm.rows[-1][:2] == ("straggler", str(LARGE_STRAGGLER))
    md = render_markdown(large, plots)
    assert f"The slowest of 1,024 ranks is rank {slowest.rank}" in md_section(md, "Ranks side by side")
    assert f"| straggler | {LARGE_STRAGGLER} | node-064 |" in md_section(md, "GPUs, processes and hosts")


def test_at_2_ranks_every_rank_keeps_its_row(reports: dict[str, RunAnalysis], plots: list[PlotFile]) -> None:
    demo = reports["demo"]
    ranks = _section_tables(demo, "ranks")
    assert list(ranks) == ["Steady-state steps per rank; phase columns are medians"]
    per_rank = ranks["Steady-state steps per rank; phase columns are medians"]
    assert per_rank.header[:5] == ("Rank", "Host", "Steps", "Median step", "p95 step")
    assert [r[:2] for r in per_rank.rows] == [("0", "node-a"), ("1", "node-a")]
    hardware = _section_tables(demo, "hardware")
    processes_title = "Training processes (each rank with its children)"
    assert list(hardware) == [processes_title, "Hosts", "Network interfaces"]
    processes = hardware[processes_title]
    assert processes.header == ("Rank", "CPU mean", "Peak RSS")
    assert [r[0] for r in processes.rows] == ["0", "1"]
    assert {r[0] for r in hardware["Hosts"].rows} == {"node-a"}
    gpus = _section_tables(reports["gpu"], "hardware")["GPUs: NVIDIA H200 on node-a"]
    assert gpus.header[:2] == ("GPU", "Util mean / max") and [r[0] for r in gpus.rows] == ["0", "1"]
    with_comm = dataclasses.replace(demo, communication=_communication(2, late=1))
    comm = _section_tables(with_comm, "communication")
    assert list(comm) == ["Per rank, mean per step"]
    header = ("Rank", "Collectives", "Exposed", "Bytes", "Collectives/step")
    assert comm["Per rank, mean per step"].header == header
    assert [r[0] for r in comm["Per rank, mean per step"].rows] == ["0", "1"]
    page = parse(render_html(with_comm, plots)).text
    for section_id in ("ranks", "hardware", "communication"):
        assert "spread across" not in page[section_id] and "at the extremes" not in page[section_id]
