"""FSDP2's exposed communication on CPU against its counterfactual: the same steps with communication free.

    python benchmarks/fsdp_exposed_check.py [--steps 200] [--repeats 2] [--warmup 10]

One 2-rank FSDP2 run on CPU with gloo (tests/workloads/tiny.py, recorded by TuneupCallback) per repeat,
whose odd steps make every all-gather and reduce-scatter free (`--free-collectives-odd-steps`: each rank
fills the output from its own input, so training's values go wrong, which the check does not need). Steps
with and without communication alternate, so the host's drift hits both alike. What communication cost
the step is the step-time saving (even steps' mean less the odd steps'); what tuneup says it cost is the
exposed time it recorded (`comm_exposed_ms`, even less odd). The error is (exposed - saving) / saving,
over both ranks' steps after warm-up: negative where part of the collectives' cost lies outside the
training thread's waits (gloo's threads taking CPU from compute on a small host).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuneup.record.reader import load_run  # noqa: E402


def one_run(out: Path, steps: int, warmup: int) -> dict[str, float]:
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "workloads" / "tiny.py"),
            *("--out", str(out), "--devices", "2", "--strategy", "fsdp2", "--max-steps", str(steps)),
            "--free-collectives-odd-steps",
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=str(out.parent),
    )
    run = load_run(out)
    recorded = [s for rank in sorted(run.ranks) for s in run.steps(rank) if s.step >= warmup]
    with_comm = [s for s in recorded if s.step % 2 == 0]
    free = [s for s in recorded if s.step % 2 == 1]

    def mean(steps: list, name: str) -> float:
        return statistics.fmean(getattr(s, name) for s in steps)

    saving = mean(with_comm, "wall_ms") - mean(free, "wall_ms")
    exposed = mean(with_comm, "comm_exposed_ms") - mean(free, "comm_exposed_ms")
    return {
        "step_ms": mean(with_comm, "wall_ms"),
        "free_step_ms": mean(free, "wall_ms"),
        "saving_ms": saving,
        "exposed_ms": exposed,
        "error": (exposed - saving) / saving,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args()
    print("repeat  step ms  free step ms  saving ms  exposed ms  error")
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            r = one_run(Path(tmp) / f"run{repeat}", args.steps, args.warmup)
            print(
                f"{repeat:6d}  {r['step_ms']:7.2f}  {r['free_step_ms']:12.2f}  {r['saving_ms']:9.2f}  "
                f"{r['exposed_ms']:10.2f}  {r['error']:+.1%}"
            )


if __name__ == "__main__":
    main()
