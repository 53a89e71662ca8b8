"""The processes of a job as the recording session sees them: this process's rank, how many there are, and
the one collective the session needs (a broadcast from rank 0, at the start of a fit, never per step).

An adapter hands the session its trainer's own (Lightning's strategy broadcasts through its process group);
`TorchRanks` is torch.distributed's default group, or one process where none is initialized.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tuneup._log import warn_once


class Ranks(Protocol):
    """This process among the job's: `broadcast(obj)` returns rank 0's `obj` on every rank."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def broadcast(self, obj: Any) -> Any: ...


@dataclass(frozen=True)
class TrainerRanks:
    """A trainer's own ranks and broadcast (e.g. Lightning's `trainer.strategy.broadcast`)."""

    rank: int
    world_size: int
    broadcast_fn: Callable[[Any], Any]

    def broadcast(self, obj: Any) -> Any:
        return self.broadcast_fn(obj) if self.world_size > 1 else obj


class TorchRanks:
    """torch.distributed's default process group; one process (rank 0 of 1) where none is initialized."""

    def __init__(self) -> None:
        self._dist: Any = None
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                self._dist = dist
        except ImportError:
            pass
        self.rank = int(self._dist.get_rank()) if self._dist else 0
        self.world_size = int(self._dist.get_world_size()) if self._dist else 1

    def broadcast(self, obj: Any) -> Any:
        if self._dist is None or self.world_size == 1:
            return obj
        box = [obj]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]


def local_rank_from_env(default: int = 0) -> int:
    """The rank on this node as launchers set it (torchrun's LOCAL_RANK), else `default`."""
    try:
        return int(os.environ.get("LOCAL_RANK", default))
    except ValueError:
        return default


def gather_hosts(world_size: int) -> list[str] | None:
    """Every rank's host name, by rank (one collective at setup), or None without a process group."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        hosts: list[Any] = [None] * world_size
        dist.all_gather_object(hosts, socket.gethostname())
        return [str(h) for h in hosts]
    except Exception as exc:  # every rank fails alike here; the record just lacks the hosts
        warn_once("gather-hosts", f"cannot gather the ranks' host names ({type(exc).__name__}: {exc})")
        return None
