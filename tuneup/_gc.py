"""Pausing Python's cyclic garbage collector around work that makes millions of acyclic objects.

A run's records are millions of small objects without cycles. Each allocation burst triggers collections
that walk all of them again and again (nearly a third of the load time of a 1,024-rank run) and free
nothing; reference counting still frees whatever is dropped.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cyclic_gc_paused(collect_after_objects: int | None = None) -> Iterator[None]:
    """The collector off inside, back as it was after. With `collect_after_objects`, one full collection
    at the end when more objects than that were kept: left in the youngest generation they would be walked
    by a young, a middle and a full collection in turn; one collection moves them to the oldest at the
    cost of one. Nested inside another pause, it only pauses."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
            if collect_after_objects is not None and gc.get_count()[0] > collect_after_objects:
                gc.collect()
