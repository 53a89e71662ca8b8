"""Trials of the CI gate on real runs: how often `tuneup bench --ab` flags a 5% slowdown, how often it
flags nothing (A/A), with and without a CPU burner, beside the old bench/compare on the same runs.

    python benchmarks/ab_trials.py --workload compute --trials 20 --out /tmp/ab-trials
    python benchmarks/ab_trials.py --workload ddp --trials 20 --kinds slow,aa --out /tmp/ab-ddp

The workload is benchmarks/ab_workload.py (a compute-bound MLP step on CPU; `ddp`: 2 ranks under
torchrun, gloo). First one A/A calibration (`--calibration-blocks` blocks, the same command on both
sides), whose --json every trial then plans from, as a CI job would reuse a nightly calibration. Each
trial is one `tuneup bench --ab` as a CI job runs it (its own process, `--max-minutes`, its own seed):
- `slow`: the candidate's step made `--slowdown` (5%) slower, with compute or (`--slowdown-by stall`) a
  wait the ranks share (ab_workload.py says how, and where each lands as 5% of the step);
- `aa`: the same command on both sides;
- `aa-burner`: A/A while a process burns one CPU for half of the trial (the first half on even trials,
  the second on odd), as another job on a shared runner would.
The kinds alternate trial by trial, so that the runner's drift over the hour hits them alike. A trial
is flagged when the gate exits 1 (a regression in any metric); "on time" counts those with a regression
in throughput or step time, the slowdown itself. The old way on the same runs: each
side's runs pooled (2 x blocks a side, no pairing) and judged by `tuneup compare`'s default rule.
Every trial is appended to OUT/trials.jsonl as it ends, so a stopped benchmark keeps what it ran; the
table is printed from that file (`--table-only` prints it again).

`--side-by-side` runs each block's A and B at once, each pinned to half of the CPUs. With `ddp` on a
2-core runner a run's 2 ranks then share one core: not how DDP runs in production, but a relative check of
the same program on both sides (a 10-block A/A pilot on 12-04: sd 0.031 of the block log ratio at 28 s a
block, against 0.045 at 38 s one after another, the same hour). `--pin-ranks` keeps the runs one after
another and puts each rank on a CPU of its own (12-04 late: sd 0.027 at 28 s a block, 0.063 unpinned).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from statistics import median
from typing import Any

from tuneup.compare.compare import compare
from tuneup.compare.rule import Rule, Verdict
from tuneup.compare.runs import Side, load_side

HERE = Path(__file__).resolve().parent
KINDS = ("slow", "aa", "aa-burner")
# The tuneup each trial ran (a trial's row names it: the gate changes between sets of trials).
COMMIT = subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True, check=False
).stdout.strip()


def workload_command(
    workload: str, steps: int, slowdown: float, clock: str = "wall", by: str = "burn", pin: bool = False
) -> str:
    script = shlex.quote(str(HERE / "ab_workload.py"))
    tail = f"{script} --steps {steps} --slowdown {slowdown:g}"
    if pin:
        tail += " --pin-rank"
    if clock != "wall":  # the earlier trials' commands, unchanged where the clock is the wall's
        tail += f" --slowdown-clock {clock}"
    if slowdown > 0.0 and by != "burn":  # and where the slowdown is a burn
        tail += f" --slowdown-by {by}"
    if workload == "ddp":
        return (
            f"{shlex.quote(sys.executable)} -m torch.distributed.run --standalone --nproc-per-node 2 {tail}"
        )
    return f"{shlex.quote(sys.executable)} {tail}"


def tuneup_bench(*args: str) -> tuple[int, float]:
    """Run `tuneup bench ...` as a CI job would; (exit code, seconds)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tuneup", "bench", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    if done.returncode not in (0, 1, 3, 4):
        raise SystemExit(f"tuneup bench failed ({done.returncode}): {done.stderr.decode()[-800:]}")
    return done.returncode, time.monotonic() - started


class Burner:
    """One process spinning on a CPU from `start_s` to `start_s + length_s` after `begin()`."""

    def __init__(self, start_s: float, length_s: float) -> None:
        self.start_s, self.length_s = start_s, length_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        if self._stop.wait(self.start_s):
            return
        spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            self._stop.wait(self.length_s)
        finally:
            spin.kill()
            spin.wait()

    def __enter__(self) -> Burner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def old_compare_flags(ab_dir: Path, metrics: list[str]) -> tuple[bool, float | None]:
    """The old bench/compare on the trial's runs: each side pooled, unpaired, the default rule."""
    sides = {}
    for slot in ("A", "B"):
        runs = [load_side(d).runs[0] for d in sorted(ab_dir.glob(f"block-*/{slot}-*/run-01"))]
        sides[slot] = Side(f"{ab_dir}/{slot}", "set", tuple(runs))
    result = compare(sides["A"], sides["B"], metrics=metrics, rule=Rule())
    step = next((r for r in result.results if r.metric == "step time"), None)
    change = None if step is None or step.ratio is None else step.ratio - 1.0
    return any(r.verdict is Verdict.REGRESSION for r in result.results), change


def side_by_side(args: argparse.Namespace) -> list[str]:
    return ["--side-by-side"] if args.side_by_side else []


def run_trial(args: argparse.Namespace, index: int, kind: str, calibration: Path, plan_s: float) -> dict:
    slowdown = args.slowdown if kind == "slow" else 0.0
    out = args.out / f"{kind}-{index:02d}"
    report = out.with_suffix(".json")
    # A trial not in trials.jsonl was stopped midway: its runs are started over, not mixed with new ones.
    shutil.rmtree(out, ignore_errors=True)
    report.unlink(missing_ok=True)
    bench_args = [
        "--ab",
        "--baseline-cmd", workload_command(args.workload, args.steps, 0.0, pin=args.pin_ranks),
        "--cmd", workload_command(
            args.workload, args.steps, slowdown, args.slowdown_clock, args.slowdown_by, args.pin_ranks
        ),
        "--calibration", str(calibration),
        "--max-minutes", f"{args.max_minutes:g}",
        "--min-detectable", f"{args.min_detectable:g}",
        "--metrics", args.metrics,
        "--seed", str(1000 + index),
        "--timeout", "300",
        "--out", str(out),
        "--json", str(report),
        *side_by_side(args),
    ]  # fmt: skip
    if kind == "aa-burner":
        half_s = plan_s / 2.0
        burner = Burner(0.0 if index % 2 == 0 else half_s, half_s)
        with burner:
            code, seconds = tuneup_bench(*bench_args)
    else:
        code, seconds = tuneup_bench(*bench_args)
    document = json.loads(report.read_text(encoding="utf-8"))
    step = next(m for m in document["metrics"] if m["metric"] == "step time")
    old_flag, old_change = old_compare_flags(out / "ab", [m.strip() for m in args.metrics.split(",")])
    return {
        "commit": COMMIT,
        "workload": args.workload,
        "side_by_side": args.side_by_side,
        "slowdown_clock": args.slowdown_clock,
        "slowdown_by": args.slowdown_by,
        "pin_ranks": args.pin_ranks,
        "kind": kind,
        "trial": index,
        "injected": slowdown,
        "exit_code": code,
        "flagged": code == 1,
        "verdict": document["verdict"],
        "regressions": [m["metric"] for m in document["metrics"] if m["verdict"] == "REGRESSION"],
        "step_change": step["change"],
        "step_p_worse": step["p_worse"],
        "blocks": len(step["log_ratios"]),
        "blocks_planned": document.get("blocks_planned"),
        "block_sd": step["sd_log_ratio"],
        "alpha": document["rule"]["alpha"],
        "planned_sd": (document.get("plan") or {}).get("sd_planned"),
        "planned_detectable": (document.get("plan") or {}).get("detectable"),
        "seconds": seconds,
        "old_flagged": old_flag,
        "old_step_change": old_change,
    }


def time_flagged(row: dict[str, Any]) -> bool:
    """Caught by its time (throughput or step time), not by another metric alone: before bd20482 a run's
    peak memory on CPU was the most of a few sampled PSS reads, and a slower run, read more times, could
    read higher with that alone (the kernel's high-water mark since)."""
    return any(metric in ("throughput", "step time") for metric in row["regressions"])


def table(rows: list[dict[str, Any]]) -> str:
    from tuneup.report.format import aligned_table

    out = []
    for workload in sorted({r["workload"] for r in rows}):
        for kind in KINDS:
            these = [r for r in rows if r["workload"] == workload and r["kind"] == kind]
            if not these:
                continue
            changes = [r["step_change"] for r in these if r["step_change"] is not None]
            out.append(
                [
                    workload,
                    kind,
                    str(len(these)),
                    f"{sum(r['flagged'] for r in these)}/{len(these)}",
                    f"{sum(time_flagged(r) for r in these)}/{len(these)}",
                    f"{sum(r['old_flagged'] for r in these)}/{len(these)}",
                    f"{median(changes):+.1%}" if changes else "-",
                    f"{median(r['blocks'] for r in these):g}",
                    f"{median(r['seconds'] for r in these) / 60:.1f} / {max(r['seconds'] for r in these) / 60:.1f}",
                ]
            )
    header = [
        "workload", "kind", "trials", "bench --ab flagged", "on time", "old compare flagged",
        "median step change", "blocks", "minutes (median / max)",
    ]  # fmt: skip
    return "\n".join(aligned_table(header, out, right={2, 3, 4, 5, 6, 7, 8}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("compute", "ddp"), default="compute")
    parser.add_argument("--trials", type=int, default=20, help="trials of each kind")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"from {', '.join(KINDS)}")
    parser.add_argument("--slowdown", type=float, default=0.05)
    parser.add_argument(
        "--slowdown-clock",
        choices=("wall", "cpu", "thread"),
        default="wall",
        help="ab_workload.py's (which says what each measures); the earlier trials ran wall and cpu",
    )
    parser.add_argument(
        "--slowdown-by",
        choices=("burn", "stall"),
        default="burn",
        help="ab_workload.py's: compute, or a wait the ranks share after backward",
    )
    parser.add_argument(
        "--pin-ranks", action="store_true", help="ab_workload.py --pin-rank on both sides: a rank a CPU"
    )
    parser.add_argument("--min-detectable", type=float, default=0.05)
    parser.add_argument("--max-minutes", type=float, default=10.0, help="each trial's CI time")
    parser.add_argument("--calibration-blocks", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100, help="training steps a run")
    parser.add_argument("--metrics", default="throughput,step_time,peak_memory")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="the gate's blocks run A and B at once, each on half of the CPUs (ddp: a run's 2 ranks share one)",
    )
    parser.add_argument("--table-only", action="store_true", help="print the table of OUT/trials.jsonl")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds):
        parser.error(f"--kinds: choose from {', '.join(KINDS)}")
    log = args.out / "trials.jsonl"
    if not args.table_only:
        args.out.mkdir(parents=True, exist_ok=True)
        calibration = args.out / "calibration.json"
        if not calibration.is_file():
            command = workload_command(args.workload, args.steps, 0.0, pin=args.pin_ranks)
            # One look: an A/A that settles NO CHANGE early would stop short of the blocks asked for (the
            # DDP side-by-side calibration of 12-04 stopped at 7 of 10).
            code, seconds = tuneup_bench(
                "--ab", "--baseline-cmd", command, "--cmd", command, "--calibrate-blocks", "0",
                "--blocks", str(args.calibration_blocks), "--looks", "1", "--metrics", args.metrics,
                "--out", str(args.out / "calibration"), "--json", str(calibration), *side_by_side(args),
            )  # fmt: skip
            print(f"calibration: {args.calibration_blocks} A/A blocks in {seconds:.0f} s (exit {code})")
        document = json.loads(calibration.read_text(encoding="utf-8"))
        step = next(m for m in document["metrics"] if m["metric"] == "step time")
        sd = step["sd_log_ratio"]
        print(
            f"calibration: sd of the block log ratio {sd:.4f}, {document['seconds_per_block']:.1f} s a block"
        )
        done = set()
        if log.is_file():
            done = {(r["kind"], r["trial"]) for r in map(json.loads, log.read_text().splitlines())}
        plan_s = args.max_minutes * 60.0
        for index in range(args.trials):
            for kind in kinds:
                if (kind, index) in done:
                    continue
                row = run_trial(args, index, kind, calibration, plan_s)
                plan_s = row["seconds"]  # the burner's half: of the last trial's length
                with log.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
                print(
                    f"{kind} {index}: exit {row['exit_code']} ({row['verdict']}), step "
                    f"{row['step_change']:+.1%} p={row['step_p_worse']:.3g} over {row['blocks']} blocks, "
                    f"{row['seconds']:.0f} s; old compare {'flagged' if row['old_flagged'] else 'not flagged'}",
                    flush=True,
                )
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    print(table(rows) if rows else "no trials yet")
    return 0 if rows or not args.table_only else 1


if __name__ == "__main__":
    sys.exit(main())
