"""How many samples and tokens a batch holds.

Users with unusual batches pass `batch_size_fn` / `tokens_fn`. Otherwise the size is read from the first
tensor found (depth-first through dicts, tuples, lists and dataclass-like objects), and tokens from an
integer matrix (token ids) when there is one: `input_ids` by name first, else the first 2-D integer tensor.
Only shapes are read, never values, so nothing here waits for the GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tuneup._log import warn_once

_MAX_DEPTH = 4
_TOKEN_KEYS = ("input_ids", "tokens", "token_ids", "idx", "x")


def _is_tensor(obj: Any) -> bool:
    # Duck-typed so this module needs no torch import: torch.Tensor and numpy arrays both qualify.
    return hasattr(obj, "shape") and hasattr(obj, "dtype") and not isinstance(obj, type)


def _children(obj: Any) -> list[Any]:
    if isinstance(obj, Mapping):
        return list(obj.values())
    if isinstance(obj, (str, bytes)):
        return []
    if isinstance(obj, Sequence):
        return list(obj)
    return []


def _tensors(obj: Any, depth: int = 0) -> list[Any]:
    if _is_tensor(obj):
        return [obj]
    if depth >= _MAX_DEPTH:
        return []
    found: list[Any] = []
    for child in _children(obj):
        found.extend(_tensors(child, depth + 1))
    return found


def _is_integer(tensor: Any) -> bool:
    dtype = str(tensor.dtype)
    return "int" in dtype and "uint8" not in dtype  # uint8 is nearly always image data, not token ids


def infer_batch_size(batch: Any) -> int | None:
    for tensor in _tensors(batch):
        shape = tuple(tensor.shape)
        if shape:
            return int(shape[0])
    return None


def infer_tokens(batch: Any) -> int | None:
    if isinstance(batch, Mapping):
        for key in _TOKEN_KEYS:
            value = batch.get(key)
            if _is_tensor(value) and len(value.shape) == 2 and _is_integer(value):
                return int(value.shape[0] * value.shape[1])
    for tensor in _tensors(batch):
        if len(tensor.shape) == 2 and _is_integer(tensor):
            return int(tensor.shape[0] * tensor.shape[1])
    return None


class BatchCounter:
    """Counts samples and tokens of batches, with the user's functions when given."""

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int] | None = None,
        tokens_fn: Callable[[Any], int | None] | None = None,
    ) -> None:
        self.batch_size_fn = batch_size_fn
        self.tokens_fn = tokens_fn

    def samples(self, batch: Any) -> int | None:
        if self.batch_size_fn is not None:
            return self._call(self.batch_size_fn, batch, "batch_size_fn")
        size = infer_batch_size(batch)
        if size is None:
            warn_once(
                "batch-size",
                f"cannot tell the batch size of a {type(batch).__name__} batch; samples/s will be missing. "
                "Pass TuneupCallback(batch_size_fn=lambda batch: ...) to count samples.",
            )
        return size

    def tokens(self, batch: Any) -> int | None:
        if self.tokens_fn is not None:
            return self._call(self.tokens_fn, batch, "tokens_fn")
        return infer_tokens(batch)

    @staticmethod
    def _call(fn: Callable[[Any], int | None], batch: Any, name: str) -> int | None:
        try:
            value = fn(batch)
        except Exception as exc:
            warn_once(f"{name}-raised", f"{name} raised {type(exc).__name__}: {exc}; the count is left out")
            return None
        if value is None:
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            warn_once(f"{name}-type", f"{name} returned {value!r}, not an integer; the count is left out")
            return None
