"""The advice model replayed on the accuracy benchmark's recorded runs (tests/data/advise_accuracy.tgz, written
by `benchmarks/advise_accuracy.py --archive`): each workload's advised baseline is advised again with the
installed model, and its recommendations are checked against the gains the benchmark measured when it applied
the same changes (interleaved with the baseline, on the 2-core machine; see benchmarks/README.md).

A fresh recommendation is matched to a measurement by its changes (knob -> proposed value): the benchmark
measured the recommendations of the model it ran with and standard alternatives (batch x2, two workers,
accumulation x2, 32-true), so a model that now proposes one of those is checked too. This is the regression
guard of the advice's accuracy: the intervals must hold for at least 80% of the measured changes.
"""

from __future__ import annotations

import json
import math
import statistics
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.archives import extract_all
from tuneup.advise import Advice, AdviceOptions, advise
from tuneup.advise.model import Range, Recommendation
from tuneup.analyze.model import RunAnalysis
from tuneup.analyze.noise_scale import statistical_efficiency
from tuneup.report import analyze

ARCHIVE = Path(__file__).parent / "data" / "advise_accuracy.tgz"
COVERAGE_GOAL = 0.8
LOSS = -0.02  # a recommendation that measured below this in every pair lost (issue 25)
MIN_MATCHED = 4  # fewer matched recommendations: the archive no longer tests the model; re-record it


@dataclass(frozen=True)
class Case:
    workload: str
    result: dict[str, Any]  # the benchmark's record of the workload (results.json)
    base: RunAnalysis
    advice: Advice


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    out = tmp_path_factory.mktemp("advise_accuracy")
    with tarfile.open(ARCHIVE) as tar:
        extract_all(tar, out)
    root = out / "advise_accuracy"
    results = json.loads((root / "results.json").read_text(encoding="utf-8"))["results"]
    found = []
    for r in results:
        base = analyze(root / r["workload"] / r["base_runs"][0])
        found.append(Case(r["workload"], r, base, advise([base], AdviceOptions(whatif=False))))
    return found


def _changes(rec: Recommendation) -> dict[str, str]:
    return {c.knob: c.proposed for c in rec.changes}


def measured_gain(case: Case, rec: Recommendation) -> tuple[float, list[float]] | None:
    """The gain the benchmark measured for the recommendation's changes, in its objective (overall: ratio of
    the medians; and per interleaved pair), or None where they were not measured."""
    if rec.objective not in ("samples/s", "goodput"):
        return None
    arm = next((a for a in case.result["arms"] if a["changes"] == _changes(rec)), None)
    if arm is None or arm["global_batch"] is None:
        return None
    rates = [r for r in arm["rates"] if r == r]  # NaN: a failed run
    base_rates = case.result["base_rates"]
    if not rates:
        return None
    factor = 1.0
    if rec.objective == "goodput":
        ns = case.base.noise_scale
        assert ns is not None and ns.b_simple is not None and ns.b_simple > 0
        factor = statistical_efficiency(ns.b_simple, case.result["global_batch"], arm["global_batch"])
    pairs = [r / b * factor - 1 for r, b in zip(arm["rates"], base_rates, strict=True) if r == r]
    return statistics.median(rates) / statistics.median(base_rates) * factor - 1, pairs


def matched(cases: list[Case]) -> list[tuple[Case, Recommendation, float, list[float]]]:
    found = []
    for case in cases:
        for rec in case.advice.recommendations:
            m = measured_gain(case, rec)
            if m is not None:
                found.append((case, rec, *m))
    return found


def _check_range(r: Range, what: str, *, relative: bool) -> None:
    assert all(math.isfinite(x) for x in (r.value, r.low, r.high)), what
    assert r.low <= r.value <= r.high, f"{what}: {r.value} not in [{r.low}, {r.high}]"
    if relative:
        assert r.low > -1, f"{what}: interval below -100% ({r.low})"
    else:
        assert r.low >= 0, f"{what}: a negative time or rate ({r.low})"


def test_the_archive_holds_at_least_ten_workloads_each_with_interleaved_baselines(cases: list[Case]) -> None:
    assert len(cases) >= 10
    for case in cases:
        assert len(case.result["base_rates"]) >= 2, case.workload  # A/A: the baseline in every round
        for arm in case.result["arms"]:
            if arm["knobs"] is not None and arm["rates"]:
                assert len(arm["rates"]) == len(case.result["base_rates"]), (case.workload, arm["name"])


def test_every_printed_interval_is_ordered_and_contains_its_point(cases: list[Case]) -> None:
    for case in cases:
        if case.advice.current is not None:
            _check_range(case.advice.current.samples_per_s, f"{case.workload} current", relative=False)
        for rec in case.advice.recommendations:
            what = f"{case.workload}: {rec.title}"
            _check_range(rec.gain, what, relative=True)
            if rec.predicted is not None:
                _check_range(rec.predicted.step_ms, f"{what} step", relative=False)
                _check_range(rec.predicted.samples_per_s, f"{what} samples/s", relative=False)


def test_enough_recommendations_were_measured_to_test_the_model(cases: list[Case]) -> None:
    found = matched(cases)
    assert len(found) >= MIN_MATCHED, (
        f"only {len(found)} of the model's recommendations were measured by the benchmark: re-record the "
        "archive (benchmarks/advise_accuracy.py --archive tests/data/advise_accuracy.tgz)"
    )


def _coverage(cases: list[Case]) -> tuple[float, list[str]]:
    found = matched(cases)
    misses = [
        f"{c.workload}: {rec.title}: predicted {rec.gain.value:+.1%} [{rec.gain.low:+.1%}, {rec.gain.high:+.1%}], "
        f"measured {gain:+.1%}"
        for c, rec, gain, _ in found
        if not rec.gain.low <= gain <= rec.gain.high
    ]
    return 1 - len(misses) / max(1, len(found)), misses


def test_the_measured_gains_fall_inside_the_intervals_for_at_least_80_percent(cases: list[Case]) -> None:
    # 9 of 10 on this archive (the one outside: accumulation 2 on the local-SGD run, predicted +19.1%
    # [+13.4, +25.0], measured +49%). Note the worker hand-over bound (advise/data_loading.py
    # WORKER_HANDOVER_MS) was set from this archive's GAN: that recommendation is in-sample here.
    coverage, misses = _coverage(cases)
    assert coverage >= COVERAGE_GOAL, f"coverage {coverage:.0%}; outside: {misses}"


def test_no_recommendation_lost_in_every_pair(cases: list[Case]) -> None:
    lost = [
        f"{c.workload}: {rec.title}: pairs {', '.join(f'{g:+.1%}' for g in pairs)}"
        for c, rec, _, pairs in matched(cases)
        if pairs and all(g < LOSS for g in pairs)
    ]
    assert not lost, lost
