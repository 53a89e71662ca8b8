"""What TuneupDDPStrategy's modes cost and save on the demo transformer: 2 gloo ranks on this machine.

    python benchmarks/strategies.py [--steps 300] [--seeds 3] [--out DIR]

For each mode (exact all-reduce, fp16, PowerSGD rank 4 with error feedback, local SGD H=4 and H=8), each
seed, one training of `--steps` steps of tests/workloads/sync_demo.py with TuneupCallback; the modes
interleaved within each seed, so a slow spell of this shared machine falls on all of them alike. Every
mode runs its first 50 steps exactly (the strategy's warm-up; "exact" runs plain DDP throughout), and the
per-step figures are read from the run record over the steps after that, the same steps for every mode:

- step ms: the median step wall time, and the mean (which throughput follows: local SGD's rare, slow
  averaging steps are in the mean, not the median);
- exposed ms: the mean communication the step waited for (after backward, plus local SGD's averages);
- bytes/step: the mean bytes the collectives sent (a local step sends none);
- loss: the held-out loss after training (the same 256 sequences for every run).

Printed: the mean over seeds with its spread (standard deviation), and each mode against the exact run of
the same seed: the mean step's change and the loss difference, with the paired standard error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuneup import load_run  # noqa: E402
from tuneup.report.format import aligned_table  # noqa: E402

WORKLOAD = ROOT / "tests" / "workloads" / "sync_demo.py"
WARMUP_STEPS = 50
MODES: dict[str, dict[str, object] | None] = {
    "exact": None,
    "fp16": {"compression": "fp16"},
    "powersgd-r4": {"compression": "powersgd", "powersgd_rank": 4},
    "local-sgd-h4": {"local_sgd_period": 4},
    "local-sgd-h8": {"local_sgd_period": 8},
}


def train(out: Path, strategy: dict[str, object] | None, seed: int, steps: int) -> dict[str, float]:
    args = [sys.executable, str(WORKLOAD), str(out), "--steps", str(steps), "--seed", str(seed)]
    if strategy is not None:
        args += ["--strategy", json.dumps({**strategy, "warmup_steps": WARMUP_STEPS})]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{out}: training failed\n{proc.stderr[-3000:]}")
    result = json.loads((out / "result.json").read_text())
    steps_after = [s for s in load_run(out / "run").steps(0) if s.step >= WARMUP_STEPS]
    return {
        "step_ms": statistics.median(s.wall_ms for s in steps_after),
        # Throughput follows the mean (local SGD's averaging steps are slow and rare: not in the median).
        "mean_step_ms": statistics.fmean(s.wall_ms for s in steps_after),
        "exposed_ms": statistics.fmean(s.comm_exposed_ms or 0.0 for s in steps_after),
        "bytes_per_step": statistics.fmean(s.comm_bytes or 0 for s in steps_after),
        "loss": result["held_out_loss"],
        "fallbacks": len((result.get("strategy") or {}).get("fallbacks") or []),
    }


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=sorted(MODES), default=list(MODES))
    parser.add_argument("--out", type=Path, default=Path("/tmp/strategies") / time.strftime("%Y%m%d-%H%M%S"))
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes}
    for seed in range(args.seeds):
        for mode in args.modes:
            started = time.monotonic()
            results[mode].append(train(args.out / f"{mode}-seed{seed}", MODES[mode], seed, args.steps))
            r = results[mode][-1]
            print(
                f"seed {seed} {mode:13s} step {r['step_ms']:6.1f} ms  exposed {r['exposed_ms']:5.1f} ms  "
                f"{r['bytes_per_step'] / 1e6:6.3f} MB/step  loss {r['loss']:.4f}  "
                f"({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    base = results.get("exact")
    rows = []
    for mode, runs in results.items():
        step, step_sd = _mean_sd([r["step_ms"] for r in runs])
        exposed, _ = _mean_sd([r["exposed_ms"] for r in runs])
        sent, _ = _mean_sd([r["bytes_per_step"] for r in runs])
        loss, loss_sd = _mean_sd([r["loss"] for r in runs])
        row = [
            mode,
            f"{step:.1f} ± {step_sd:.1f}",
            f"{exposed:.1f}",
            f"{sent / 1e6:.3f}",
            f"{loss:.4f} ± {loss_sd:.4f}",
            str(sum(int(r["fallbacks"]) for r in runs)),
        ]
        if base is not None:
            # Paired by seed: each mode against the exact run of its own seed, launched beside it.
            step_change, step_change_sd = _mean_sd(
                [r["mean_step_ms"] / b["mean_step_ms"] - 1 for r, b in zip(runs, base, strict=True)]
            )
            base_sent = statistics.fmean(r["bytes_per_step"] for r in base)
            diffs = [r["loss"] - b["loss"] for r, b in zip(runs, base, strict=True)]
            mean_diff, sd_diff = _mean_sd(diffs)
            se = sd_diff / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
            base_loss = statistics.fmean(b["loss"] for b in base)
            row += [
                f"{step_change:+.1%} ± {step_change_sd:.1%}",
                f"{base_sent / sent:.1f}x" if sent else "all",
                f"{mean_diff / base_loss:+.2%} ({mean_diff / se:+.1f} SE)"
                if se and se == se
                else f"{mean_diff / base_loss:+.2%}",
            ]
        rows.append(row)
    header = ["mode", "median step ms (sd)", "exposed ms", "MB/step", "held-out loss (sd)", "fallbacks"]
    if base is not None:
        header += ["mean step vs exact (sd)", "bytes cut", "loss vs exact (paired SE)"]
    print()
    print(
        f"{args.steps} steps, {args.seeds} seeds, 2 gloo ranks; per-step figures over steps {WARMUP_STEPS}+"
    )
    print("\n".join(aligned_table(header, rows, right=range(1, len(header)))))
    print(f"\nruns and results.json in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
