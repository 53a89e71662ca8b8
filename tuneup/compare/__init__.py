"""`tuneup compare`: did a change make training slower? A verdict per metric from a few runs a side.

`decide` applies the rule (DESIGN.md, "CI regression": a one-sided Welch t-test on log values AND a
change beyond max(5%, 2 x the baseline's run-to-run CV)) to one metric and says why in one sentence;
`simulate_flag_rate` measures its false alarms and power. With `--target`, `to_target` adds each side's
time and $ to a quality target beside samples/s, and which side is faster to it. The statistics in `stats`
are pure Python, so a CI job needs neither numpy nor scipy.
"""

from __future__ import annotations

from tuneup.compare.rule import MetricComparison, Rule, Verdict, decide, simulate_flag_rate
from tuneup.compare.stats import (
    WelchResult,
    bootstrap_ratio_of_medians,
    coefficient_of_variation,
    student_t_sf,
    welch,
)

__all__ = [
    "MetricComparison",
    "Rule",
    "Verdict",
    "WelchResult",
    "bootstrap_ratio_of_medians",
    "coefficient_of_variation",
    "decide",
    "simulate_flag_rate",
    "student_t_sf",
    "welch",
]
