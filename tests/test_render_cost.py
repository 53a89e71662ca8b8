"""The report's cost section in HTML, Markdown and JSON, on runs priced, unpriced, on GPUs and on CPU.

The runs are synthetic but go through the real writer, reader, analysis and renderers. Their figures are
round on purpose, so the expected dollars, watts and MFU below are worked out by hand:

- 2 ranks, 100 steps of 100 ms each (10 optimizer steps/s), 8 samples and 1,000 tokens per rank and
  step: 160 samples/s and 20,000 tokens/s; the run lasts 10 s; max_steps=1,000.
- 2 H200 GPUs, each at 500 W for 10 s by its energy counter: 10,000 J, 1,000 W in all.
- 9.894 TFLOP per micro-batch per rank: 98.94 TFLOP/s per device, a tenth of the H200's dense bf16 peak.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import typing
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tuneup.analyze.model import from_json
from tuneup.cli import main
from tuneup.cost.options import CostOptions
from tuneup.cost.pricing import PriceChoice
from tuneup.record import RankWriter, write_manifest
from tuneup.report import format as fmt
from tuneup.report import report_schema, write_report
from tuneup.report.sections import cost as cost_section

GIB = 2**30
T0 = 1_700_000_000.0
H200_BF16_DENSE_TFLOPS = 989.4
FLOPS_PER_MICRO_BATCH = H200_BF16_DENSE_TFLOPS / 10 / 10 * 1e12  # 10% MFU at 10 steps/s
HOSTILE = "<script>alert(1)</script>"


def _make_run(path: Path, *, gpus: bool = True, flops: bool = True, pricing: dict | None = None) -> Path:
    manifest: dict[str, Any] = {
        "run_id": "cost-run",
        "created_unix": T0,
        "world_size": 2,
        "num_nodes": 1,
        "trainer": {
            "namespace": "lightning.pytorch",
            "strategy": "DDPStrategy",
            "accelerator": "CUDAAccelerator" if gpus else "CPUAccelerator",
            "precision": "bf16-mixed",
            "accumulate_grad_batches": 1,
            "max_steps": 1000,
        },
        "dataloader": {"batch_size": 8, "dataset_len": 16_000, "sampler": "DistributedSampler"},
        "model": {"class": "TinyLM", "parameters": 1000},
        "gpus": {
            "driver_version": "570.86.15",
            "gpus": [
                {
                    "index": i,
                    "name": "NVIDIA H200",
                    "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0",
                    "memory_total_bytes": 141 * GIB,
                }
                for i in range(2)
            ],
        }
        if gpus
        else None,
    }
    if pricing is not None:
        manifest["pricing"] = pricing
    write_manifest(path, manifest)
    for rank in range(2):
        w = RankWriter(path, rank)
        w.open({"host": "node-a", "start_unix": T0, "timing": "host"})
        if flops:
            w.add_event("flops", flops=FLOPS_PER_MICRO_BATCH, samples=8)
        for s in range(100):
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
                    "grad_norm": None,
                    "peak_mem_bytes": None,
                }
            )
        for i in range(11):
            sample: dict[str, Any] = {"t": T0 + i, "process": {"cpu_percent": 100.0, "rss_bytes": GIB}}
            if gpus:
                sample["gpus"] = [
                    {
                        "index": rank,
                        "bus_id": f"00000000:{0x18 + rank:02X}:00.0",
                        "util_percent": 90.0,
                        "mem_used_bytes": 100 * GIB,
                        "mem_total_bytes": 141 * GIB,
                        "power_w": 500.0,
                        "temp_c": 60,
                        "sm_clock_mhz": 1980,
                        "energy_j": 500.0 * i,
                        "throttle": [],
                    }
                ]
            w.add_telemetry(sample)
        w.close(status="completed")
    return path


class _Text(HTMLParser):
    """The visible text of one section of the page, and the tags the page opens."""

    def __init__(self, section: str) -> None:
        super().__init__(convert_charrefs=True)
        self.section, self.inside, self.text, self.tags = section, 0, [], set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        if tag == "section":
            self.inside = 1 if dict(attrs).get("id") == self.section else 0

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self.inside = 0

    def handle_data(self, data: str) -> None:
        if self.inside:
            self.text.append(data)


def html_section(page: str, section: str = "cost") -> str:
    parser = _Text(section)
    parser.feed(page)
    return re.sub(r"\s+", " ", "".join(parser.text))


def md_section(md: str, title: str = "Cost") -> str:
    """The section's Markdown with its dollar signs unescaped (they are escaped, or GitHub reads maths)."""
    section = md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    assert "$" not in section.replace("\\$", ""), "an unescaped $ starts inline maths on GitHub"
    return section.replace("\\$", "$")


def _write(run: Path, out: Path, cost: CostOptions | None = None) -> tuple[str, str, dict[str, Any]]:
    """The report in all three formats; report.json checked against the schema on the way."""
    written = write_report(run, out, "html,md,json", cost=cost)
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    jsonschema.validate(report, report_schema())
    page = (out / "report.html").read_text(encoding="utf-8")
    md = (out / "report.md").read_text(encoding="utf-8")
    assert written.path("html") and written.path("md")
    return page, md, report


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_run(tmp_path_factory.mktemp("gpu") / "run")


def test_priced_per_gpu_hour_hand_computed_figures(gpu_run: Path, tmp_path: Path) -> None:
    options = CostOptions(
        price=PriceChoice(price_per_hour=3.5, price_per="gpu", source="command line"),
        electricity_usd_per_kwh=0.12,
        target_tokens=1e9,
    )
    page, md, report = _write(gpu_run, tmp_path / "out", options)
    cost = report["cost"]
    assert cost["priced"] is True and cost["price"]["usd_per_hour"] == pytest.approx(7.0)
    html, mdc = html_section(page), md_section(md)
    for out in (html, mdc):
        # 2 GPUs x $3.50; 20,000 tokens/s = 72 M tokens/h, so $7 / 72 = $0.0972 per 1M tokens.
        assert "Priced at $7.00/h for the job: 2 x $3.50 per GPU-hour (command line)." in out
        assert "$0.0972" in out
        assert "$0.0194" in out  # spent so far: 10 s at $7/h
        assert "$0.194" in out  # one epoch: 1,000 steps at 10/s = 100 s
        assert "1,000 training steps" in out and "1 min 40 s" in out
        assert "10.3 M" in out  # tokens per $: 72 M / 7
        assert "82,286" in out  # samples per $: 160 x 3,600 / 7
        # Projections: 900 steps to max_steps=1,000 in 90 s for $0.175; 1e9 tokens = 500,000 steps.
        assert "max_steps=1,000" in out and "900" in out and "1 min 30 s" in out and "$0.175" in out
        assert "1,000,000,000 tokens" in out and "499,900" in out and "13 h 53 min" in out
        assert "$97.20" in out
        # Compute: 98.94 TFLOP/s per device of the 989.4 dense bf16 peak.
        assert "19.8 TFLOP" in out and "197.9 TFLOP/s" in out and "98.9 TFLOP/s" in out
        assert "989.4 TFLOP/s (dense bf16)" in out and "H200-SXM" in out
        assert "10.0%" in out
        # Energy: 2 x 500 W x 10 s = 10,000 J = 2.78 Wh; 1,000 W / 10 steps/s = 100 J per step;
        # 1,000 W / 20,000 tokens/s = 0.05 J per token = 13.9 Wh per 1M tokens; at $0.12/kWh.
        assert "2.78 Wh" in out and "1,000 W" in out and "100.0 J" in out and "13.9 Wh" in out
        assert "$0.12/kWh" in out and "$0.000333" in out and "$0.00167" in out
        assert "GPUs only: host CPUs, memory, networking and cooling are not in it." in out
        # No catalog: no spot column, no caution, no instance.
        assert "Spot" not in out and "Check this price" not in out and "Instance:" not in out
    assert "MFU" in html and "10.0%" in html.split("MFU", 1)[1][:40]
    assert re.search(r"\| Per 1M tokens \| \$0\.0972 \|", mdc)


def test_priced_from_the_catalog_shows_the_doubt_and_the_catalog(gpu_run: Path, tmp_path: Path) -> None:
    options = CostOptions(price=PriceChoice(instance="gcp:a3-ultragpu-8g", source="command line"))
    page, md, report = _write(gpu_run, tmp_path / "out", options)
    price = report["cost"]["price"]
    assert price["instance"]["as_of_date"] is None and price["doubts"]
    # 2 of the machine's 8 GPUs: a quarter of $86.75992/h on demand and of $40.99433/h at spot.
    assert price["usd_per_hour"] == pytest.approx(86.75992 / 4)
    html, mdc = html_section(page), md_section(md)
    for out in (html, mdc):
        assert "$21.69/h" in out and "$10.25/h" in out  # on demand, spot
        assert "Check this price" in out
        assert "Undated: the source catalog commit's date is not known." in out
        assert f"version {price['catalog_version']}" in out and price["catalog_version"] == "2026.11.29"
        assert "the price is undated" in out
        assert "gcp:a3-ultragpu-8g (us-central1) on-demand $86.76/h" in out
        assert "Instance: gcp:a3-ultragpu-8g" in out and "$40.99/h" in out
        # 900 steps to go at 10/s: 90 s at $21.68998/h on demand and $10.2485825/h at spot.
        assert "$0.542" in out and "$0.256" in out
    # The caution is a finding-styled warning in HTML, a warning bullet in Markdown.
    assert 'class="finding warning"' in page.split('<section id="cost">', 1)[1]
    assert "- ⚠️ **Check this price**: Undated:" in mdc
    assert "| Figure | On-demand | Spot |" in mdc


def test_unpriced_report_says_why_and_shows_no_money(gpu_run: Path, tmp_path: Path) -> None:
    page, md, report = _write(gpu_run, tmp_path / "out")
    cost = report["cost"]
    assert cost["priced"] is False and cost["price"] is None
    assert all(v is None for v in cost["figures"].values())
    html, mdc = html_section(page), md_section(md)
    for out in (html, mdc):
        assert "Not priced: no price given: pass --instance" in out
        assert "$" not in out  # no "$0", no "$ per": nothing priced at all
        assert "Cost to go" not in out and "Costs to go appear once the run is priced" in out
        # What needs no price still shows: time to go, MFU, energy.
        assert "1 min 30 s" in out and "10.0%" in out and "2.78 Wh" in out
        assert "Electricity price" in out and "not given" in out
        assert "— (no electricity price given)" in out


def test_cpu_run_says_mfu_is_not_defined(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "run", gpus=False)
    page, md, report = _write(run, tmp_path / "out", CostOptions(price=PriceChoice(price_per_hour=2.0)))
    flops = report["cost"]["flops"]
    assert flops["mfu"] is None and flops["achieved_tflops_per_s"] == pytest.approx(197.88)
    assert report["cost"]["energy"]["source"] is None
    html, mdc = html_section(page), md_section(md)
    for out in (html, mdc):
        assert "MFU is not defined on CPU" in out
        assert "197.9 TFLOP/s" in out
        assert "— (not defined; see below)" in out
        assert "Energy: no GPU energy or power was recorded" in out
        assert "$2.00/h" in out  # 1 node x $2 per node-hour
    assert "0.0%" not in html and "0%" not in html


def test_no_flops_counted_says_so(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "run", flops=False)
    page, md, _ = _write(run, tmp_path / "out", CostOptions(price=PriceChoice(price_per_hour=2.0)))
    for out in (html_section(page), md_section(md)):
        assert "Compute: FLOPs were not counted: TuneupCallback(count_flops=True)" in out
        assert "FLOPs were not counted" in out
        assert "TFLOP" not in out


def test_price_recorded_by_the_run_shows_in_tuneup_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _make_run(
        tmp_path / "run", pricing={"price_per_hour": 3.5, "price_per": "gpu", "source": "callback"}
    )
    assert main(["show", str(run)]) == 0
    out = capsys.readouterr().out
    assert "  cost: $7.00/h (callback); $0.0972 per 1M tokens; MFU 10.0%" in out.splitlines()
    unpriced = _make_run(tmp_path / "unpriced")
    assert main(["show", str(unpriced)]) == 0
    assert "cost:" not in capsys.readouterr().out


def test_hostile_user_catalog_is_escaped(gpu_run: Path, tmp_path: Path) -> None:
    catalog = tmp_path / "mine.csv"
    catalog.write_text(
        "provider,instance,region,gpu,gpu_count,on_demand_usd_hr,spot_usd_hr,intra_node_link,"
        "inter_node_gbps,source,as_of,doubt\n"
        f'evil,box-8,us-east-1,"{HOSTILE}",8,40,20,"<img src=x onerror=alert(2)>","<b>100</b>",'
        f'"{HOSTILE} | [x](javascript:y)","<b>soon</b>","{HOSTILE}\nsecond line"\n',
        encoding="utf-8",
    )
    options = CostOptions(
        price=PriceChoice(instance="evil:box-8", source="command line"), catalog=str(catalog)
    )
    page, md, report = _write(gpu_run, tmp_path / "out", options)
    assert HOSTILE in report["cost"]["price"]["basis"]
    cost_html = page.split('<section id="cost">', 1)[1].split("</section>", 1)[0]
    for out in (cost_html, md_section(md)):
        assert "<script" not in out.lower() and "<b>" not in out and "<img" not in out
        assert out.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 4  # basis, doubt, source, gpu
    parser = _Text("cost")
    parser.feed(page)
    assert "script" not in parser.tags and "b" not in parser.tags
    # Images only from the plots: the catalog's <img> is text.
    assert page.count("<img ") == page.count('<img src="data:image/png;base64,')
    # Markdown: no link is made, and the table stays one row per line.
    assert not re.search(r"(?<!\\)\]\(javascript:", md)
    assert "$10.00/h" in html_section(page)  # 2 of 8 GPUs at $40/h


def test_schema_rejects_a_malformed_cost(gpu_run: Path, tmp_path: Path) -> None:
    _, _, report = _write(gpu_run, tmp_path / "out", CostOptions(price=PriceChoice(price_per_hour=1.0)))
    schema = report_schema()
    for breaking in (
        lambda c: c.pop("figures"),
        lambda c: c["figures"].update(usd_per_hour="7"),
        lambda c: c["price"].update(doubts="none"),
        lambda c: c.update(priced=False),  # priced=False needs price null and a reason
        lambda c: c["projections"][0].pop("usd"),
        lambda c: c["energy"].pop("mean_power_w"),
        lambda c: c["flops"].update(mfu=-0.1),
    ):
        bad = copy.deepcopy(report)
        breaking(bad["cost"])
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    # A version-1 report from before cost figures (cost null) still validates.
    jsonschema.validate({**report, "cost": None}, schema)


def test_missing_cost_figures_render_as_dashes_not_zeros(gpu_run: Path, tmp_path: Path) -> None:
    from tuneup.report.html import render_html
    from tuneup.report.markdown import render_markdown

    _, _, report = _write(gpu_run, tmp_path / "out", CostOptions(price=PriceChoice(price_per_hour=1.0)))

    def nones(value: Any, optional: bool = False) -> Any:
        """Every figure the analysis may leave out (an Optional number) left out; texts, flags and the
        structure (the price, its instance, the spot figures) kept, so every row still shows."""
        if isinstance(value, list):
            return [nones(v) for v in value]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            hints = typing.get_type_hints(type(value))
            return dataclasses.replace(
                value,
                **{
                    f.name: nones(getattr(value, f.name), type(None) in typing.get_args(hints[f.name]))
                    for f in dataclasses.fields(value)
                },
            )
        return None if optional and not isinstance(value, (bool, str)) else value

    analysis = from_json(report)
    hollow = dataclasses.replace(analysis, cost=nones(analysis.cost))
    for out in (html_section(render_html(hollow, [])), md_section(render_markdown(hollow, []))):
        assert "$0" not in out and " 0 W" not in out and "0.0%" not in out
        assert not re.search(r"\bNone\b|\bnan\b", out)
        assert fmt.MISSING in out


def test_cost_formatters() -> None:
    assert fmt.usd(1234.564) == "$1,234.56" and fmt.usd(21.68998) == "$21.69"
    assert fmt.usd(0.0123456) == "$0.0123" and fmt.usd(0.9996) == "$1.00" and fmt.usd(0) == "$0.00"
    assert (
        fmt.usd(1e-7) == "$0.0000001"
        and fmt.usd(0.5) == "$0.50"
        and fmt.usd(-3) == "-$3.00"
        and fmt.usd(None) == fmt.MISSING
    )
    assert fmt.usd_rate(3.5, "h") == "$3.50/h" and fmt.usd_rate(None, "h") == fmt.MISSING
    assert fmt.kwh(1.2) == "1.20 kWh" and fmt.kwh(0.0025) == "2.50 Wh" and fmt.kwh(2e-6) == "0.002 Wh"
    assert fmt.flop_count(1.2e13) == "12.0 TFLOP" and fmt.flop_count(3.75e11) == "375.0 GFLOP"
    assert fmt.tflops_rate(312) == "312.0 TFLOP/s" and fmt.tflops_rate(0.0123) == "12.3 GFLOP/s"
    assert fmt.tflops_rate(None) == fmt.MISSING
    assert fmt.fraction_percent(0.165) == "16.5%" and fmt.fraction_percent(0.00042) == "0.042%"
    assert fmt.fraction_percent(None) == fmt.MISSING
    assert fmt.large(4_067_240) == "4.07 M" and fmt.large(63_550.6) == "63,551" and fmt.large(3e9) == "3.00 B"
    assert fmt.figure(0.00221973) == "0.00222" and fmt.figure(132.275) == "132.3"
    assert cost_section.NOT_MEASURED
