"""The tuner's knobs: what `tuneup tune` can change, each said once.

A knob is one `Knob` entry in this registry, and its apply function. Every other part of the tuner reads
the registry instead of spelling knobs:

    tuneup.tune.space    Config's attributes, their order, their label ("b32 a2 w1 fp16", by each knob's
                         `label_format`), the values SearchSpace accepts (`value_type`, `minimum`, `choices`)
    tuneup.tune.command  the `tuneup tune` option (`option`, `metavar`, `help`)
    tuneup.tune.session  the values tried around the baseline's (`defaults`), what the baseline's run says
                         the knob was (`from_run`), and whether a trial's run is checked against it (`verify`)
    tuneup.tune.predict  how the predictor reads it: an input of the step-time model (`model_input`), or a
                         residual knob whose effects the trials measure and whose unmeasured levels are
                         bounded by `unmeasured`
    tuneup.tune.script   the LightningCLI override (`cli_key` for a Trainer argument, or `cli_arg` for a
                         DataLoader's, found in the script's config: both from `argument_of`); a knob with
                         neither reaches the trial through TuneupCallback
    tuneup.tune.render   its name for people (`title`) and the code that applies it (`code`: the DataLoader,
                         Trainer or DDPStrategy argument its `argument_of` names, or its own `code_of`)
    plugins/lightning/trial.py  calls `apply` in the training process, at the callback's setup

How to add a knob
-----------------
1. Write its apply function below, `apply_<name>(ctx: TrialContext, value)`: set the value the Lightning
   way (an attribute of the Trainer, the module, the datamodule or the strategy) through `ctx.trainer` and
   `ctx.pl_module`, then say `ctx.applied(name, value)`, or `ctx.refused(name, reason)` with the fix
   where the script cannot take it (the tuner then drops the knob). What needs the wrapped model or the
   built DataLoader goes in `ctx.at_train_start(name, step)`. Import torch or Lightning inside it, never
   at the top of this module (the `tuneup` command starts without them).
2. Add one `Knob(...)` to `_BUILT_IN`, at the end (the order is Config's: it orders configurations and
   labels, and names trial directories). Say what its value is an argument of (`argument_of`), where it
   is one argument of the knob's name, else its `code_of`. Give it `unmeasured` bounds unless the
   step-time model predicts it (`model_input` with no bounds means the model alone predicts every level).
3. Test it: tests/test_tune_knobs.py checks that every entry is complete and shows, with a knob registered
   for the test, how a value flows through the space, the trial and the report; add a case for the new
   knob's apply function with a real fit in tests/test_tune_trial.py.
No other module changes: `tuneup tune --<option>` takes it, the search tries it, the trial applies it and
the report prints the code.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from tuneup.advise.observe import Observation

# The DDP communication hooks a trial can apply, by the name `tuneup tune --comm-hook` takes. "allreduce" is
# DDP's default; "fp16"/"bf16" compress the gradients to 16 bits on the wire (torch's fp16_compress_hook,
# bf16_compress_hook); bf16 needs NCCL, since gloo cannot all-reduce bf16.
COMM_HOOKS = ("allreduce", "fp16", "bf16")
# `--comm-hook` names -> the torch hook, as an expression under `default_hooks` (allreduce is DDP's own).
HOOK_EXPRESSIONS = {
    "fp16": "default_hooks.fp16_compress_hook",
    "bf16": "default_hooks.bf16_compress_hook",
}
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true", "transformer-engine")


class SpaceError(ValueError):
    """A knob value or constraint that cannot be tuned: names the option and the fix (exit code 2)."""


# ---------------------------------------------------------------------------------------------------
# What an entry's functions are given.


@dataclass(frozen=True, slots=True)
class SpaceContext:
    """What the baseline's run says about the job, for the values tried around the baseline's."""

    world_size: int
    ranks_per_node: int
    on_gpu: bool
    cpus: int


@dataclass(frozen=True, slots=True)
class StepShares:
    """The predicted step's make-up, for bounding a level no trial has measured."""

    data: float  # the data wait's share of the step
    comm: float  # exposed communication's share of the step
    on_gpu: bool


@dataclass(frozen=True, slots=True)
class KnobCode:
    """How a knob's value is written in the settings to apply (tuneup.tune.render.settings_code)."""

    dataloader: Mapping[str, object] = field(default_factory=dict)  # DataLoader / DataModule arguments
    trainer: Mapping[str, object] = field(default_factory=dict)  # Trainer arguments
    ddp: Mapping[str, str] = field(default_factory=dict)  # DDPStrategy arguments, as Python expressions
    ddp_strategy: bool = False  # the value needs a DDP strategy, with or without arguments
    comment: str = ""  # at the end of the Python line that carries it
    notes: tuple[str, ...] = ()  # comment lines after the Python
    yaml_note: str = ""  # a comment line after the YAML


class TrialContext(Protocol):
    """What an apply function is given in the training process (plugins/lightning/trial.py)."""

    @property
    def trainer(self) -> Any: ...

    @property
    def pl_module(self) -> Any: ...

    @property
    def on_cuda(self) -> bool: ...

    def applied(self, knob: str, value: Any) -> None:
        """The value is in place (written to applied.json)."""

    def refused(self, knob: str, reason: str) -> None:
        """The script cannot take the value: why, with the fix. The tuner drops the knob."""

    def at_train_start(self, knob: str, step: Callable[[], None]) -> None:
        """Run `step` at on_train_start, once the strategy has wrapped the model and the DataLoader is built."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Knob:
    """One tuner knob: everything the tuner says about it."""

    name: str  # Config's attribute, the key in tune.json, the trial spec's settings and applied.json
    title: str  # for people: "batch size per rank"
    value_type: type  # int or str
    option: str  # the `tuneup tune` option: "--batch-size"
    metavar: str
    help: str
    label_format: str  # the value in a configuration's short label, by str.format: "b{}" labels 32 "b32"
    apply: Callable[[TrialContext, Any], None]  # sets it in the training process (see the module doc)
    # What the value is an argument of, under the knob's own name: a DataLoader's or DataModule's (its
    # LightningCLI key found in the script's config), the Trainer's (LightningCLI's trainer.<name>) or
    # DDPStrategy's. The code that applies the value and the LightningCLI override follow from it.
    argument_of: Literal["dataloader", "trainer", "ddp"] | None = None
    code_comment: str = ""  # at the end of the Python line that carries the argument
    code_of: Callable[[Any], KnobCode] | None = None  # the code, for a knob that is no one argument
    minimum: int = 1  # int knobs: the least value
    choices: tuple[str, ...] = ()  # str knobs: the values allowed
    choices_owner: str = ""  # whose list the choices are, for the error: "Lightning's"
    # The values tried around the baseline's when the option is not given (none: tuned only when asked).
    defaults: Callable[[Any, SpaceContext], tuple[Any, ...]] = lambda current, job: ()
    from_run: Callable[[Observation], Any] | None = None  # the value the baseline's run had
    verify: bool = False  # a trial whose run had another value than asked fails (needs from_run)
    model_input: bool = False  # the step-time model takes it (tuneup.advise.model.Setting, same name)
    model_default: Any = None  # what the model takes where a configuration leaves the knob to the script
    # A residual knob (the trials measure its effects): how far a level no trial has measured could move
    # the step, (low, high) factors. None: the step-time model predicts every level.
    unmeasured: Callable[[Any, StepShares], tuple[float, float]] | None = None

    @property
    def cli_key(self) -> str | None:
        """Its LightningCLI key where every script has it (a Trainer argument): "trainer.precision"."""
        return f"trainer.{self.name}" if self.argument_of == "trainer" else None

    @property
    def cli_arg(self) -> str | None:
        """The init argument of the datamodule or the model that takes it in a LightningCLI script, if any."""
        return self.name if self.argument_of == "dataloader" else None

    def label(self, value: Any) -> str:
        return self.label_format.format(value)

    def code(self, value: Any) -> KnobCode:
        """The code that applies the value (tuneup.tune.render.settings_code)."""
        if self.argument_of == "dataloader":
            return KnobCode(dataloader={self.name: value}, comment=self.code_comment)
        if self.argument_of == "trainer":
            return KnobCode(trainer={self.name: value}, comment=self.code_comment)
        if self.argument_of == "ddp":  # DDPStrategy's arguments are written as Python expressions
            return KnobCode(ddp={self.name: str(value)}, ddp_strategy=True, comment=self.code_comment)
        if self.code_of is None:
            raise ValueError(f"tuner knob {self.name!r} says neither its argument_of nor its code_of")
        return self.code_of(value)

    def check(self, values: Sequence[Any]) -> tuple[Any, ...]:
        """The values as a search space holds them (ints sorted, others in the order given), each checked;
        SpaceError names the option and the fix."""
        if self.value_type is int:
            out = []
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or v < self.minimum:
                    raise SpaceError(
                        f"{self.option} values must be whole numbers >= {self.minimum}, got {v!r}"
                    )
                out.append(v)
            return tuple(sorted(set(out)))
        for v in values:
            if not isinstance(v, self.value_type) or (self.choices and v not in self.choices):
                owner = f"{self.choices_owner}: " if self.choices_owner else ""
                raise SpaceError(f"{self.option} {v!r} is not one of {owner}{', '.join(self.choices)}")
        return tuple(dict.fromkeys(values))

    def accepts(self, value: Any) -> bool:
        """Whether `value` is of the knob's type (a stored configuration is read with this)."""
        return value is None or (isinstance(value, self.value_type) and not isinstance(value, bool))


# ---------------------------------------------------------------------------------------------------
# The registry.

_REGISTRY: dict[str, Knob] = {}


def knobs() -> tuple[Knob, ...]:
    """Every knob, in Config's order."""
    return tuple(_REGISTRY.values())


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def knob(name: str) -> Knob | None:
    return _REGISTRY.get(name)


def register(entry: Knob) -> Knob:
    """Add a knob at the end of the registry (a name taken is refused: a knob is said once)."""
    if entry.name in _REGISTRY:
        raise ValueError(f"a tuner knob named {entry.name!r} is already registered")
    _REGISTRY[entry.name] = entry
    return entry


@contextlib.contextmanager
def registered(entry: Knob) -> Iterator[Knob]:
    """The knob registered for the block, removed after it (for a test or an experiment)."""
    register(entry)
    try:
        yield entry
    finally:
        _REGISTRY.pop(entry.name, None)


# ---------------------------------------------------------------------------------------------------
# Apply functions (in the training process; duck-typed on the Trainer and the module, so that one serves
# both Lightning namespaces).


def _parsing(trainer: Any) -> Any:
    """The Trainer's own namespace's `utilities.parsing` (lightning.pytorch or pytorch_lightning)."""
    namespace = type(trainer).__module__.split(".trainer")[0]
    return importlib.import_module(f"{namespace}.utilities.parsing")


def _set_attribute(ctx: TrialContext, name: str, value: int) -> bool:
    """Lightning's `lightning_setattr` (BatchSizeFinder's convention): the module, its hparams or its
    datamodule; False where none has the attribute."""
    parsing = _parsing(ctx.trainer)
    if not parsing.lightning_hasattr(ctx.pl_module, name):
        return False
    parsing.lightning_setattr(ctx.pl_module, name, value)
    ctx.applied(name, value)
    return True


def apply_batch_size(ctx: TrialContext, value: Any) -> None:
    """A `batch_size` attribute of the LightningModule, its hparams or its datamodule; the dataloaders are
    built after the callback's setup, from it."""
    if not _set_attribute(ctx, "batch_size", int(value)):
        ctx.refused(
            "batch_size",
            "neither the LightningModule, its hparams nor its datamodule has a `batch_size` attribute "
            "(Lightning's convention, as BatchSizeFinder uses): give the one that builds the DataLoader "
            "`self.batch_size` and use it there",
        )


def apply_accumulation(ctx: TrialContext, value: Any) -> None:
    """The Trainer's attribute, which its fit loop reads at every batch (as GradientAccumulationScheduler
    sets it)."""
    name = "accumulate_grad_batches"
    if not getattr(ctx.pl_module, "automatic_optimization", True):
        ctx.refused(
            name,
            "the module optimizes manually (automatic_optimization = False): Lightning's accumulation does "
            "not apply; accumulate in training_step yourself",
        )
        return
    if any(type(c).__name__ == "GradientAccumulationScheduler" for c in ctx.trainer.callbacks):
        ctx.refused(name, "a GradientAccumulationScheduler sets it")
        return
    ctx.trainer.accumulate_grad_batches = int(value)
    ctx.applied(name, int(value))


def _train_dataloaders(trainer: Any) -> list[Any]:
    loaders = getattr(trainer, "train_dataloader", None)
    found: list[Any] = []

    def walk(obj: Any, depth: int = 0) -> None:
        if depth > 3 or obj is None:
            return
        if hasattr(obj, "num_workers") and hasattr(obj, "dataset"):
            found.append(obj)
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v, depth + 1)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v, depth + 1)
        elif hasattr(obj, "iterables"):  # Lightning's CombinedLoader
            walk(obj.iterables, depth + 1)

    walk(loaders)
    return found


def apply_workers(ctx: TrialContext, value: Any) -> None:
    """A `num_workers` attribute where the module or datamodule has one; else the training DataLoader's own
    attribute at on_train_start, before its first iterator is made."""
    workers = int(value)
    if _set_attribute(ctx, "num_workers", workers):
        return

    def on_the_loader() -> None:
        loaders = _train_dataloaders(ctx.trainer)
        if not loaders:
            ctx.refused("num_workers", "no training DataLoader was found to set it on")
            return
        for loader in loaders:
            loader.num_workers = workers
            if workers > 0 and getattr(loader, "prefetch_factor", 2) is None:
                loader.prefetch_factor = 2  # DataLoader's own default for workers; None was for 0
        ctx.applied("num_workers", workers)

    ctx.at_train_start("num_workers", on_the_loader)


def comm_hook_function(name: str) -> Any:
    """torch's hook for a `--comm-hook` name."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return {
        "allreduce": default_hooks.allreduce_hook,
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
    }[name]


def apply_comm_hook(ctx: TrialContext, value: Any) -> None:
    """On CUDA, the DDP strategy's `_ddp_comm_hook`, which Lightning registers when it wraps the model; off
    CUDA (where Lightning drops it) registered on the wrapped model at on_train_start."""
    name, trainer = str(value), ctx.trainer
    strategy = trainer.strategy
    if int(trainer.world_size) <= 1:
        ctx.refused("comm_hook", "one process: there is no gradient communication to compress")
        return
    if not hasattr(strategy, "_ddp_comm_hook"):
        ctx.refused("comm_hook", f"{type(strategy).__name__} is not a DDP strategy")
        return
    if name == "bf16" and not ctx.on_cuda:
        ctx.refused("comm_hook", "bf16 compression needs NCCL: gloo cannot all-reduce bf16")
        return
    if getattr(strategy, "_ddp_comm_hook", None) is not None:
        ctx.refused("comm_hook", "the script already passes a ddp_comm_hook (one hook per model)")
        return
    ctx.applied("comm_hook", name)
    if ctx.on_cuda:
        strategy._ddp_comm_hook = comm_hook_function(name)  # Lightning registers it when it wraps the model
        return

    def register_on_the_model() -> None:
        try:
            # Through DDP's register_comm_hook, which tuneup's CommProbe (when installed) wraps and times.
            trainer.strategy.model.register_comm_hook(None, comm_hook_function(name))
        except Exception as exc:
            ctx.refused("comm_hook", f"registering it failed: {type(exc).__name__}: {exc}")

    ctx.at_train_start("comm_hook", register_on_the_model)


def apply_bucket_cap(ctx: TrialContext, value: Any) -> None:
    """The DDP strategy's keyword arguments for DistributedDataParallel, read when it wraps the model (after
    the callbacks' setup)."""
    trainer = ctx.trainer
    strategy = trainer.strategy
    kwargs = getattr(strategy, "_ddp_kwargs", None)
    if int(trainer.world_size) <= 1 or not isinstance(kwargs, dict):
        ctx.refused(
            "bucket_cap_mb",
            f"{type(strategy).__name__} on {trainer.world_size} process(es) wraps no DistributedDataParallel",
        )
        return
    kwargs["bucket_cap_mb"] = int(value)
    ctx.applied("bucket_cap_mb", int(value))


def apply_reshard_after_forward(ctx: TrialContext, value: Any) -> None:
    """FSDP2's runtime setter on every `fully_shard`-ed module, once the strategy has wrapped the model (the
    user's `configure_model` ran): False keeps each unit's gathered parameters from its forward to its
    backward (no backward all-gather, more memory), True frees them after forward. FSDP1 (Lightning's
    FSDPStrategy) fixes its sharding strategy when it wraps: refused there."""
    name, keep = "reshard_after_forward", str(value) == "true"

    def on_the_modules() -> None:
        from tuneup.recording.describe import fsdp_units

        modules = fsdp_units(ctx.trainer.strategy.model)
        if not modules:
            ctx.refused(
                name,
                "no module was sharded with FSDP2's fully_shard (ModelParallelStrategy and a configure_model "
                "calling fully_shard): FSDP1's sharding_strategy is fixed when the model is wrapped, so pass "
                "FSDPStrategy(sharding_strategy='SHARD_GRAD_OP') yourself",
            )
            return
        for module in modules:
            module.set_reshard_after_forward(keep, recurse=False)
        ctx.applied(name, str(value))

    ctx.at_train_start(name, on_the_modules)


def refuse_precision(ctx: TrialContext, value: Any) -> None:
    """Not applied in the process: the Trainer builds its precision plugin when it is constructed. Tuned
    through a LightningCLI override (`cli_key`)."""
    ctx.refused(
        "precision",
        "the Trainer fixes its precision when it is constructed: tune precision with a LightningCLI "
        "script (--trainer.precision) or pass it to the Trainer yourself",
    )


# ---------------------------------------------------------------------------------------------------
# Values tried around the baseline's, and bounds for unmeasured levels.


def _batch_defaults(current: Any, job: SpaceContext) -> tuple[Any, ...]:
    """The per-rank batch from half to 4x."""
    b = current
    return tuple(sorted({max(1, b // 2), b, 2 * b, 4 * b})) if b else ()


def _workers_defaults(current: Any, job: SpaceContext) -> tuple[Any, ...]:
    """Up to Lightning's suggestion, CPUs per local rank - 1."""
    if current is None:
        return ()
    most = max(1, job.cpus // max(1, job.ranks_per_node) - 1)
    return tuple(sorted({0, 1, min(2, most), min(4, most), current}))


def _hook_defaults(current: Any, job: SpaceContext) -> tuple[Any, ...]:
    """The fp16 hook (and bf16 on GPUs, where NCCL carries it) where ranks communicate through DDP (a sharded
    run's baseline has no hook: `from_run` says None)."""
    if job.world_size <= 1 or current is None:
        return ()
    return ("allreduce", "fp16", "bf16") if job.on_gpu else ("allreduce", "fp16")


def _workers_bound(level: Any, shares: StepShares) -> tuple[float, float]:
    # Up to all of the wait gone; worker processes also take CPU from the ranks.
    return 1.0 - min(shares.data, 0.95), 1.15


def _hook_bound(level: Any, shares: StepShares) -> tuple[float, float]:
    if level in ("fp16", "bf16"):
        return 1.0 - 0.5 * min(shares.comm, 0.95), 1.1
    return 1.0 - min(shares.comm, 0.95) * 0.5, 1.0 / (1.0 - 0.5 * min(shares.comm, 0.9))


def _bucket_bound(level: Any, shares: StepShares) -> tuple[float, float]:
    # Fewer, larger buckets pay less latency but start later behind backward: up to half the exposed
    # communication either way.
    return 1.0 - 0.5 * min(shares.comm, 0.95), 1.0 + 0.5 * min(shares.comm, 0.95)


def _precision_bound(level: Any, shares: StepShares) -> tuple[float, float]:
    # 16-bit is several times faster on tensor cores, and >2x slower on CPUs without bf16 units
    # (pytorch #86270).
    return (0.25, 1.3) if shares.on_gpu else (0.8, 3.0)


def _reshard_bound(level: Any, shares: StepShares) -> tuple[float, float]:
    # Keeping the gathered parameters drops the backward's all-gathers: about half of a sharded step's
    # collectives (one gather of the two per unit; the reduce-scatters stay), the exposed share of which
    # it saves at most; resharding again brings them back.
    half = 0.5 * min(shares.comm, 0.95)
    return (1.0 - half, 1.05) if level == "false" else (0.95, 1.0 / (1.0 - half))


# ---------------------------------------------------------------------------------------------------
# Code for the settings to apply.


def _hook_code(value: Any) -> KnobCode:
    expression = HOOK_EXPRESSIONS.get(value)
    if expression is None:  # "allreduce": DDP's own gradient all-reduce, without a hook
        return KnobCode(ddp_strategy=True)
    if value == "bf16":  # gloo cannot all-reduce bf16: there is no CPU way to offer
        notes: tuple[str, ...] = (
            "# Lightning applies ddp_comm_hook only on CUDA devices; the bf16 hook needs NCCL (GPUs).",
        )
    else:
        notes = (
            "# Lightning applies ddp_comm_hook only on CUDA devices. On CPU (gloo), register the hook",
            "# yourself, in a callback's on_fit_start(self, trainer, pl_module):",
            f"#     trainer.strategy.model.register_comm_hook(None, {expression})",
        )
    return KnobCode(
        ddp={"ddp_comm_hook": expression},
        ddp_strategy=True,
        notes=notes,
        yaml_note="# ddp_comm_hook is applied by Lightning only on CUDA devices (see the Python for CPU).",
    )


def _reshard_code(value: Any) -> KnobCode:
    keep = "False" if value == "false" else "True"
    return KnobCode(
        notes=(
            f"# FSDP2: in configure_model, fully_shard(module, mesh=..., reshard_after_forward={keep}) for each",
            f"# block; or, once wrapped, for m in self.modules(): if isinstance(m, FSDPModule): "
            f"m.set_reshard_after_forward({keep}, recurse=False)",
        ),
        yaml_note="# reshard_after_forward is fully_shard's argument in configure_model: no LightningCLI key",
    )


# ---------------------------------------------------------------------------------------------------
# The knobs, in Config's order.

_BUILT_IN = (
    Knob(
        name="batch_size",
        title="batch size per rank",
        value_type=int,
        option="--batch-size",
        metavar="B,...",
        help="per-rank micro-batch sizes",
        label_format="b{}",
        apply=apply_batch_size,
        argument_of="dataloader",
        code_comment="batch_size is per rank",
        defaults=_batch_defaults,
        from_run=lambda o: o.batch_size,
        verify=True,
        model_input=True,
        model_default=1,
    ),
    Knob(
        name="accumulate_grad_batches",
        title="gradient accumulation",
        value_type=int,
        option="--accumulate",
        metavar="K,...",
        help="accumulate_grad_batches values",
        label_format="a{}",
        apply=apply_accumulation,
        argument_of="trainer",
        defaults=lambda current, job: (1, 2, 4),
        from_run=lambda o: o.accumulation,
        verify=True,
        model_input=True,
        model_default=1,
    ),
    Knob(
        name="num_workers",
        title="dataloader workers",
        value_type=int,
        minimum=0,
        option="--workers",
        metavar="W,...",
        help="DataLoader num_workers values",
        label_format="w{}",
        apply=apply_workers,
        argument_of="dataloader",
        defaults=_workers_defaults,
        from_run=lambda o: o.num_workers,
        verify=True,
        model_input=True,
        unmeasured=_workers_bound,
    ),
    Knob(
        name="comm_hook",
        title="DDP comm hook",
        value_type=str,
        choices=COMM_HOOKS,
        option="--comm-hook",
        metavar="H,...",
        help=f"DDP comm hooks: {', '.join(COMM_HOOKS)}",
        label_format="{}",
        apply=apply_comm_hook,
        code_of=_hook_code,
        defaults=_hook_defaults,
        # The record says DDP ran, not which hook: the script's own is taken as DDP's default. A sharded run
        # (FSDP) has no DDP hook.
        from_run=lambda o: "allreduce" if o.world_size > 1 and o.sharding is None else None,
        unmeasured=_hook_bound,
    ),
    Knob(
        name="precision",
        title="precision",
        value_type=str,
        choices=PRECISIONS,
        choices_owner="Lightning's",
        option="--precision",
        metavar="P,...",
        help="Lightning precisions (LightningCLI scripts)",
        label_format="{}",
        apply=refuse_precision,
        argument_of="trainer",
        from_run=lambda o: o.precision,
        verify=True,
        model_input=True,
        unmeasured=_precision_bound,
    ),
    Knob(
        name="bucket_cap_mb",
        title="DDP bucket size (MB)",
        value_type=int,
        option="--bucket-cap-mb",
        metavar="MB,...",
        help="DDP gradient bucket sizes (DDP's default: 25)",
        label_format="bucket{}MB",
        apply=apply_bucket_cap,
        argument_of="ddp",
        unmeasured=_bucket_bound,
    ),
    Knob(
        name="reshard_after_forward",
        title="FSDP2 reshard after forward",
        value_type=str,
        choices=("true", "false"),
        option="--reshard-after-forward",
        metavar="true,false",
        help="FSDP2 (fully_shard) runs: free each unit's gathered parameters after forward (true) or keep "
        "them for backward (false: no backward all-gather, more memory)",
        label_format="raf-{}",
        apply=apply_reshard_after_forward,
        code_of=_reshard_code,
        # What the run's FSDP2 units did (its manifest), else FSDP2's default for every unit but the root;
        # tried both ways on an FSDP2 run.
        defaults=lambda current, job: ("true", "false") if current is not None else (),
        from_run=lambda o: (
            ("false" if o.reshard_after_forward is False else "true") if o.sharding == "FSDP2" else None
        ),
        verify=True,
        unmeasured=_reshard_bound,
    ),
)

for _entry in _BUILT_IN:
    register(_entry)
