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


Path = tuple[Any, ...]  # keys and indices from the batch down to one tensor


def _is_tensor(obj: Any) -> bool:
    # Duck-typed so this module needs no torch import: torch.Tensor and numpy arrays both qualify.
    return hasattr(obj, "shape") and hasattr(obj, "dtype") and not isinstance(obj, type)


def _children(obj: Any) -> list[tuple[Any, Any]]:
    if isinstance(obj, Mapping):
        return list(obj.items())
    if isinstance(obj, (str, bytes)):
        return []
    if isinstance(obj, Sequence):
        return list(enumerate(obj))
    return []


def _tensor_paths(obj: Any, path: Path = (), depth: int = 0) -> list[tuple[Path, Any]]:
    if _is_tensor(obj):
        return [(path, obj)]
    if depth >= _MAX_DEPTH:
        return []
    found: list[tuple[Path, Any]] = []
    for key, child in _children(obj):
        found.extend(_tensor_paths(child, (*path, key), depth + 1))
    return found


def _follow(obj: Any, path: Path) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def _is_integer(tensor: Any) -> bool:
    dtype = str(tensor.dtype)
    return "int" in dtype and "uint8" not in dtype  # uint8 is nearly always image data, not token ids


def _size_path(batch: Any) -> Path | None:
    for path, tensor in _tensor_paths(batch):
        if len(tensor.shape):
            return path
    return None


def _token_path(batch: Any) -> Path | None:
    if isinstance(batch, Mapping):
        for key in _TOKEN_KEYS:
            value = batch.get(key)
            if _is_tensor(value) and len(value.shape) == 2 and _is_integer(value):
                return (key,)
    for path, tensor in _tensor_paths(batch):
        if len(tensor.shape) == 2 and _is_integer(tensor):
            return path
    return None


def infer_batch_size(batch: Any) -> int | None:
    path = _size_path(batch)
    return None if path is None else int(_follow(batch, path).shape[0])


def infer_tokens(batch: Any) -> int | None:
    path = _token_path(batch)
    if path is None:
        return None
    shape = _follow(batch, path).shape
    return int(shape[0] * shape[1])


_UNKNOWN = object()


class BatchCounter:
    """Counts samples and tokens of batches, with the user's functions when given.

    Where the size and the token ids sit in a batch is found once and then followed directly: batches of
    one dataloader share their structure, and walking every batch costs tens of microseconds a step.
    A batch where the remembered place holds no suitable tensor is searched afresh.
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int] | None = None,
        tokens_fn: Callable[[Any], int | None] | None = None,
    ) -> None:
        self.batch_size_fn = batch_size_fn
        self.tokens_fn = tokens_fn
        self._size_path: Any = _UNKNOWN
        self._token_path: Any = _UNKNOWN

    def samples(self, batch: Any) -> int | None:
        if self.batch_size_fn is not None:
            return self._call(self.batch_size_fn, batch, "batch_size_fn")
        path = self._size_path
        if path is not _UNKNOWN and path is not None:
            # Every micro-batch: the remembered path, one shape read, no type checks (a wrong guess
            # raises, and the batch is searched again below).
            try:
                obj = batch
                for key in path:
                    obj = obj[key]
                shape = obj.shape
                if len(shape):
                    return int(shape[0])
            except (KeyError, IndexError, TypeError, AttributeError):
                pass
        self._size_path = _size_path(batch)
        if self._size_path is None:
            warn_once(
                "batch-size",
                f"cannot tell the batch size of a {type(batch).__name__} batch; samples/s will be missing. "
                "Pass TuneupCallback(batch_size_fn=lambda batch: ...) to count samples.",
            )
            return None
        return int(_follow(batch, self._size_path).shape[0])

    def tokens(self, batch: Any) -> int | None:
        if self.tokens_fn is not None:
            return self._call(self.tokens_fn, batch, "tokens_fn")
        if self._token_path is None:
            return None  # the first batch held no token ids: a model that is not a language model
        if self._token_path is not _UNKNOWN:
            try:
                tensor = _follow(batch, self._token_path)
                if _is_tensor(tensor) and len(tensor.shape) == 2:
                    return int(tensor.shape[0] * tensor.shape[1])
            except (KeyError, IndexError, TypeError):
                pass
        self._token_path = _token_path(batch)
        return None if self._token_path is None else infer_tokens(batch)

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
