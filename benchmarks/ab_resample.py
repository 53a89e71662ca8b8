"""The gate's flag rates from measured A/A blocks, resampled: what many more trials of benchmarks/ab_trials.py
would give, at a fraction of their hours.

    python benchmarks/ab_resample.py /tmp/ab-trials [more trial directories] [--blocks 26] [--trials 10000]

Reads every A/A block log ratio (step time) the directories hold: the calibration's (calibration.json) and
the A/A trials' (aa-NN.json, aa-burner-NN.json), centred on 0. A resampled trial draws `--blocks` of them with
replacement; a slowdown trial adds log(1 + slowdown) to each, as an injected slowdown would shift every
block. Each is decided by the gate's rule (tuneup.compare.ab.decide_paired with the bench --ab defaults,
or --alpha), looking at the blocks as the gate's sequential design does (--looks, the gate's default; 1:
one test at the end) and stopping where it would. What it assumes: blocks independent of each other, and a slowdown that shifts the log ratio
and leaves its spread alone; what it cannot see: a noise level that changes from one job to the next
beyond what the pooled blocks hold. The real trials are the check on it.

`--replay` instead walks each saved trial's own blocks (every metric, in the order they ran) through the
looks, as `tuneup bench --ab` would have with `--looks` over the blocks that trial planned: which verdict,
after how many blocks, against the verdict the trial gave.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tuneup.compare.ab import (
    DEFAULT_ALPHA,
    PairedComparison,
    ab_rule,
    decide_paired,
    gate_settled,
    verdict_word,
)
from tuneup.compare.rule import Verdict
from tuneup.compare.sequential import DEFAULT_FUTILITY_BUDGET, DEFAULT_LOOKS, Look, design


def aa_block_ratios(directories: list[Path]) -> list[float]:
    ratios: list[float] = []
    for directory in directories:
        for path in sorted(directory.glob("calibration.json")) + sorted(directory.glob("aa*.json")):
            document = json.loads(path.read_text(encoding="utf-8"))
            step = next(m for m in document["metrics"] if m["metric"] == "step time")
            ratios.extend(step["log_ratios"])
    return ratios


def through_looks(
    looks: Sequence[Look], decide: Callable[[Look], list[PairedComparison]]
) -> tuple[list[PairedComparison], Look]:
    """The gate's walk: each look's verdicts until `gate_settled` (the last look always is); those
    verdicts and the look they came at."""
    for look in looks:
        results = decide(look)
        if gate_settled(results):
            break
    return results, look


def flag_rate(
    ratios: list[float],
    blocks: int,
    slowdown: float,
    trials: int,
    alpha: float,
    seed: int,
    looks: int = DEFAULT_LOOKS,
    futility_budget: float = DEFAULT_FUTILITY_BUDGET,
) -> tuple[float, float]:
    """(share of trials flagged REGRESSION, mean blocks run)."""
    rng = random.Random(seed)
    rule = ab_rule(alpha, 0.05)
    plan = design(blocks, alpha, looks, futility_budget)
    shift = math.log1p(slowdown)
    flagged = 0
    blocks_run = 0
    for _ in range(trials):
        drawn = [rng.choice(ratios) + shift for _ in range(blocks)]
        # decide_paired takes each block's runs; one figure a side whose log ratio is the drawn one.
        pairs = [([1.0], [math.exp(r)]) for r in drawn]
        results, look = through_looks(
            plan.looks,
            lambda look, pairs=pairs: [
                decide_paired("step time", pairs[: look.blocks], higher_is_better=False, rule=rule, look=look)
            ],
        )
        flagged += results[0].verdict is Verdict.REGRESSION
        blocks_run += look.blocks
    return flagged / trials, blocks_run / trials


def replay(paths: list[Path], looks: int, futility_budget: float) -> None:
    """Each trial's blocks through the looks (the gate's stop rule on all its metrics)."""
    for path in paths:
        document = json.loads(path.read_text(encoding="utf-8"))
        rule_fields = document["rule"]
        rule = ab_rule(rule_fields["alpha"], 2.0 * rule_fields["min_effect"])
        metrics = document["metrics"]
        planned = len(metrics[0]["log_ratios"])
        results, look = through_looks(
            design(planned, rule.alpha, looks, futility_budget).looks,
            lambda look, metrics=metrics, rule=rule: [
                decide_paired(
                    m["metric"],
                    [([1.0], [math.exp(r)]) for r in m["log_ratios"][: look.blocks]],
                    higher_is_better=m["higher_is_better"],
                    rule=rule,
                    look=look,
                )
                for m in metrics
            ],
        )
        regressions = [r.metric for r in results if r.verdict is Verdict.REGRESSION]
        print(
            f"{path.parent.name}/{path.stem}: {verdict_word(results)} after {look.blocks} of {planned} blocks "
            f"{regressions or ''}; the trial: {document['verdict']}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directories", nargs="+", type=Path)
    parser.add_argument("--blocks", type=int, nargs="+", default=[18, 26, 34])
    parser.add_argument("--slowdowns", type=float, nargs="+", default=[0.0, 0.03, 0.05])
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--looks", type=int, nargs="+", default=[DEFAULT_LOOKS])
    parser.add_argument("--futility-budget", type=float, default=DEFAULT_FUTILITY_BUDGET)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--replay", action="store_true", help="walk each saved trial's blocks through the looks"
    )
    args = parser.parse_args(argv)
    if args.replay:
        paths = [
            p for d in args.directories for p in sorted(d.glob("*.json")) if p.name != "calibration.json"
        ]
        replay(paths, args.looks[0], args.futility_budget)
        return 0
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
    header = "looks  blocks  " + "  ".join(
        f"{'A/A' if s == 0 else f'{s:.0%} slower':>18}" for s in args.slowdowns
    )
    print(header)
    for looks in args.looks:
        for blocks in args.blocks:
            cells = []
            for slowdown in args.slowdowns:
                rate, mean_blocks = flag_rate(
                    ratios, blocks, slowdown, args.trials, args.alpha, args.seed, looks, args.futility_budget
                )
                cells.append(f"{rate:>7.1%} ({mean_blocks:4.1f} bl)")
            print(f"{looks:>5}  {blocks:>6}  " + "  ".join(f"{c:>18}" for c in cells))
    print(
        f"share of {args.trials} resampled trials flagged REGRESSION, and the mean blocks they ran "
        f"(seed {args.seed}; futility budget {args.futility_budget:g})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
