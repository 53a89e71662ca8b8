"""`tuneup fleet INDEX`: the dashboard's figures against a small index whose answers are worked out by hand,
its page (escaping, filters, policy), the terminal summary, JSON, and bad input.

The index is written here with pyarrow in the layout `tuneup index` writes (benchmarks/fleet_screenshot.py's
`write_index`), so these tests need no training and no run records.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fleet_screenshot import write_index
from tuneup import cli
from tuneup.analyze.model import BADPUT_CATEGORIES
from tuneup.fleet import fleet_cli
from tuneup.fleet.dashboard import NO_GROUP, FleetIndexError, build_fleet_view
from tuneup.fleet.render import render_html, render_json, render_text

EVIL = "<script>alert(1)</script>"


def _at(day: int, month: int = 11) -> datetime:
    return datetime(2026, month, day, 12, 0, tzinfo=timezone.utc)


def _run(
    key: str,
    start: datetime,
    usd: float | None,
    *,
    tags: dict[str, str],
    instance: str = "p4d.24xlarge",
    world: int = 8,
    productive_s: float = 600.0,
    data_wait_s: float = 400.0,
    samples: int = 1_000_000,
    recommendation: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A run whose ledger is productive compute and data wait only (the other categories 0), priced at
    `usd` for the whole wall time."""
    wall = productive_s + data_wait_s
    row: dict[str, Any] = {
        "run_key": key,
        "run_id": key.rsplit("/", 1)[-1],
        "start": start,
        "duration_s": wall,
        "tags": tags,
        "instance": instance,
        "gpu": "A100",
        "world_size": world,
        "precision": "bf16-mixed",
        "strategy": "ddp",
        "global_batch_size": 256,
        "usd": usd,
        "device_hours": wall / 3600 * world,
        "samples": samples,
        "tokens": samples * 1000,
        "samples_per_s": samples / wall,
        "mfu": 0.4,
        "useful_share": productive_s / wall,
        "badput_usd": None if usd is None else usd * data_wait_s / wall,
        "top_recommendation": recommendation,
        "top_gain": 0.2 if recommendation else None,
    }
    for c in BADPUT_CATEGORIES:
        row[f"{c}_s"] = {"productive_compute": productive_s, "data_wait": data_wait_s}.get(c, 0.0)
        row[f"{c}_usd"] = None if usd is None else usd * row[f"{c}_s"] / wall
    row.update(extra)
    return row


def _windows(key: str, per_window: list[float]) -> list[dict[str, Any]]:
    return [
        {
            "run_key": key,
            "window": w,
            "first_step": w * 10,
            "last_step": w * 10 + 9,
            "samples_per_s": v,
            "step_median_ms": 256 / v * 1000,
        }
        for w, v in enumerate(per_window)
    ]


# The first window of each is warm-up (10 samples/s): left out. Run a2 is 20% slower than a1; a3 is a2 again.
STEADY = [10.0, 100.0, 101.0, 99.0, 100.5, 99.5]
SLOWER = [10.0, 80.0, 80.8, 79.2, 80.4, 79.6]


@pytest.fixture
def index(tmp_path: Path) -> Path:
    runs = [
        _run(
            "s3://b/a1",
            _at(1),
            100.0,
            tags={"project": "alpha", "user": "ana"},
            recommendation="raise num_workers",
        ),
        _run("s3://b/a2", _at(3), 50.0, tags={"project": "alpha"}, samples=500_000),
        _run("s3://b/a3", _at(5), 20.0, tags={"project": "alpha"}, samples=400_000),
        _run(
            "s3://b/x1",
            _at(10),
            30.0,
            tags={"project": EVIL},
            instance="g5.12xlarge",
            world=4,
            productive_s=900.0,
            data_wait_s=100.0,
        ),
        _run("s3://b/b1", _at(20, month=10), None, tags={"project": "beta"}),  # no price
        _run("s3://b/n1", _at(2), 10.0, tags={"experiment": "e"}, productive_s=1000.0, data_wait_s=0.0),
        {"run_key": "s3://b/bad", "run_id": "bad", "error": "manifest.json: truncated"},
    ]
    steps = _windows("s3://b/a1", STEADY) + _windows("s3://b/a2", SLOWER) + _windows("s3://b/a3", SLOWER)
    return write_index(tmp_path / "index", runs, steps)


def test_totals_and_ledger_by_hand(index: Path) -> None:
    view = build_fleet_view(index)
    t = view.whole.totals
    assert (
        view.runs_in_index == 7 and view.unreadable_runs == 1 and view.unreadable_examples == ["s3://b/bad"]
    )
    assert (t.runs, t.priced_runs) == (6, 5)
    assert t.usd == pytest.approx(100 + 50 + 20 + 30 + 10)
    # Useful seconds over ledger seconds: 600 x 4 (a1, a2, a3, b1) + 900 + 1000 over 6 x 1000 s.
    assert t.useful_share == pytest.approx((600 * 4 + 900 + 1000) / 6000)
    # Badput $: 40% of a1, a2, a3, 10% of x1, none of n1 (b1 unpriced: not in the base either).
    assert t.badput_usd == pytest.approx(40 + 20 + 8 + 3 + 0)
    assert t.badput_usd_share == pytest.approx(71 / 210)
    # $ per 1M samples, pooled over the priced runs: 210 $ over 1 + 0.5 + 0.4 + 1 + 1 M samples.
    assert t.usd_per_million_samples == pytest.approx(210 / 3.9)
    ledger = {line.category: line for line in view.whole.ledger}
    assert list(ledger) == list(BADPUT_CATEGORIES)
    assert ledger["data_wait"].seconds == pytest.approx(400 * 4 + 100)
    assert ledger["data_wait"].share == pytest.approx(1700 / 6000)
    assert ledger["data_wait"].usd == pytest.approx(71)
    assert ledger["productive_compute"].usd == pytest.approx(139)
    assert ledger["data_wait"].usd_share == pytest.approx(71 / 210)
    assert ledger["checkpoint_saves"].seconds == 0.0


def test_groups_periods_and_slices(index: Path) -> None:
    view = build_fleet_view(index)
    assert view.filters.group_by == "project"
    assert view.groups == ["alpha", EVIL, "beta", NO_GROUP]  # by spend; the untagged run last
    assert view.period_unit == "week"  # Oct 20 to Nov 10: four weeks; a day each would be 22
    assert view.periods == ["2026-W43", "2026-W44", "2026-W45", "2026-W46"]  # ISO weeks, UTC
    alpha = view.slice("alpha", None)
    assert alpha is not None and alpha.totals.usd == pytest.approx(170) and alpha.totals.runs == 3
    assert [r.run_id for r in alpha.expensive_runs] == ["a1", "a2", "a3"]
    assert alpha.expensive_runs[0].top_recommendation == "raise num_workers"
    # Every (tag value, period) slice adds up to its tag value's.
    cells = [s for s in view.slices if s.group == "alpha" and s.period is not None]
    assert sum(s.totals.usd or 0 for s in cells) == pytest.approx(170)
    # Configurations: p4d x 8 pooled over a1, a2, a3, n1 (b1 unpriced): 180 $ over 2.9 M samples.
    p4d = next(c for c in view.whole.configurations if c.instance == "p4d.24xlarge")
    assert p4d.runs == 5 and p4d.usd == pytest.approx(180)
    assert p4d.usd_per_million_samples == pytest.approx(180 / 2.9)
    spend = {(c.period, c.key): c.usd for c in view.spend_by_group}
    assert sum(v or 0 for v in spend.values()) == pytest.approx(210)


def test_regressions_use_the_compare_rule_on_windows(index: Path) -> None:
    view = build_fleet_view(index)
    r = view.regressions
    # alpha's three runs are two pairs; x1, b1 are alone in their tag value; n1 has no project tag.
    assert r.pairs_judged == 2 and r.ungrouped_runs == 1
    assert r.verdicts["REGRESSION"] == 1 and r.verdicts["NO CHANGE"] == 1
    first = r.pairs[0]
    assert (first.verdict, first.baseline_run_id, first.candidate_run_id) == ("REGRESSION", "a1", "a2")
    assert first.baseline_windows == first.candidate_windows == 5  # the warm-up window left out
    assert first.change == pytest.approx(0.2, abs=0.002)
    assert first.ratio_low is not None and first.ratio_low < 0.8 < first.ratio_high
    assert "autocorrelated" in r.samples


def test_unpriced_runs_pair_only_with_runs_on_the_same_gpu(tmp_path: Path) -> None:
    # No instance recorded: the GPU stands for it, so an A100 run is not "the run before" an L4 run (the
    # L4's slower windows would read as a regression).
    runs = [
        _run("r/a100", _at(1), None, tags={"project": "p"}, instance=None, gpu="A100"),
        _run("r/l4", _at(2), None, tags={"project": "p"}, instance=None, gpu="L4"),
        _run("r/l4-again", _at(3), None, tags={"project": "p"}, instance=None, gpu="L4"),
    ]
    steps = _windows("r/a100", STEADY) + _windows("r/l4", SLOWER) + _windows("r/l4-again", SLOWER)
    r = build_fleet_view(write_index(tmp_path / "index", runs, steps)).regressions
    assert r.pairs_judged == 1 and r.verdicts["REGRESSION"] == 0
    assert (r.pairs[0].baseline_run_id, r.pairs[0].candidate_run_id) == ("l4", "l4-again")


def test_cli_filters_narrow_the_runs(index: Path) -> None:
    view = build_fleet_view(index, tags={"project": "alpha"}, since="2026-11-02", until="2026-11-03")
    assert view.whole.totals.runs == 1 and view.whole.totals.usd == pytest.approx(
        50
    )  # a2; --until is the day
    view = build_fleet_view(index, group_by="user")
    assert view.groups == ["ana", NO_GROUP]


def test_html_escapes_tags_and_filters_in_css(index: Path, tmp_path: Path) -> None:
    page = render_html(build_fleet_view(index), tmp_path / "plots")
    assert EVIL not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page  # no script at all: the filters are CSS
    assert "default-src &#x27;none&#x27;" in page and "script-src" not in page
    # A radio button per tag value and per period, and a rule that hides other slices for each.
    for name in ("fg-all", "fg-0", "fg-3", "fp-all", "fp-0"):
        assert f'id="{name}"' in page
    assert "#fg-1:checked ~ main .s:not(.g-1)" in page and "#fp-0:checked ~ main .r:not(.p-0)" in page
    assert 'class="s g-0 p-all"' in page and "data:image/png;base64," in page
    assert "autocorrelated" in page
    assert "No runs for this choice of filters." in page  # e.g. beta in the week of x1


def test_text_and_json(index: Path) -> None:
    view = build_fleet_view(index)
    text = render_text(view)
    assert (
        "$210.00" in text and "Data wait" in text and "Synchronization waits" in text and "71.7%" in text
    )  # spend, ledger, useful share
    assert re.search(r"a2\s+a1\s+alpha\s+20\.\d%", text)
    document = json.loads(render_json(view))
    assert document["slices"][0]["totals"]["usd"] == pytest.approx(210)
    assert document["regressions"]["pairs"][0]["verdict"] == "REGRESSION"


def _tuneup(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """The real `tuneup` entry point, with the fleet command registered where cli.py does not yet."""
    build = cli.build_parser

    def with_fleet() -> Any:
        parser = build()
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        if "fleet" not in sub.choices:
            fleet_cli.add_command(sub, cli.UsageError)
        return parser

    monkeypatch.setattr(cli, "build_parser", with_fleet)
    return cli.main(argv)


def test_cli_writes_and_prints(
    index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert _tuneup(["fleet", str(index), "-o", str(out), "--format", "html,md,json,text"], monkeypatch) == 0
    assert {p.name for p in out.iterdir()} >= {"fleet.html", "fleet.md", "fleet.json"}
    assert "Where the money went" in capsys.readouterr().out
    markdown = (out / "fleet.md").read_text()
    assert EVIL not in markdown and "&lt;script&gt;alert(1)&lt;/script&gt;" in markdown
    assert "fleet_spend_by_group.png" in markdown and (out / "fleet_spend_by_group.png").is_file()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["{missing}"], "does not exist"),
        (["{plain}"], "is not a fleet index"),
        (["{junk}"], "cannot read"),
        (["{index}", "--since", "last tuesday"], "--since 'last tuesday' is not a date"),
        (["{index}", "--tag", "project"], "is not KEY=VALUE"),
        (["{index}", "--format", "pdf"], "choose one or more of html, md, json, text"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    index: Path,
    tmp_path: Path,
    args: list[str],
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "runs.parquet").write_text("not parquet")
    paths = {
        "missing": tmp_path / "nope",
        "plain": tmp_path / "plain",
        "junk": tmp_path / "junk",
        "index": index,
    }
    argv = ["fleet", *(a.format(**paths) for a in args), "-o", str(tmp_path / "out")]
    assert _tuneup(argv, monkeypatch) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_a_non_parquet_runs_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "runs.parquet").write_text("not parquet")
    with pytest.raises(FleetIndexError, match="cannot read"):
        build_fleet_view(tmp_path)


def test_filters_that_match_nothing_say_so(index: Path, tmp_path: Path) -> None:
    view = build_fleet_view(index, tags={"project": "nobody"})
    assert view.slices == [] and view.regressions.pairs_judged == 0
    assert "No readable run matches the filters." in render_text(view)
    assert "No readable run matches the filters." in render_html(view, tmp_path / "plots")
    assert json.loads(render_json(view))["slices"] == []


def test_the_no_change_shortcut_gives_the_rules_verdicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks.fleet_screenshot import synthetic_runs
    from tuneup.fleet import dashboard

    index = write_index(tmp_path / "index", *synthetic_runs(400))
    fast = build_fleet_view(index).regressions
    monkeypatch.setattr(dashboard, "NEAR_ONE", 0.0)  # every pair through decide
    slow = build_fleet_view(index).regressions
    assert fast.pairs_judged > 50 and fast.verdicts["NO CHANGE"] > 0 and fast.verdicts["REGRESSION"] > 0
    assert fast.verdicts == slow.verdicts
    assert [(p.candidate_key, p.verdict) for p in fast.pairs] == [
        (p.candidate_key, p.verdict) for p in slow.pairs
    ]
