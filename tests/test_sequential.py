"""The A/B's early stop (tuneup.compare.sequential): the boundaries against published values, and the
false-alarm rate and power of the gate's looks measured by simulation through `decide_paired`."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from tuneup.compare.ab import ab_rule, decide_paired, gate_settled, plan
from tuneup.compare.rule import Verdict
from tuneup.compare.sequential import (
    Look,
    alpha_spent,
    design,
    efficacy_boundaries,
    final_level,
    look_blocks,
    upper_tail,
)


@pytest.mark.parametrize(
    ("looks", "published"),
    [
        (2, (2.963, 1.969)),
        (3, (3.710, 2.511, 1.993)),
        (4, (4.333, 2.963, 2.359, 2.014)),
        (5, (4.877, 3.357, 2.680, 2.290, 2.031)),
    ],
)
def test_the_boundaries_are_the_published_lan_demets_obrien_fleming_ones(
    looks: int, published: tuple[float, ...]
) -> None:
    # One-sided alpha 0.025 at equal shares: the values gsDesign (sfLDOF) and Jennison & Turnbull tabulate.
    bounds = efficacy_boundaries(tuple(k / looks for k in range(1, looks + 1)), 0.025)
    assert bounds == pytest.approx(published, abs=0.002)


def test_spending_reaches_alpha_at_the_end_and_one_look_is_the_fixed_test() -> None:
    assert alpha_spent(1.0, 0.01) == pytest.approx(0.01)
    assert 0 < alpha_spent(1 / 3, 0.01) < alpha_spent(2 / 3, 0.01) < 0.01
    assert upper_tail(efficacy_boundaries((1.0,), 0.01)[0]) == pytest.approx(0.01)
    assert final_level(0.01, 1) == 0.01
    assert 0.009 < final_level(0.01, 3) < 0.01  # the last look keeps nearly all of alpha
    with pytest.raises(ValueError, match="must increase"):
        efficacy_boundaries((0.5, 0.4, 1.0), 0.01)


@pytest.mark.parametrize(
    ("planned", "looks", "expected"),
    [(32, 3, (11, 22, 32)), (10, 3, (4, 7, 10)), (3, 3, (3,)), (27, 1, (27,)), (12, 4, (6, 9, 12))],
)
def test_the_looks_are_equal_shares_of_at_least_four_blocks(
    planned: int, looks: int, expected: tuple[int, ...]
) -> None:
    assert look_blocks(planned, looks) == expected


def _gate(ratios: list[float], looks: tuple[Look, ...], rule) -> tuple[Verdict, int]:
    """The gate's walk over its looks, as `tuneup bench --ab` does: (verdict, blocks run)."""
    pairs = [([1.0], [math.exp(r)]) for r in ratios]
    for look in looks:
        result = decide_paired(
            "step time", pairs[: look.blocks], higher_is_better=False, rule=rule, look=look
        )
        if result.settled:
            break
    return result.verdict, look.blocks


def test_the_looks_keep_the_false_alarm_rate_at_alpha_where_peeking_does_not() -> None:
    # A threshold of 0.1%: the test alone decides, as it does where the change to detect is small.
    rule = ab_rule(alpha=0.05, min_detectable=0.002)
    sequential = design(30, 0.05, looks=3).looks
    # The same looks each at alpha: stopping at the first p < alpha.
    peeking = tuple(dataclasses.replace(look, alpha=0.05, futility=None) for look in sequential)
    # Out of time after 15 blocks: the first look as planned, then the rest of alpha at block 15.
    ended = design(30, 0.05, looks=3, end_blocks=15).looks
    assert [look.blocks for look in ended] == [10, 15]
    assert (ended[0].alpha, ended[0].futility) == (sequential[0].alpha, sequential[0].futility)
    rng = random.Random(11)
    trials = 6000
    flagged = {"sequential": 0, "peeking": 0, "ended": 0}
    for _ in range(trials):
        ratios = [rng.gauss(0.0, 0.03) for _ in range(30)]
        flagged["sequential"] += _gate(ratios, sequential, rule)[0] is Verdict.REGRESSION
        flagged["peeking"] += _gate(ratios, peeking, rule)[0] is Verdict.REGRESSION
        flagged["ended"] += _gate(ratios, ended, rule)[0] is Verdict.REGRESSION
    # Binomial sd at 0.05 over 6,000 trials: 0.0028. Peeking three times gives about 0.1.
    assert flagged["sequential"] / trials < 0.058
    assert flagged["peeking"] / trials > 0.07
    assert 0.042 < flagged["ended"] / trials < 0.058  # the early end spends alpha, no more and not much less


def test_the_planned_looks_keep_the_power_and_stop_early_without_a_change() -> None:
    rule = ab_rule(alpha=0.01, min_detectable=0.05)
    # The noise of the compute trials' blocks (benchmarks/ab_trials.py): sd 0.06 of the log ratio.
    fixed = plan([0.06, -0.06] * 20, min_detectable=0.05, alpha=0.01, looks=1)
    planned = plan([0.06, -0.06] * 20, min_detectable=0.05, alpha=0.01)
    assert planned.looks == 3 and planned.blocks > fixed.blocks  # the max grows ...
    assert "3 looks" in planned.text() and "at most" in planned.text()
    looks = design(planned.blocks, 0.01).looks
    rng = random.Random(3)
    trials = 1500
    outcomes = {}
    for slowdown in (0.0, 0.05, 0.20):
        runs = [
            _gate([rng.gauss(math.log1p(slowdown), 0.06) for _ in range(planned.blocks)], looks, rule)
            for _ in range(trials)
        ]
        flagged = sum(verdict is Verdict.REGRESSION for verdict, _ in runs) / trials
        outcomes[slowdown] = (flagged, sum(blocks for _, blocks in runs) / trials)
    assert outcomes[0.0][0] <= 0.01 + 0.008
    assert outcomes[0.05][0] >= 0.9
    assert outcomes[0.20][0] == 1.0 and outcomes[0.20][1] < 1.1 * looks[0].blocks  # stops at the first look
    assert outcomes[0.0][1] < 0.85 * fixed.blocks  # ... and the expected time without a change shrinks


def test_a_look_settles_a_clear_verdict_and_leaves_an_open_one_running() -> None:
    rule = ab_rule(alpha=0.01, min_detectable=0.05)
    first, _, last = design(30, 0.01, looks=3).looks
    rng = random.Random(5)

    def at(look: Look, mean: float, sd: float):
        pairs = [([1.0], [math.exp(rng.gauss(mean, sd))]) for _ in range(look.blocks)]
        return decide_paired("step time", pairs, higher_is_better=False, rule=rule, look=look)

    slow = at(first, math.log(1.3), 0.01)
    assert (slow.verdict, slow.settled) == (Verdict.REGRESSION, True)
    assert "look 1 of 3, at block 10 of 30" in slow.reason
    quiet = at(first, 0.0, 0.005)
    assert (quiet.verdict, quiet.settled) == (Verdict.NO_CHANGE, True)
    assert "5% either way is ruled out" in quiet.reason
    open_ = at(first, 0.0, 0.15)  # too noisy to rule 5% out in 10 blocks
    assert not open_.settled
    # The last look decides whatever it sees, at its own level (below alpha: some was spent earlier).
    assert at(last, 0.0, 0.06).settled and last.alpha < 0.01
    assert at(last, 0.0, 0.06).level == last.alpha


def test_the_gate_stops_on_a_settled_regression_or_when_every_metric_is_settled() -> None:
    rule = ab_rule(alpha=0.01, min_detectable=0.05)
    first = design(30, 0.01, looks=3).looks[0]
    rng = random.Random(9)

    def metric(mean: float, sd: float):
        pairs = [([1.0], [math.exp(rng.gauss(mean, sd))]) for _ in range(first.blocks)]
        return decide_paired("step time", pairs, higher_is_better=False, rule=rule, look=first)

    regressed, quiet, noisy = metric(math.log(1.3), 0.01), metric(0.0, 0.005), metric(0.0, 0.15)
    assert (regressed.settled, quiet.settled, noisy.settled) == (True, True, False)
    assert gate_settled([regressed, noisy])  # the gate fails whatever the noisy metric says later
    assert gate_settled([quiet, quiet])
    assert not gate_settled([quiet, noisy])  # a metric still open keeps the job running
    assert not gate_settled([])
