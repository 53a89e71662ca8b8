"""One "node" of a multi-node job simulated on one machine: launched by torchrun (`--nnodes=2
--node-rank=N`), one rank per node, recording to the *relative* run directory "run", so that each node's
working directory plays its own disk, or to the run directory given (a URL on object storage):
`python -m torch.distributed.run ... node_job.py NAMESPACE [DIRPATH]`."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    namespace = sys.argv[1]
    L = importlib.import_module(namespace)
    boring = importlib.import_module(f"{namespace}.demos.boring_classes")
    import torch.distributed as dist

    from tuneup import TuneupCallback

    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        num_nodes=2,
        strategy="ddp",
        max_steps=6,
        callbacks=[TuneupCallback(dirpath=sys.argv[2] if len(sys.argv) > 2 else "run")],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(boring.BoringModel(), boring.BoringDataModule())
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
