"""How well `tuneup regressions` finds steps and drifts in a CI history, and how often it cries wolf.

    python benchmarks/regressions_check.py [--seeds 20] [--json PATH]

Synthetic histories from tests/test_regressions.py (`synthetic_history`): samples_per_s around 1,000 with
Gaussian noise of a given CV, a 5% slowdown at records 60 and 120, and 0.1% slower per record from record
150 to the last (200 records). Per noise level and seed:

- steps: both found within 2 records of where they were injected, the true ratio 0.95 inside the step's
  95% interval, and any other change point reported (a false one);
- drift: a drift reported over a segment that ends at the last record, its slope's 95% interval, and
  whether -0.1% per record lies inside it (the segment may start before record 150: then the slope is
  less and the interval may miss it);
- A/A: the same noise, no step and no drift: a history with any change point or drift is a false alarm.

Rows with slow jobs add, to that share of the records, a slowdown of 15-40% (a CI job on a busy runner).

Then the time `find_changes` takes on one metric of a 200- and a 2,000-record history (steps at 30% and
60% of it, the drift over its last 50 records), best of 3. Seeded: the same arguments print the same
figures (the times aside).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_regressions import DRIFT_FROM, DRIFT_PER_RECORD, RECORDS, STEP_RATIO, STEPS_AT, synthetic_history

from tuneup.compare.changepoints import find_changes

# (noise CV, share of records 15-40% slow: a CI job on a busy runner)
ROWS = ((0.01, 0.0), (0.015, 0.0), (0.02, 0.0), (0.015, 0.03), (0.02, 0.05))


def _series(records: list) -> tuple[list[float], list[str]]:
    return [r.metrics["samples_per_s"] for r in records], [r.commit for r in records]


def detection(cv: float, seeds: int, slow_share: float = 0.0) -> dict[str, float]:
    both = step_cover = extra = drift_found = drift_cover = 0
    slopes = []
    for seed in range(seeds):
        changes = find_changes(*_series(synthetic_history(seed, noise_cv=cv, slow_share=slow_share)))
        matched = [
            [c for c in changes.change_points if abs(c.index - at) <= 2 and c.ratio < 1.0] for at in STEPS_AT
        ]
        both += all(len(m) == 1 for m in matched)
        step_cover += sum(m[0].ratio_low <= STEP_RATIO <= m[0].ratio_high for m in matched if m)
        extra += len(changes.change_points) - sum(len(m) for m in matched)
        drifts = [d for d in changes.drifts if d.end_index == RECORDS - 1 and d.percent_per_record < 0]
        if drifts:
            drift_found += 1
            d = drifts[0]
            slopes.append(d.percent_per_record)
            drift_cover += d.percent_low <= -100 * DRIFT_PER_RECORD <= d.percent_high
    return {
        "cv": cv,
        "slow_share": slow_share,
        "seeds": seeds,
        "both_steps_found": both,
        "steps_ratio_in_interval": step_cover,
        "extra_change_points": extra,
        "drift_found": drift_found,
        "drift_rate_in_interval": drift_cover,
        "drift_percent_per_record_median": sorted(slopes)[len(slopes) // 2] if slopes else None,
    }


def false_alarms(cv: float, seeds: int, slow_share: float = 0.0) -> int:
    alarms = 0
    for seed in range(seeds):
        changes = find_changes(
            *_series(
                synthetic_history(
                    1000 + seed, steps_at=(), drift_from=None, noise_cv=cv, slow_share=slow_share
                )
            )
        )
        alarms += bool(changes.change_points or changes.drifts)
    return alarms


def timing(records: int) -> float:
    history = synthetic_history(
        0, records, steps_at=(records * 3 // 10, records * 6 // 10), drift_from=records - 50
    )
    values, commits = _series(history)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        find_changes(values, commits)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    figures: dict = {"steps_at": STEPS_AT, "drift_from": DRIFT_FROM, "detection": [], "aa": []}
    print(
        f"{args.seeds} seeds a row; 5% slowdowns at records {STEPS_AT}, -0.1%/record from {DRIFT_FROM} to {RECORDS - 1}"
    )
    print(
        "noise CV | slow jobs | both steps (within 2) | 0.95 in interval | extra change points | drift found | -0.1 in interval | median slope | A/A false alarms"
    )
    for cv, slow_share in ROWS:
        row = detection(cv, args.seeds, slow_share)
        aa = false_alarms(cv, args.seeds, slow_share)
        figures["detection"].append(row)
        figures["aa"].append({"cv": cv, "slow_share": slow_share, "seeds": args.seeds, "false_alarms": aa})
        slope = row["drift_percent_per_record_median"]
        print(
            f"{100 * cv:7.1f}% | {100 * slow_share:3.0f}% | {row['both_steps_found']:>2}/{args.seeds} | {row['steps_ratio_in_interval']:>2}/{2 * args.seeds} "
            f"| {row['extra_change_points']} | {row['drift_found']:>2}/{args.seeds} | {row['drift_rate_in_interval']:>2}/{row['drift_found']} "
            f"| {slope:+.3f}%/record | {aa}/{args.seeds}"
            if slope is not None
            else f"{100 * cv:7.1f}% | {row}"
        )
    for records in (200, 2000):
        seconds = timing(records)
        figures[f"seconds_{records}_records"] = seconds
        print(f"find_changes on {records:,} records: {seconds * 1000:.0f} ms (best of 3)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
