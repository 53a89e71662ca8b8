"""The demo's transformer trained under `TuneupDDPStrategy` (or plain DDP), for the strategy's tests and
`benchmarks/strategies.py`.

    python tests/workloads/sync_demo.py OUT_DIR [--strategy JSON] [--namespace pytorch_lightning]
        [--steps 300] [--seed 0] [--devices 2] [--fault SCALE] [--no-callback]

`--strategy` is the strategy's keyword arguments as JSON ('{"compression": "fp16"}'); absent: Lightning's
own "ddp". Rank 0 writes OUT_DIR/result.json: the held-out loss after training, the final training loss,
the fit's wall time and the strategy's summary. `--fault SCALE` multiplies every compressed or local
result by SCALE (a faulty compressor, for the safeguard's test).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--strategy", default=None)
    parser.add_argument("--namespace", default="lightning.pytorch")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--fault", type=float, default=None)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--no-callback", action="store_true")
    args = parser.parse_args()

    import importlib

    import torch
    from torch.utils.data import DataLoader

    from tuneup import TuneupCallback, demo
    from tuneup.plugins.lightning import strategy as strategies

    L = importlib.import_module(args.namespace)
    demo._lightning = lambda: L  # the demo's model, built on this namespace's LightningModule
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.devices))
    L.seed_everything(args.seed, workers=True, verbose=False)
    # The same data for every strategy and seed: the seed changes the model's initialisation and order.
    seqs = demo._markov_tokens(demo.BATCH_SIZE * args.devices * args.steps + 256, seed=0)
    train, held_out = seqs[:-256], seqs[-256:]
    loader = DataLoader(demo._TokenDataset(train), batch_size=demo.BATCH_SIZE, shuffle=True, drop_last=True)
    if args.strategy is None:
        strategy: object = "ddp"
    else:
        cls = (
            strategies.PLTuneupDDPStrategy
            if args.namespace == "pytorch_lightning"
            else strategies.TuneupDDPStrategy
        )
        strategy = cls(**json.loads(args.strategy))
    callbacks = [] if args.no_callback else [TuneupCallback(dirpath=args.out / "run")]
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=strategy,
        max_steps=args.steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=str(args.out),
    )
    model = demo.build_model(learning_rate=args.lr)
    if args.fault is not None:
        scale = args.fault

        class Fault(L.Callback):
            def on_train_start(self, trainer: object, pl_module: object) -> None:
                trainer.strategy.sync.state.fault = lambda averaged: averaged.mul_(scale)  # type: ignore[attr-defined]

        trainer.callbacks.append(Fault())
    started = time.perf_counter()
    trainer.fit(model, loader)
    fit_s = time.perf_counter() - started
    model.eval()
    with torch.no_grad():
        logits = model(held_out[:, :-1].to(model.device))
        held_out_loss = float(
            torch.nn.functional.cross_entropy(
                logits.reshape(-1, demo.VOCAB_SIZE), held_out[:, 1:].reshape(-1)
            )
        )
    summary = (
        trainer.strategy.tuneup_sync_summary() if hasattr(trainer.strategy, "tuneup_sync_summary") else None
    )
    if trainer.global_rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        result = {
            "held_out_loss": held_out_loss,
            "train_loss": float(trainer.callback_metrics.get("train_loss", float("nan"))),
            "fit_s": fit_s,
            "steps": trainer.global_step,
            "strategy": summary,
            "hooks_wrapped": getattr(getattr(callbacks[0], "_comm", None), "hooks_wrapped", None)
            if callbacks
            else None,
        }
        (args.out / "result.json").write_text(json.dumps(result, indent=1))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
