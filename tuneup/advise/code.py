"""The exact code that applies a recommendation: Trainer, DataLoader and strategy arguments in Python, and
the same as a LightningCLI YAML fragment. One function per kind of knob; the run's own Lightning
namespace (`lightning.pytorch` or `pytorch_lightning`) is the one imported."""

from __future__ import annotations

from collections.abc import Mapping


def _namespace(namespace: str | None) -> str:
    return namespace if namespace in ("lightning.pytorch", "pytorch_lightning") else "lightning.pytorch"


def _value(v: object) -> str:
    return repr(v)


def trainer_args(namespace: str | None, args: Mapping[str, object]) -> tuple[str, str]:
    """(Python, YAML) for Trainer arguments."""
    ns = _namespace(namespace)
    shown = ", ".join(f"{k}={_value(v)}" for k, v in args.items())
    python = f"from {ns} import Trainer\n\ntrainer = Trainer(..., {shown})"
    yaml = "trainer:\n" + "".join(f"  {k}: {_yaml(v)}\n" for k, v in args.items())
    return python, yaml.rstrip("\n")


def dataloader_args(args: Mapping[str, object]) -> tuple[str, str]:
    """(Python, YAML) for DataLoader arguments; the YAML assumes a DataModule that takes them as init
    arguments (LightningCLI passes `data:` keys to the DataModule)."""
    shown = ", ".join(f"{k}={_value(v)}" for k, v in args.items())
    python = f"from torch.utils.data import DataLoader\n\nloader = DataLoader(dataset, ..., {shown})"
    yaml = "data:\n" + "".join(f"  {k}: {_yaml(v)}\n" for k, v in args.items())
    return python, yaml.rstrip("\n")


def batch_size(namespace: str | None, batch: int, accumulation: int | None) -> tuple[str, str]:
    """A per-rank batch size (Lightning's BatchSizeFinder convention: the DataLoader's batch_size, or a
    `batch_size` attribute the module or DataModule builds it from) and, where it changes, accumulation."""
    python, yaml = dataloader_args({"batch_size": batch})
    python += "  # per rank"
    if accumulation is not None:
        trainer_python, trainer_yaml = trainer_args(namespace, {"accumulate_grad_batches": accumulation})
        python, yaml = f"{python}\n\n{trainer_python}", f"{yaml}\n{trainer_yaml}"
    return python, yaml


def ddp_strategy(namespace: str | None, kwargs: Mapping[str, str]) -> tuple[str, str]:
    """(Python, YAML) for a DDPStrategy with arguments; values are Python expressions (a hook's import
    path), written as such in Python and as strings in YAML."""
    ns = _namespace(namespace)
    imports = [f"from {ns} import Trainer", f"from {ns}.strategies import DDPStrategy"]
    if any("default_hooks." in v for v in kwargs.values()):
        imports.append("from torch.distributed.algorithms.ddp_comm_hooks import default_hooks")
    args = ", ".join(f"{k}={v}" for k, v in kwargs.items())
    python = "\n".join(imports) + f"\n\ntrainer = Trainer(..., strategy=DDPStrategy({args}))"
    yaml = f"trainer:\n  strategy:\n    class_path: {ns}.strategies.DDPStrategy\n    init_args:\n" + "".join(
        f"      {k}: {_yaml_expr(v)}\n" for k, v in kwargs.items()
    )
    return python, yaml.rstrip("\n")


# tuneup's DDP strategy (compression, local SGD, a safeguard) exists once per Lightning namespace: a Trainer
# rejects a strategy of the other one.
SYNC_STRATEGY_MODULE = "tuneup.plugins.lightning.strategy"
SYNC_STRATEGY_CLASS = {"lightning.pytorch": "TuneupDDPStrategy", "pytorch_lightning": "PLTuneupDDPStrategy"}


def sync_strategy(namespace: str | None, kwargs: Mapping[str, object]) -> tuple[str, str]:
    """(Python, YAML) for tuneup's DDP strategy of the run's namespace with arguments (SyncConfig's
    fields, DDPStrategy's own); values are plain values, not expressions."""
    ns = _namespace(namespace)
    cls = SYNC_STRATEGY_CLASS[ns]
    args = ", ".join(f"{k}={_python(v)}" for k, v in kwargs.items())
    python = (
        f"from {ns} import Trainer\nfrom tuneup.plugins.lightning import {cls}\n\n"
        f"trainer = Trainer(..., strategy={cls}({args}))"
    )
    yaml = f"trainer:\n  strategy:\n    class_path: {SYNC_STRATEGY_MODULE}.{cls}\n    init_args:\n" + "".join(
        f"      {k}: {_yaml(v)}\n" for k, v in kwargs.items()
    )
    return python, yaml.rstrip("\n")


def _python(v: object) -> str:
    # Double quotes, as the formatters of most projects write strings.
    return f'"{v}"' if isinstance(v, str) else repr(v)


def _yaml(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _yaml_expr(v: str) -> str:
    # A hook's import path, as jsonargparse resolves callables.
    v = v.replace("default_hooks.", "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.")
    return v


def shell_env(variables: Mapping[str, str | None], where: str) -> str:
    """A shell line that sets (or, for a None value, unsets) NCCL's and the like's environment variables,
    with where it must run: every rank's environment, before the process group starts."""
    sets = " ".join(f"{k}={v}" for k, v in variables.items() if v is not None)
    unsets = " ".join(k for k, v in variables.items() if v is None)
    lines = [f"# {where}"]
    if unsets:
        lines.append(f"unset {unsets}")
    if sets:
        lines.append(f"export {sets}")
    return "\n".join(lines)


def model_checkpoint(
    namespace: str | None, every_n_train_steps: int, train_time_interval_s: float | None = None
) -> tuple[str, str]:
    """(Python, YAML) for a ModelCheckpoint that saves every N training steps and keeps `last.ckpt` (what a
    restart resumes from: `trainer.fit(..., ckpt_path="last")`); the time-based form, where given, as a
    comment beside it."""
    ns = _namespace(namespace)
    python = (
        f"from {ns} import Trainer\nfrom {ns}.callbacks import ModelCheckpoint\n\n"
        f"checkpoint = ModelCheckpoint(every_n_train_steps={every_n_train_steps}, save_last=True)\n"
    )
    if train_time_interval_s is not None:
        python += (
            "# or by wall time: ModelCheckpoint(train_time_interval=datetime.timedelta("
            f"seconds={round(train_time_interval_s)}), save_last=True)\n"
        )
    python += 'trainer = Trainer(..., callbacks=[checkpoint])\ntrainer.fit(model, ..., ckpt_path="last")'
    yaml = (
        "trainer:\n  callbacks:\n"
        f"    - class_path: {ns}.callbacks.ModelCheckpoint\n      init_args:\n"
        f"        every_n_train_steps: {every_n_train_steps}\n        save_last: true\n"
        "ckpt_path: last"
    )
    return python, yaml
