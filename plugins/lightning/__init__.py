"""PyTorch Lightning integration: `TuneupCallback`.

The callback works in a `lightning.pytorch` Trainer and in a `pytorch_lightning` Trainer alike (it
subclasses the Callback of each namespace that is installed), and from a LightningCLI config
(`trainer.callbacks: [{class_path: tuneup.TuneupCallback}]`).
"""

from tuneup.plugins.lightning.callback import TuneupCallback

__all__ = ["TuneupCallback"]
