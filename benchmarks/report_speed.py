"""How long `tuneup report` takes for a big run (goals: 8 ranks x 100,000 steps under 15 s, and
1,024 ranks x 10,000 steps under 30 s, on 2 cores).

    python benchmarks/report_speed.py                              # 8 ranks x 100,000 steps
    python benchmarks/report_speed.py --ranks 1024 --steps 10000   # 128 nodes x 8 GPUs
    python benchmarks/report_speed.py ... [--repeats 3] [--jobs N] [--keep DIR [--reuse]] [--profile FILE]

The run is synthetic but written through the real RankWriter with the default recording policy, as
TuneupCallback writes it on a cluster of 8-GPU nodes: rank r on host `node{r // 8}` (local rank r % 8),
100 ms steps with jitter, a warm-up, and one straggler rank; one telemetry sample per simulated second,
each rank with its own process tree, and each node's local rank 0 alone with the host and its 8 GPUs
(the sampler's keys, as `default_sensors` gives them); priced as an aws:p5.48xlarge job. Ranks are
generated in `--jobs` processes (all cores by default; 1,024 x 10,000 takes about a minute on 2 cores
and 850 MiB of disk); generation is not timed, and `--keep DIR --reuse` times the run already in DIR.

Each repeat times the report's parts one after the other (load, analysis, plots, JSON, Markdown, HTML:
what `write_report` does), then the `tuneup report` command end to end, as a user waits for it; the
median of each is printed.
`--profile FILE` profiles one more `write_report` with cProfile and writes its top entries to FILE.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tuneup.record import RankWriter, write_manifest
from tuneup.report import json_text, write_report

RANKS_PER_NODE = 8
START_UNIX = 1_790_000_000.0  # a real unix time: the record's times have all their digits
INSTANCE = "aws:p5.48xlarge"  # 8 x H100 80 GB
GPU_MEM_BYTES = 80 * 2**30
PCIE_EVERY_N = 5  # NvmlSensor's default: PCIe throughput every 5th tick


def default_straggler(ranks: int) -> int:
    # Not a local rank 0 (those also carry the node's telemetry), and in the middle of a large job.
    return 3 if ranks <= RANKS_PER_NODE else ranks // 2 + 5


def write_run_manifest(run_dir: Path, ranks: int) -> None:
    nodes = -(-ranks // RANKS_PER_NODE)
    per_node = min(ranks, RANKS_PER_NODE)
    write_manifest(
        run_dir,
        {
            "run_id": "bench",
            "created_unix": START_UNIX,
            "world_size": ranks,
            "num_nodes": nodes,
            "trainer": {
                "namespace": "lightning.pytorch",
                "strategy": "DDPStrategy",
                "accelerator": "CUDAAccelerator",
                "precision": "bf16-mixed",
                "accumulate_grad_batches": 1,
                "devices": per_node,
                "num_nodes": nodes,
            },
            "dataloader": {"batch_size": 32, "num_workers": 4, "pin_memory": True, "drop_last": True},
            "model": {"class": "BenchModel", "parameters": 124_000_000},
            "gpus": {
                "driver_version": "560.35.03",
                "gpus": [
                    {
                        "index": g,
                        "name": "NVIDIA H100 80GB HBM3",
                        "pci_bus_id": f"00000000:{0x18 + 0x10 * g:02X}:00.0",
                        "memory_total_bytes": GPU_MEM_BYTES,
                        "nvlink_links_active": 18,
                    }
                    for g in range(per_node)
                ],
            },
            "communication": {"backend": "nccl", "ranks_per_node": per_node, "nccl_version": "2.21.5"},
            "pricing": {"instance": INSTANCE, "price_per": "node"},
            "recording": {"telemetry_interval_s": 1.0, "timing": "cuda_event"},
        },
    )


def write_rank(run_dir: Path, rank: int, world_size: int, steps: int, straggler: int) -> None:
    """One rank's files, through the RankWriter, as TuneupCallback and the telemetry sampler write them."""
    rng = random.Random(rank)
    local = rank % RANKS_PER_NODE
    slow = 15.0 if rank == straggler else 0.0
    w = RankWriter(run_dir, rank)
    w.open(
        {
            "host": f"node{rank // RANKS_PER_NODE}",
            "pid": 4000 + local,
            "local_rank": local,
            "node_rank": rank // RANKS_PER_NODE,
            "world_size": world_size,
            "device": f"cuda:{local}",
            "device_bus_id": f"00000000:{0x18 + 0x10 * local:02X}:00.0",
            "timing": "cuda_event",
            "start_unix": START_UNIX,
            "global_step_at_start": 0,
        }
    )
    t = START_UNIX
    for step in range(steps):
        # Warm-up: the first step carries setup (allocator, autotuning), the next few are still slow.
        warm = 2500.0 if step == 0 else 150.0 * 0.8**step if step < 30 else 0.0
        fwd = 30.0 + rng.gauss(0, 1) + slow + warm / 2
        bwd = 55.0 + rng.gauss(0, 1) - slow + warm / 2
        data, opt, other = 1.0 + abs(rng.gauss(0, 0.3)), 6.0, 8.0
        wall = data + fwd + bwd + opt + other
        t += wall / 1000.0
        w.add_step(
            {
                "step": step,
                "epoch": step // 10_000,
                "t_end": t,
                "wall_ms": wall,
                "data_ms": data,
                "forward_ms": fwd,
                "backward_ms": bwd,
                "optimizer_ms": opt,
                "other_ms": other,
                "micro_batches": 1,
                "samples": 32,
                "tokens": 32 * 1024,
                "loss": 4.0 / (1 + step / 1000) + rng.gauss(0, 0.01),
                "grad_norm": None,
                "peak_mem_bytes": 60 * 2**30,
            }
        )
    for i in range(int(t - START_UNIX) + 1):
        sample: dict[str, Any] = {"t": START_UNIX + i + 0.004 * rng.random()}
        process: dict[str, Any] = {"rss_bytes": 12 * 2**30 + 4096 * i, "num_processes": 5, "num_threads": 40}
        if i:  # CPU time needs two readings
            process["cpu_percent"] = round(rng.uniform(100.0, 110.0), 1)
        sample["process"] = process
        if local == 0:  # the machine and its GPUs: local rank 0 only (default_sensors)
            system: dict[str, Any] = {
                "mem_used_bytes": 200 * 2**30 + 2**20 * i,
                "mem_total_bytes": 2048 * 2**30,
                "disk_read_bytes": 10**6 * i,
                "disk_write_bytes": 10**5 * i,
                "net": {
                    "lo": {"sent_bytes": 10**6 * i, "recv_bytes": 10**6 * i},
                    "eth0": {"sent_bytes": 10**8 * i, "recv_bytes": 10**8 * i},
                },
            }
            if i:
                system = {"cpu_percent": round(rng.uniform(30.0, 50.0), 1), **system}
            sample["system"] = system
            gpus = []
            for g in range(RANKS_PER_NODE):
                gpu: dict[str, Any] = {
                    "index": g,
                    "bus_id": f"00000000:{0x18 + 0x10 * g:02X}:00.0",
                    "util_percent": rng.randint(85, 100),
                    "mem_util_percent": rng.randint(30, 60),
                    "mem_used_bytes": 70 * 2**30,
                    "mem_total_bytes": GPU_MEM_BYTES,
                    "power_w": round(rng.uniform(550.0, 650.0), 3),
                    "energy_j": 600.0 * i,
                    "sm_clock_mhz": 1980,
                    "mem_clock_mhz": 2619,
                    "temp_c": 60 + g,
                    "throttle_reasons": 0,
                    "throttle": [],
                }
                if i % PCIE_EVERY_N == 0:
                    gpu["pcie_tx_bytes_per_s"] = 1024 * rng.randint(10_000, 20_000)
                    gpu["pcie_rx_bytes_per_s"] = 1024 * rng.randint(10_000, 20_000)
                gpu["nvlink_tx_bytes"] = 1024 * 10**6 * i
                gpu["nvlink_rx_bytes"] = 1024 * 10**6 * i
                gpus.append(gpu)
            sample["gpus"] = gpus
        w.add_telemetry(sample)
    w.close(status="completed", data_timing="fetch")


def _write_ranks(run_dir: Path, ranks: list[int], world_size: int, steps: int, straggler: int) -> None:
    for rank in ranks:
        write_rank(run_dir, rank, world_size, steps, straggler)


def generate(run_dir: Path, ranks: int, steps: int, jobs: int = 1, straggler: int | None = None) -> None:
    straggler = default_straggler(ranks) if straggler is None else straggler
    write_run_manifest(run_dir, ranks)
    if jobs <= 1 or ranks == 1:
        _write_ranks(run_dir, list(range(ranks)), ranks, steps, straggler)
        return
    with ProcessPoolExecutor(jobs) as pool:
        # Interleaved, so each process gets its share of the heavier local ranks 0.
        futures = [
            pool.submit(_write_ranks, run_dir, list(range(j, ranks, jobs)), ranks, steps, straggler)
            for j in range(jobs)
        ]
        for f in futures:
            f.result()


def _timed_parts(run_dir: Path, out: Path) -> dict[str, float]:
    """What write_report does, one part at a time (its internals: kept loose, so a rename shows here)."""
    from tuneup.analyze.analysis import analyze_run
    from tuneup.analyze.model import to_json
    from tuneup.record.segments import load_segments
    from tuneup.report.html import render_html
    from tuneup.report.markdown import render_markdown
    from tuneup.report.sections import render_plots

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    segments = load_segments(run_dir)
    times["load"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = analyze_run(segments[-1], None, segments)
    times["analyze"] = time.perf_counter() - t0
    del segments
    t0 = time.perf_counter()
    plots = render_plots(report, out)
    times["plots"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    (out / "report.json").write_text(json_text(to_json(report)), encoding="utf-8")
    times["json"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    (out / "report.md").write_text(render_markdown(report, plots), encoding="utf-8")
    times["md"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    (out / "report.html").write_text(render_html(report, plots), encoding="utf-8")
    times["html"] = time.perf_counter() - t0
    return times


def _profile(run_dir: Path, out: Path, path: Path, top: int = 60) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    write_report(run_dir, out)
    profiler.disable()
    text = io.StringIO()
    for key in ("cumulative", "tottime"):
        text.write(f"==== write_report, sorted by {key} ====\n")
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(top)
    path.write_text(text.getvalue(), encoding="utf-8")
    profiler.dump_stats(path.with_suffix(".prof"))  # for pstats or snakeviz: callers, callees, all entries
    print(f"profile of one write_report written to {path} (all of it: {path.with_suffix('.prof')})")


def _print_summary(
    parts: dict[str, list[float]], totals: list[float], written: list[Path], goal_s: float
) -> None:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    shown = ", ".join(f"{name} {med(v):.2f}" for name, v in parts.items())
    render = sum(med(parts[k]) for k in ("plots", "json", "md", "html"))
    print(
        f"parts (median of {len(totals)}, s): {shown}; plots+json+md+html {render:.2f}; "
        f"sum {sum(med(v) for v in parts.values()):.2f}"
    )
    totals = sorted(totals)
    print(
        f"tuneup report (html, md, json, {sum(p.suffix == '.png' for p in written)} plots): "
        f"median {med(totals):.2f} s, min {totals[0]:.2f} s, max {totals[-1]:.2f} s "
        f"over {len(totals)} runs (goal: < {goal_s:.0f} s)"
    )
    sizes = ", ".join(
        f"{f.name} {f.stat().st_size / 2**10:,.0f} KiB"
        for f in written
        if f.suffix in (".html", ".md", ".json")
    )
    print(f"sizes: {sizes}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes that generate the run")
    p.add_argument("--straggler", type=int, help="the slow rank (default: 3, or ranks // 2 + 5 beyond 8)")
    p.add_argument("--keep", type=Path, help="write the run and report here and keep them")
    p.add_argument("--reuse", action="store_true", help="with --keep: time the run already there")
    p.add_argument("--profile", type=Path, help="profile one more report with cProfile; top entries here")
    args = p.parse_args()
    goal = 15.0 if args.ranks <= 8 else 30.0
    base = args.keep or Path(tempfile.mkdtemp(prefix="tuneup-report-bench-"))
    run_dir = base / "run"
    if not (args.reuse and (run_dir / "manifest.json").is_file()):
        shutil.rmtree(run_dir, ignore_errors=True)
        t0 = time.perf_counter()
        generate(run_dir, args.ranks, args.steps, args.jobs, args.straggler)
        print(
            f"generated {args.ranks} ranks x {args.steps:,} steps in {time.perf_counter() - t0:.1f} s",
            end=" ",
        )
    else:
        print(f"reusing {run_dir}", end=" ")
    size = sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file())
    print(f"({size / 2**20:.1f} MiB on disk)", flush=True)

    parts: dict[str, list[float]] = {}
    totals: list[float] = []
    written = None
    for _ in range(args.repeats):
        # The whole command, as a user waits for it: interpreter start, imports, load, analysis, files.
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "tuneup", "report", str(run_dir), "-o", str(base / "report")],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        totals.append(time.perf_counter() - t0)
        written = sorted((base / "report").iterdir())
        print(f"  tuneup report {totals[-1]:.2f} s", flush=True)
    # Then the parts, in this process: after every command, since the memory a loaded run leaves in this
    # process slowed the commands that followed it by 15% (25.2 s, then 29.7 s).
    for _ in range(args.repeats):
        for name, seconds in _timed_parts(run_dir, base / "parts").items():
            parts.setdefault(name, []).append(seconds)
    shutil.rmtree(base / "parts", ignore_errors=True)
    if written is not None:
        _print_summary(parts, totals, written, goal)
    if args.profile:
        _profile(run_dir, base / "report", args.profile)
    if args.keep is None:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
