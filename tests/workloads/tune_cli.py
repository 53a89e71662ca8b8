"""A LightningCLI script for `tuneup tune`: the tune_models MLP and datamodule, knobs as CLI overrides.

    python tests/workloads/tune_cli.py NAMESPACE fit [--trainer.devices=2 --data.item_cost_us=200 ...]

NAMESPACE is lightning or pytorch_lightning. TuneupCallback is not in the script: the tuner adds it
(`--trainer.callbacks+=tuneup.TuneupCallback`) when the resolved config has none.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.workloads.tune_models import make_classes


def main() -> None:
    import torch

    torch.set_num_threads(1)
    namespace = sys.argv[1]
    L = importlib.import_module("lightning.pytorch" if namespace == "lightning" else "pytorch_lightning")
    cli_module = importlib.import_module(f"{L.__name__}.cli")
    model_cls, data_cls = make_classes(L)
    cli_module.LightningCLI(
        model_cls,
        data_cls,
        args=sys.argv[2:],
        trainer_defaults={
            "accelerator": "cpu",
            "max_steps": 400,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
        },
        save_config_callback=None,
    )


if __name__ == "__main__":
    main()
