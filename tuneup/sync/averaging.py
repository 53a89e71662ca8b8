"""Local SGD's parameter averaging, and the process groups of a hierarchical job.

Ranks r = node * ranks_per_node + local (Lightning's and torchrun's numbering). A hierarchical job
averages gradients within each node every step (the DDP hook's "local" mode, over the node's group) and
parameters across nodes every H steps, over the cross-node group of its local rank ({local, local + L,
...}): ranks of one node hold the same parameters, so that average is the global one, and the slow link
carries one model's bytes every H steps instead of one gradient's every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tuneup.collect.comm import PARAM_AVERAGING, collectives_as


@dataclass(frozen=True)
class Topology:
    world_size: int
    rank: int
    ranks_per_node: int

    def __post_init__(self) -> None:
        if self.world_size % self.ranks_per_node:
            raise ValueError(
                f"ranks_per_node={self.ranks_per_node} does not divide the world size {self.world_size}: "
                "every node must hold the same number of ranks"
            )

    @property
    def nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    @property
    def node(self) -> int:
        return self.rank // self.ranks_per_node

    def node_ranks(self, node: int) -> list[int]:
        return list(range(node * self.ranks_per_node, (node + 1) * self.ranks_per_node))

    def cross_ranks(self, local: int) -> list[int]:
        return [node * self.ranks_per_node + local for node in range(self.nodes)]


def make_groups(topology: Topology) -> tuple[Any, Any]:
    """(this rank's node group, its cross-node group). Every rank creates every group, in one order, as
    torch.distributed.new_group requires."""
    import torch.distributed as dist

    node_group = cross_group = None
    for node in range(topology.nodes):
        group = dist.new_group(topology.node_ranks(node))
        if node == topology.node:
            node_group = group
    for local in range(topology.ranks_per_node):
        group = dist.new_group(topology.cross_ranks(local))
        if local == topology.rank % topology.ranks_per_node:
            cross_group = group
    return node_group, cross_group


class ParameterAverager:
    """Averages a set of parameters over a group; optionally measures, first, how far apart the ranks had
    drifted (the safeguard's divergence)."""

    def __init__(self, group: Any, group_size: int, scope: str | None) -> None:
        self.group = group
        self.group_size = group_size
        self.scope = scope
        self._last_average: Any = None
        self.sent_bytes = 0

    def average(self, params: list[Any], measure: bool) -> float | None:
        """Average `params` in place; with `measure`, return the ranks' spread around the average (root
        mean square over ranks) relative to how far the average moved since the last averaging."""
        import torch
        import torch.distributed as dist

        if not params:
            return None
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in params])
            before = flat.clone() if measure else None
            flat.div_(self.group_size)
            with collectives_as(PARAM_AVERAGING, self.scope):
                dist.all_reduce(flat, group=self.group)
            self.sent_bytes += flat.numel() * flat.element_size()
            offset = 0
            for p in params:
                n = p.numel()
                p.detach().copy_(flat[offset : offset + n].view_as(p))
                offset += n
            divergence = None
            if measure and before is not None:
                spread = torch.stack(
                    [torch.linalg.vector_norm(before - flat).float() ** 2, torch.ones((), device=flat.device)]
                )
                dist.all_reduce(spread, group=self.group)
                rms_spread = math.sqrt(float(spread[0]) / max(1.0, float(spread[1])))
                if self._last_average is not None:
                    moved = float(torch.linalg.vector_norm(flat - self._last_average))
                    divergence = rms_spread / moved if moved > 0 else (0.0 if rms_spread == 0 else math.inf)
            # Kept for the next measure (one copy of the parameters, every H steps).
            self._last_average = flat.clone()
        return divergence
