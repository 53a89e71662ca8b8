"""Interleaved A/B (`tuneup bench --ab`): the schedule, the paired decision under drift, the plan, the CLI."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import psutil
import pytest

from tuneup.compare import history
from tuneup.compare.ab import (
    BASELINE,
    CANDIDATE,
    ab_rule,
    block_log_ratio,
    blocks_needed,
    cpu_halves,
    decide_paired,
    detectable_change,
    format_markdown,
    noise_seen,
    normal_blocks_needed,
    paired_t,
    plan,
    schedule,
    side_by_side_schedule,
)
from tuneup.compare.bench import pinned_argv
from tuneup.compare.rule import Verdict, decide
from tuneup.compare.stats import chi2_quantile, welch

# The tests' shared CLI runner; the tests directory is no package, so found by path (either pytest entry).
sys.path.insert(0, str(Path(__file__).parent))
from test_compare import cli
from test_compare_ci import schema_errors

RULE = ab_rule(alpha=0.05, min_detectable=0.05)


def test_each_block_is_abba_or_baab_and_the_seed_fixes_the_order() -> None:
    order = schedule(40, seed=7)
    assert len(order) == 160
    firsts = Counter()
    for block in range(40):
        sides = [side for b, side in order if b == block]
        assert sides in (
            [BASELINE, CANDIDATE, CANDIDATE, BASELINE],
            [CANDIDATE, BASELINE, BASELINE, CANDIDATE],
        )
        firsts[sides[0]] += 1
    assert firsts[BASELINE] > 5 and firsts[CANDIDATE] > 5  # both orders are drawn
    assert schedule(40, seed=7) == order
    assert schedule(40, seed=8) != order
    with pytest.raises(ValueError):
        schedule(0, seed=1)


def test_side_by_side_blocks_run_each_side_on_each_half_and_the_seed_fixes_the_order() -> None:
    order = side_by_side_schedule(40, seed=7)
    assert len(order) == 80  # two rounds a block, the other side on the second half
    firsts = Counter()
    for block in range(40):
        on_first_half = [side for b, side in order if b == block]
        assert sorted(on_first_half) == sorted([BASELINE, CANDIDATE])  # the halves swap within the block
        firsts[on_first_half[0]] += 1
    assert firsts[BASELINE] > 5 and firsts[CANDIDATE] > 5
    assert side_by_side_schedule(40, seed=7) == order != side_by_side_schedule(40, seed=8)
    with pytest.raises(ValueError):
        side_by_side_schedule(0, seed=1)


def test_the_cpus_split_in_two_halves_and_one_cpu_is_refused() -> None:
    assert cpu_halves({3, 0, 1, 2}) == ((0, 1), (2, 3))
    assert cpu_halves({5, 1, 9}) == ((1,), (5, 9))
    with pytest.raises(ValueError, match="at least 2 CPUs"):
        cpu_halves({0})


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="pinning is Linux's")
def test_a_pinned_command_and_what_it_starts_run_on_the_cpus_given() -> None:
    cpu = min(os.sched_getaffinity(0))
    child = "import os, subprocess, sys; print(sorted(os.sched_getaffinity(0))); sys.stdout.flush(); "
    child += "subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'])"
    shown = subprocess.run(pinned_argv([sys.executable, "-c", child], [cpu]), capture_output=True, text=True)
    assert shown.returncode == 0 and shown.stdout.split() == [f"[{cpu}]", f"[{cpu}]"], shown.stderr
    missing = subprocess.run(pinned_argv(["no-such-command-xyz"], [cpu]), capture_output=True, text=True)
    assert missing.returncode == 1 and "cannot run no-such-command-xyz" in missing.stderr


def _drifting_blocks(
    rng: random.Random, blocks: int, slowdown: float, drift: float, noise_sd: float
) -> list[tuple[list[float], list[float]]]:
    """Step times (ms) of runs in A B B A order per block: the machine slows by `drift` over the whole
    job (linearly), each run has lognormal noise, the candidate is slower by `slowdown`."""
    total = 4 * blocks
    out = []
    for k in range(blocks):
        times = []
        for i, side in enumerate((BASELINE, CANDIDATE, CANDIDATE, BASELINE)):
            machine = 1.0 + drift * (4 * k + i) / total
            times.append(
                20.0
                * machine
                * (1.0 + (slowdown if side == CANDIDATE else 0.0))
                * math.exp(rng.gauss(0, noise_sd))
            )
        out.append(([times[0], times[3]], [times[1], times[2]]))
    return out


def test_a_5_percent_slowdown_under_a_30_percent_drift_is_flagged_paired_but_not_pooled() -> None:
    rng = random.Random(3)
    blocks = _drifting_blocks(rng, blocks=6, slowdown=0.05, drift=0.30, noise_sd=0.01)
    paired = decide_paired("step time", blocks, higher_is_better=False, rule=RULE)
    assert paired.verdict is Verdict.REGRESSION, paired.reason
    assert paired.ci_low is not None and paired.ci_high is not None
    assert 1.03 < paired.ci_low < 1.05 < paired.ci_high < 1.07
    assert paired.effect_text in paired.reason.replace(" higher", "").replace("step time ", "+")
    # The same runs pooled: an unpaired Welch test on their logs cannot tell the change from the drift's
    # spread (at a 20% drift over 8 blocks it still could, p about 0.01), and `tuneup compare`'s rule
    # (threshold 2 x the pooled CV) does not flag it either.
    base = [v for a, _ in blocks for v in a]
    cand = [v for _, b in blocks for v in b]
    unpaired = welch([math.log(v) for v in base], [math.log(v) for v in cand])
    assert unpaired.p_b_greater > 0.05
    assert decide("step time", base, cand, higher_is_better=False).verdict is not Verdict.REGRESSION


def test_identical_sides_under_drift_raise_at_most_5_percent_false_alarms() -> None:
    rng = random.Random(11)
    trials = 400
    flagged = sum(
        decide_paired(
            "step time",
            _drifting_blocks(rng, blocks=6, slowdown=0.0, drift=0.20, noise_sd=0.02),
            higher_is_better=False,
            rule=RULE,
        ).verdict
        is Verdict.REGRESSION
        for _ in range(trials)
    )
    assert flagged <= 0.05 * trials, flagged


def test_few_blocks_are_inconclusive_and_constant_blocks_are_decided() -> None:
    one = decide_paired("throughput", [([10.0, 10.0], [9.0, 9.0])], higher_is_better=True, rule=RULE)
    assert one.verdict is Verdict.INCONCLUSIVE and "at least 2" in one.reason
    constant = decide_paired("throughput", [([10.0, 10.0], [9.0, 9.0])] * 3, higher_is_better=True, rule=RULE)
    assert constant.verdict is Verdict.REGRESSION and constant.effect_text == "-10.0%"
    same = decide_paired("throughput", [([10.0], [10.0])] * 3, higher_is_better=True, rule=RULE)
    assert same.verdict is Verdict.NO_CHANGE
    with pytest.raises(ValueError, match="> 0"):
        block_log_ratio([0.0], [1.0])


def test_paired_t_matches_a_hand_computation() -> None:
    d = [0.01, 0.03, 0.02, 0.04]
    test = paired_t(d)
    sd = math.sqrt(sum((x - 0.025) ** 2 for x in d) / 3)
    assert test.mean_log_ratio == pytest.approx(0.025)
    assert test.sd_log_ratio == pytest.approx(sd)
    # t = 0.025 / (sd / 2) = 3.873 with 3 df: P(T > t) = 0.01522 (tables)
    assert test.p_greater == pytest.approx(0.01522, abs=2e-4)
    assert test.p_less == pytest.approx(1 - test.p_greater)
    # 90% interval: t(0.05, 3) = 2.3534
    assert test.ci_high_log - test.mean_log_ratio == pytest.approx(2.3534 * sd / 2, rel=1e-3)


@pytest.mark.parametrize("sd", [0.005, 0.02, 0.05, 0.1])
def test_the_planner_needs_the_closed_form_blocks_or_a_few_more(sd: float) -> None:
    n = blocks_needed(sd, 0.05, alpha=0.05, power=0.9)
    closed = normal_blocks_needed(sd, 0.05, alpha=0.05, power=0.9)
    assert n is not None and n >= 2
    assert max(2, math.ceil(closed)) <= n <= math.ceil(closed) + 3  # Student's quantiles add a few
    # and n blocks detect 5% while one block fewer does not
    assert detectable_change(sd, n, 0.05) <= 0.05 + 1e-12
    if n > 2:
        assert detectable_change(sd, n - 1, 0.05) > 0.05


def test_the_planner_by_hand_and_within_the_time() -> None:
    # sd 0.02, 5%: n = 4, since sqrt(4) log(1.05) / 0.02 = 4.879 >= t(.05,3) + t(.1,3) = 2.353 + 1.638,
    # and n = 3 gives 4.225 < 2.920 + 1.886.
    assert blocks_needed(0.02, 0.05, alpha=0.05) == 4
    calibration = [0.02, -0.02, 0.0]  # sd 0.02 from 3 blocks: planned on 0.02 x sqrt(2 / 0.4463) = 0.0423
    # One look (no early stop): the sequential design's plan is tests/test_sequential.py's.
    p = plan(calibration, min_detectable=0.05, alpha=0.05, seconds_per_block=60.0, max_seconds=180.0, looks=1)
    assert p.sd_log_ratio == pytest.approx(0.02) and p.sd_planned == pytest.approx(0.0423, rel=0.01)
    assert (p.blocks_needed, p.blocks_in_time, p.blocks) == (9, 3, 3)
    assert p.detectable > 0.05  # three blocks cannot see 5%: said before starting
    assert "can detect" in p.text() and "80% upper confidence limit" in p.text()
    roomy = plan(
        calibration, min_detectable=0.05, alpha=0.05, seconds_per_block=60.0, max_seconds=3600.0, looks=1
    )
    assert roomy.blocks == 9 and roomy.detectable <= 0.05
    # The limit narrows to the estimate as the calibration grows: 30 blocks, 0.02 x sqrt(29 / 22.48).
    assert plan([0.02, -0.02] * 15, min_detectable=0.05, alpha=0.05).sd_planned == pytest.approx(
        0.02 * 1.0171 * math.sqrt(29 / 22.475), rel=0.01
    )
    with pytest.raises(ValueError, match="at least 2"):
        plan([0.01], min_detectable=0.05, alpha=0.05)


def test_blocks_noisier_than_the_plan_say_what_they_could_detect_and_what_would() -> None:
    # Planned on a quiet day (sd 0.02 from 30 blocks), run on a runner four times as noisy: 21 blocks.
    quiet = plan(
        [0.02, -0.02] * 15, min_detectable=0.05, alpha=0.01, seconds_per_block=20.0, max_seconds=420.0
    )
    noisy = [0.08, -0.08] * 10 + [0.0]  # sd 0.080
    rule = ab_rule(alpha=0.01, min_detectable=0.05)
    result = decide_paired(
        "step time", [([10.0], [10.0 * math.exp(r)]) for r in noisy], higher_is_better=False, rule=rule
    )
    seen = noise_seen(quiet, result, 20.0, alpha=0.01)
    assert seen is not None and seen.sd_log_ratio == pytest.approx(0.080, abs=0.001)
    assert seen.sd_planned == quiet.sd_planned < 0.03
    # What 21 blocks detect at the noise they showed, at the plan's last level and power; and 5% needs more.
    assert seen.detectable == pytest.approx(detectable_change(seen.sd_log_ratio, 21, quiet.level, 0.95))
    assert seen.detectable > 0.05 and seen.blocks_needed is not None and seen.blocks_needed > 21
    assert detectable_change(seen.sd_log_ratio, seen.blocks_needed, quiet.level, 0.95) <= 0.05
    assert detectable_change(seen.sd_log_ratio, seen.blocks_needed - 1, quiet.level, 0.95) > 0.05
    minutes = seen.blocks_needed * 20.0 / 60.0
    assert f"not 5.0%, which needs {seen.blocks_needed} blocks (about {minutes:.0f} min at 20 s a block)" in (
        seen.text()
    )
    markdown = format_markdown(
        [result], baseline="a", candidate="b", blocks=21, seed=0, rule=rule, plan=quiet, noise=seen
    )
    assert f"- **{seen.text()}**" in markdown
    # Blocks within the plan's noise, or noisier but still able to see 5%: nothing to say.
    calm_blocks = [([10.0], [10.0 * math.exp(r)]) for r in [0.01, -0.01] * 10]
    calm = decide_paired("step time", calm_blocks, higher_is_better=False, rule=rule)
    assert noise_seen(quiet, calm, 20.0, alpha=0.01) is None
    a_little_noisier = [([10.0], [10.0 * math.exp(r)]) for r in [0.03, -0.03] * 10]
    result = decide_paired("step time", a_little_noisier, higher_is_better=False, rule=rule)
    assert result.sd_log_ratio is not None and result.sd_log_ratio > quiet.sd_planned
    assert noise_seen(quiet, result, 20.0, alpha=0.01) is None


@pytest.mark.parametrize(
    ("df", "exact"), [(1, 0.0642), (2, 0.4463), (5, 2.3425), (10, 6.1791), (30, 23.3641)]
)
def test_the_chi_square_quantile_at_the_plans_level(df: int, exact: float) -> None:
    # scipy.stats.chi2.ppf(0.2, df); at 1 df the approximation is 14% low (a larger sd limit: safe)
    assert chi2_quantile(0.2, df) == pytest.approx(exact, rel=0.15 if df == 1 else 0.01)


FAKE_RUN = """
import os, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.test_compare import synthetic_run
counter = Path({counter!r})
n = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(n + 1))
# The machine slows by 1% a run (a drift common to both sides); the argument is the workload's own factor.
synthetic_run(Path(os.environ["TUNEUP_DIR"]), 10.0 * float(sys.argv[1]) * (1 + 0.01 * n))
"""


def _fake_ab(tmp_path: Path, factor: str, *options: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`bench --ab` of FAKE_RUN at `factor` against 1.0 on step time, with --json and --markdown in tmp_path:
    the process and its JSON (None where none was written)."""
    script = tmp_path / "fake_run.py"
    script.write_text(
        FAKE_RUN.format(root=str(Path(__file__).parent.parent), counter=str(tmp_path / "counter")),
        encoding="utf-8",
    )
    result = cli(
        "bench", "--ab", "--cmd", f"{sys.executable} {script} {factor}", "--baseline-cmd",
        f"{sys.executable} {script} 1.0", "--calibrate-blocks", "0", "--metrics", "step_time",
        "--out", str(tmp_path / "out"), "--json", str(tmp_path / "ab.json"), "--markdown", str(tmp_path / "ab.md"),
        *options,
        timeout=300,
    )  # fmt: skip
    written = tmp_path / "ab.json"
    return result, json.loads(written.read_text()) if written.is_file() else None


@pytest.mark.slow  # 20 runs of a fake workload: about 7 s
def test_bench_ab_plans_runs_blocks_and_flags_a_5_percent_slowdown(tmp_path: Path) -> None:
    result, _ = _fake_ab(
        tmp_path, "1.05", "--calibrate-blocks", "2", "--blocks", "3", "--seed", "5",
        "--junit", str(tmp_path / "ab.xml"), "--history", str(tmp_path / "history.jsonl"),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "can detect" in result.stdout
    assert "REGRESSION" in result.stdout
    document = json.loads((tmp_path / "ab.json").read_text())
    (step,) = document["metrics"]
    assert step["verdict"] == "REGRESSION"
    assert len(step["log_ratios"]) == 3
    assert step["ratio"] == pytest.approx(1.05, rel=0.01)  # the drift cancels within A B B A
    assert document["plan"]["calibration_blocks"] == 2
    assert document["noise_seen"] is None  # planned on 2 blocks' upper limit: no block is noisier
    assert int((tmp_path / "counter").read_text()) == 4 * (2 + 3)
    # The CI history gets one record: the candidate's runs' figures (6 of them, 10.5 ms x the drift) and the verdict.
    (record,) = history.read(tmp_path / "history.jsonl")
    assert record.verdict == "regression"
    assert 10.5 < record.metrics["step_time_ms"] < 10.5 * 1.2
    # The two sides' run directories have names of one length (the environment's size moves the stack).
    block = tmp_path / "out" / "ab" / "block-01"
    assert sorted(p.name for p in block.iterdir()) == ["A-1", "A-2", "B-1", "B-2"]
    # The CI formats state the same verdict and effect figure as the table.
    effect = next(line for line in result.stdout.splitlines() if line.startswith("step time")).split()[2]
    markdown = (tmp_path / "ab.md").read_text()
    assert markdown.startswith("**tuneup bench --ab: 1 regression(s)**")
    assert f"| step time | **REGRESSION** | {effect} |" in markdown
    assert "- 3 blocks of A B B A or B A A B, order drawn with seed 5" in markdown
    assert "can detect" in markdown and "paired t-test" in markdown
    suite = ET.fromstring((tmp_path / "ab.xml").read_text())
    assert schema_errors(suite) == []
    assert (suite.get("name"), suite.get("tests"), suite.get("failures")) == ("tuneup bench --ab", "1", "1")
    failure = suite.find("testcase/failure")
    assert (
        failure is not None and failure.get("message") == f"step time: REGRESSION, {effect} (threshold 2.5%)"
    )


@pytest.mark.slow  # 2 x 16 runs of a fake workload: about 10 s
@pytest.mark.parametrize(("factor", "verdict", "code"), [("1.3", "REGRESSION", 1), ("1.0", "NO CHANGE", 0)])
def test_bench_ab_stops_at_the_first_look_once_the_verdict_is_settled(
    tmp_path: Path, factor: str, verdict: str, code: int
) -> None:
    result, document = _fake_ab(tmp_path, factor, "--blocks", "12")
    assert result.returncode == code, result.stdout + result.stderr
    assert "looks after blocks 4, 8, 12" in result.stdout
    assert "settled after 4 blocks" in result.stdout
    assert int((tmp_path / "counter").read_text()) == 4 * 4  # the 8 blocks after the first look never ran
    assert document is not None
    assert (document["blocks_run"], document["blocks_planned"]) == (4, 12)
    assert [look["blocks"] for look in document["looks"]] == [4, 8, 12]
    (step,) = document["metrics"]
    assert step["verdict"] == verdict and step["settled"] and len(step["log_ratios"]) == 4
    assert step["level"] == document["looks"][0]["alpha"] < 1e-4  # the first look's level, not alpha's
    assert "look 1 of 3, at block 4 of 12, settled" in step["reason"]
    markdown = (tmp_path / "ab.md").read_text()
    assert "- 4 blocks of A B B A" in markdown and "stopped early, of at most 12" in markdown


@pytest.mark.slow  # a few runs of a fake workload: about 4 s
def test_bench_ab_ends_within_max_minutes_and_decides_on_the_blocks_it_ran(tmp_path: Path) -> None:
    result, document = _fake_ab(tmp_path, "1.3", "--blocks", "40", "--max-minutes", "0.05")
    # 3 s for 40 blocks of 4 processes: it stops at the first block the next would not fit after (at
    # least 2, for a test), and the 30% slowdown is a regression at the alpha left.
    assert result.returncode == 1 and document is not None, result.stdout + result.stderr
    ran = document["blocks_run"]
    assert 2 <= ran < 40 and document["blocks_planned"] == 40
    assert f"stopping after {ran} of 40 blocks" in result.stdout
    assert [look["blocks"] for look in document["looks"]] == [ran]  # before the first planned look (14)
    (step,) = document["metrics"]
    assert step["verdict"] == "REGRESSION" and step["level"] == pytest.approx(0.01)
    assert (
        f"stopped {40 - ran} blocks short of the 40 planned: out of time" in (tmp_path / "ab.md").read_text()
    )


@pytest.mark.slow  # 16 runs of a fake workload: about 5 s
def test_bench_ab_says_when_its_blocks_were_noisier_than_its_calibration(tmp_path: Path) -> None:
    # A calibration of a perfectly quiet runner (every A/A block the same); the fake's blocks vary a
    # little (its drift, and its figures' rounding), which at 0.01% to detect is too much for 4 blocks.
    calibration = tmp_path / "calibration.json"
    calibration.write_text(
        json.dumps({"seconds_per_block": 1.0, "metrics": [{"metric": "step time", "log_ratios": [0.0] * 10}]})
    )
    result, document = _fake_ab(
        tmp_path, "1.05", "--calibration", str(calibration), "--blocks", "4", "--looks", "1",
        "--min-detectable", "0.0001",
    )  # fmt: skip
    assert document is not None, result.stdout + result.stderr
    seen = document["noise_seen"]
    assert seen is not None and seen["metric"] == "step time" and seen["blocks"] == 4
    assert seen["sd_log_ratio"] > seen["sd_planned"] == 0.0 and seen["detectable"] > 0.0001
    assert "step time's blocks varied more than the plan assumed" in result.stdout
    assert "calibrate again on this runner" in (tmp_path / "ab.md").read_text()


SIDE_BY_SIDE_RUN = """
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.test_compare import synthetic_run
run_dir = Path(os.environ["TUNEUP_DIR"])
started = time.time()
time.sleep(0.5)
synthetic_run(run_dir, 10.0 * float(sys.argv[1]))
seen = {{"cpus": sorted(os.sched_getaffinity(0)), "started": started, "ended": time.time()}}
(run_dir / "seen.json").write_text(json.dumps(seen))
"""


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin"
)
@pytest.mark.slow  # 2 calibration and 3 A/B blocks of 2 rounds of 2 runs at once: about 6 s
def test_side_by_side_runs_a_and_b_at_once_on_swapped_halves_and_flags_a_5_percent_slowdown(
    tmp_path: Path,
) -> None:
    script = tmp_path / "side_run.py"
    script.write_text(SIDE_BY_SIDE_RUN.format(root=str(Path(__file__).parent.parent)), encoding="utf-8")
    result = cli(
        "bench", "--ab", "--side-by-side", "--cmd", f"{sys.executable} {script} 1.05", "--baseline-cmd",
        f"{sys.executable} {script} 1.0", "--calibrate-blocks", "2", "--blocks", "3", "--metrics", "step_time",
        "--out", str(tmp_path / "out"), "--json", str(tmp_path / "ab.json"), "--markdown", str(tmp_path / "ab.md"),
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "A|B then B|A" in result.stdout and "REGRESSION" in result.stdout
    document = json.loads((tmp_path / "ab.json").read_text())
    assert document["side_by_side"] is True and document["blocks_run"] == 3
    (step,) = document["metrics"]
    assert step["ratio"] == pytest.approx(1.05, rel=0.01)
    assert "A|B then B|A" in (tmp_path / "ab.md").read_text()
    first, second = cpu_halves()
    for phase, blocks in (("calibration", 2), ("ab", 3)):
        for block in range(1, blocks + 1):
            seen = {
                slot: json.loads((tmp_path / "out" / phase / f"block-{block:02d}" / slot / "run-01" / "seen.json").read_text())
                for slot in ("A-1", "A-2", "B-1", "B-2")
            }  # fmt: skip
            for a, b in (("A-1", "B-1"), ("A-2", "B-2")):  # one round: both at once, on the two halves
                assert {tuple(seen[a]["cpus"]), tuple(seen[b]["cpus"])} == {first, second}
                assert seen[a]["started"] < seen[b]["ended"] and seen[b]["started"] < seen[a]["ended"]
            assert seen["A-1"]["cpus"] != seen["A-2"]["cpus"]  # each side on each half within the block


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin"
)
@pytest.mark.slow  # one round: a failing run ends its partner
def test_side_by_side_names_the_run_that_failed_and_ends_the_one_beside_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    slow = tmp_path / "slow.py"
    slow.write_text(SLOW_WORK, encoding="utf-8")
    started_s = time.monotonic()
    result = cli(
        "bench", "--ab", "--side-by-side", "--cmd", f"{sys.executable} -c 'import sys; sys.exit(3)'",
        "--baseline-cmd", f"{sys.executable} {slow} {pid_file}", "--calibrate-blocks", "0", "--blocks", "2",
        "--out", str(tmp_path / "out"),
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "candidate block 1" in result.stderr and "exited with 3" in result.stderr
    assert "cancelled" not in result.stderr
    assert time.monotonic() - started_s < 60  # the baseline's 120 s sleep was ended, not waited for
    run_pid = int(pid_file.read_text())
    assert not psutil.pid_exists(run_pid) or psutil.Process(run_pid).status() == psutil.STATUS_ZOMBIE


WORK = """
import os, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.test_compare import synthetic_run
import speed  # from the tree the command runs in: the baseline's worktree on PYTHONPATH, first
synthetic_run(Path(os.environ["TUNEUP_DIR"]), 10.0 * speed.FACTOR)
"""


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True
    )


@pytest.mark.slow  # 8 runs of a fake workload and a git worktree: about 4 s
def test_baseline_ref_runs_the_baseline_from_its_own_worktree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "work.py").write_text(WORK.format(root=str(Path(__file__).parent.parent)), encoding="utf-8")
    (repo / "speed.py").write_text("FACTOR = 1.0\n", encoding="utf-8")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "baseline")
    # The candidate is the checkout's own state, 20% slower and not even committed.
    (repo / "speed.py").write_text("FACTOR = 1.2\n", encoding="utf-8")
    out = tmp_path / "out"
    result = cli(
        "bench", "--ab", "--cmd", f"{sys.executable} work.py", "--baseline-ref", "HEAD",
        "--baseline-setup", "echo set up > setup.txt", "--calibrate-blocks", "0", "--blocks", "2",
        "--metrics", "step_time", "--out", str(out), "--json", str(tmp_path / "ab.json"),
        cwd=repo, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    (step,) = json.loads((tmp_path / "ab.json").read_text())["metrics"]
    assert step["ratio"] == pytest.approx(1.2, rel=0.01)
    # The worktree is gone afterwards, and git no longer lists it.
    assert not (out / "baseline-tree").exists()
    listed = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
    assert len(listed.splitlines()) == 1
    # A ref git does not know: exit 2, naming it and the fetch that would bring it, before any run.
    missing = cli(
        "bench", "--ab", "--cmd", f"{sys.executable} work.py", "--baseline-ref", "no-such-branch",
        "--blocks", "2", "--calibrate-blocks", "0", "--out", str(tmp_path / "out2"), cwd=repo,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "'no-such-branch': no such commit" in missing.stderr and "git fetch" in missing.stderr
    # Outside a repository.
    outside = cli(
        "bench", "--cmd", "true", "--baseline-ref", "main", "--out", str(tmp_path / "out3"), cwd=tmp_path
    )
    assert outside.returncode == 2 and "needs a git checkout" in outside.stderr


SLOW_WORK = """
import os, sys, time
from pathlib import Path
Path(sys.argv[1]).write_text(str(os.getpid()))
time.sleep(120)
"""


@pytest.mark.slow  # a git worktree, one run started and cancelled: about 3 s
def test_sigterm_ends_the_runs_and_removes_the_baseline_worktree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "work.py").write_text(SLOW_WORK, encoding="utf-8")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "baseline")
    pid_file, out = tmp_path / "pid", tmp_path / "out"
    bench = subprocess.Popen(
        [
            sys.executable, "-m", "tuneup", "bench", "--ab", "--cmd", f"{sys.executable} work.py {pid_file}",
            "--baseline-ref", "HEAD", "--blocks", "2", "--calibrate-blocks", "0", "--out", str(out),
        ],
        cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid_file.exists(), "the first run never started"
    assert (out / "baseline-tree").is_dir()
    bench.send_signal(signal.SIGTERM)  # what a cancelled CI job sends
    _, err = bench.communicate(timeout=60)
    assert bench.returncode == 143, err
    run_pid = int(pid_file.read_text())
    assert not psutil.pid_exists(run_pid) or psutil.Process(run_pid).status() == psutil.STATUS_ZOMBIE
    assert not (out / "baseline-tree").exists()
    listed = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
    assert len(listed.splitlines()) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--looks", "0"], "--looks must be at least 1"),
        (["--alpha", "0.6"], "--alpha must be below 0.5"),
        (["--blocks", "1"], "--blocks must be at least 2"),
        (["--calibrate-blocks", "1"], "--calibrate-blocks must be 0 or at least 2"),
        (["--side-by-side", "--calibration", "CALIBRATION"], "its blocks ran one after another"),
    ],
)
def test_bad_ab_options_are_exit_2_naming_the_option(
    tmp_path: Path, options: list[str], message: str
) -> None:
    # A calibration of blocks run one after another (as every one before --side-by-side was).
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"metrics": [{"metric": "step time", "log_ratios": [0.0, 0.01]}]}))
    options = [str(calibration) if o == "CALIBRATION" else o for o in options]
    result = cli(
        "bench", "--ab", "--cmd", "true", "--baseline-cmd", "true", "--out", str(tmp_path / "out"),
        *(["--blocks", "3"] if "--blocks" not in options else []), *options,
    )  # fmt: skip
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # refused before any run


def test_side_by_side_without_ab_is_exit_2() -> None:
    result = cli("bench", "--side-by-side", "--cmd", "true", "--out", "/nonexistent/never-made")
    assert result.returncode == 2 and "add --ab" in result.stderr and "Traceback" not in result.stderr
