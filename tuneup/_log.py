"""Logging for tuneup: one logger, and warnings that are said once.

tuneup observes someone else's training. A failing sensor must not flood their log every step, so every
degradation is reported through `warn_once`, keyed by what failed.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("tuneup")

_said: set[str] = set()
_said_lock = threading.Lock()


def first_time(key: str) -> bool:
    """True the first time `key` is seen in this process."""
    with _said_lock:
        if key in _said:
            return False
        _said.add(key)
        return True


def warn_once(key: str, message: str, *, level: int = logging.WARNING) -> bool:
    """Log `message` the first time `key` is seen in this process; return whether it was logged."""
    if not first_time(key):
        return False
    logger.log(level, "tuneup: %s", message)
    return True


def info_once(key: str, message: str) -> bool:
    return warn_once(key, message, level=logging.INFO)


def reset_said() -> None:
    """Forget what was said (tests use this to observe a warning twice in one process)."""
    with _said_lock:
        _said.clear()
