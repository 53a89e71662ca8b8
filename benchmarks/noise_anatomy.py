"""Where the CI gate's noise lives on this runner: inside a run, between runs, shared between cores?

    python benchmarks/noise_anatomy.py [--long-steps 6000] [--pairs 12] [--trial DIR ...] [--out DIR]

The gate (`tuneup bench --ab`) needs about (2.6 x block sd / change)^2 blocks to see a change, so what
would shrink a block's sd per minute decides how it should run. Three measurements on the trials'
workload (benchmarks/ab_workload.py, one process, one thread), each a question about a design choice:

1. Longer runs? One process of `--long-steps` steps: the sd of the log mean step time over windows of
   k x 100 consecutive steps, beside what it would be if 100-step windows were independent (sd_1 /
   sqrt(k)). If the sd falls as predicted, longer runs average the noise away; if it stays, the noise is
   slow (drift over tens of seconds), and a longer run only adds minutes.
2. Both sides at once? `--pairs` A/A pairs of 100-step runs, each pair once side by side (pinned to cores
   0 and 1) and once one after the other. If the runner's noise were shared by its cores (a host-wide
   slowdown), the side-by-side pair's log ratio would vary less and a gate could run A and B together.
3. What a run's second half adds: from the runs of recorded `bench --ab` trials (benchmarks/ab_trials.py's
   OUT/KIND-NN directories), each block's log ratio from the first and from the second half of every run's
   steps, and their correlation rho: doubling a run's steps would leave (1 + rho) / 2 of the variance.
   Beside it, the trial's step split by phase (all runs' means, B over A): what the optimizer phase added,
   as a share of A's step (a `slow` trial's injection burns there), and the ratio of forward + backward,
   which no trial changes, so that it reads the runner's noise alone.

Prints a table and writes OUT/noise_anatomy.json (a part skipped keeps what the file held).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import correlation, fmean, stdev

from tuneup.record.reader import load_run
from tuneup.record.writer import RecordingPolicy

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "ab_workload.py"
WINDOW_STEPS = RecordingPolicy.window_steps  # the recorder's default window; a run's own is in its manifest


def run_workload(run_dir: Path, steps: int, cpu: int | None = None) -> subprocess.Popen[bytes]:
    command = [sys.executable, str(WORKLOAD), "--steps", str(steps)]
    if cpu is not None:
        command = ["taskset", "-c", str(cpu), *command]
    env = dict(os.environ, TUNEUP_DIR=str(run_dir))
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def finished(*processes: subprocess.Popen[bytes]) -> None:
    for process in processes:
        if process.wait() != 0:
            raise SystemExit(f"the workload failed: {process.args}")


def step_times_ms(run_dir: Path) -> list[float]:
    """Rank 0's recorded step times, without the first (the process's one-off setup)."""
    return [s.wall_ms for s in load_run(run_dir).ranks[0].steps][1:]


def log_mean_ms(run_dir: Path) -> float:
    return math.log(fmean(step_times_ms(run_dir)))


def longer_runs(work: Path, steps: int) -> dict:
    run_dir = work / "long"
    finished(run_workload(run_dir, steps))
    run = load_run(run_dir)
    window_steps = run.manifest.recording["window_steps"]
    windows = run.ranks[0].windows[1:]  # the first holds the setup step
    means_ms = [w.stats["wall_ms"]["mean"] for w in windows if w.count == window_steps]
    sd_1 = stdev(math.log(m) for m in means_ms)
    rows = []
    for k in (1, 2, 3, 5, 10):
        groups = [fmean(means_ms[i : i + k]) for i in range(0, len(means_ms) - k + 1, k)]
        if len(groups) >= 3:
            rows.append(
                {
                    "run_steps": k * window_steps,
                    "windows": len(groups),
                    "sd_log": stdev(math.log(g) for g in groups),
                    "sd_if_independent": sd_1 / math.sqrt(k),
                }
            )
    logs = [math.log(m) for m in means_ms]
    tenth = max(1, len(means_ms) // 10)
    return {
        "steps": steps,
        "window_means_ms": means_ms,
        "lag1_autocorrelation": correlation(logs[:-1], logs[1:]),
        "first_to_last_tenth": fmean(means_ms[-tenth:]) / fmean(means_ms[:tenth]),
        "rows": rows,
    }


def side_by_side(work: Path, pairs: int, steps: int) -> dict:
    together, apart = [], []
    for i in range(pairs):
        # The two ways alternate pair by pair, so that the runner's drift over the minutes hits both.
        a, b = work / f"together-{i}-a", work / f"together-{i}-b"
        finished(run_workload(a, steps, cpu=0), run_workload(b, steps, cpu=1))
        together.append(log_mean_ms(b) - log_mean_ms(a))
        a, b = work / f"apart-{i}-a", work / f"apart-{i}-b"
        finished(run_workload(a, steps))
        finished(run_workload(b, steps))
        apart.append(log_mean_ms(b) - log_mean_ms(a))
    return {
        "pairs": pairs,
        "run_steps": steps,
        "sd_log_ratio_side_by_side": stdev(together),
        "sd_log_ratio_one_after_other": stdev(apart),
    }


def run_figures(run_dir: Path) -> tuple[float, float, float, float, float]:
    """A run's mean step over all its steps, its first half and its second half, then its mean optimizer
    phase and forward + backward, in ms (the first step left out: the process's one-off setup)."""
    steps = load_run(run_dir).ranks[0].steps[1:]
    times = [s.wall_ms for s in steps]
    middle = len(times) // 2
    return (
        fmean(times),
        fmean(times[:middle]),
        fmean(times[middle:]),
        fmean(s.optimizer_ms for s in steps),
        fmean(s.forward_ms + s.backward_ms for s in steps),
    )


def run_halves(trial: Path) -> dict:
    """Each block's log ratio (B over A) from the whole runs and from each half of their steps; and the
    trial's step, optimizer and forward + backward, each side's runs pooled (cut-short blocks too)."""
    blocks = [
        {side: [run_figures(d) for d in sorted(block.glob(f"{side}-*/run-01"))] for side in "AB"}
        for block in sorted((trial / "ab").glob("block-*"))
    ]
    ratios: list[list[float]] = [[], [], []]
    for runs in blocks:
        a, b = runs["A"], runs["B"]
        if len(a) < 2 or len(b) < 2:
            continue  # a block cut short
        for part in range(3):
            ratios[part].append(math.log(fmean(x[part] for x in b)) - math.log(fmean(x[part] for x in a)))
    rho = correlation(ratios[1], ratios[2])
    pooled_a, pooled_b = (
        [fmean(run[i] for runs in blocks for run in runs[side]) for i in range(5)] for side in "AB"
    )
    return {
        "trial": trial.name,
        "blocks": len(ratios[0]),
        "sd_whole": stdev(ratios[0]),
        "sd_first_half": stdev(ratios[1]),
        "sd_second_half": stdev(ratios[2]),
        "halves_correlation": rho,
        "variance_left_by_doubling": (1 + rho) / 2,
        "step_ratio": pooled_b[0] / pooled_a[0],
        "optimizer_added_share": (pooled_b[3] - pooled_a[3]) / pooled_a[0],
        "forward_backward_ratio": pooled_b[4] / pooled_a[4],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long-steps", type=int, default=6000, help="0: skip measurement 1")
    parser.add_argument("--pairs", type=int, default=12, help="0: skip measurement 2")
    parser.add_argument("--run-steps", type=int, default=100, help="steps of each paired run")
    parser.add_argument("--trial", type=Path, nargs="*", default=[], help="bench --ab trial directories")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "noise_anatomy")
    args = parser.parse_args()
    if args.long_steps and args.long_steps < 5 * WINDOW_STEPS:
        parser.error(f"--long-steps {args.long_steps}: give at least {5 * WINDOW_STEPS} (or 0 to skip)")
    if args.pairs == 1:
        parser.error("--pairs 1: an sd needs at least 2 pairs (or 0 to skip)")
    # A part not measured this time keeps what the file holds from an earlier run.
    written = args.out / "noise_anatomy.json"
    report: dict = json.loads(written.read_text(encoding="utf-8")) if written.exists() else {}
    with tempfile.TemporaryDirectory(prefix="noise-anatomy-") as scratch:
        work = Path(scratch)
        if args.long_steps:
            report["longer_runs"] = long = longer_runs(work, args.long_steps)
            print(
                f"1. one process, {args.long_steps} steps: lag-1 autocorrelation of 100-step windows "
                f"{long['lag1_autocorrelation']:.2f}; last tenth / first tenth {long['first_to_last_tenth']:.2f}"
            )
            print("   run steps  windows  sd(log mean)  sd if independent")
            for row in long["rows"]:
                print(
                    f"   {row['run_steps']:9d}  {row['windows']:7d}  {row['sd_log']:12.4f}  "
                    f"{row['sd_if_independent']:17.4f}"
                )
        if args.pairs:
            report["side_by_side"] = pair = side_by_side(work, args.pairs, args.run_steps)
            print(
                f"2. {args.pairs} A/A pairs of {args.run_steps}-step runs: sd of the log ratio "
                f"{pair['sd_log_ratio_side_by_side']:.4f} side by side (cores 0, 1), "
                f"{pair['sd_log_ratio_one_after_other']:.4f} one after the other"
            )
    if args.trial:
        report["run_halves"] = [run_halves(t) for t in args.trial]
        print("3. trial        blocks  sd whole  sd 1st half  sd 2nd half  rho   variance left by 2x steps")
        for h in report["run_halves"]:
            print(
                f"   {h['trial']:13s} {h['blocks']:6d}  {h['sd_whole']:8.4f}  {h['sd_first_half']:11.4f}  "
                f"{h['sd_second_half']:11.4f}  {h['halves_correlation']:4.2f}  "
                f"{h['variance_left_by_doubling']:.2f}"
            )
        print("   trial        step B/A  optimizer added (share of A's step)  forward+backward B/A")
        for h in report["run_halves"]:
            print(
                f"   {h['trial']:13s} {h['step_ratio']:8.3f}  {h['optimizer_added_share']:+35.3f}  "
                f"{h['forward_backward_ratio']:20.3f}"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    written.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"written: {written}")


if __name__ == "__main__":
    main()
