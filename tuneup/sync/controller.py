"""What a synchronisation strategy does at each optimizer step: start compressing or stepping locally after
the warm-up, average parameters every H steps, run the safeguard's checks, and fall back when they say so.

Every decision here is taken alike on every rank, or the ranks would issue different collectives and hang:
the step counts are the same everywhere, and a check decides from values all-reduced first (the loss of
each rank's data differs; the errors are computed from averaged tensors, equal everywhere, and are
all-reduced anyway).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from tuneup._log import warn_once
from tuneup.sync.averaging import ParameterAverager, Topology, make_groups
from tuneup.sync.config import SyncConfig
from tuneup.sync.hook import COMPRESSED_MODES, HookState, sync_hook
from tuneup.sync.powersgd import PowerSGD
from tuneup.sync.safeguard import Safeguard

# Clean checks in a row after which the interval between checks doubles (up to MAX_BACKOFF times the
# configured one): checking costs one exact all-reduce of a bucket, and a run that has stayed healthy
# needs it less. A breached check brings the configured interval back.
CLEAN_CHECKS_TO_BACK_OFF = 5
MAX_BACKOFF = 8
MAX_PENDING_EVENTS = 10_000
MAX_HISTORY = 2_000


class SyncController:
    def __init__(
        self, config: SyncConfig, ddp_model: Any, topology: Topology, backend: str, device: Any = "cpu"
    ) -> None:
        import torch.distributed as dist

        if config.compression == "bf16" and backend.lower() != "nccl":
            raise ValueError(
                f"compression='bf16' needs the NCCL backend: {backend} cannot all-reduce bf16 tensors. "
                "Use compression='fp16' here, or bf16 on GPUs with NCCL."
            )
        self.config = config
        self.topology = topology
        group = getattr(ddp_model, "process_group", None) or dist.group.WORLD
        self.hierarchical = bool(
            config.hierarchical if config.hierarchical is not None else topology.nodes > 1
        )
        node_group = None
        self.averager: ParameterAverager | None = None
        if config.local_sgd_period is not None:
            if self.hierarchical and topology.nodes > 1:
                node_group, cross_group = make_groups(topology)
                self.averager = ParameterAverager(cross_group, topology.nodes, "cross_node")
            else:
                self.hierarchical = False
                self.averager = ParameterAverager(group, topology.world_size, None)
        self.target_mode = "local" if config.local_sgd_period is not None else config.compression
        powersgd = (
            PowerSGD(config.powersgd_rank, config.error_feedback)
            if config.compression == "powersgd"
            else None
        )
        self.state = HookState(
            "exact",
            group,
            topology.world_size,
            powersgd,
            node_group=node_group,
            node_size=topology.ranks_per_node,
        )
        self.safeguard = Safeguard.for_config(config)
        self.period = config.local_sgd_period
        self.step = 0  # optimizer steps taken (every optimizer's)
        self._optimizer_steps: dict[int, int] = {}  # per optimizer, since the local steps began
        self._interval = config.check_every_n_steps
        self._next_check = self._interval
        self._clean_in_row = 0
        self._loss_sum: Any = 0.0
        self._loss_count = 0
        # Where the check's figures are all-reduced: the rank's own device (NCCL takes CUDA tensors only),
        # also when no training_step returned a loss (manual optimization may return nothing).
        self._device: Any = device
        # Drained by TuneupCallback as they come; without it, only the latest are kept.
        self.events: deque[tuple[str, dict[str, Any]]] = deque(maxlen=MAX_PENDING_EVENTS)
        self.fallbacks: list[dict[str, Any]] = []
        self.started_at: int | None = None
        # Every trainable parameter, for the averages that end local steps (a fallback, the end of training).
        self._params = [p for p in ddp_model.parameters() if p.requires_grad]
        ddp_model.register_comm_hook(self.state, sync_hook)
        self.events.append(("sync_strategy", self.describe()))
        if config.start_step == 0:
            self._start()

    # -- the training's side ---------------------------------------------------------------------------

    def observe_loss(self, output: Any) -> None:
        """A training_step's output: its loss joins the mean the next check compares."""
        loss = output.get("loss") if isinstance(output, dict) else output
        if loss is None or not hasattr(loss, "detach") or loss.numel() != 1:
            return
        self._loss_sum = self._loss_sum + loss.detach().float().reshape(())
        self._loss_count += 1

    def after_optimizer_step(self, optimizer: Any) -> None:
        self.step += 1
        step = self.step
        if self.started_at is None:
            # The exact warm-up: its checks only take the loss, the level later checks compare with.
            if self._checking and step >= self._next_check:
                self._check(step, None)
            if step == self.config.start_step:
                self._start()  # from the next backward on
        elif self.state.mode == "local" and self.averager is not None and self.period is not None:
            key = id(optimizer)
            taken = self._optimizer_steps[key] = self._optimizer_steps.get(key, 0) + 1
            if taken % self.period == 0:
                measure = self._checking and step >= self._next_check
                divergence = self.averager.average(_parameters(optimizer), measure)
                if measure:
                    self._check(step, divergence)
        elif self._checking and step >= self._next_check:
            error = None
            if self.state.mode in COMPRESSED_MODES:
                error, self.state.check_error = self.state.check_error, None
            self._check(step, error)
        self.state.check_next = (
            self._checking and self.state.mode in COMPRESSED_MODES and step + 1 >= self._next_check
        )

    @property
    def _checking(self) -> bool:
        # During the warm-up the checks only take the loss (the level later checks compare with); after a
        # fallback to exact averaging there is nothing left to check.
        if self.config.check_every_n_steps <= 0:
            return False
        return self.started_at is None or self.state.mode != "exact"

    # -- decisions -------------------------------------------------------------------------------------

    def _start(self) -> None:
        self.state.mode = self.target_mode
        self.started_at = self.step
        self._optimizer_steps.clear()
        self.events.append(
            ("sync_started", {"step": self.step, "mode": self.target_mode, "label": self.config.label})
        )

    def _check(self, step: int, error: float | None) -> None:
        import torch
        import torch.distributed as dist

        # The rank's loss sum (a tensor on its device: read here, not at every step), loss count and
        # error, summed over the ranks in one small all-reduce.
        measured = error is not None
        values = torch.tensor(
            [0.0, float(self._loss_count), error if measured else 0.0, float(measured)],
            dtype=torch.float64,
            device=self._device,
        )
        values[0] += self._loss_sum.to(values) if torch.is_tensor(self._loss_sum) else float(self._loss_sum)
        dist.all_reduce(values, group=self.state.group)
        total, count, error_sum, errors = values.tolist()
        self._loss_sum, self._loss_count = 0.0, 0
        loss = total / count if count else None
        error = error_sum / errors if errors else None
        if self.started_at is None:
            # The exact warm-up: its losses set the level the checks after it compare with.
            self.safeguard.observe_loss_only(loss)
            self._next_check = step + self._interval
            return
        check = self.safeguard.observe(step, error, loss)
        self.events.append(("sync_check", check.to_dict()))
        if check.breached:
            self._clean_in_row = 0
            self._interval = self.config.check_every_n_steps
        else:
            self._clean_in_row += 1
            if self._clean_in_row >= CLEAN_CHECKS_TO_BACK_OFF:
                self._clean_in_row = 0
                self._interval = min(self._interval * 2, self.config.check_every_n_steps * MAX_BACKOFF)
        self._next_check = step + self._interval
        if check.fall_back:
            self._fall_back(step, check.reasons)

    def _fall_back(self, step: int, reasons: tuple[str, ...]) -> None:
        before = self.describe_mode()
        if self.state.mode == "local" and self.period is not None and self.period // 2 >= 2:
            self.period //= 2
            self._optimizer_steps.clear()
        else:
            if self.state.mode == "local" and self.averager is not None:
                # The ranks' parameters differ after local steps: make them one again before exact
                # gradient averaging takes over (which would keep any difference forever).
                self._average_all_parameters()
            self.state.mode = "exact"
        after = self.describe_mode()
        event = {"step": step, "from": before, "to": after, "reasons": list(reasons)}
        self.fallbacks.append(event)
        self.events.append(("sync_fallback", event))
        warn_once(
            f"sync-fallback:{after}",
            f"the safeguard of {self.config.label} fell back to {after} at step {step}: {'; '.join(reasons)}",
        )

    def _average_all_parameters(self) -> None:
        if self.averager is not None:
            self.averager.average(self._params, measure=False)

    def finish(self) -> None:
        """At the end of training: make the ranks' parameters one again if local steps left them apart."""
        if self.state.mode == "local":
            # (After TuneupCallback has closed its record: Lightning calls the callbacks' on_train_end
            # before the strategy's.)
            self._average_all_parameters()

    # -- what it did -----------------------------------------------------------------------------------

    def describe_mode(self) -> str:
        mode = self.state.mode
        if mode == "local":
            return f"local SGD, H={self.period}" + (" (hierarchical)" if self.hierarchical else "")
        if mode == "powersgd":
            return self.config.label
        return "exact all-reduce" if mode == "exact" else f"{mode} compression"

    def describe(self) -> dict[str, Any]:
        return {
            "label": self.config.label,
            "config": self.config.to_dict(),
            "start_step": self.config.start_step,
            "hierarchical": self.hierarchical,
            "nodes": self.topology.nodes,
            "ranks_per_node": self.topology.ranks_per_node,
        }

    def summary(self) -> dict[str, Any]:
        s = self.state
        return {
            **self.describe(),
            "steps": self.step,
            "started_at": self.started_at,
            "mode_at_end": self.describe_mode(),
            "hook_iterations": s.iteration,
            "exact_bytes": s.exact_bytes,
            "sent_bytes": s.sent_bytes,
            "check_bytes": s.check_bytes,
            "param_avg_bytes": self.averager.sent_bytes if self.averager is not None else 0,
            "checks": len(self.safeguard.checks),
            "breached_checks": sum(1 for c in self.safeguard.checks if c.breached),
            "fallbacks": list(self.fallbacks),
            # The latest checks at full precision (the events round their figures).
            "check_history": [[c.step, c.error, c.loss] for c in self.safeguard.checks[-MAX_HISTORY:]],
        }

    def take_events(self) -> list[tuple[str, dict[str, Any]]]:
        taken = list(self.events)
        self.events.clear()
        return taken


def _parameters(optimizer: Any) -> list[Any]:
    return [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
