"""How long `tuneup report` takes for a big run: 8 ranks x 100,000 steps (goal: under 15 s on 2 cores).

    python benchmarks/report_speed.py [--ranks 8] [--steps 100000] [--keep DIR]

The run is synthetic but written through the real RankWriter with the default recording policy, as
TuneupCallback writes it: 100 ms steps with jitter and one straggler rank, and one telemetry sample per
simulated second (10,000 per rank), GPU fields included. Only the report is timed, not the generation.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from tuneup.record import RankWriter, write_manifest
from tuneup.report import write_report

STEP_S = 0.1


def generate(run_dir: Path, ranks: int, steps: int) -> None:
    write_manifest(
        run_dir,
        {
            "run_id": "bench",
            "created_unix": 0.0,
            "world_size": ranks,
            "num_nodes": 1,
            "trainer": {"strategy": "DDPStrategy", "precision": "bf16-mixed", "accumulate_grad_batches": 1},
            "dataloader": {"batch_size": 32, "num_workers": 4},
            "model": {"class": "BenchModel", "parameters": 124_000_000},
        },
    )
    for rank in range(ranks):
        rng = random.Random(rank)
        w = RankWriter(run_dir, rank)
        w.open({"host": f"node{rank // 8}", "start_unix": 0.0})
        t = 0.0
        for step in range(steps):
            fwd = 30.0 + rng.gauss(0, 1) + (8.0 if rank == 3 else 0.0)
            bwd = 55.0 + rng.gauss(0, 1) - (8.0 if rank == 3 else 0.0)
            data, opt, other = 1.0 + abs(rng.gauss(0, 0.3)), 6.0, 8.0
            wall = data + fwd + bwd + opt + other
            t += wall / 1000.0
            w.add_step(
                {
                    "step": step,
                    "epoch": step // 10_000,
                    "t_end": round(t, 3),
                    "wall_ms": round(wall, 3),
                    "data_ms": round(data, 3),
                    "forward_ms": round(fwd, 3),
                    "backward_ms": round(bwd, 3),
                    "optimizer_ms": opt,
                    "other_ms": other,
                    "micro_batches": 1,
                    "samples": 32,
                    "tokens": 32 * 1024,
                    "loss": round(4.0 / (1 + step / 1000), 6),
                    "grad_norm": None,
                    "peak_mem_bytes": 60 * 2**30,
                }
            )
        for i in range(int(steps * STEP_S)):
            w.add_telemetry(
                {
                    "t": float(i),
                    "process": {"cpu_percent": 105.0, "rss_bytes": 12 * 2**30},
                    "system": {
                        "cpu_percent": 40.0,
                        "mem_used_bytes": 200 * 2**30,
                        "mem_total_bytes": 1024 * 2**30,
                        "disk_read_bytes": 10**6 * i,
                        "disk_write_bytes": 10**5 * i,
                        "net": {"eth0": {"sent_bytes": 10**8 * i, "recv_bytes": 10**8 * i}},
                    }
                    if rank % 8 == 0
                    else None,
                    "gpus": [
                        {
                            "index": g,
                            "bus_id": f"00000000:{g:02X}:00.0",
                            "util_percent": 90.0,
                            "power_w": 600.0,
                            "energy_j": 600.0 * i,
                            "mem_used_bytes": 70 * 2**30,
                            "mem_total_bytes": 141 * 2**30,
                            "sm_clock_mhz": 1980,
                            "temp_c": 60,
                        }
                        for g in range(8)
                    ]
                    if rank % 8 == 0
                    else None,
                }
            )
        w.close(status="completed")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--keep", type=Path, help="write the run and report here and keep them")
    args = p.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="tuneup-report-bench-"))
    run_dir = base / "run"
    t0 = time.perf_counter()
    generate(run_dir, args.ranks, args.steps)
    size = sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file())
    print(
        f"generated {args.ranks} ranks x {args.steps:,} steps in {time.perf_counter() - t0:.1f} s "
        f"({size / 2**20:.1f} MiB on disk)"
    )
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        written = write_report(run_dir, base / "report")
        times.append(time.perf_counter() - t0)
    times.sort()
    print(
        f"tuneup report (html, md, json, {sum(p.suffix == '.png' for p in written.files)} plots): "
        f"median {times[len(times) // 2]:.2f} s, min {times[0]:.2f} s, max {times[-1]:.2f} s "
        f"over {args.repeats} runs (goal: < 15 s)"
    )
    if args.keep is None:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
