"""A tiny Lightning workload for tests: in-process (`fit(...)`) or as a script (DDP launches it again).

    python tests/workloads/tiny.py --out RUN_DIR [--namespace pytorch_lightning] [--devices 2] ...

Options inject delays where the tests need them: in the dataloader (`--slow-data-ms`), in
`training_step` (`--slow-step-ms`, on one rank with `--slow-rank`), in every all-gather and reduce-scatter
call on every rank (`--slow-gather-ms`, `--slow-scatter-ms`: FSDP's; from step `--slow-from-step` on, so
that one run holds the steps without delay to compare with), can make those collectives free on odd steps
(`--free-collectives-odd-steps`: a counterfactual, training's values go wrong), and can kill the process
(`--die-at-step`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


class RandomRegression(Dataset):
    def __init__(self, n: int = 256, dim: int = 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class SlowCollate:
    def __init__(self, delay_ms: float) -> None:
        self.delay_s = delay_ms / 1000.0

    def __call__(self, items: list[Any]) -> Any:
        if self.delay_s:
            time.sleep(self.delay_s)
        return torch.utils.data.default_collate(items)


# What the patched collectives do now (patch_collectives; set per batch by collectives_callback): "slow",
# the delays apply; "free", no communication at all.
_COLLECTIVES_NOW = {"slow": True, "free": False}
_GATHERS = ("all_gather_single", "all_gather_into_tensor")
_SCATTERS = ("reduce_scatter_single", "reduce_scatter_tensor")


def _local_result(gather: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The output's shape filled from this rank's input alone: a collective made free (values wrong)."""
    output = args[0] if args else kwargs.get("output", kwargs.get("output_tensor"))
    source = args[1] if len(args) > 1 else kwargs.get("input", kwargs.get("input_tensor"))
    if gather:
        copies = output.numel() // max(1, source.numel())
        output.view(copies, -1).copy_(source.reshape(1, -1).expand(copies, -1))
    else:
        output.view(-1).copy_(source.reshape(-1)[: output.numel()])


def patch_collectives(gather_ms: float, scatter_ms: float, free: bool) -> None:
    """Every all-gather and reduce-scatter that calls through `torch.distributed` (FSDP2's do), on the
    calling thread: delayed by `gather_ms` / `scatter_ms` (time the training thread waits in the call, as
    a slow link would make it), or, where `free` and `_COLLECTIVES_NOW["free"]`, not communicated at all
    (the counterfactual of free communication: training need not stay correct). Installed before the fit,
    so tuneup's own wrappers time it."""
    import functools

    dist = torch.distributed
    for name in (*_GATHERS, *_SCATTERS):
        original = getattr(dist, name, None)
        delay_ms = gather_ms if name in _GATHERS else scatter_ms
        if original is None or not (delay_ms or free):
            continue

        def patched(
            *args: Any,
            _original: Any = original,
            _delay_s: float = delay_ms / 1000.0,
            _gather: bool = name in _GATHERS,
            **kwargs: Any,
        ) -> Any:
            if _COLLECTIVES_NOW["free"] and not kwargs.get("async_op"):
                _local_result(_gather, args, kwargs)
                return None
            # Sleep, then spin the last 2 ms: a loaded host wakes a sleeper late, and the test compares
            # the wait tuneup finds with the delay asked for.
            delay_s = _delay_s if _COLLECTIVES_NOW["slow"] else 0.0
            deadline = time.perf_counter() + delay_s
            if delay_s > 0.002:
                time.sleep(delay_s - 0.002)
            while time.perf_counter() < deadline:
                pass
            return _original(*args, **kwargs)

        setattr(dist, name, functools.wraps(original)(patched))


def lightning_namespace(name: str) -> Any:
    return importlib.import_module("lightning.pytorch" if name == "lightning" else "pytorch_lightning")


def user_hook(state, bucket):  # type: ignore[no-untyped-def]
    """A user's own DDP comm hook: average by dividing first, then summing (what allreduce_hook does).

    Unannotated on purpose: DDP rejects a hook whose annotations are not the GradBucket and Future
    classes themselves, and this module's `from __future__ import annotations` turns them into strings.
    """
    world = torch.distributed.get_world_size()
    work = torch.distributed.all_reduce(bucket.buffer().div_(world), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def comm_hook(name: str) -> tuple[Any, Any]:
    """(state, hook) for --comm-hook."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "fp16":
        return None, default_hooks.fp16_compress_hook
    if name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2
        )
        return state, powerSGD_hook.powerSGD_hook
    if name == "user":
        return None, user_hook
    raise ValueError(name)


def make_module(
    namespace: str,
    *,
    dim: int = 16,
    hidden: int = 32,
    slow_step_ms: float = 0.0,
    slow_rank: int = -1,
    die_at_step: int = -1,
    manual: bool = False,
    hook: str = "none",
    fsdp2: bool = False,
) -> Any:
    L = lightning_namespace(namespace)

    class TinyModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(dim, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
            )
            self.automatic_optimization = not manual

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            # Under torchrun, only the first attempt dies: the restart it causes then runs to the end.
            first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
            if die_at_step >= 0 and self.trainer.global_step >= die_at_step and first_attempt:
                os.kill(os.getpid(), signal.SIGKILL)
            if slow_step_ms and (slow_rank < 0 or self.global_rank == slow_rank):
                time.sleep(slow_step_ms / 1000.0)
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            if manual:
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
            return loss

        def on_fit_start(self) -> None:
            # Lightning ignores ddp_comm_hook off CUDA; on CPU a hook is registered on the DDP model here.
            if hook != "none":
                state, fn = comm_hook(hook)
                self.trainer.strategy.model.register_comm_hook(state, fn)

        def configure_model(self) -> None:
            if fsdp2:
                from torch.distributed.fsdp import fully_shard

                for layer in self.net:
                    if isinstance(layer, torch.nn.Linear):
                        fully_shard(layer, mesh=self.device_mesh["data_parallel"])
                fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return TinyModule()


def make_loader(*, batch_size: int = 8, slow_data_ms: float = 0.0, n: int = 256, dim: int = 16) -> DataLoader:
    return DataLoader(RandomRegression(n, dim), batch_size=batch_size, collate_fn=SlowCollate(slow_data_ms))


def make_trainer(
    namespace: str,
    callbacks: list[Any],
    *,
    max_steps: int,
    devices: int = 1,
    strategy: str = "auto",
    accumulate: int = 1,
    root: str | None = None,
    **kwargs: Any,
) -> Any:
    L = lightning_namespace(namespace)
    return L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        max_steps=max_steps,
        accumulate_grad_batches=accumulate,
        callbacks=callbacks,
        logger=kwargs.pop("logger", False),
        enable_checkpointing=kwargs.pop("enable_checkpointing", False),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        **kwargs,
    )


def collectives_callback(slow_from_step: int, free_odd_steps: bool, L: Any) -> Any:
    """Sets what the patched collectives do at each batch: delayed from training step `slow_from_step` on;
    free on odd steps where `free_odd_steps` (steps with and without communication interleaved, so the
    host's drift hits both alike)."""

    class _Collectives(L.Callback):
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            _COLLECTIVES_NOW["slow"] = trainer.global_step >= slow_from_step
            _COLLECTIVES_NOW["free"] = free_odd_steps and trainer.global_step % 2 == 1

    return _Collectives()


def progress_file_callback(path: str, L: Any) -> Any:
    """Appends the number of each finished optimizer step to `path` with one unbuffered write, so that a
    test that kills the process knows how far training got, whatever tuneup managed to write."""

    class _ProgressFile(L.Callback):
        def __init__(self) -> None:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            os.write(self.fd, f"{trainer.global_step - 1}\n".encode())

    return _ProgressFile()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", help="the run directory (default: $TUNEUP_DIR, as `tuneup bench` sets it)")
    p.add_argument("--namespace", default="lightning", choices=["lightning", "pytorch_lightning"])
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--slow-data-ms", type=float, default=0.0)
    p.add_argument("--slow-step-ms", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--die-at-step", type=int, default=-1)
    p.add_argument("--slow-gather-ms", type=float, default=0.0)
    p.add_argument("--slow-scatter-ms", type=float, default=0.0)
    p.add_argument("--slow-from-step", type=int, default=0)
    p.add_argument("--free-collectives-odd-steps", action="store_true")
    p.add_argument("--flush-every-steps", type=int, default=50)
    p.add_argument("--no-callback", action="store_true")
    p.add_argument("--comm-hook", default="none", choices=["none", "fp16", "powersgd", "user"])
    p.add_argument("--progress-file", help="append each finished optimizer step's number here, unbuffered")
    p.add_argument("--save-params", help="write the trained parameters here (torch.save), from rank 0")
    p.add_argument("--csv-log", help="log to a CSVLogger in this directory, every 4 steps")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.slow_gather_ms or args.slow_scatter_ms or args.free_collectives_odd_steps:
        patch_collectives(args.slow_gather_ms, args.slow_scatter_ms, args.free_collectives_odd_steps)

    from tuneup import TuneupCallback

    callbacks = (
        []
        if args.no_callback
        else [
            TuneupCallback(
                dirpath=args.out, flush_every_steps=args.flush_every_steps, telemetry_interval_s=0.2
            )
        ]
    )
    if args.progress_file:
        callbacks.append(progress_file_callback(args.progress_file, lightning_namespace(args.namespace)))
    if args.slow_from_step or args.free_collectives_odd_steps:
        callbacks.append(
            collectives_callback(
                args.slow_from_step, args.free_collectives_odd_steps, lightning_namespace(args.namespace)
            )
        )
    fsdp2 = args.strategy == "fsdp2"
    model = make_module(
        args.namespace,
        slow_step_ms=args.slow_step_ms,
        slow_rank=args.slow_rank,
        die_at_step=args.die_at_step,
        hook=args.comm_hook,
        fsdp2=fsdp2,
    )
    strategy: Any = args.strategy
    if fsdp2:
        # FSDP2 on CPU: fully_shard through ModelParallelStrategy (Lightning's FSDPStrategy refuses CPU).
        strategy = lightning_namespace(args.namespace).strategies.ModelParallelStrategy(
            data_parallel_size=args.devices, tensor_parallel_size=1
        )
    trainer = make_trainer(
        args.namespace,
        callbacks,
        max_steps=args.max_steps,
        devices=args.devices,
        strategy=strategy,
        accumulate=args.accumulate,
        root=str(Path(args.out or os.environ.get("TUNEUP_DIR", "run")).parent),
        **(
            {
                "logger": lightning_namespace(args.namespace).loggers.CSVLogger(
                    args.csv_log, name="", version=""
                ),
                "log_every_n_steps": 4,
            }
            if args.csv_log
            else {}
        ),
    )
    trainer.fit(model, make_loader(batch_size=args.batch_size, slow_data_ms=args.slow_data_ms, n=4096))
    if args.save_params and trainer.global_rank == 0 and not fsdp2:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.save_params)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # A gloo group left alive at interpreter exit can abort the process (see DESIGN.md).
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
