"""Is the live tuner's winner as fast as the best of an exhaustive sweep? 2-rank gloo DDP, on this machine.

    python benchmarks/tune_live.py [--workload data-heavy] [--out DIR] [--reruns 3]

1. The exhaustive sweep: every configuration of benchmarks/tune_oracle.py's space (24: batch x
   accumulation x workers x comm hook) run once as a trial; its best by measured throughput.
2. `tuneup tune` on the same workload and space, with a third of the sweep's trials (8, the baseline
   included) and its own confirmation against the current settings.
3. The winner and the sweep's best rerun `--reruns` times each, interleaved, so that the comparison is
   not the sweep's best single (and therefore lucky) measurement against the tuner's.

Goal (issue 15): the winner's mean throughput within 5% of the sweep best's (ratio >= 0.95), and the winner
not a setting the compare rule cannot tell from the current one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tune_oracle import PLAIN, WORKLOADS
from tuneup.tune.objective import Objective
from tuneup.tune.protocol import StopRule
from tuneup.tune.runner import Limits
from tuneup.tune.script import inspect_script
from tuneup.tune.session import Session, TuneOptions
from tuneup.tune.space import Config
from tuneup.tune.state import Trial, TuneState, load_state

TRIAL_STEPS = "120"


def _session(work: Path, argv: list[str]) -> Session:
    work.mkdir(parents=True, exist_ok=True)
    state = TuneState(command=argv, script_kind="callback", objective="throughput")
    options = TuneOptions(
        objective=Objective("throughput"),
        stop=StopRule(max_steps=int(TRIAL_STEPS), min_steps=30),
        limits=Limits(stall_s=60, startup_s=180),
    )
    return Session(work, state, inspect_script(argv, os.environ, "callback"), options)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="data-heavy")
    parser.add_argument("--out", type=Path, default=Path("/tmp/tune_live") / time.strftime("%Y%m%d-%H%M%S"))
    parser.add_argument("--reruns", type=int, default=3)
    args = parser.parse_args()
    arguments, space = WORKLOADS[args.workload]
    argv = [sys.executable, str(PLAIN), *arguments]

    sweep = _session(args.out / "sweep", argv)
    baseline = sweep.run_trial(None, "baseline")
    configs = space.configs(baseline.config)
    for config in configs:
        trial = sweep.run_trial(config, "search")
        print(f"sweep {config.label()}: {trial.status} {trial.samples_per_s or 0:,.0f} samples/s", flush=True)
    measured = [t for t in sweep.trials if t.measured and t.role == "search"]
    sweep_best = max(measured, key=lambda t: t.samples_per_s or 0.0)
    print(
        f"sweep best: {sweep_best.config.label()} {sweep_best.samples_per_s:,.0f} samples/s ({len(configs)} trials)"
    )

    tune_dir = args.out / "tune"
    knobs = {
        "--batch-size": space.batch_size,
        "--accumulate": space.accumulate_grad_batches,
        "--workers": space.num_workers,
        "--comm-hook": space.comm_hook,
    }
    command = [sys.executable, "-m", "tuneup", "tune", "--out", str(tune_dir), "--trial-steps", TRIAL_STEPS,
               "--max-trials", str(len(configs) // 3)]  # fmt: skip
    for flag, values in knobs.items():
        if values:
            command += [flag, ",".join(str(v) for v in values)]
    started = time.monotonic()
    proc = subprocess.run([*command, "--", *argv], capture_output=True, text=True, check=False)
    print(proc.stdout[-4000:])
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        return 1
    state = load_state(tune_dir)
    result = state.result or {}
    winner = Config.from_dict(result["winner"]).over(state.trials[0].config)
    searched = len([t for t in state.trials if t.role != "confirm"])
    print(
        f"tune: {searched} trials + {len(state.trials) - searched} confirmation runs in {time.monotonic() - started:.0f} s"
    )
    print(
        f"tune winner: {winner.label()} (kept current: {result.get('kept_current')}; {result.get('reason')})"
    )

    rerun = _session(args.out / "rerun", argv)
    rerun.run_trial(None, "baseline")
    figures: dict[str, list[float]] = {"winner": [], "sweep best": []}
    for i in range(args.reruns):
        order = [("winner", winner), ("sweep best", sweep_best.config)]
        for name, config in order if i % 2 == 0 else reversed(order):
            trial: Trial = rerun.run_trial(config, "confirm")
            if trial.measured and trial.samples_per_s:
                figures[name].append(trial.samples_per_s)
    means = {k: statistics.fmean(v) for k, v in figures.items() if v}
    ratio = means["winner"] / means["sweep best"]
    print(
        f"reruns ({args.reruns} each, interleaved): winner {means['winner']:,.0f} samples/s, sweep best "
        f"{means['sweep best']:,.0f} samples/s: ratio {ratio:.3f} -> {'PASS' if ratio >= 0.95 else 'FAIL'} (goal >= 0.95)"
    )
    summary = {
        "workload": args.workload,
        "sweep_trials": len(configs),
        "sweep_best": sweep_best.config.as_dict(),
        "tune_trials": searched,
        "winner": winner.as_dict(),
        "result": result,
        "reruns": figures,
        "ratio": ratio,
    }
    (args.out / "tune_live.json").write_text(json.dumps(summary, indent=1))
    return 0 if ratio >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
