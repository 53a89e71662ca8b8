"""Counting the floating-point operations of one training micro-batch, once, with torch's FlopCounterMode.

FlopCounterMode is a dispatch mode: every op of the counted micro-batch (forward, backward, and the
optimizer step when it falls in it) goes through Python, so that micro-batch runs several times slower.
That is why it counts one micro-batch only, at the start of training, where the warm-up already is;
the analysis multiplies by the micro-batches of each step. It counts matrix products, convolutions and
attention (the operations that set a model's FLOPs, and the ones a GPU's peak is quoted for); element-wise
work is left out, as MFU conventions do.
"""

from __future__ import annotations

from typing import Any

from tuneup._log import warn_once


class MicroBatchFlopCounter:
    """`start()` before a micro-batch, `stop()` after it: the FLOPs of what ran in between, or None.

    Never raises: a model the counter cannot follow (an op without a formula, a custom autograd
    function that breaks under a dispatch mode) gives None and one warning, and training goes on.
    """

    def __init__(self) -> None:
        self._mode: Any = None

    @property
    def counting(self) -> bool:
        return self._mode is not None

    def start(self) -> None:
        if self._mode is not None:
            return
        try:
            from torch.utils.flop_counter import FlopCounterMode

            mode = FlopCounterMode(display=False)
            mode.__enter__()
            self._mode = mode
        except Exception as exc:
            warn_once("flops-start", f"cannot count FLOPs ({type(exc).__name__}: {exc}); MFU is left out")

    def stop(self) -> int | None:
        """The FLOPs counted since `start()`; None if nothing was being counted or counting failed."""
        mode, self._mode = self._mode, None
        if mode is None:
            return None
        try:
            mode.__exit__(None, None, None)
            return int(mode.get_total_flops())
        except Exception as exc:
            warn_once("flops-stop", f"cannot count FLOPs ({type(exc).__name__}: {exc}); MFU is left out")
            return None
