"""Size of one rank's run record after a long run, and how long writing and loading it take.

    python benchmarks/record_size.py [--steps 1000000] [--dir PATH] [--json PATH]

Drives `RankWriter` directly (no Lightning, no torch) with synthetic optimizer steps shaped like the ones
`TuneupCallback` writes for a GPU run of ~100 ms steps, under the default `RecordingPolicy`, then reads
the run back with `load_run`. Telemetry and events are left out: this measures the per-step streams.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuneup.record import RankWriter, RecordingPolicy, load_run, write_manifest
from tuneup.record.schema import rank_dir_name

STEP_S = 0.1  # simulated step time: sets t_end and the magnitude of the phase times
SAMPLES = 32
SEQ_LEN = 2048


def synthetic_steps(n: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Step records with the callback's fields, rounding and key order (see StepClock._resolve)."""
    rng = random.Random(seed)
    t0 = 1_700_000_000.0
    for step in range(n):
        data = rng.uniform(0.2, 3.0)
        forward = rng.gauss(30.0, 1.5)
        backward = rng.gauss(55.0, 2.5)
        optimizer = rng.gauss(8.0, 0.5)
        other = rng.uniform(0.0, 2.0)
        wall = data + forward + backward + optimizer + other
        # A loss that falls slowly with noise: its digits are as incompressible as a real one's.
        loss = 2.0 + 8.0 / math.sqrt(step + 10) + rng.gauss(0.0, 0.05)
        yield {
            "step": step,
            "epoch": step // 10_000,
            "t_end": round(t0 + (step + 1) * STEP_S, 3),
            "wall_ms": round(wall, 3),
            "data_ms": round(data, 3),
            "forward_ms": round(forward, 3),
            "backward_ms": round(backward, 3),
            "optimizer_ms": round(optimizer, 3),
            "other_ms": round(other, 3),
            "micro_batches": 1,
            "samples": SAMPLES,
            "tokens": SAMPLES * SEQ_LEN,
            "loss": float(f"{loss:.7g}"),
            "grad_norm": None,
            "peak_mem_bytes": 61_000_000_000 + rng.randrange(0, 200_000_000),
        }


def peak_rss_bytes() -> int:
    # ru_maxrss is in kilobytes on Linux and in bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def measure(run_dir: Path, steps: int) -> dict[str, Any]:
    write_manifest(run_dir, {"run_id": "bench", "created_unix": 0, "world_size": 1, "num_nodes": 1})
    policy = RecordingPolicy()
    writer = RankWriter(run_dir, 0, policy)
    writer.open({"host": "bench", "timing": "cuda_event"})

    # Only the writer's calls are timed: making the synthetic records costs about as much again.
    add_step = writer.add_step
    clock = time.perf_counter
    write_s = 0.0
    for record in synthetic_steps(steps):
        start = clock()
        add_step(record)
        write_s += clock() - start
    start = clock()
    writer.close(status="completed")
    close_s = clock() - start

    rank_dir = run_dir / rank_dir_name(0)
    files = {p.name: p.stat().st_size for p in sorted(rank_dir.iterdir()) if p.is_file()}
    lines = {name: (rank_dir / name).read_bytes().count(b"\n") for name in files if name.endswith(".jsonl")}

    rss_before = peak_rss_bytes()
    start = clock()
    run = load_run(run_dir)
    load_s = clock() - start
    rank = run.ranks[0]
    return {
        "steps": steps,
        "policy": policy.as_dict(),
        "files_bytes": files,
        "lines": lines,
        "rank_total_bytes": sum(files.values()),
        "manifest_bytes": (run_dir / "manifest.json").stat().st_size,
        "write_s": write_s,
        "write_us_per_step": write_s * 1e6 / steps,
        "close_s": close_s,
        "load_s": load_s,
        "loaded_steps": len(rank.steps),
        "loaded_windows": len(rank.windows),
        "load_warnings": run.warnings,
        "peak_rss_bytes_before_load": rss_before,
        "peak_rss_bytes_after_load": peak_rss_bytes(),
    }


def report(m: dict[str, Any]) -> str:
    mb = 1e6
    rows = [f"{m['steps']:,} steps, one rank, default RecordingPolicy {m['policy']}"]
    rows.append(f"  {'file':<16} {'bytes':>12} {'MB':>8} {'lines':>9} {'bytes/line':>11}")
    for name, size in m["files_bytes"].items():
        n = m["lines"].get(name)
        per_line = f"{size / n:.0f}" if n else "-"
        rows.append(
            f"  {name:<16} {size:>12,} {size / mb:>8.2f} {n if n is not None else '-':>9} {per_line:>11}"
        )
    rows.append(f"  {'rank total':<16} {m['rank_total_bytes']:>12,} {m['rank_total_bytes'] / mb:>8.2f}")
    rows.append(f"  (manifest.json, once per run: {m['manifest_bytes']:,} bytes)")
    rows.append(
        f"write: {m['write_s']:.2f} s in add_step ({m['write_us_per_step']:.2f} us/step), close {m['close_s'] * 1e3:.1f} ms"
    )
    rows.append(
        f"load_run: {m['load_s']:.2f} s -> {m['loaded_steps']:,} steps, {m['loaded_windows']:,} windows, "
        f"{len(m['load_warnings'])} warnings; peak RSS {m['peak_rss_bytes_before_load'] / mb:.0f} MB before load, "
        f"{m['peak_rss_bytes_after_load'] / mb:.0f} MB after"
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--steps", type=int, default=1_000_000, help="optimizer steps to write (default 1,000,000)"
    )
    p.add_argument("--dir", metavar="PATH", help="write the run here and keep it (default: a temporary dir)")
    p.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be at least 1")

    if args.dir:
        run_dir = Path(args.dir)
        if run_dir.exists() and any(run_dir.iterdir()):
            p.error(f"--dir {run_dir} is not empty; pass a new or empty directory")
        m = measure(run_dir, args.steps)
    else:
        with tempfile.TemporaryDirectory(prefix="tuneup-record-size-") as tmp:
            m = measure(Path(tmp) / "run", args.steps)
    print(report(m))
    if args.json:
        Path(args.json).write_text(json.dumps(m, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
