"""The report's figures: which PNGs are written for which data, and that bad data skips a figure, never raises."""

from __future__ import annotations

import copy
import logging
import math
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuneup.analyze.analysis import analyze_run
from tuneup.analyze.model import AnalysisFormatError, RunAnalysis, from_json
from tuneup.record import RankWriter, load_run, write_manifest
from tuneup.report import plotting as plots
from tuneup.report import sections
from tuneup.report.artifacts import PlotFile
from tuneup.report.sections import SECTIONS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SECTION_IDS = {sid for sid, _ in SECTIONS}
# In page order: a section's figures follow the sections before it.
EXPECTED_SECTIONS = {
    "fit_timeline.png": "timeline",
    "badput.png": "badput",
    "step_breakdown.png": "step-time",
    "throughput.png": "timeseries",
    "step_time.png": "timeseries",
    "loss.png": "timeseries",
    "gpu_utilization.png": "hardware",
    "host_utilization.png": "hardware",
    "rank_step_time.png": "ranks",
    "communication.png": "communication",
    "sync_strategy.png": "sync-strategy",
    "noise_scale.png": "noise-scale",
    "convergence_steps.png": "convergence",
    "convergence_hours.png": "convergence",
    "convergence_samples.png": "convergence",
    "convergence_usd.png": "convergence",
    "convergence_ranks.png": "convergence",
}
# The fixture reports hold no convergence section (tests/test_convergence.py draws its figures from runs);
# the recorded run at the end draws convergence_ranks.png from its two ranks' training losses.
CONVERGENCE_PLOTS = {name for name in EXPECTED_SECTIONS if name.startswith("convergence_")}
# The fixtures time no collectives; tests/test_report.py checks the communication plot of a real run.
# The fixture reports predate the job timeline and the badput ledger (report.json has neither): the
# recorded-run test at the end draws fit_timeline.png and badput.png.
# Nor do they record gradient norms: tests/test_noise_scale.py draws noise_scale.png from a real run; nor a
# synchronisation strategy: tests/test_sync_report.py draws sync_strategy.png from real runs.
ALL_BUT_COMM = set(EXPECTED_SECTIONS) - {
    "communication.png",
    "fit_timeline.png",
    "badput.png",
    "noise_scale.png",
    "sync_strategy.png",
    *CONVERGENCE_PLOTS,
}
CPU_PLOTS = ALL_BUT_COMM - {"gpu_utilization.png"}
PHASE_SHARES = {"data": 0.004, "forward": 0.317, "backward": 0.618, "optimizer": 0.037, "other": 0.024}


# ------------------------------------------------------------------------------------------------
# Reports in the shape analyze_run emits (see tuneup/analyze/analysis.py), deterministic.


def _series(t_s: list[float], values: list[float]) -> dict[str, list[float]]:
    return {"t_s": t_s, "values": values}


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[round(p * (len(ordered) - 1))]

    return {k: q(p) for k, p in (("min", 0), ("p5", 0.05), ("p25", 0.25), ("p50", 0.5))} | {
        k: q(p) for k, p in (("p75", 0.75), ("p95", 0.95), ("max", 1.0))
    }


def make_gpus(count: int, points: int, hosts: tuple[str, ...] = ("vm",)) -> list[dict[str, Any]]:
    """`telemetry.gpus` entries as `_telemetry_section` writes them."""
    gpus = []
    for i in range(count):
        t_s = [round(0.5 * k, 3) for k in range(points)]
        util = [max(0.0, min(100.0, 70 + 25 * math.sin(k / 9 + i))) for k in range(points)]
        power = [120 + 3 * u for u in util]
        mem = [min(70e9, 2e9 + (k + i) * 1e8) for k in range(points)]
        gpus.append(
            {
                "host": hosts[i % len(hosts)],
                "index": i // len(hosts),
                "bus_id": f"0000:{i:02x}:00.0",
                "lost": False,
                "util_percent_mean": round(sum(util) / points, 1),
                "util_percent_max": max(util),
                "mem_used_bytes_max": int(max(mem)),
                "mem_total_bytes": 85899345920,
                "power_w_mean": round(sum(power) / points, 1),
                "power_w_max": max(power),
                "energy_j": 1000.0,
                "temp_c_max": 71.0,
                "sm_clock_mhz_mean": 1755.0,
                "throttle_reasons": [],
                "series": {
                    "util_percent": _series(t_s, util),
                    "power_w": _series(t_s, power),
                    "mem_used_bytes": _series(t_s, mem),
                },
            }
        )
    return gpus


def make_report(
    *,
    ranks: int = 2,
    steps: int = 300,
    gpus: int = 0,
    telemetry_points: int = 46,
    hosts: tuple[str, ...] = ("vm",),
    straggler: int | None = None,
    tokens_per_sample: int | None = 64,
    warmup_steps: int = 1,
) -> dict[str, Any]:
    """A report like the 2-rank CPU demo's; sizes and the straggler are chosen by the test."""
    batch = 16
    per_rank_ts: dict[str, dict[str, list[Any]]] = {}
    per_rank_st: list[dict[str, Any]] = []
    for r in range(ranks):
        walls = [
            round((600.0 if s < warmup_steps else 150.0) + 30 * math.sin(s / 7 + r) + (s * 37 % 11), 3)
            for s in range(steps)
        ]
        t, t_s = 0.2, []
        for w in walls:
            t += w / 1000
            t_s.append(round(t, 3))
        per_rank_ts[str(r)] = {"step": list(range(steps)), "t_s": t_s, "step_time_ms": walls}
        steady = walls[warmup_steps:] or walls
        mean = sum(steady) / len(steady)
        phases = {p: round(mean * share, 3) for p, share in PHASE_SHARES.items()}
        if r == straggler:
            phases["forward"] += 40.0
            phases["other"] = max(0.0, phases["other"] - 40.0)
        per_rank_st.append(
            {
                "rank": r,
                "steps": len(steady),
                "median_ms": _quantiles(steady)["p50"],
                "p95_ms": _quantiles(steady)["p95"],
                "phase_median_ms": dict(phases),
                "phase_mean_ms": phases,
                "distribution_ms": _quantiles(steady),
            }
        )
    samples_per_s = [
        round(sum(batch / per_rank_ts[str(r)]["step_time_ms"][s] * 1000 for r in range(ranks)), 3)
        for s in range(steps)
    ]
    proc_t = [round(1.0 * k + 0.07, 3) for k in range(telemetry_points)]
    host_t = proc_t[1:]
    report: dict[str, Any] = {
        "report_schema_version": 1,
        "run": {
            "run_id": "run",
            "world_size": ranks,
            "ranks_present": list(range(ranks)),
            "missing_ranks": [],
            "hosts": {str(r): hosts[r % len(hosts)] for r in range(ranks)},
            "model_class": "TinyLM",
        },
        "warmup": {
            "steps": warmup_steps,
            "per_rank": {str(r): warmup_steps for r in range(ranks)},
            "share": warmup_steps / steps if steps else 0.0,
            "first_steady_step": warmup_steps if steps > warmup_steps else None,
            "rule": "steps in the first half slower than 1.5x the median of the second half",
        },
        "throughput": {
            "samples_per_s": round(sum(samples_per_s[warmup_steps:]) / max(1, steps - warmup_steps), 3),
            "tokens_per_s": None,
            "steps_per_s": 6.7,
            "per_rank": [],
        },
        "step_time": {
            "median_ms": 150.0,
            "mean_ms": 150.0,
            "p95_ms": 180.0,
            "phases": {p: {"ms": 150.0 * s, "share": s} for p, s in PHASE_SHARES.items()},
            "per_rank": per_rank_st,
        },
        "timeseries": {
            "source": "steps",
            "per_rank": per_rank_ts,
            "throughput": {
                "step": list(range(steps)),
                "samples_per_s": samples_per_s,
                "tokens_per_s": [
                    None if tokens_per_sample is None else round(v * tokens_per_sample, 3)
                    for v in samples_per_s
                ],
            },
            "loss": {
                "step": list(range(steps)),
                "values": [
                    round(1.6 + 108 * math.exp(-s / 20) + 0.05 * math.sin(s), 6) for s in range(steps)
                ],
            },
        },
        "ranks": {
            "straggler": None
            if straggler is None
            else {"rank": straggler, "phase": "forward", "excess_ms": 40.0, "summary": "rank is slow"}
        },
        "telemetry": {
            "samples": telemetry_points * ranks,
            "gpus": make_gpus(gpus, telemetry_points, hosts),
            "processes": [
                {
                    "rank": r,
                    "cpu_percent_mean": 100.0,
                    "rss_bytes_max": 900_000_000,
                    "series": {
                        "cpu_percent": _series(
                            proc_t, [100.0 / (1 + r % 2) + 3 * math.sin(k) for k in range(telemetry_points)]
                        ),
                        "rss_bytes": _series(
                            proc_t, [8e8 + 1e6 * k + 4e8 * (r % 2) for k in range(telemetry_points)]
                        ),
                    },
                }
                for r in range(ranks)
            ],
            "hosts": [
                {
                    "host": host,
                    "cpu_percent_mean": 99.6,
                    "mem_used_bytes_max": 1_400_000_000,
                    "mem_total_bytes": 25_000_000_000,
                    "net_bytes_per_s": {"eth0": {"sent_bytes_per_s": 1.0, "recv_bytes_per_s": 1.0}},
                    "series": {
                        "cpu_percent": _series(host_t, [99.0] * len(host_t)),
                        "mem_used_bytes": _series(proc_t, [1.3e9] * telemetry_points),
                        "net_recv_bytes_per_s": _series(
                            host_t, [2e8 + 5e7 * math.sin(k) for k in range(len(host_t))]
                        ),
                        "net_sent_bytes_per_s": _series(
                            host_t, [1.9e8 + 5e7 * math.cos(k) for k in range(len(host_t))]
                        ),
                    },
                }
                for host in hosts
            ],
        },
        "findings": [],
        "warnings": [],
    }
    return report


def _defaults() -> dict[str, Any]:
    """What a report holds besides the parts these tests draw from: every section, empty."""
    return {
        "report_schema_version": 1,
        "generated_unix": 1_700_000_000.0,
        "tuneup_version": "test",
        "run": {
            "run_id": "run",
            "path": "/runs/run",
            "world_size": 1,
            "num_nodes": 1,
            "ranks_present": [],
            "missing_ranks": [],
            "hosts": {},
            "accumulate_grad_batches": 1,
            "hardware": {"gpu_names": [], "gpus_per_node": 0},
            "steps_recorded": 0,
            "status": {},
            "data_timing": [],
            "timing": [],
        },
        "warmup": {"steps": 0, "per_rank": {}, "share": 0.0, "first_steady_step": None, "rule": ""},
        "throughput": {"samples_per_s": None, "tokens_per_s": None, "steps_per_s": None, "per_rank": []},
        "step_time": {"median_ms": None, "mean_ms": None, "p95_ms": None, "phases": {}, "per_rank": []},
        "timeseries": {
            "source": "steps",
            "per_rank": {},
            "throughput": {"step": [], "samples_per_s": [], "tokens_per_s": []},
            "loss": {"rank": None, "step": [], "values": []},
        },
        "ranks": {"straggler": None},
        "data_loader": {"stall_count": 0, "worst_stalls": []},
        "telemetry": {"samples": 0, "gpus": [], "processes": [], "hosts": []},
        "environment": {"versions": {}, "env": {}, "trainer": {}, "dataloader": {}},
        "communication": None,
        "cost": None,
        "findings": [],
        "warnings": [],
    }


def _complete(report: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    out = dict(defaults)
    for key, value in report.items():
        default = defaults.get(key)
        fill = isinstance(value, dict) and isinstance(default, dict) and default
        out[key] = _complete(value, default) if fill else value
    return out


def analysis(report: dict[str, Any] | RunAnalysis) -> RunAnalysis:
    """The typed analysis of a hand-made report: the parts a test leaves out are there, empty."""
    if isinstance(report, RunAnalysis):
        return report
    return from_json(_complete(report, _defaults()))


def render_plots(report: dict[str, Any] | RunAnalysis, out_dir: Path) -> list[PlotFile]:
    return sections.render_plots(analysis(report), out_dir)


# ------------------------------------------------------------------------------------------------
# Checks.


def check_png(path: Path) -> tuple[int, int]:
    """A real PNG of report size with something drawn on it; returns its size in pixels."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width == plots.WIDTH_PX, (path.name, width)
    assert 400 <= height <= 1500, (path.name, height)
    assert len(data) > 15_000, f"{path.name} is suspiciously small ({len(data)} bytes)"
    import matplotlib.image

    pixels = matplotlib.image.imread(path)
    # A figure with only its frame drawn is almost all white; a real plot inks a few percent of it.
    inked = (pixels[:, :, :3].min(axis=2) < 0.9).mean()
    assert inked > 0.02, f"{path.name} looks empty ({inked:.1%} of pixels drawn)"
    return width, height


def check_plot_files(files: list[PlotFile], out_dir: Path, expected: set[str]) -> None:
    names = [f.name for f in files]
    assert sorted(names) == sorted(expected)
    assert len(set(names)) == len(names)
    for f in files:
        assert f.path == out_dir / f.name
        assert f.path.is_file()
        assert f.section in SECTION_IDS
        assert f.section == EXPECTED_SECTIONS[f.name]
        assert f.title.strip() and len(f.title) < 100
        # One sentence: ends with a full stop and has no other sentence end inside.
        assert f.caption.endswith("."), f.caption
        assert ". " not in f.caption[:-1], f.caption
        assert len(f.caption) > 60, f.caption
        check_png(f.path)
    # Nothing else was left in the folder (no temporary files, no figures that were not returned).
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(expected)


def plot_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if "plot" in r.getMessage() and r.levelno >= logging.WARNING
    ]


# ------------------------------------------------------------------------------------------------
# Tests.


@pytest.fixture(scope="module")
def demo_render(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[PlotFile], Path]:
    out = tmp_path_factory.mktemp("demo")
    return render_plots(make_report(), out), out


def demo_caption(demo_render: tuple[list[PlotFile], Path], name: str) -> str:
    return next(f.caption for f in demo_render[0] if f.name == name)


def draw(name: str, report: dict[str, Any] | RunAnalysis, render: bool = False) -> Any:
    """One figure's `_Drawn` (or None) without writing it: for tests that only read its words.

    `render` also lays out and rasterizes it, which is where text is parsed.
    """
    import matplotlib
    import matplotlib.style

    plot = next(p for m in sections.SECTION_MODULES for p in m.PLOTS if p.name == name)
    with matplotlib.rc_context(), matplotlib.style.context(["default", plots.STYLE]):
        drawn = plot.draw(analysis(report))
        if drawn is not None and render:
            drawn.figure.canvas.draw()
    return drawn


def legend_labels(fig: Any) -> list[str]:
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    return [t.get_text() for legend in legends for t in legend.get_texts()]


def test_demo_report_writes_every_cpu_plot(demo_render: tuple[list[PlotFile], Path]) -> None:
    files, out = demo_render
    # No GPUs in the demo: that figure is skipped, and check_plot_files sees no file for it either.
    check_plot_files(files, out, CPU_PLOTS)
    # Page order is the order the plots are listed in, which the renderers rely on.
    assert [f.name for f in files] == [n for n in EXPECTED_SECTIONS if n in CPU_PLOTS]
    assert "rank" in next(f.title for f in files if f.name == "rank_step_time.png")
    assert "straggler" not in next(f.title for f in files if f.name == "rank_step_time.png")


def test_gpu_telemetry_adds_the_gpu_plot_and_a_straggler_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = render_plots(make_report(gpus=2, straggler=1), tmp_path)
    check_plot_files(files, tmp_path, ALL_BUT_COMM)
    by_name = {f.name: f for f in files}
    gpu = by_name["gpu_utilization.png"]
    assert "power" in gpu.caption and "utilization" in gpu.caption
    # Three stacked panels are taller than a single plot.
    assert check_png(gpu.path)[1] > plots.HEIGHT_PX
    rank_plot = by_name["rank_step_time.png"]
    assert "rank 1" in rank_plot.title and "straggler" in rank_plot.title
    assert "straggler" in rank_plot.caption
    assert plot_warnings(caplog) == []


def _drop_loss(r: dict[str, Any]) -> None:
    r["timeseries"]["loss"] = {"step": [], "values": []}


def _no_gpus(r: dict[str, Any]) -> None:
    r["telemetry"]["gpus"] = []


def _no_process_or_host_telemetry(r: dict[str, Any]) -> None:
    r["telemetry"]["processes"] = []
    r["telemetry"]["hosts"] = []


def _no_throughput(r: dict[str, Any]) -> None:
    r["timeseries"]["throughput"] = {"step": [], "samples_per_s": [], "tokens_per_s": []}


def _no_steady_steps(r: dict[str, Any]) -> None:
    r["step_time"]["per_rank"] = []


def _no_per_rank_series(r: dict[str, Any]) -> None:
    r["timeseries"]["per_rank"] = {}


def _no_telemetry_key(r: dict[str, Any]) -> None:
    del r["telemetry"]


@pytest.mark.parametrize(
    ("remove", "missing"),
    [
        (_drop_loss, {"loss.png"}),
        (_no_gpus, {"gpu_utilization.png"}),
        (_no_process_or_host_telemetry, {"host_utilization.png"}),
        (_no_telemetry_key, {"gpu_utilization.png", "host_utilization.png"}),
        (_no_throughput, {"throughput.png"}),
        (_no_steady_steps, {"step_breakdown.png", "rank_step_time.png"}),
        (_no_per_rank_series, {"step_time.png"}),
    ],
)
def test_a_plot_without_data_is_skipped(remove: Any, missing: set[str]) -> None:
    report = make_report(gpus=1, steps=40, telemetry_points=10)
    remove(report)
    drawn = {name: draw(name, report) for name in ALL_BUT_COMM}
    assert {name for name, d in drawn.items() if d is None} == missing


def test_render_skips_what_is_missing_and_writes_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    report = make_report(gpus=1, steps=40, telemetry_points=10)
    _drop_loss(report)
    _no_process_or_host_telemetry(report)
    files = render_plots(report, tmp_path)
    check_plot_files(files, tmp_path, ALL_BUT_COMM - {"loss.png", "host_utilization.png"})
    # Skipped because the data was missing, not because drawing raised and was caught.
    assert plot_warnings(caplog) == []


def test_no_tokens_keeps_throughput_without_a_tokens_axis(demo_render: tuple[list[PlotFile], Path]) -> None:
    drawn = draw("throughput.png", make_report(tokens_per_sample=None, steps=40))
    assert drawn is not None
    assert "tokens" not in drawn.caption
    assert "tokens" in demo_caption(demo_render, "throughput.png")


def test_tokens_per_sample_that_vary_get_their_own_line() -> None:
    report = make_report(steps=40)
    tp = report["timeseries"]["throughput"]
    tp["tokens_per_s"] = [v * (50 + i % 7) for i, v in enumerate(tp["samples_per_s"])]
    drawn = draw("throughput.png", report, render=True)
    assert "tokens/s (pink, right axis)" in drawn.caption
    # The constant case has one line and a relabelled axis, never a second line on top of the first.
    axes = drawn.figure.axes
    assert sum(len(ax.get_lines()) for ax in axes) == 3  # samples, steady rate, tokens


def _single_point(r: dict[str, Any]) -> None:
    for series in r["timeseries"]["per_rank"].values():
        for key in series:
            series[key] = series[key][:1]
    for key in ("step", "samples_per_s", "tokens_per_s"):
        r["timeseries"]["throughput"][key] = r["timeseries"]["throughput"][key][:1]
    r["timeseries"]["loss"] = {"step": [0], "values": [2.0]}
    for group in ("gpus", "processes", "hosts"):
        for entry in r["telemetry"][group]:
            for s in entry["series"].values():
                s["t_s"], s["values"] = s["t_s"][:1], s["values"][:1]


def _all_none(r: dict[str, Any]) -> None:
    # The typed analysis holds numbers in its series: a value that is no figure is NaN there (None only
    # where the type allows it, as in tokens/s).
    nan = float("nan")
    for series in r["timeseries"]["per_rank"].values():
        series["step_time_ms"] = [nan] * len(series["step_time_ms"])
    tp = r["timeseries"]["throughput"]
    tp["samples_per_s"] = [nan] * len(tp["step"])
    tp["tokens_per_s"] = [None] * len(tp["step"])
    r["timeseries"]["loss"]["values"] = [nan] * len(r["timeseries"]["loss"]["step"])
    for entry in r["step_time"]["per_rank"]:
        entry["phase_mean_ms"] = dict.fromkeys(entry["phase_mean_ms"], nan)
        entry["distribution_ms"] = dict.fromkeys(entry["distribution_ms"], nan)
    for group in ("gpus", "processes", "hosts"):
        for entry in r["telemetry"][group]:
            for s in entry["series"].values():
                s["values"] = [nan] * len(s["values"])


def _not_finite(r: dict[str, Any]) -> None:
    nan = float("nan")
    r["timeseries"]["loss"]["values"] = [nan, float("inf"), nan]
    r["timeseries"]["loss"]["step"] = [0, 1, 2]
    r["warmup"]["first_steady_step"] = None  # typed: a step number or None, never NaN
    for entry in r["step_time"]["per_rank"]:
        entry["distribution_ms"]["p50"] = nan


def _wrong_types(r: dict[str, Any]) -> None:
    r["timeseries"]["per_rank"] = ["not", "a", "dict"]
    r["timeseries"]["throughput"] = "broken"
    r["timeseries"]["loss"] = {"step": "0,1,2", "values": None}
    r["step_time"]["per_rank"] = [None, 3, {"rank": "x"}]
    r["ranks"] = {"straggler": {"rank": True}}
    r["telemetry"] = {
        "gpus": [None, {"series": None}],
        "processes": "x",
        "hosts": [{"series": {"cpu_percent": 5}}],
    }


def _empty_report(r: dict[str, Any]) -> None:
    r.clear()


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (_single_point, {"step_breakdown.png", "rank_step_time.png"}),
        (_all_none, set()),
        (_not_finite, ALL_BUT_COMM - {"loss.png", "rank_step_time.png"}),
        (_empty_report, set()),
    ],
)
def test_degenerate_input_skips_instead_of_raising(
    damage: Any, expected: set[str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    report = make_report(gpus=1, steps=30, telemetry_points=10)
    damage(report)
    files = render_plots(report, tmp_path)
    assert {f.name for f in files} == expected
    assert plot_warnings(caplog) == []


def test_wrong_types_are_refused_where_the_report_is_read() -> None:
    # The figures draw from the typed analysis: a report with wrong types never reaches them, and reading
    # it names the field instead of drawing a broken figure.
    report = make_report(gpus=1, steps=30, telemetry_points=10)
    _wrong_types(report)
    with pytest.raises(AnalysisFormatError, match=r"report\.\w+"):
        analysis(report)


def test_eight_ranks_of_a_thousand_points_render(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    report = make_report(ranks=8, steps=1000, gpus=8, telemetry_points=1000, hosts=("node-a",), straggler=5)
    files = render_plots(report, tmp_path)
    check_plot_files(files, tmp_path, ALL_BUT_COMM)
    assert plot_warnings(caplog) == []


def test_many_ranks_get_a_colour_bar_instead_of_a_legend(demo_render: tuple[list[PlotFile], Path]) -> None:
    report = make_report(ranks=plots.MAX_LEGEND_ENTRIES + 4, steps=50, telemetry_points=10)
    for name in ("host_utilization.png",):
        drawn = draw(name, report, render=True)
        assert "colour bar" in drawn.caption
        assert not [label for label in legend_labels(drawn.figure) if label.startswith("rank")]
        assert "colour bar" not in demo_caption(demo_render, name)
        few = draw(name, make_report(steps=50, telemetry_points=10))
        assert {"rank 0", "rank 1"} <= set(legend_labels(few.figure))


def test_many_ranks_draw_the_spread_of_step_times_not_a_line_each(
    demo_render: tuple[list[PlotFile], Path],
) -> None:
    report = make_report(ranks=plots.MAX_LEGEND_ENTRIES + 4, steps=50, telemetry_points=2, straggler=3)
    drawn = draw("step_time.png", report, render=True)
    assert "median rank" in drawn.caption and "5th to 95th percentile" in drawn.caption
    assert "colour bar" not in drawn.caption
    labels = legend_labels(drawn.figure)
    assert "median rank" in labels and "p5 to p95 of the ranks" in labels
    # The straggler keeps a line of its own; no other rank gets one, in the plot or the legend.
    assert [label for label in labels if label.startswith("rank")] == ["rank 3 (straggler)"]
    assert len(drawn.figure.axes[0].get_lines()) == 2
    few = demo_caption(demo_render, "step_time.png")
    assert "median rank" not in few and "each of the 2 ranks" in few


def _tick_labels_overlap(fig: Any, labels: list[Any]) -> bool:
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in labels if t.get_text()]
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


@pytest.mark.parametrize(
    ("ranks", "hosts", "expected"),
    [
        (8, 1, [f"rank {r}" for r in range(8)]),
        # Beyond 32 ranks, one bar per host (the host's name alone: every host has 8 ranks).
        (64, 8, [f"node-{h}" for h in range(8)]),
        # Beyond 32 hosts, five ranks show the spread.
        (1024, 128, ["fastest", "p5", "median", "p95", "slowest"]),
    ],
)
def test_step_breakdown_stays_readable_at_any_rank_count(ranks: int, hosts: int, expected: list[str]) -> None:
    names = tuple(f"node-{h}" for h in range(hosts))
    report = make_report(ranks=ranks, steps=6, telemetry_points=2, hosts=names, straggler=ranks - 3)
    # Ranks run on their hosts in blocks (8 per host), as a launcher places them.
    report["run"]["hosts"] = {str(r): names[r * hosts // ranks] for r in range(ranks)}
    drawn = draw("step_breakdown.png", report, render=True)
    ax = drawn.figure.axes[0]
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert len(ticks) == len(expected)
    assert [t.split(":")[0].split(" (")[0] for t in ticks] == expected, ticks
    assert not _tick_labels_overlap(drawn.figure, ax.get_yticklabels())
    # The straggler is named wherever its bar is.
    straggler = ranks - 3
    if ranks <= 32:
        assert f"rank {straggler} (straggler)" in ticks
    elif hosts <= 32:
        assert any(f"straggler: rank {straggler}" in t for t in ticks)
    assert f"{ranks:,}" in drawn.caption or ranks <= 32


# ------------------------------------------------------------------------------------------------
# 1,024 ranks on 128 hosts: a figure per rank or host becomes a heatmap or a band, and nothing overprints.


@pytest.fixture(scope="module")
def large_report() -> dict[str, Any]:
    """1,024 ranks on 128 hosts of 8 GPUs, placed in blocks as a launcher does; rank 517 is the straggler."""
    names = tuple(f"node-{h:03d}" for h in range(128))
    report = make_report(ranks=1024, steps=24, gpus=1024, telemetry_points=6, hosts=names, straggler=517)
    report["run"]["hosts"] = {str(r): names[r // 8] for r in range(1024)}
    return report


def make_communication(ranks: int, late: int) -> dict[str, Any]:
    """`communication` as analyze_run writes it: rank `late` spends the least time in collectives."""
    return {
        "backend": "nccl",
        "world_size": ranks,
        "ranks_per_node": 8,
        "comm_ms_per_step": 30.0,
        "share_of_step": 0.2,
        "exposed_ms_per_step": 10.0,
        "overlapped_ms_per_step": 20.0,
        "exposed_share_of_step": 0.07,
        "per_rank": [
            {
                "rank": r,
                "steps_with_comm": 20,
                "comm_ms": 10.0 if r == late else 30.0 + r % 5,
                "exposed_ms": 5.0 if r == late else 10.0,
                "bytes_per_step": 5e8,
                "collectives_per_step": 14.0,
            }
            for r in range(ranks)
        ],
        "per_bucket": [
            {
                "bucket": b,
                "kind": "all_reduce",
                "bytes": 26_214_400,
                "dtype": "bfloat16",
                "median_ms": 2.0 + b / 10,
                "count": 20,
            }
            for b in range(20)
        ],
        "by_size": [],
        "fits": [],
        "link": None,
        "late_rank": None,
        "ddp_logging": None,
    }


def test_rank_step_time_becomes_a_heatmap_beyond_32_ranks(large_report: dict[str, Any]) -> None:
    report = copy.deepcopy(large_report)
    # One step far slower than the rest must not take the whole colour range (limits at p1 and p99).
    report["timeseries"]["per_rank"]["100"]["step_time_ms"][12] = 30_000.0
    drawn = draw("rank_step_time.png", report, render=True)
    ax, colour_bar = drawn.figure.axes[:2]
    (image,) = ax.get_images()
    assert image.get_array().shape[0] == 1024  # a row per rank
    assert image.get_clim()[1] < 1000
    assert colour_bar.get_ylabel() == "step time (ms)"
    assert "rank 517 is the straggler" in drawn.title
    assert any(t.get_text() == "rank 517: straggler" for t in ax.texts)
    # Hosts label the rank axis sparsely; no label runs into another.
    labels = [t for t in ax.get_yticklabels() if t.get_text()]
    assert 2 <= len(labels) <= 16 and labels[0].get_text() == "node-000 · 0"
    assert not _tick_labels_overlap(drawn.figure, labels)
    assert not _tick_labels_overlap(drawn.figure, ax.get_xticklabels())
    assert "1,024 ranks" in drawn.caption and "128 hosts" in drawn.caption
    # Up to 32 ranks a box per rank, as before.
    boxes = draw("rank_step_time.png", make_report(ranks=32, steps=30))
    assert not boxes.figure.axes[0].get_images()
    assert boxes.title == "Step time distribution per rank"


def test_per_host_figures_draw_a_band_beyond_16_hosts(large_report: dict[str, Any]) -> None:
    gpu = draw("gpu_utilization.png", large_report, render=True)
    labels = legend_labels(gpu.figure)
    assert labels[:2] == ["all GPUs: median", "all GPUs: p5 to p95"]
    assert labels[2].startswith("least busy: node-")
    # The median, the least busy GPU and, on the memory panel, the capacity: never a line per GPU.
    assert all(len(ax.get_lines()) <= 3 for ax in gpu.figure.axes)
    assert "1,024 GPUs on 128 hosts" in gpu.caption and "5th to 95th percentile" in gpu.caption
    host = draw("host_utilization.png", large_report, render=True)
    labels = legend_labels(host.figure)
    assert "all ranks: median" in labels and "rank 517 (straggler)" in labels
    assert "hosts receive: median" in labels and "hosts send: median" in labels
    assert not [label for label in labels if label.startswith("node-")]
    assert all(len(ax.get_lines()) <= 2 for ax in host.figure.axes)
    assert "1,024 ranks" in host.caption and "128 hosts" in host.caption
    # A few hosts keep a line each.
    few = draw("host_utilization.png", make_report(steps=30, telemetry_points=10, hosts=("a", "b")))
    assert {"a receive", "b send"} <= set(legend_labels(few.figure))


def test_communication_figure_reads_at_any_rank_count(large_report: dict[str, Any]) -> None:
    report = {**large_report, "communication": make_communication(1024, late=517)}
    drawn = draw("communication.png", report, render=True)
    left, right = drawn.figure.axes[:2]
    assert not [t for t in left.get_yticklabels() if t.get_text().startswith("rank")]
    assert any(t.get_text() == "rank 517: least time" for t in left.texts)
    for ax in (left, right):
        assert not _tick_labels_overlap(drawn.figure, ax.get_xticklabels())
    assert "1,024 ranks" in drawn.caption
    two_ranks = {**make_report(), "communication": make_communication(2, late=1)}
    few = draw("communication.png", two_ranks, render=True)
    assert [t.get_text() for t in few.figure.axes[0].get_yticklabels()] == ["rank 0", "rank 1"]


def test_every_figure_of_1024_ranks_on_128_hosts_renders(
    large_report: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    report = {**large_report, "communication": make_communication(1024, late=517)}
    files = render_plots(report, tmp_path)
    # A fixture: no timeline, no gradient norms, no synchronisation strategy.
    check_plot_files(
        files,
        tmp_path,
        set(EXPECTED_SECTIONS)
        - {"fit_timeline.png", "badput.png", "noise_scale.png", "sync_strategy.png", *CONVERGENCE_PLOTS},
    )
    assert plot_warnings(caplog) == []


def test_dollar_signs_in_names_render_literally(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # "$x^2$" would quietly render as math; the second name is not valid mathtext, so if names were
    # parsed as math, drawing would raise and the figures with host names would be missing.
    hosts = ("$x^2$", "node$\\notacommand{$-1")
    report = make_report(gpus=2, steps=30, telemetry_points=10, hosts=hosts, ranks=2)
    report["run"]["model_class"] = "a$b"
    files = render_plots(report, tmp_path)
    assert {f.name for f in files} == ALL_BUT_COMM
    assert plot_warnings(caplog) == []
    labels = legend_labels(draw("gpu_utilization.png", report).figure)
    assert any(label.startswith("$x^2$ GPU") for label in labels), labels


def test_idle_network_is_left_out_and_said(demo_render: tuple[list[PlotFile], Path]) -> None:
    report = make_report(steps=30, telemetry_points=10)
    for host in report["telemetry"]["hosts"]:
        for key in ("net_recv_bytes_per_s", "net_sent_bytes_per_s"):
            host["series"][key]["values"] = [0.0] * len(host["series"][key]["values"])
    drawn = draw("host_utilization.png", report)
    assert "not drawn" in drawn.caption
    assert len(drawn.figure.axes) == 2
    busy = demo_caption(demo_render, "host_utilization.png")
    assert "MB/s" in busy and "not drawn" not in busy


def test_window_means_are_labelled_as_windows() -> None:
    report = make_report(steps=30, telemetry_points=10)
    report["timeseries"]["source"] = "windows"
    for name in ("throughput.png", "step_time.png", "loss.png"):
        drawn = draw(name, report, render=True)
        assert "window" in drawn.figure.axes[0].get_xlabel()


def test_a_slow_first_step_does_not_flatten_the_step_time_plot() -> None:
    report = make_report(steps=60, warmup_steps=2)
    for series in report["timeseries"]["per_rank"].values():
        series["step_time_ms"][0] = 30_000.0
    drawn = draw("step_time.png", report)
    assert drawn.figure.axes[0].get_ylim()[1] < 1000
    assert "30,000 ms" in drawn.caption


def test_stale_figure_from_an_earlier_report_is_removed(tmp_path: Path) -> None:
    (tmp_path / "gpu_utilization.png").write_bytes(b"an old figure")
    files = render_plots({"timeseries": make_report(steps=30)["timeseries"]}, tmp_path)
    assert "gpu_utilization.png" not in {f.name for f in files}
    assert not (tmp_path / "gpu_utilization.png").exists()


def test_a_plot_that_fails_to_draw_costs_only_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(report: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    from tuneup.report.sections import timeseries

    patched = tuple(plots.Plot(p.name, broken) if p.name == "loss.png" else p for p in timeseries.PLOTS)
    monkeypatch.setattr(timeseries, "PLOTS", patched)
    files = render_plots({"timeseries": make_report(steps=30)["timeseries"]}, tmp_path)
    assert {f.name for f in files} == {"throughput.png", "step_time.png"}
    assert any("loss.png" in w and "boom" in w for w in plot_warnings(caplog))


def test_callers_matplotlib_settings_are_left_alone(tmp_path: Path) -> None:
    import matplotlib

    backend = matplotlib.get_backend()
    with matplotlib.rc_context({"lines.linewidth": 7.0, "text.parse_math": True}):
        render_plots({"timeseries": {"loss": make_report(steps=30)["timeseries"]["loss"]}}, tmp_path)
        assert matplotlib.rcParams["lines.linewidth"] == 7.0
        assert matplotlib.rcParams["text.parse_math"] is True
    assert matplotlib.get_backend() == backend


def test_importing_the_module_does_not_import_matplotlib() -> None:
    code = "import sys, tuneup.report.sections; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_sections_are_report_sections() -> None:
    listed = {p.name: m.ID for m in sections.SECTION_MODULES for p in m.PLOTS}
    assert set(listed.values()) <= SECTION_IDS
    assert listed == EXPECTED_SECTIONS


def _write_recorded_run(path: Path) -> Path:
    """A 2-rank run with GPU, process and host telemetry, through the real writer."""
    t0 = 1_700_000_000.0
    write_manifest(
        path,
        {
            "run_id": "r1",
            "created_unix": t0,
            "world_size": 2,
            "num_nodes": 1,
            "trainer": {"max_steps": 60, "accumulate_grad_batches": 1},
            "dataloader": {"batch_size": 8},
            "model": {"class": "Tiny$Model$"},
        },
    )
    for rank in range(2):
        w = RankWriter(path, rank)
        # The fit's own times, as the callback records them: setup before t0, a save and a validation.
        w.open(
            {
                "host": "gpu$node",
                "start_unix": t0,
                "timing": "host",
                "fit_start_unix": t0 - 1.5,
                "train_start_unix": t0,
            }
        )
        w.add_event("sanity_check", t_start=t0 - 0.8, duration_ms=600.0)
        t = t0
        for s in range(60):
            if s == 30:
                w.add_event("validation", step=s, t_start=t, duration_ms=400.0)
                w.add_event("checkpoint", step=s, t_start=t + 0.4, duration_ms=250.0)
                t += 0.65
            wall = (900.0 if s == 0 else 50.0 + 5 * math.sin(s)) + 10 * rank
            t += wall / 1000
            phases = {
                "data_ms": 1.0,
                "forward_ms": 0.3 * wall,
                "backward_ms": 0.5 * wall,
                "optimizer_ms": 2.0,
            }
            w.add_step(
                {
                    "step": s,
                    "epoch": 0,
                    "t_end": t,
                    "wall_ms": wall,
                    **phases,
                    "other_ms": wall - sum(phases.values()),
                    "micro_batches": 1,
                    "samples": 8,
                    "tokens": 8 * 128,
                    "loss": 3.0 * math.exp(-s / 30) + 0.1,
                    "grad_norm": None,
                    "peak_mem_bytes": None,
                }
            )
        for k in range(12):
            sample: dict[str, Any] = {
                "t": t0 + 0.3 * k,
                "process": {"cpu_percent": 95.0 + k % 3, "rss_bytes": 1e9 + 1e7 * k},
            }
            if rank == 0:
                sample["system"] = {
                    "cpu_percent": 90.0,
                    "mem_used_bytes": 5e9,
                    "mem_total_bytes": 6.4e10,
                    "net": {
                        "lo": {"sent_bytes": 1e9 * k, "recv_bytes": 1e9 * k},
                        "ib0": {"sent_bytes": 4e8 * k, "recv_bytes": 4e8 * k},
                    },
                }
                sample["gpus"] = [
                    {
                        "index": i,
                        "util_percent": 60.0 + 3 * k + i,
                        "mem_used_bytes": 2e10 + 1e9 * k,
                        "mem_total_bytes": 8.5e10,
                        "power_w": 300.0 + 10 * k,
                    }
                    for i in range(2)
                ]
            w.add_telemetry(sample)
        w.close(status="completed", train_end_unix=t + 0.05, fit_end_unix=t + 0.3, stop_reason="max_steps")
    return path


def test_a_recorded_run_through_analyze_run_renders_every_plot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Guards the contract with analysis.py: the fixtures above only help if they match what it emits.
    report = analyze_run(load_run(_write_recorded_run(tmp_path / "run")))
    assert len(report.telemetry.gpus) == 2
    original = copy.deepcopy(report)
    out = tmp_path / "plots"
    files = render_plots(report, out)
    check_plot_files(files, out, ALL_BUT_COMM | {"fit_timeline.png", "badput.png", "convergence_ranks.png"})
    assert report == original, "render_plots must not change the report it draws"
    assert plot_warnings(caplog) == []
