"""How often `tuneup compare` flags a regression: false alarms (A/A) and power, by noise and run count.

    python benchmarks/compare_power.py [--runs 3 5 10] [--trials 5000] [--seed 0] [--json PATH]

Simulated comparisons with `tuneup.compare.simulate_flag_rate`: per trial, `runs` baseline and `runs`
candidate throughputs with lognormal run-to-run noise of the row's coefficient of variation, the
candidate slowed by the column's fraction, judged by the default rule (one-sided Welch t-test on log
values, p < 0.05, and a slowdown beyond max(5%, 2 x the baseline's CV)). The 0% column is the false
alarm rate, the others the power. Pure Python, seeded: the same arguments print the same table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tuneup.compare import Rule, simulate_flag_rate

CVS = (0.01, 0.02, 0.03, 0.05, 0.10)
SLOWDOWNS = (0.0, 0.05, 0.10, 0.20)


def flag_rates(runs: int, trials: int, seed: int, rule: Rule) -> dict[float, dict[float, float]]:
    """{cv: {slowdown: share of trials flagged REGRESSION}} for one run count a side."""
    return {
        cv: {s: simulate_flag_rate(cv, s, runs, trials, rule=rule, seed=seed) for s in SLOWDOWNS}
        for cv in CVS
    }


def format_table(runs: int, trials: int, rates: dict[float, dict[float, float]]) -> str:
    header = ["baseline CV"] + [f"{s:.0%} (A/A)" if s == 0 else f"{s:.0%} slower" for s in SLOWDOWNS]
    rows = [[f"{cv:.0%}"] + [f"{rates[cv][s]:.1%}" for s in SLOWDOWNS] for cv in CVS]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [f"{runs} runs a side, {trials} trials per cell: share flagged REGRESSION"]
    lines += [
        "  " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True))
        for row in [header, *rows]
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[3, 5, 10], help="runs a side, one table each")
    parser.add_argument("--trials", type=int, default=5000, help="simulated comparisons per cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the rates here")
    args = parser.parse_args(argv)
    if args.trials < 1 or any(r < 2 for r in args.runs):
        parser.error("--trials must be >= 1 and --runs >= 2 (a test needs 2 runs a side)")

    rule = Rule()
    started = time.perf_counter()
    print(f"rule: {rule.describe()}")
    print(
        "noise: lognormal, the row's CV run to run, on both sides; the candidate slowed by the column's share"
    )
    results = {}
    for runs in args.runs:
        rates = flag_rates(runs, args.trials, args.seed, rule)
        results[runs] = rates
        print()
        print(format_table(runs, args.trials, rates))
    elapsed_s = time.perf_counter() - started
    print(f"\nseed {args.seed}; {elapsed_s:.1f} s, python {sys.version.split()[0]}")
    if args.json:
        payload = {
            "rule": rule.describe(),
            "trials": args.trials,
            "seed": args.seed,
            "flag_rate": {
                str(runs): {
                    f"{cv:g}": {f"{s:g}": rate for s, rate in row.items()} for cv, row in rates.items()
                }
                for runs, rates in results.items()
            },
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
