"""LightningCLI with Lightning's BoringModel, for the strategy's YAML test:
`python sync_cli.py NAMESPACE --config CONFIG.yaml` (fit)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    # Read, not popped: DDP relaunches this command line as it is for the other ranks.
    namespace = sys.argv[1]
    cli = importlib.import_module(f"{namespace}.cli")
    boring = importlib.import_module(f"{namespace}.demos.boring_classes")
    cli.LightningCLI(boring.BoringModel, boring.BoringDataModule, args=["fit", *sys.argv[2:]])
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
