"""PyTorch Lightning integration: `TuneupCallback` and `TuneupDDPStrategy`.

The callback works in a `lightning.pytorch` Trainer and in a `pytorch_lightning` Trainer alike (it
subclasses the Callback of each namespace that is installed), and from a LightningCLI config
(`trainer.callbacks: [{class_path: tuneup.TuneupCallback}]`). The strategy exists once per namespace:
`TuneupDDPStrategy` (`lightning.pytorch`), `PLTuneupDDPStrategy` (`pytorch_lightning`), and by name as
`strategy="tuneup_ddp"` in either.
"""

from tuneup.plugins.lightning.callback import TuneupCallback
from tuneup.plugins.lightning.strategy import PLTuneupDDPStrategy, TuneupDDPStrategy

__all__ = ["PLTuneupDDPStrategy", "TuneupCallback", "TuneupDDPStrategy"]
