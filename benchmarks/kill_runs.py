"""Kill training with SIGKILL at random moments; every record left behind must load and report.

    python benchmarks/kill_runs.py [--runs 20] [--seed 0] [--flush-every-steps 10]

Each run trains the tiny test model (tests/workloads/tiny.py, ~3 ms steps, so that the 2 s window stays
within the first 1,000 steps, which the record keeps one by one) with
TuneupCallback, and a second callback that appends every finished step's number to a progress file with
one unbuffered write: the truth about how far training got. Once the run's manifest exists (training has
begun), the process is killed after a random delay, uniform over the next 2 s: early steps, the middle,
during a flush or a telemetry write, whatever the moment happens to be. Then:

    loads      `tuneup.load_run` reads the record (warnings allowed, no error)
    reports    `tuneup report --format json` exits 0 and names the rank that stopped without closing
    lost       steps finished (progress file) minus steps recorded: what the kill cost the record

The README's reliability table quotes this script's output.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "tests" / "workloads" / "tiny.py"


@dataclass
class KillResult:
    delay_s: float
    finished_steps: int
    recorded_steps: int
    loads: bool
    reports: bool
    says_unclosed: bool
    note: str = ""

    @property
    def lost_steps(self) -> int:
        return max(0, self.finished_steps - self.recorded_steps)


def kill_once(tmp: Path, n: int, delay_s: float, flush_every_steps: int) -> KillResult:
    from tuneup import RunRecordError, load_run

    run_dir, progress = tmp / f"run-{n:02d}", tmp / f"progress-{n:02d}.txt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(
        [sys.executable, str(WORKLOAD), "--out", str(run_dir), "--max-steps", "2000", "--slow-step-ms", "2",
         "--flush-every-steps", str(flush_every_steps), "--progress-file", str(progress)],
        env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (run_dir / "manifest.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(delay_s)
    if proc.poll() is not None:
        return KillResult(delay_s, 0, 0, False, False, False, "finished before the kill")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lines = progress.read_text().split() if progress.exists() else []
    finished = int(lines[-1]) + 1 if lines else 0
    try:
        run = load_run(run_dir)
        recorded = len(run.steps(0))
        loads = True
    except RunRecordError as exc:
        return KillResult(delay_s, finished, 0, False, False, False, str(exc))
    out = tmp / f"report-{n:02d}"
    report = subprocess.run(
        [sys.executable, "-m", "tuneup", "report", str(run_dir), "-o", str(out), "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    reports = report.returncode == 0 and (out / "report.json").exists()
    warnings = json.loads((out / "report.json").read_text())["warnings"] if reports else []
    says = any("without closing" in w for w in warnings)
    return KillResult(delay_s, finished, recorded, loads, reports, says)


def kill_runs(runs: int, seed: int, flush_every_steps: int, tmp: Path) -> list[KillResult]:
    rng = random.Random(seed)
    results = []
    for n in range(runs):
        result = kill_once(tmp, n, rng.uniform(0.0, 2.0), flush_every_steps)
        results.append(result)
        print(
            f"run {n + 1:2d}: killed {result.delay_s:.2f} s into training, {result.finished_steps} steps finished, "
            f"{result.recorded_steps} recorded (lost {result.lost_steps}); loads {result.loads}, "
            f"reports {result.reports}, says unclosed {result.says_unclosed} {result.note}",
            flush=True,
        )
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--flush-every-steps", type=int, default=10)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tuneup-kills-") as tmp:
        results = kill_runs(args.runs, args.seed, args.flush_every_steps, Path(tmp))
    killed = [r for r in results if not r.note]
    lost = sorted(r.lost_steps for r in killed)
    print(
        f"\n{len(killed)} of {len(results)} runs killed mid-training (flush every {args.flush_every_steps} steps): "
        f"{sum(r.loads for r in killed)} load, {sum(r.reports for r in killed)} report, "
        f"{sum(r.says_unclosed for r in killed)} say the rank stopped without closing; "
        f"steps lost: median {lost[len(lost) // 2] if lost else '-'}, max {lost[-1] if lost else '-'}"
    )
    sys.exit(0 if all(r.loads and r.reports and r.says_unclosed for r in killed) else 1)


if __name__ == "__main__":
    main()
