"""What timing every gradient collective costs: 2-process DDP on CPU, arms in lockstep in one launch.

    python benchmarks/comm_overhead.py [--repeats 5] [--slices 300] [--slice-steps 2] [--width 768] [--json PATH]

Goal: the probe costs <= 1% at ~10 ms steps.

One launch of 2 processes (gloo over loopback). Each process builds the same MLP once per arm, each in
its own `DistributedDataParallel` over the one process group:

    builtin      DDP as it comes: its C++ all-reduce, no comm hook (what a CPU run without tuneup does)
    python-hook  DDP with torch's Python `allreduce_hook` registered, no probe
    probe        DDP with tuneup's `CommProbe` installed and its default hook registered, as
                 `TuneupCallback` does on CPU; every step the step's collectives are taken from the probe
                 and resolved to records, inline (the callback does that on its writer thread; inline is
                 the conservative choice on 2 cores)
    probe-wrap   the probe wrapping torch's `allreduce_hook`, as it wraps a user's own hook (or
                 Lightning's on CUDA)

Why lockstep in one launch: whole launches differ from each other by more than the 1% in question (an
earlier version of this script, one launch per arm, gave +2% to +9% from one pair of launches to the
next). Here the arms take turns every 2 steps (a slice), each round in an order shuffled with a seed
both processes share, so the machine's drift hits them alike and no arm always follows the same one
(benchmarks/overhead.py explains both), and both processes follow the same schedule (DDP synchronizes
them at every step anyway).

A step is forward, backward (the all-reduces overlap it), the optimizer step, timed on rank 0 with
`time.perf_counter`. The first 20% of slices are warm-up. Per arm, `ms/step` is the median over repeats
of the median slice. The comparisons (`paired`) are overhead.py's: per repeat, the trimmed mean of
log(arm's slice / the reference arm's slice of the same round); over repeats, their mean with Student's
t 95% interval.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# The same MLP and batch as the single-process benchmark (run from this directory, so it imports).
from overhead import BATCH, IN_DIM, make_net, t95, trimmed_mean
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from tuneup.collect.comm import CommProbe, resolve_collectives

ARMS = ("builtin", "python-hook", "probe", "probe-wrap")
WARMUP_FRACTION = 0.2
GOAL_PERCENT = 1.0


def host_elapsed_ms(a: float, b: float) -> float:
    return (b - a) * 1000.0


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        models: dict[str, DistributedDataParallel] = {}
        models["builtin"] = DistributedDataParallel(make_net(args.width))
        models["python-hook"] = DistributedDataParallel(make_net(args.width))
        models["python-hook"].register_comm_hook(state=None, hook=allreduce_hook)
        probe = CommProbe(on_cuda=False, world_size=world)
        probe.install()
        models["probe"] = DistributedDataParallel(make_net(args.width))
        probe.register_default_hook(models["probe"])
        models["probe-wrap"] = DistributedDataParallel(make_net(args.width))
        models["probe-wrap"].register_comm_hook(
            state=None, hook=allreduce_hook
        )  # through the probe's wrapper
        optimizers = {arm: torch.optim.SGD(m.parameters(), lr=1e-4) for arm, m in models.items()}
        g = torch.Generator().manual_seed(rank)
        batches = [
            (torch.randn(BATCH, IN_DIM, generator=g), torch.randn(BATCH, 1, generator=g)) for _ in range(8)
        ]
        collectives_per_step: list[int] = []

        def step(arm: str, i: int) -> float:
            model, opt = models[arm], optimizers[arm]
            x, y = batches[i % len(batches)]
            start, cpu_start = time.perf_counter(), time.process_time()
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if arm.startswith("probe"):
                records, _summary = resolve_collectives(probe.take(), host_elapsed_ms, start)
                collectives_per_step.append(len(records))
            return time.perf_counter() - start, time.process_time() - cpu_start

        results = []
        for repeat in range(args.repeats):
            slices: dict[str, list[float]] = {arm: [] for arm in ARMS}
            cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
            rng = random.Random(repeat)  # the same on both ranks: they must step the same arm together
            for s in range(args.slices):
                order = list(ARMS)
                rng.shuffle(order)
                for arm in order:
                    times = [step(arm, s * args.slice_steps + k) for k in range(args.slice_steps)]
                    slices[arm].append(statistics.fmean(t[0] for t in times) * 1000.0)
                    cpu[arm].append(statistics.fmean(t[1] for t in times) * 1000.0)
            results.append({"wall": slices, "cpu": cpu})
            if rank == 0:
                mean = {
                    arm: statistics.median(v[int(len(v) * WARMUP_FRACTION) :]) for arm, v in slices.items()
                }
                print(
                    f"repeat {repeat + 1}/{args.repeats}: "
                    + ", ".join(f"{arm} {ms:.3f} ms" for arm, ms in mean.items()),
                    flush=True,
                )
        probe.uninstall()
        if rank == 0:
            buckets = statistics.median(collectives_per_step) if collectives_per_step else 0
            Path(out).write_text(json.dumps({"repeats": results, "collectives_per_step": buckets}))
    finally:
        dist.destroy_process_group()


def paired(repeats: list[dict[str, list[float]]], arm: str, reference: str, skip: int) -> list[float]:
    """Estimate and 95% interval of arm / reference - 1 from slices paired by round (see the docstring)."""
    per_repeat = [
        trimmed_mean([math.log(a / b) for a, b in zip(r[arm][skip:], r[reference][skip:], strict=True)])
        for r in repeats
    ]
    mean = statistics.fmean(per_repeat)
    half = t95(len(per_repeat) - 1) * statistics.stdev(per_repeat) / math.sqrt(len(per_repeat))
    return [math.expm1(mean), math.expm1(mean - half), math.expm1(mean + half)]


def summarize_measure(repeats: list[dict[str, list[float]]], slices: int) -> dict[str, Any]:
    """Medians over repeats of each arm's median slice, and paired ratios against builtin and python-hook."""
    skip = int(slices * WARMUP_FRACTION)
    medians = {arm: statistics.median(statistics.median(r[arm][skip:]) for r in repeats) for arm in ARMS}
    return {
        "step_ms": medians,
        "vs_builtin": {arm: medians[arm] / medians["builtin"] - 1 for arm in ARMS[1:]},
        "paired_vs_builtin": {arm: paired(repeats, arm, "builtin", skip) for arm in ARMS[1:]},
        "paired_vs_python_hook": {arm: paired(repeats, arm, "python-hook", skip) for arm in ARMS[2:]},
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--slices", type=int, default=300, help="rounds per repeat (each arm runs one slice a round)"
    )
    p.add_argument("--slice-steps", type=int, default=2, help="steps per slice (default 2)")
    p.add_argument("--width", type=int, default=768, help="MLP width; 768 gives ~10-12 ms steps on 2 cores")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tuneup-comm-bench-") as tmp:
        out = str(Path(tmp) / "result.json")
        mp.spawn(worker, args=(2, free_port(), args, out), nprocs=2, join=True)
        data = json.loads(Path(out).read_text())
    summary = {
        "width": args.width,
        "repeats": args.repeats,
        "slices": args.slices,
        "collectives_per_step": data["collectives_per_step"],
        **{m: summarize_measure([r[m] for r in data["repeats"]], args.slices) for m in ("wall", "cpu")},
    }
    print(
        f"\n2-process DDP (gloo, CPU), MLP {IN_DIM}-{args.width}-{args.width}-1, batch {BATCH}, "
        f"{summary['collectives_per_step']:.0f} buckets/step, {args.repeats} repeats x {args.slices} slices "
        f"x {args.slice_steps} steps per arm, lockstep. wall: rank 0's step time; cpu: its process's CPU time "
        "per step, all threads"
    )
    for measure in ("wall", "cpu"):
        m = summary[measure]
        print(
            f"  {measure:<5}{'arm':<12} {'ms/step':>8} {'vs builtin':>11} {'paired':>8} {'95% CI':>18}"
            f" {'vs python-hook':>15} {'95% CI':>18}"
        )
        for arm in ARMS:
            line = f"       {arm:<12} {m['step_ms'][arm]:>8.3f}"
            if arm != "builtin":
                med, lo, hi = m["paired_vs_builtin"][arm]
                line += f" {m['vs_builtin'][arm]:>+11.2%} {med:>+8.2%} {f'[{lo:+.2%}, {hi:+.2%}]':>18}"
            if arm in m["paired_vs_python_hook"]:
                med, lo, hi = m["paired_vs_python_hook"][arm]
                line += f" {med:>+15.2%} {f'[{lo:+.2%}, {hi:+.2%}]':>18}"
            print(line)
    print(f"  goal: probe <= {GOAL_PERCENT:.0f}% at ~10 ms steps; total {time.perf_counter() - began:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    sys.exit(main())
