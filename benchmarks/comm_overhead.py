"""What timing every gradient collective costs: 2-process DDP on CPU, with and without it (goal: <= 1%
at ~10 ms steps).

    python benchmarks/comm_overhead.py [--repeats 5] [--steps 300] [--width 768]

Both arms train with TuneupCallback; one with `profile_communication=False`, so the difference is the
communication probe alone (the comm hook wrapper, the wrapped collectives, the per-collective records).
Each measurement is one 2-process DDP fit launched in its own process; the arms alternate, A B A B, so
the machine's drift hits both. A fit's figure is the median step time on rank 0 after the first 20% of
steps; the overhead is the ratio of the medians over repeats, with the paired per-repeat ratios beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = """
import json, sys, time, torch
import lightning.pytorch as L
from torch.utils.data import DataLoader, TensorDataset
from tuneup import TuneupCallback

width, steps, comm, out, result = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "on", sys.argv[4], sys.argv[5]
torch.set_num_threads(1)
torch.manual_seed(0)

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                       torch.nn.ReLU(), torch.nn.Linear(width, 1))
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

class Clock(L.Callback):
    def __init__(self):
        self.t = []
    def on_train_batch_end(self, trainer, *args):
        self.t.append(time.perf_counter())

# The probe's own time per step, measured inside: each timed hook call minus the hook it wraps, plus the
# wrapped collectives' bookkeeping. A lower bound on the probe's cost that whole-fit noise cannot hide.
import tuneup.collect.comm as comm_module

own = {"s": 0.0}
original_wrap = comm_module.CommProbe.wrap_hook

def measured_wrap(self, hook):
    inner = {"s": 0.0}
    def timed_inner(state, bucket):
        t = time.perf_counter()
        try:
            return hook(state, bucket)
        finally:
            inner["s"] += time.perf_counter() - t
    wrapped = original_wrap(self, timed_inner)
    def outer(state, bucket):
        before_inner = inner["s"]
        t = time.perf_counter()
        try:
            return wrapped(state, bucket)
        finally:
            own["s"] += (time.perf_counter() - t) - (inner["s"] - before_inner)
    return outer

comm_module.CommProbe.wrap_hook = measured_wrap

x = torch.randn(64 * 16, 64)
clock = Clock()
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=steps, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    callbacks=[clock, TuneupCallback(dirpath=out, profile_communication=comm)])
trainer.fit(Net(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=64))
if trainer.global_rank == 0:
    gaps = [b - a for a, b in zip(clock.t, clock.t[1:])][steps // 5:]
    with open(result, "w") as f:
        gaps.sort()
        json.dump({"median_ms": gaps[len(gaps) // 2] * 1000, "own_us_per_step": own["s"] / steps * 1e6}, f)
torch.distributed.destroy_process_group()
"""


OWN_US: list[float] = []


def fit_once(arm: str, width: int, steps: int, tmp: Path, n: int) -> float:
    script = tmp / "worker.py"
    script.write_text(WORKER)
    result = tmp / f"{arm}-{n}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    subprocess.run(
        [sys.executable, str(script), str(width), str(steps), arm, str(tmp / f"run-{arm}-{n}"), str(result)],
        check=True,
        capture_output=True,
        env=env,
        cwd=tmp,
        timeout=600,
    )
    data = json.loads(result.read_text())
    if arm == "on":
        OWN_US.append(data["own_us_per_step"])
    return data["median_ms"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--width", type=int, default=768, help="MLP width; 768 gives ~10 ms steps on 2 cores")
    args = p.parse_args()
    began = time.perf_counter()
    results: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="tuneup-comm-bench-") as name:
        tmp = Path(name)
        for r in range(args.repeats):
            for arm in ("off", "on") if r % 2 == 0 else ("on", "off"):
                results[arm].append(fit_once(arm, args.width, args.steps, tmp, r))
            print(
                f"repeat {r + 1}/{args.repeats}: off {results['off'][-1]:.3f} ms, on {results['on'][-1]:.3f} ms",
                flush=True,
            )
    off, on = statistics.median(results["off"]), statistics.median(results["on"])
    paired = sorted(a / b - 1 for a, b in zip(results["on"], results["off"], strict=True))
    print(
        f"\n2-process DDP, MLP width {args.width}, {args.steps} steps, {args.repeats} repeats:\n"
        f"  median step without the probe {off:.3f} ms, with {on:.3f} ms: overhead {on / off - 1:+.2%}\n"
        f"  paired per repeat: median {statistics.median(paired):+.2%}, min {paired[0]:+.2%}, max {paired[-1]:+.2%}\n"
        f"  inside the probe's hook wrapper (rank 0): median {statistics.median(OWN_US):.1f} us per step "
        f"= {statistics.median(OWN_US) / 1000 / off:+.3%} of the step\n"
        f"  goal: <= 1% at ~10 ms steps; total {time.perf_counter() - began:.0f} s"
    )


if __name__ == "__main__":
    main()
