"""Does the step-time model predict what it has not seen? Fit on runs at batch 8, 16 and 32 (one rank),
then predict the median step at batch 24 and 64, at accumulation 4, and at world size 2 (DDP over gloo,
with the link measured by `tuneup probe-network`), and measure each.

    python benchmarks/predict.py [--model lm|mlp] [--steps 60] [--out DIR]
    python benchmarks/predict.py --runs FIT_RUN... --check RUN...   # any recorded runs (e.g. a GPU sweep)

The workload is the demo's transformer language model (`--model lm`, the default) or a 5 M-parameter
MLP (`--model mlp`, whose one-thread GEMM time is far from linear in the batch: the model's weak case).
Every run uses one torch thread per rank, so that one rank and two ranks on a 2-core machine compute at
the same speed per rank (what the model assumes of a CPU run; on GPUs each rank has its own device).
Prints predicted vs measured with the interval, and whether the measurement fell inside it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

FIT = ((8, 1, 1), (16, 1, 1), (32, 1, 1))  # (batch per rank, accumulation, world size)
CHECK = ((24, 1, 1), (64, 1, 1), (16, 4, 1), (16, 1, 2))


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    try:
        import lightning.pytorch as L
    except ImportError:
        import pytorch_lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from tuneup import TuneupCallback

    class Mlp(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            # ~25 MFLOP per sample forward and backward: steps of 5-50 ms on one CPU thread.
            self.net = torch.nn.Sequential(
                torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 2048), torch.nn.GELU(),
                torch.nn.Linear(2048, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10),
            )  # fmt: skip

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            # SGD: the step is the model's compute, not a 5M-parameter AdamW update on one thread.
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    n = args.batch * args.accum * args.devices * (args.steps + 2)
    g = torch.Generator().manual_seed(0)
    if args.model == "lm":
        # The demo's transformer language model (tuneup/demo.py) on its Markov tokens.
        from tuneup.demo import _markov_tokens, _TokenDataset, build_model

        module: Any = build_model()
        data: Any = _TokenDataset(_markov_tokens(n))
    else:
        module = Mlp()
        data = TensorDataset(torch.randn(n, 256, generator=g), torch.randint(0, 10, (n,), generator=g))
    trainer = L.Trainer(
        accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
        max_steps=args.steps, accumulate_grad_batches=args.accum, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[TuneupCallback(dirpath=args.run_dir, telemetry_interval_s=1.0)],
    )  # fmt: skip
    trainer.fit(module, DataLoader(data, batch_size=args.batch))


def _record(out: Path, batch: int, accum: int, world: int, steps: int, model: str) -> Path:
    run_dir = out / f"b{batch}-a{accum}-w{world}"
    cmd = [sys.executable, __file__, "--worker", "--batch", str(batch), "--accum", str(accum),
           "--devices", str(world), "--steps", str(steps), "--run-dir", str(run_dir), "--model", model]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900
    )
    return run_dir


def _probe(out: Path) -> Path:
    run_dir = out / "probe"
    cmd = [sys.executable, "-m", "tuneup", "probe-network", "--nproc", "2", "--collectives", "all_reduce",
           "--max-bytes", "16M", "--iters", "10", "--out", str(run_dir)]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    return run_dir


def compare(fit_dirs: list[Path], check_dirs: list[Path], link: Path | None) -> list[dict[str, Any]]:
    from tuneup.advise.model import Setting
    from tuneup.advise.observe import observe
    from tuneup.advise.step_model import fit_step_model, with_link
    from tuneup.report import analyze

    fitted = [observe(analyze(d)) for d in fit_dirs]
    model = fit_step_model(fitted)
    if link is not None:
        fits = analyze(link).communication.fits  # type: ignore[union-attr]
        model = with_link(model, fits, (fitted[0].parameters or 0) * 4)
    rows = []
    print(f"fitted to {', '.join(d.name for d in fit_dirs)}: compute {model.line.intercept_ms:.3f} ms + "
          f"{model.line.slope_ms:.4f} ms/sample; largest in-sample error "
          f"{(model.fit_error or 0):.1%}")  # fmt: skip
    print(f"{'run':<22} {'predicted median ms':>28} {'measured':>10} {'error':>8} {'inside':>7}")
    for d in check_dirs:
        o = observe(analyze(d))
        p = model.predict(Setting(o.batch_size, o.accumulation, o.world_size, o.precision)).median_ms
        err = p.value / o.step_median_ms - 1
        inside = p.low <= o.step_median_ms <= p.high
        rows.append({"run": d.name, "predicted": p.value, "low": p.low, "high": p.high,
                     "measured": o.step_median_ms, "error": err, "inside": inside})  # fmt: skip
        shown = f"{p.value:.2f} [{p.low:.2f}, {p.high:.2f}]"
        print(f"{d.name:<22} {shown:>28} {o.step_median_ms:>10.2f} {err:>+8.1%} {inside!s:>7}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--runs", nargs="*", type=Path, help="recorded runs to fit to (skips recording)")
    parser.add_argument("--check", nargs="*", type=Path, help="recorded runs to predict")
    parser.add_argument("--link", type=Path, help="a probe-network run for other world sizes")
    parser.add_argument(
        "--model", default="lm", choices=["lm", "mlp"], help="the demo's transformer LM (default) or an MLP"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument("--accum", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.runs:
        compare(args.runs, args.check or [], args.link)
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="tuneup-predict-"))
    fit_dirs = [_record(out, b, a, w, args.steps, args.model) for b, a, w in FIT]
    check_dirs = [_record(out, b, a, w, args.steps, args.model) for b, a, w in CHECK]
    compare(fit_dirs, check_dirs, _probe(out))
    print(f"runs in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
