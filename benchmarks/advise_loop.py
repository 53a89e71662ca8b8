"""The closed loop: record a run, ask `tuneup advise`, apply exactly what it recommends, rerun, and see
whether the measured gain lands inside the predicted interval.

    python benchmarks/advise_loop.py [--case data|comm|all] [--repeats 2] [--steps 120] [--out DIR]

Cases (CPU, this machine's cores):
- data: one process, a Dataset whose __getitem__ waits `--item-ms` per sample (storage-like), no workers;
- comm: DDP over 2 gloo processes (one torch thread each), a model with many parameters for its compute,
  so that the gradients' all-reduce is a large share of the step.

Each recommendation's changes are applied through the workload's own arguments, one per knob the advice
can name (batch size, accumulation, DataLoader workers and flags, torch threads, the fp16 comm hook
registered by a callback, as the printed code does). Base and changed runs alternate (A B A B ...); the
measured gain is the ratio of median samples/s, in the advice's objective (goodput where the noise scale
was measured: samples/s times the statistical efficiency at the new global batch).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CASES: dict[str, dict[str, Any]] = {
    "data": {"devices": 1, "batch": 32, "item_ms": 1.0, "width": 512, "threads": 2},
    "comm": {"devices": 2, "batch": 8, "item_ms": 0.0, "width": 2048, "threads": 1},
}


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    try:
        import lightning.pytorch as L
    except ImportError:
        import pytorch_lightning as L
    from torch.utils.data import DataLoader, Dataset

    from tuneup import TuneupCallback

    width = args.width

    class Slow(Dataset):  # type: ignore[type-arg]
        def __init__(self, n: int) -> None:
            g = torch.Generator().manual_seed(0)
            self.x = torch.randn(n, 256, generator=g)
            self.y = torch.randint(0, 10, (n,), generator=g)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> Any:
            if args.item_ms:
                time.sleep(args.item_ms / 1000.0)
            return self.x[i], self.y[i]

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(256, width), torch.nn.GELU(), torch.nn.Linear(width, width), torch.nn.GELU(),
                torch.nn.Linear(width, 10),
            )  # fmt: skip

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    class CommHook(L.Callback):
        # What the advice prints for fp16 compression on CPU (Lightning ignores ddp_comm_hook off CUDA).
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            trainer.strategy.model.register_comm_hook(None, default_hooks.fp16_compress_hook)

    n = args.batch * args.accum * args.devices * (args.steps + 4)
    loader_kw: dict[str, Any] = {"batch_size": args.batch, "num_workers": args.workers}
    if args.workers:
        loader_kw["persistent_workers"] = args.persistent_workers
        if args.prefetch:
            loader_kw["prefetch_factor"] = args.prefetch
    callbacks = [TuneupCallback(dirpath=args.run_dir)]
    if args.comm_hook == "fp16":
        callbacks.insert(0, CommHook())
    trainer = L.Trainer(
        accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
        max_steps=args.steps, accumulate_grad_batches=args.accum, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
    )  # fmt: skip
    trainer.fit(Model(), DataLoader(Slow(n), **loader_kw))
    if args.devices > 1 and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # gloo with a registered hook can abort at exit otherwise


def _run(out: Path, name: str, knobs: dict[str, Any], steps: int) -> Path:
    run_dir = out / name
    cmd = [sys.executable, __file__, "--worker", "--run-dir", str(run_dir), "--steps", str(steps)]
    for key, value in knobs.items():
        if isinstance(value, bool):
            if value:
                cmd.append(f"--{key.replace('_', '-')}")
        else:
            cmd += [f"--{key.replace('_', '-')}", str(value)]
    env = {**os.environ, "OMP_NUM_THREADS": str(knobs.get("threads", 1))}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    return run_dir


def apply(knobs: dict[str, Any], rec: Any) -> dict[str, Any] | None:
    """The workload's arguments with the recommendation's changes; None if a knob has no argument here."""
    new = dict(knobs)
    for c in rec.changes:
        if c.knob == "batch_size":
            new["batch"] = int(c.proposed)
        elif c.knob == "accumulate_grad_batches":
            new["accum"] = int(c.proposed)
        elif c.knob == "num_workers":
            new["workers"] = int(c.proposed)
        elif c.knob == "torch intra-op threads":
            new["threads"] = int(c.proposed)
        elif c.knob == "persistent_workers":
            new["persistent_workers"] = c.proposed == "True"
        elif c.knob == "prefetch_factor":
            new["prefetch"] = int(c.proposed)
        elif c.knob == "ddp_comm_hook" and c.proposed == "fp16_compress_hook":
            new["comm_hook"] = "fp16"
        elif c.knob == "pin_memory":
            continue  # no effect on CPU
        else:
            return None
    return new


def _measured(run_dir: Path) -> tuple[float, Any]:
    from tuneup.report import analyze

    a = analyze(run_dir)
    return float(a.throughput.samples_per_s or 0.0), a


def loop(case: str, out: Path, repeats: int, steps: int) -> list[dict[str, Any]]:
    from tuneup.advise import AdviceOptions, advise
    from tuneup.analyze.noise_scale import statistical_efficiency

    knobs = {"accum": 1, "workers": 0, **CASES[case]}
    base_dir = _run(out, f"{case}-base-0", knobs, steps)
    base_rate, base = _measured(base_dir)
    advice = advise([base], AdviceOptions(whatif=False))
    print(f"\n== {case}: base {base_rate:,.1f} samples/s; {len(advice.recommendations)} recommendation(s) ==")
    for c in advice.considered:
        print(f"   considered: {c.knob}: {c.reason}")
    rows = []
    for rec in advice.recommendations:
        new_knobs = apply(knobs, rec)
        if new_knobs is None:
            print(f" - {rec.title}: not applicable in this workload ({[c.knob for c in rec.changes]})")
            continue
        base_rates, new_rates = [base_rate], []
        for r in range(repeats):
            new_rates.append(_measured(_run(out, f"{case}-{rec.id}-{r}", new_knobs, steps))[0])
            if r + 1 < repeats:
                base_rates.append(_measured(_run(out, f"{case}-base-{r + 1}", knobs, steps))[0])
        measured = statistics.median(new_rates) / statistics.median(base_rates)
        if rec.objective == "goodput" and advice.current is not None:
            b_noise = base.noise_scale.b_simple if base.noise_scale else None
            if b_noise:
                b0 = CASES[case]["batch"] * CASES[case]["devices"]
                b1 = new_knobs["batch"] * new_knobs["accum"] * new_knobs["devices"]
                measured *= statistical_efficiency(b_noise, b0, b1)
        gain = measured - 1
        inside = rec.gain.low <= gain <= rec.gain.high
        print(
            f" - {rec.title}\n   predicted {rec.objective} {rec.gain.value:+.1%} [{rec.gain.low:+.1%}, "
            f"{rec.gain.high:+.1%}]; measured {gain:+.1%} (base {statistics.median(base_rates):,.1f}, "
            f"after {statistics.median(new_rates):,.1f} samples/s, {repeats} run(s) each); inside: {inside}"
        )
        rows.append({"case": case, "id": rec.id, "predicted": rec.gain, "measured": gain, "inside": inside})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", default="all", choices=[*CASES, "all"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    for name, default in (("devices", 1), ("batch", 16), ("accum", 1), ("workers", 0), ("threads", 1),
                          ("width", 512), ("prefetch", 0)):  # fmt: skip
        parser.add_argument(f"--{name}", type=int, default=default, help=argparse.SUPPRESS)
    parser.add_argument("--item-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--persistent-workers", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--comm-hook", default="none", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="tuneup-advise-loop-"))
    for case in CASES if args.case == "all" else [args.case]:
        loop(case, out, args.repeats, args.steps)
    print(f"\nruns in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
