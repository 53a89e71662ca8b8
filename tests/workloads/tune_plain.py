"""A plain training script with TuneupCallback, for `tuneup tune` (tests and benchmarks/tune_live.py).

python tests/workloads/tune_plain.py [--namespace lightning|pytorch_lightning] [--devices N]
    [--hidden H] [--item-cost-us US] [--batch-size B] [--workers W] [--max-steps N] [--dirpath DIR]

--dirpath is given to TuneupCallback(dirpath=...), as the README's example does.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.workloads.tune_models import make_classes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namespace", default="lightning", choices=("lightning", "pytorch_lightning"))
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--item-cost-us", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--dirpath", default=None)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    L = importlib.import_module("lightning.pytorch" if args.namespace == "lightning" else "pytorch_lightning")
    from tuneup import TuneupCallback

    model_cls, data_cls = make_classes(L)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=args.strategy if args.devices > 1 else "auto",
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[TuneupCallback(dirpath=args.dirpath, count_flops=False)],
    )
    trainer.fit(
        model_cls(hidden=args.hidden),
        datamodule=data_cls(
            batch_size=args.batch_size, num_workers=args.workers, item_cost_us=args.item_cost_us
        ),
    )


if __name__ == "__main__":
    main()
