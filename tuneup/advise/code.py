"""The exact code that applies a recommendation, in the API of the trainer that recorded the run.

The module's functions are the Lightning Trainer's: its, the DataLoader's and the strategy's arguments in
Python, and the same as a LightningCLI YAML fragment; the run's own Lightning namespace
(`lightning.pytorch` or `pytorch_lightning`) is the one imported. `for_run` gives each trainer's snippets,
one method per kind of knob: the Lightning Trainer's (those functions), Lightning Fabric's, the Hugging Face
Trainer's `TrainingArguments` and a plain PyTorch loop's, in Python only (YAML is LightningCLI's). A knob
only the Lightning Trainer has (tuneup's TuneupDDPStrategy) is said to need it, never printed as if it
applied to another trainer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from tuneup.sync.config import SyncConfig


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


# -- each trainer's snippets -------------------------------------------------------------------------------

# The adapters' names for the trainer that recorded a run (each rank's info, `TrainingFacts.trainer_name`).
LIGHTNING = "lightning"
FABRIC = "lightning.fabric"
TRANSFORMERS = "transformers"
LOOP = "loop"

Snippet = tuple[str, str | None]  # (Python, YAML; None where the trainer has no config file of tuneup's)


class TrainerCode(ABC):
    """One trainer's snippets, one method per kind of knob the advice sets."""

    name: str  # the trainer as a sentence names it

    def batch_size(self, batch: int, accumulation: int | None) -> Snippet:
        """A per-rank batch size and, where it changes, the micro-batches accumulated per optimizer step. A
        trainer handed the user's own DataLoader (Fabric, a plain loop) takes the batch size there."""
        python = dataloader_args({"batch_size": batch})[0] + "  # per rank" + self.batch_size_note(batch)
        if accumulation is not None:
            python += "\n\n" + self.accumulation(accumulation)[0]
        return python, None

    def batch_size_note(self, batch: int) -> str:
        """What follows the DataLoader line of `batch_size` ("": nothing)."""
        return ""

    @abstractmethod
    def accumulation(self, micro_batches: int) -> Snippet:
        """`micro_batches` micro-batches per optimizer step, the gradients all-reduced on the last only."""

    @abstractmethod
    def precision(self, precision: str, on_gpu: bool) -> Snippet:
        """Training in `precision` (Lightning's names: "bf16-mixed", "32-true")."""

    @abstractmethod
    def precision_line(self, precision: str, on_gpu: bool) -> str:
        """The one line of `precision` that a sentence quotes."""

    def dataloader(
        self, args: Mapping[str, object], threads: int | None = None, workers: int | None = None
    ) -> Snippet:
        """DataLoader arguments (num_workers, pin_memory, ...), and where `threads` is given, the main
        process's intra-op threads cut to it, leaving `workers` cores to the workers. A trainer that is
        handed the user's own DataLoader (Fabric, a plain loop) takes them there."""
        return _loader_python(args, threads, workers, "training"), None

    @abstractmethod
    def checkpoint(self, every_n_train_steps: int, train_time_interval_s: float | None = None) -> Snippet:
        """A checkpoint every N training steps that a restart resumes from (the time-based form, where
        given, as a comment)."""

    @abstractmethod
    def resume(self) -> str:
        """What a restart needs to resume from the last checkpoint, for a caveat."""

    @abstractmethod
    def ddp_args(self, kwargs: Mapping[str, object]) -> str:
        """DistributedDataParallel's own arguments (bucket_cap_mb, ...) inline, as a sentence quotes them."""

    def sync_strategy(self, kwargs: Mapping[str, object]) -> Snippet:
        """tuneup's DDP strategy with SyncConfig's arguments (compression, local SGD): the Lightning
        Trainer's; another trainer is told so."""
        return _lightning_only(self.name, kwargs, self.instead_of_sync_strategy)

    # What another trainer can do instead of TuneupDDPStrategy, as comment lines ("": nothing).
    instead_of_sync_strategy = ""

    def sync_strategy_note(self) -> str:
        """ "" for the Lightning Trainer; else what follows a mention of TuneupDDPStrategy in a sentence."""
        return f", which needs the Lightning Trainer ({self.name} has no equivalent)"


def _lightning_only(name: str, kwargs: Mapping[str, object], instead: str) -> Snippet:
    """A recommendation of TuneupDDPStrategy, which plugs into the Lightning Trainer only, for another
    trainer: what it would take, and `instead`, what this trainer can do."""
    strategy = f"TuneupDDPStrategy({_call_args(kwargs)})"
    lines = [
        f"# {strategy} is a strategy of the Lightning Trainer (tuneup.plugins.lightning),",
        f"# and {name} has no equivalent: to apply it, train with the Lightning Trainer,",
        f"# strategy={strategy}.",
    ]
    return "\n".join([*lines, *([instead] if instead else [])]), None


def _call_args(kwargs: Mapping[str, object]) -> str:
    return ", ".join(f"{k}={_python(v)}" for k, v in kwargs.items())


def _loader_python(args: Mapping[str, object], threads: int | None, workers: int | None, before: str) -> str:
    """A DataLoader with `args`, and where `threads` is given, the main process's intra-op threads cut to it
    (`before`: the call the cut must precede) so that `workers` cores are left to the workers."""
    python, _ = dataloader_args(args)
    if threads is None:
        return python
    return "import torch\n" + python.replace(
        "\n\nloader",
        f"\n\ntorch.set_num_threads({threads})  # in the main process, before {before}: {workers} core(s) left "
        "to the workers\nloader",
    )


class LightningCode(TrainerCode):
    """The Lightning Trainer of `namespace`: Trainer, DataLoader and strategy arguments, and LightningCLI
    YAML (the module's functions)."""

    name = "the Lightning Trainer"

    def __init__(self, namespace: str | None) -> None:
        self.namespace = namespace

    def batch_size(self, batch: int, accumulation: int | None) -> Snippet:
        return batch_size(self.namespace, batch, accumulation)

    def accumulation(self, micro_batches: int) -> Snippet:
        return trainer_args(self.namespace, {"accumulate_grad_batches": micro_batches})

    def precision(self, precision: str, on_gpu: bool) -> Snippet:
        return trainer_args(self.namespace, {"precision": precision})

    def precision_line(self, precision: str, on_gpu: bool) -> str:
        return self.precision(precision, on_gpu)[0].splitlines()[-1]

    def dataloader(
        self, args: Mapping[str, object], threads: int | None = None, workers: int | None = None
    ) -> Snippet:
        _, yaml = dataloader_args(args)
        if threads is not None:
            yaml += f"\n# and torch.set_num_threads({threads}) in the training script (no LightningCLI key)"
        return _loader_python(args, threads, workers, "fit"), yaml

    def checkpoint(self, every_n_train_steps: int, train_time_interval_s: float | None = None) -> Snippet:
        return model_checkpoint(self.namespace, every_n_train_steps, train_time_interval_s)

    def resume(self) -> str:
        return 'a restart resumes from the last checkpoint only with save_last=True and ckpt_path="last"'

    def ddp_args(self, kwargs: Mapping[str, object]) -> str:
        return f"DDPStrategy({_call_args(kwargs)})"

    def sync_strategy(self, kwargs: Mapping[str, object]) -> Snippet:
        return sync_strategy(self.namespace, kwargs)

    def sync_strategy_note(self) -> str:
        return ""


def _accumulation_loop(micro_batches: int, loader: str, no_sync: str, backward: str, after_step: str) -> str:
    """A loop that steps the optimizer every `micro_batches` micro-batches, each micro-batch's forward and
    `backward` inside `no_sync` (what skips the gradient all-reduce but on the last micro-batch)."""
    lines = [
        f"accumulation = {micro_batches}  # micro-batches per optimizer step",
        f"for i, batch in enumerate({loader}):",
        "    is_last_micro_batch = (i + 1) % accumulation == 0",
        "    # the gradients all-reduced on the last micro-batch only",
        f"    with {no_sync}:",
        "        loss = compute_loss(model, batch)  # your forward and loss",
        f"        {backward}",
        "    if is_last_micro_batch:",
        "        optimizer.step()",
        "        optimizer.zero_grad()",
        *([f"        {after_step}"] if after_step else []),
    ]
    return "\n".join(lines)


def _loop_checkpoint(
    every_n_train_steps: int, interval_s: float | None, imports: str, save: list[str], restart: list[str]
) -> Snippet:
    """A loop's own save every N training steps (`save`: its lines), and what a restart loads (`restart`)."""
    lines = [
        *([imports, ""] if imports else []),
        "# in the training loop, after the optimizer step of training step `step`:",
        f"if (step + 1) % {every_n_train_steps} == 0:",
        *(f"    {line}" for line in save),
    ]
    if interval_s is not None:
        lines.append(f"# or by wall time: save where time.monotonic() - last_save_s >= {round(interval_s)}")
    return "\n".join([*lines, *restart]), None


class FabricCode(TrainerCode):
    """Lightning Fabric: `Fabric(...)` arguments, the DataLoader, and the loop Fabric leaves to its user."""

    name = "Lightning Fabric"
    instead_of_sync_strategy = (
        "# Fabric's DDPStrategy takes DistributedDataParallel's arguments, not a communication hook."
    )

    def accumulation(self, micro_batches: int) -> Snippet:
        loop = _accumulation_loop(
            micro_batches,
            "loader",  # as fabric.setup_dataloaders returned it
            "fabric.no_backward_sync(model, enabled=not is_last_micro_batch)",
            "fabric.backward(loss / accumulation)",
            "",
        )
        return loop, None

    def precision(self, precision: str, on_gpu: bool) -> Snippet:
        return f"from lightning.fabric import Fabric\n\n{self.precision_line(precision, on_gpu)}", None

    def precision_line(self, precision: str, on_gpu: bool) -> str:
        return f"fabric = Fabric(..., precision={_python(precision)})"

    def checkpoint(self, every_n_train_steps: int, train_time_interval_s: float | None = None) -> Snippet:
        return _loop_checkpoint(
            every_n_train_steps,
            train_time_interval_s,
            "",
            ['fabric.save("checkpoints/last.ckpt", {"model": model, "optimizer": optimizer, "step": step})'],
            [
                '# on a restart, before the loop: state = {"model": model, "optimizer": optimizer, "step": 0};',
                '# fabric.load("checkpoints/last.ckpt", state), and go on from state["step"] + 1',
            ],
        )

    def resume(self) -> str:
        return "a restart resumes from the last checkpoint only where the loop loads it (fabric.load) first"

    def ddp_args(self, kwargs: Mapping[str, object]) -> str:
        return f"Fabric(strategy=DDPStrategy({_call_args(kwargs)})) (lightning.fabric.strategies)"


# The Hugging Face TrainingArguments' names of DataLoader arguments, precisions and DistributedDataParallel's
# arguments (it passes on these, no others).
HF_LOADER_FIELDS = {
    "batch_size": "per_device_train_batch_size",
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
}
HF_PRECISION_FIELDS: dict[str, dict[str, object]] = {
    "bf16-mixed": {"bf16": True},
    "32-true": {"bf16": False, "fp16": False},
}
HF_DDP_FIELDS = {
    "bucket_cap_mb": "ddp_bucket_cap_mb",
    "find_unused_parameters": "ddp_find_unused_parameters",
    "broadcast_buffers": "ddp_broadcast_buffers",
    "static_graph": "ddp_static_graph",
}


class TransformersCode(TrainerCode):
    """The Hugging Face Trainer: `TrainingArguments` fields."""

    name = "the Hugging Face Trainer"
    instead_of_sync_strategy = "# TrainingArguments has no DDP communication hook."

    @staticmethod
    def arguments(fields: Mapping[str, object], before: str = "") -> str:
        """TrainingArguments with `fields` (`before`: lines that precede it)."""
        imports = "from transformers import TrainingArguments\n\n"
        return f"{imports}{before}args = TrainingArguments(..., {_call_args(fields)})"

    def batch_size(self, batch: int, accumulation: int | None) -> Snippet:
        fields: dict[str, object] = {"per_device_train_batch_size": batch}
        if accumulation is not None:
            fields["gradient_accumulation_steps"] = accumulation
        return self.arguments(fields), None

    def accumulation(self, micro_batches: int) -> Snippet:
        return self.arguments({"gradient_accumulation_steps": micro_batches}), None

    def precision(self, precision: str, on_gpu: bool) -> Snippet:
        return self.arguments(HF_PRECISION_FIELDS[precision]), None

    def precision_line(self, precision: str, on_gpu: bool) -> str:
        return f"TrainingArguments(..., {_call_args(HF_PRECISION_FIELDS[precision])})"

    def dataloader(
        self, args: Mapping[str, object], threads: int | None = None, workers: int | None = None
    ) -> Snippet:
        fields = {HF_LOADER_FIELDS[k]: v for k, v in args.items()}
        if threads is None:
            return self.arguments(fields), None
        before = (
            f"torch.set_num_threads({threads})  # in the main process, before trainer.train(): {workers} "
            "core(s) left to the workers\n"
        )
        return "import torch\n" + self.arguments(fields, before), None

    def checkpoint(self, every_n_train_steps: int, train_time_interval_s: float | None = None) -> Snippet:
        python = (
            self.arguments({"save_strategy": "steps", "save_steps": every_n_train_steps})
            + "\ntrainer.train(resume_from_checkpoint=True)  # on a restart: the last checkpoint in output_dir"
        )
        return python, None

    def resume(self) -> str:
        return (
            "a restart resumes from the last checkpoint only with trainer.train(resume_from_checkpoint=True)"
        )

    def ddp_args(self, kwargs: Mapping[str, object]) -> str:
        missing = [k for k in kwargs if k not in HF_DDP_FIELDS]
        if missing:  # DistributedDataParallel takes it; TrainingArguments does not pass it on
            return (
                f"DistributedDataParallel({_call_args(kwargs)}), which TrainingArguments does not set (it has "
                f"no {', '.join(missing)})"
            )
        return f"TrainingArguments({_call_args({HF_DDP_FIELDS[k]: v for k, v in kwargs.items()})})"


# torch's DDP communication hooks for tuneup's compression modes: the same bytes on the wire.
_TORCH_HOOKS = {"fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook"}


class LoopCode(TrainerCode):
    """A plain PyTorch loop (`tuneup.track`): torch's own calls, `model` its DistributedDataParallel."""

    name = "a plain PyTorch loop"
    instead_of_sync_strategy = (
        "# In this loop, torch's own DDP communication hooks (torch.distributed.algorithms.ddp_comm_hooks,\n"
        "# model.register_comm_hook) come closest, with torch's defaults and without the strategy's checks."
    )

    def batch_size_note(self, batch: int) -> str:
        return f"\n# and tuneup.track(..., batch_size={batch}) where the loop gives it"

    def accumulation(self, micro_batches: int) -> Snippet:
        loop = _accumulation_loop(
            micro_batches,
            "run.data(loader)",
            "contextlib.nullcontext() if is_last_micro_batch else model.no_sync()",
            "(loss / accumulation).backward()",
            "run.step(loss=loss)  # tuneup.track's step: one per optimizer step",
        )
        return (
            f"import contextlib\n\n# model: the DistributedDataParallel (without DDP, no no_sync)\n{loop}",
            None,
        )

    def precision(self, precision: str, on_gpu: bool) -> Snippet:
        if precision == "32-true":
            python = (
                "# 32-true: the forward without torch.autocast (and the model not cast to a 16-bit dtype)\n"
                "loss = compute_loss(model, batch)\nloss.backward()"
            )
            return python, None
        python = (
            f"import torch\n\n{self.precision_line(precision, on_gpu)}  # the forward and the loss only\n"
            "    loss = compute_loss(model, batch)\n"
            "loss.backward()  # outside autocast: backward runs in the forward's dtypes"
        )
        return python, None

    def precision_line(self, precision: str, on_gpu: bool) -> str:
        if precision == "32-true":
            return "no torch.autocast around the forward"
        if precision != "bf16-mixed":  # fp16 needs a GradScaler too: more than one line
            raise ValueError(f"no plain-loop code for precision {precision!r}")
        return f'with torch.autocast("{"cuda" if on_gpu else "cpu"}", dtype=torch.bfloat16):'

    def checkpoint(self, every_n_train_steps: int, train_time_interval_s: float | None = None) -> Snippet:
        return _loop_checkpoint(
            every_n_train_steps,
            train_time_interval_s,
            "import torch\nimport torch.distributed as dist",
            [
                "if not dist.is_initialized() or dist.get_rank() == 0:",
                '    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}',
                '    torch.save(state, "last.pt")',
            ],
            ['# on a restart, before the loop: torch.load("last.pt"), each load_state_dict, from step + 1'],
        )

    def resume(self) -> str:
        return "a restart resumes from the last checkpoint only where the loop loads it (torch.load) first"

    def ddp_args(self, kwargs: Mapping[str, object]) -> str:
        return f"DistributedDataParallel(model, {_call_args(kwargs)})"

    def sync_strategy(self, kwargs: Mapping[str, object]) -> Snippet:
        """torch's own DDP hook for what TuneupDDPStrategy would do, where torch has one that sends the same
        bytes: fp16/bf16 compression, and local SGD without a gradient all-reduce (torch's post-local SGD)."""
        hook = _TORCH_HOOKS.get(str(kwargs.get("compression")))
        period = kwargs.get("local_sgd_period")
        if hook is not None and set(kwargs) == {"compression"}:
            python = (
                "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n\n"
                "# torch's own hook, the same bytes on the wire; unlike TuneupDDPStrategy (the Lightning Trainer's)\n"
                "# it compresses from the first step, never checks against an exact average and never falls back\n"
                "model.register_comm_hook(state=None, hook=default_hooks."
                f"{hook})  # model: the DistributedDataParallel"
            )
            return python, None
        if period is not None and set(kwargs) <= {"local_sgd_period", "hierarchical"}:
            # What is predicted: exact steps first, then no gradient all-reduce at all (not even within a node,
            # torch's default) and the parameters averaged across every rank every `period` steps.
            start = SyncConfig(**kwargs).start_step  # type: ignore[arg-type]
            python = (
                "from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (\n"
                "    PostLocalSGDState,\n    post_localSGD_hook,\n)\n"
                "from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager\n"
                "from torch.distributed.optim import PostLocalSGDOptimizer\n\n"
                f"# torch's own local SGD: {start} exact steps, then no gradient all-reduce and the parameters\n"
                f"# averaged every {period} steps; unlike TuneupDDPStrategy (the Lightning Trainer's) it never checks\n"
                "# the ranks' divergence and never falls back\n"
                "state = PostLocalSGDState(\n"
                f"    process_group=None, subgroup=None, start_localSGD_iter={start}, "
                "post_local_gradient_allreduce=False\n)\n"
                "model.register_comm_hook(state, post_localSGD_hook)  # model: the DistributedDataParallel\n"
                f"optimizer = PostLocalSGDOptimizer(optimizer, PeriodicModelAverager(period={period}, "
                f"warmup_steps={start}))"
            )
            return python, None
        return super().sync_strategy(kwargs)

    def sync_strategy_note(self) -> str:
        return (
            ", which needs the Lightning Trainer (in a plain loop, torch's own powerSGD_hook through "
            "model.register_comm_hook comes closest, with torch's defaults and without the strategy's fallback)"
        )


def for_run(adapter: str | None, namespace: str | None) -> TrainerCode:
    """The snippets for the trainer that recorded a run: its adapter's name (the rank's info), else its
    trainer namespace (the manifest); a record that says neither is the Lightning callback's (whose records
    before adapters named themselves say only the namespace)."""
    if FABRIC in (adapter, namespace):
        return FabricCode()
    if TRANSFORMERS in (adapter, namespace):
        return TransformersCode()
    if adapter == LOOP:
        return LoopCode()
    return LightningCode(namespace)
