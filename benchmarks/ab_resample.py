"""The gate's flag rates from measured A/A blocks, resampled: what many more trials of benchmarks/ab_trials.py
would give, at a fraction of their hours.

    python benchmarks/ab_resample.py /tmp/ab-trials [more trial directories] [--blocks 26] [--trials 10000]

Reads every A/A block log ratio (step time) the directories hold: the calibration's (calibration.json) and
the A/A trials' (aa-NN.json, aa-burner-NN.json), centred on 0. A resampled trial draws `--blocks` of them with
replacement; a slowdown trial adds log(1 + slowdown) to each, as an injected slowdown would shift every
block. Each is decided by the gate's rule (tuneup.compare.ab.decide_paired with the bench --ab defaults,
or --alpha). What it assumes: blocks independent of each other, and a slowdown that shifts the log ratio
and leaves its spread alone; what it cannot see: a noise level that changes from one job to the next
beyond what the pooled blocks hold. The real trials are the check on it.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

from tuneup.compare.ab import DEFAULT_ALPHA, ab_rule, decide_paired
from tuneup.compare.rule import Verdict


def aa_block_ratios(directories: list[Path]) -> list[float]:
    ratios: list[float] = []
    for directory in directories:
        for path in sorted(directory.glob("calibration.json")) + sorted(directory.glob("aa*.json")):
            document = json.loads(path.read_text(encoding="utf-8"))
            step = next(m for m in document["metrics"] if m["metric"] == "step time")
            ratios.extend(step["log_ratios"])
    return ratios


def flag_rate(
    ratios: list[float], blocks: int, slowdown: float, trials: int, alpha: float, seed: int
) -> float:
    rng = random.Random(seed)
    rule = ab_rule(alpha, 0.05)
    shift = math.log1p(slowdown)
    flagged = 0
    for _ in range(trials):
        drawn = [rng.choice(ratios) + shift for _ in range(blocks)]
        # decide_paired takes each block's runs; one figure a side whose log ratio is the drawn one.
        pairs = [([1.0], [math.exp(r)]) for r in drawn]
        flagged += (
            decide_paired("step time", pairs, higher_is_better=False, rule=rule).verdict is Verdict.REGRESSION
        )
    return flagged / trials


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directories", nargs="+", type=Path)
    parser.add_argument("--blocks", type=int, nargs="+", default=[18, 26, 34])
    parser.add_argument("--slowdowns", type=float, nargs="+", default=[0.0, 0.03, 0.05])
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    measured = aa_block_ratios(args.directories)
    if len(measured) < 10:
        parser.error(f"only {len(measured)} A/A blocks found; run more A/A trials first")
    mean = sum(measured) / len(measured)
    sd = math.sqrt(sum((r - mean) ** 2 for r in measured) / (len(measured) - 1))
    # An A/A block's log ratio has mean 0 (the same command both sides, the order drawn at random); the
    # pool's own mean is chance, and left in it would shift every resampled trial alike.
    ratios = [r - mean for r in measured]
    print(
        f"{len(measured)} measured A/A blocks: mean log ratio {mean:+.4f} (removed), sd {sd:.4f}; "
        f"alpha {args.alpha:g}"
    )
    header = "blocks  " + "  ".join(f"{'A/A' if s == 0 else f'{s:.0%} slower':>10}" for s in args.slowdowns)
    print(header)
    for blocks in args.blocks:
        rates = [flag_rate(ratios, blocks, s, args.trials, args.alpha, args.seed) for s in args.slowdowns]
        print(f"{blocks:>6}  " + "  ".join(f"{r:>10.1%}" for r in rates))
    print(f"share of {args.trials} resampled trials flagged REGRESSION (seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
