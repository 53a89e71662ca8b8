"""`TuneupDDPStrategy`: Lightning's DDPStrategy with gradient compression or local SGD, and a safeguard.

The work is `tuneup.sync`'s; this adapter hooks it into Lightning's strategy: the comm hook is
registered right after DDP wraps the model (on every device: Lightning's own `ddp_comm_hook` is applied
on CUDA only), the training step's loss feeds the safeguard, and the optimizer step drives the rest
(warm-up, averaging, checks, fallback). With `TuneupCallback` in the same Trainer, the callback's probe
times the hook (it wraps `register_comm_hook`, so there is one hook, timed) and the callback records the
strategy's events and summary in the run.

A strategy belongs to one Lightning namespace (a `pytorch_lightning` Trainer rejects a `lightning.pytorch`
strategy): `TuneupDDPStrategy` is `lightning.pytorch`'s (`pytorch_lightning`'s where only that is
installed), `PLTuneupDDPStrategy` is `pytorch_lightning`'s. By name, `strategy="tuneup_ddp"` (or
`"tuneup_ddp_spawn"`) works in either, once tuneup's Lightning plugin is imported (`from tuneup import
TuneupCallback` does it).
"""

from __future__ import annotations

import importlib
from typing import Any

from tuneup._log import warn_once
from tuneup.sync.config import SyncConfig

STRATEGY_NAMES = {"tuneup_ddp": "popen", "tuneup_ddp_spawn": "spawn"}


def _strategy_class(namespace: str, name: str) -> type:
    base = importlib.import_module(f"{namespace}.strategies").DDPStrategy

    class Strategy(base):  # type: ignore[misc, valid-type]
        """DDP with gradient compression or local SGD, guarded against hurting convergence.

        Args:
            compression: "none", "fp16", "bf16" (NCCL only) or "powersgd".
            powersgd_rank: PowerSGD's approximation rank (1-4 usual).
            error_feedback: PowerSGD carries what compression left out into the next step.
            warmup_steps: optimizer steps of exact all-reduce before compression or local steps start
                (at least 2 for PowerSGD and local SGD: DDP rebuilds its buckets at iteration 1).
            local_sgd_period: H; after the warm-up, average the parameters every H steps instead of the
                gradients every step. Exclusive with compression.
            hierarchical: with local SGD, average gradients within each node every step and parameters
                across nodes every H steps. None: when the job has more than one node.
            ranks_per_node: override the ranks per node (devices per node); to simulate nodes on one host.
            check_every_n_steps: the safeguard's check interval (0: off); it doubles after clean checks.
            breaches_to_fall_back: breached checks in a row that make it fall back.
            max_compression_error: bound on the relative error of the compressed average of a bucket
                against its exact all-reduce.
            max_divergence: bound on the ranks' parameter spread at a local SGD average, relative to how
                far the average moved since the last one.
            max_loss_rise: bound on the mean loss since the last check over the lowest earlier check's,
                as a fraction of it.
            **kwargs: DDPStrategy's own arguments (accelerator, start_method, bucket_cap_mb, ...).
        """

        def __init__(
            self,
            compression: str = "none",
            powersgd_rank: int = 4,
            error_feedback: bool = True,
            warmup_steps: int = 50,
            local_sgd_period: int | None = None,
            hierarchical: bool | None = None,
            ranks_per_node: int | None = None,
            check_every_n_steps: int = 10,
            breaches_to_fall_back: int = 3,
            max_compression_error: float = 0.95,
            max_divergence: float = 2.0,
            max_loss_rise: float = 0.5,
            **kwargs: Any,
        ) -> None:
            self.sync_config = SyncConfig(
                compression=compression,
                powersgd_rank=powersgd_rank,
                error_feedback=error_feedback,
                warmup_steps=warmup_steps,
                local_sgd_period=local_sgd_period,
                hierarchical=hierarchical,
                ranks_per_node=ranks_per_node,
                check_every_n_steps=check_every_n_steps,
                breaches_to_fall_back=breaches_to_fall_back,
                max_compression_error=max_compression_error,
                max_divergence=max_divergence,
                max_loss_rise=max_loss_rise,
            )
            if self.sync_config.active and (
                kwargs.get("ddp_comm_hook") or kwargs.get("model_averaging_period")
            ):
                raise ValueError(
                    f"{type(self).__name__}: {self.sync_config.label} installs its own DDP comm hook and "
                    "averaging; drop ddp_comm_hook / model_averaging_period, or use compression='none'"
                )
            super().__init__(**kwargs)
            self.sync: Any = None  # tuneup.sync.controller.SyncController, once DDP wraps the model

        def configure_ddp(self) -> None:
            super().configure_ddp()
            if self.sync_config.active:
                import torch.distributed as dist

                from tuneup.sync.averaging import Topology
                from tuneup.sync.controller import SyncController

                topology = Topology(
                    world_size=self.world_size,
                    rank=self.global_rank,
                    ranks_per_node=self.sync_config.ranks_per_node or self.num_processes,
                )
                self.sync = SyncController(
                    self.sync_config, self.model, topology, str(dist.get_backend()), device=self.root_device
                )
            elif self._ddp_comm_hook is not None and self.root_device.type != "cuda":
                # Lightning registers ddp_comm_hook on CUDA only and drops it elsewhere, silently.
                hook = self._ddp_comm_hook
                if self._ddp_comm_wrapper is not None:
                    hook = self._ddp_comm_wrapper(hook)
                self.model.register_comm_hook(self._ddp_comm_state, hook)

        def training_step(self, *args: Any, **kwargs: Any) -> Any:
            output = super().training_step(*args, **kwargs)
            if self.sync is not None:
                self.sync.observe_loss(output)
            return output

        def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
            output = super().optimizer_step(optimizer, closure, model, **kwargs)
            if self.sync is not None:
                self.sync.after_optimizer_step(optimizer)
            return output

        def on_train_end(self) -> None:
            super().on_train_end()
            if self.sync is not None:
                # After local steps the ranks hold different parameters: the model that training leaves
                # (and rank 0 saves) is their average.
                self.sync.finish()

        # -- read by TuneupCallback (duck-typed: the callback does not import this module) ---------------

        def tuneup_sync_events(self) -> list[tuple[str, dict[str, Any]]]:
            return self.sync.take_events() if self.sync is not None else []

        def tuneup_sync_summary(self) -> dict[str, Any] | None:
            return self.sync.summary() if self.sync is not None else None

    Strategy.__name__ = Strategy.__qualname__ = name
    Strategy.__module__ = __name__
    _register(namespace, Strategy)
    return Strategy


def _register(namespace: str, cls: type) -> None:
    try:
        registry = importlib.import_module(f"{namespace}.strategies").StrategyRegistry
        for name, start_method in STRATEGY_NAMES.items():
            if name not in registry:
                registry.register(
                    name,
                    cls,
                    description=f"tuneup's DDP (compression, local SGD, safeguard), start_method {start_method!r}",
                    start_method=start_method,
                )
    except Exception as exc:  # the classes still work by instance
        warn_once(f"strategy-register:{namespace}", f"cannot register tuneup_ddp with {namespace} ({exc})")


def _available(namespace: str) -> bool:
    try:
        importlib.import_module(f"{namespace}.strategies")
    except ImportError:
        return False
    return True


if _available("pytorch_lightning"):
    PLTuneupDDPStrategy = _strategy_class("pytorch_lightning", "PLTuneupDDPStrategy")
if _available("lightning.pytorch"):
    TuneupDDPStrategy = _strategy_class("lightning.pytorch", "TuneupDDPStrategy")
else:
    TuneupDDPStrategy = PLTuneupDDPStrategy
