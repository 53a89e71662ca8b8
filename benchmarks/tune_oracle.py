"""Does the tuner find the best configuration in a third of the trials? Recorded grids, replayed.

    python benchmarks/tune_oracle.py record [--workload NAME] [--repeats 2] [--out tests/data/tune_grids]
    python benchmarks/tune_oracle.py replay [--grids tests/data/tune_grids] [--seeds 10] [--fraction 0.3333]

`record` runs every configuration of a grid (batch x accumulation x workers x comm hook) of a real
workload as tuning trials (tuneup.tune.session's own trial runner: supervised, each a run record), twice
in opposite orders, and saves each trial (its figures and the step-time model's Observation) as JSON.

`replay` runs the search (tuneup.tune.search) against each grid for each seed: the seed picks the user's
current settings (the baseline) and which recorded repeat each trial returns, so that the search sees the
measurement noise a live session would. With at most a third of the grid's trials (the baseline included),
the winner is the best *measured* trial; its true figure (the mean of its repeats) over the true best
(the best mean in the grid) is the score. Goal: >= 0.95 for at least 8 of 10 seeds, on every grid.
The objective is throughput per dollar at one price (the same ranking as throughput).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuneup.tune.objective import Objective
from tuneup.tune.protocol import StopRule
from tuneup.tune.runner import Limits
from tuneup.tune.search import Search
from tuneup.tune.space import Config, SearchSpace
from tuneup.tune.state import Trial, TuneState

ROOT = Path(__file__).resolve().parents[1]
PLAIN = ROOT / "tests" / "workloads" / "tune_plain.py"
USD_PER_HOUR = 1.0  # one price for every configuration: the ranking is throughput's

SPACE = SearchSpace(
    batch_size=(16, 32, 64),
    accumulate_grad_batches=(1, 2),
    num_workers=(0, 1),
    comm_hook=("allreduce", "fp16"),
)
# name -> (the workload's arguments, its grid)
WORKLOADS = {
    # Loading is CPU work (150 us a sample): workers matter, and take cores from the 2 ranks.
    "data-heavy": (["--devices", "2", "--item-cost-us", "150", "--hidden", "256"], SPACE),
    # A 1.1M-parameter MLP: the all-reduce is a large part of the step.
    "comm-heavy": (["--devices", "2", "--hidden", "1024"], SPACE),
    # One process whose loading (300 us a sample) is most of the step: a worker, not the batch, decides.
    # No comm hook: one process does not communicate.
    "one-rank-loader": (
        ["--devices", "1", "--item-cost-us", "300", "--hidden", "256"],
        SearchSpace(batch_size=(16, 32, 64), accumulate_grad_batches=(1, 2), num_workers=(0, 1)),
    ),
}


def record(args: argparse.Namespace) -> None:
    import os

    from tuneup.tune.script import inspect_script
    from tuneup.tune.session import Session, TuneOptions

    names = [args.workload] if args.workload else list(WORKLOADS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        arguments, space = WORKLOADS[name]
        argv = [sys.executable, str(PLAIN), *arguments]
        work = Path(args.work) / name / time.strftime("%Y%m%d-%H%M%S")
        work.mkdir(parents=True)
        state = TuneState(command=argv, script_kind="callback", objective="throughput")
        options = TuneOptions(
            objective=Objective("throughput"),
            stop=StopRule(max_steps=args.trial_steps, min_steps=30),
            limits=Limits(stall_s=60, startup_s=180),
        )
        session = Session(work, state, inspect_script(argv, os.environ, "callback"), options)
        baseline = session.run_trial(None, "baseline")
        if not baseline.measured:
            raise SystemExit(f"{name}: the baseline failed: {baseline.reason}")
        configs = space.configs(baseline.config)
        rows: dict[Config, list[Trial]] = defaultdict(list)
        for rep in range(args.repeats):
            order = list(configs) if rep % 2 == 0 else list(reversed(configs))
            for config in order:
                trial = session.run_trial(config, "search")
                rows[config].append(trial)
                print(
                    f"{name} rep {rep + 1} {config.label()}: {trial.status} "
                    f"{trial.samples_per_s or 0:,.0f} samples/s {trial.reason or ''}",
                    flush=True,
                )
        grid = {
            "workload": name,
            "command": [Path(a).name if a.endswith(".py") else a for a in argv[1:]],
            "recorded": time.strftime("%Y-%m-%d %H:%M"),
            "space": space.as_dict(),
            "trials": [t.as_dict() for ts in rows.values() for t in ts],
        }
        path = out / f"{name}.json"
        path.write_text(json.dumps(grid, indent=None, separators=(",", ":")))
        print(f"wrote {path}")


def load_grid(path: Path) -> tuple[str, dict[Config, list[Trial]], SearchSpace]:
    data = json.loads(path.read_text())
    rows: dict[Config, list[Trial]] = defaultdict(list)
    for t in data["trials"]:
        trial = Trial.from_dict(t)
        rows[trial.config].append(trial)
    return data["workload"], dict(rows), SearchSpace.from_dict(data["space"])


def true_value(trials: list[Trial]) -> float:
    values = [t.samples_per_s for t in trials if t.measured and t.samples_per_s]
    return statistics.fmean(values) if values else 0.0


def replay_one(
    rows: dict[Config, list[Trial]], space: SearchSpace, seed: int, fraction: float
) -> tuple[float, int, Config, Config]:
    """(score, trials used, baseline, winner) of one seeded session."""
    rng = random.Random(seed)
    configs = sorted(rows)
    budget = max(2, math.floor(len(configs) * fraction))
    baseline = rng.choice(configs)

    def run(config: Config, index: int, role: str) -> Trial:
        recorded = rng.choice(rows[config])
        return replace(recorded, index=index, role=role, usd_per_hour=USD_PER_HOUR, predicted=None)

    objective = Objective("throughput-per-dollar")
    trials = [run(baseline, 0, "baseline")]
    world = trials[0].observation.world_size if trials[0].observation else 1
    search = Search(space.with_baseline(baseline), baseline, objective, world)
    search.configs = [c for c in search.configs if c in rows]  # a grid may lack a configuration that failed
    while len(trials) < budget:
        decision = search.decide(trials)
        if decision.candidate is None:
            break
        trials.append(run(decision.candidate.config, len(trials), "search"))
    best = search.winner(trials) or trials[0]
    truth = {c: true_value(ts) for c, ts in rows.items()}
    return truth[best.config] / max(truth.values()), len(trials), baseline, best.config


def random_one(rows: dict[Config, list[Trial]], seed: int, fraction: float) -> float:
    """The same budget spent on configurations drawn at random (the baseline first): what the model adds."""
    rng = random.Random(seed)
    configs = sorted(rows)
    budget = max(2, math.floor(len(configs) * fraction))
    baseline = rng.choice(configs)
    others = [c for c in configs if c != baseline]
    picked = [baseline, *rng.sample(others, min(len(others), budget - 1))]
    measured = {c: rng.choice(rows[c]).samples_per_s or 0.0 for c in picked}
    truth = {c: true_value(ts) for c, ts in rows.items()}
    return truth[max(measured, key=measured.__getitem__)] / max(truth.values())


def replay(args: argparse.Namespace) -> int:
    paths = sorted(Path(args.grids).glob("*.json"))
    if not paths:
        raise SystemExit(
            f"no grids in {args.grids}: record them first (python benchmarks/tune_oracle.py record)"
        )
    failed = False
    for path in paths:
        name, rows, space = load_grid(path)
        best = max(rows, key=lambda c: true_value(rows[c]))
        print(
            f"{name}: {len(rows)} configurations; exhaustive best {best.label()} "
            f"{true_value(rows[best]):,.0f} samples/s"
        )
        scores = []
        for seed in range(args.seeds):
            score, used, baseline, winner = replay_one(rows, space, seed, args.fraction)
            scores.append(score)
            print(
                f"  seed {seed}: from {baseline.label():28} {used:2d} trials -> {winner.label():28} {score:.3f}"
            )
        hits = sum(s >= 0.95 for s in scores)
        randoms = [random_one(rows, seed, args.fraction) for seed in range(args.seeds)]
        print(
            f"  random search, same budget: {sum(s >= 0.95 for s in randoms)}/{args.seeds} seeds reached 0.95 "
            f"(median score {statistics.median(randoms):.3f})"
        )
        ok = hits >= math.ceil(0.8 * args.seeds)
        failed |= not ok
        print(
            f"  {hits}/{args.seeds} seeds reached 0.95 of the best (median score {statistics.median(scores):.3f}) "
            f"-> {'PASS' if ok else 'FAIL'}"
        )
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="action", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--workload", choices=sorted(WORKLOADS))
    rec.add_argument("--repeats", type=int, default=2)
    rec.add_argument("--trial-steps", type=int, default=120)
    rec.add_argument("--out", default=str(ROOT / "tests" / "data" / "tune_grids"))
    rec.add_argument("--work", default="/tmp/tune_oracle")
    rep = sub.add_parser("replay")
    rep.add_argument("--grids", default=str(ROOT / "tests" / "data" / "tune_grids"))
    rep.add_argument("--seeds", type=int, default=10)
    rep.add_argument("--fraction", type=float, default=1 / 3)
    args = parser.parse_args()
    if args.action == "record":
        record(args)
        return 0
    return replay(args)


if __name__ == "__main__":
    sys.exit(main())
