"""The code printed with each recommendation is the API of the trainer that recorded the run: Lightning
Fabric's, the Hugging Face Trainer's `TrainingArguments`, a plain PyTorch loop's, and for the Lightning
Trainer what it always was. On synthetic observations and synthetic records (no training)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from tests.synthetic import make_run, step_record
from tests.test_advise import obs
from tests.test_advise_cases import B32, B64
from tests.test_advise_rules import _interrupted
from tests.test_advise_sync import material
from tuneup.advise import batch, checkpoint, code, communication, data_loading, precision
from tuneup.advise.context import AdviceContext
from tuneup.advise.model import Recommendation
from tuneup.advise.observe import Observation
from tuneup.advise.outcomes import Economics
from tuneup.advise.step_model import fit_step_model
from tuneup.analyze.model import RunAnalysis
from tuneup.record import RankWriter, write_manifest
from tuneup.report import analyze

OTHERS = (code.FABRIC, code.TRANSFORMERS, code.LOOP)

# What each rule's code must say, per trainer: that trainer's own call (or, for tuneup's Lightning-only
# strategy, that it needs the Lightning Trainer).
EXPECTED = {
    "precision.fp32_on_cpu": {
        code.FABRIC: 'fabric = Fabric(..., precision="32-true")',
        code.TRANSFORMERS: "args = TrainingArguments(..., bf16=False, fp16=False)",
        code.LOOP: "without torch.autocast",
    },
    "communication.fp16_compression": {
        code.FABRIC: "Lightning Fabric has no equivalent: to apply it, train with the Lightning Trainer",
        code.TRANSFORMERS: "the Hugging Face Trainer has no equivalent",
        code.LOOP: "model.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)",
    },
    "communication.local_sgd": {
        code.FABRIC: "Lightning Fabric has no equivalent",
        code.TRANSFORMERS: "the Hugging Face Trainer has no equivalent",
        code.LOOP: "PostLocalSGDOptimizer(optimizer, PeriodicModelAverager(period=4, warmup_steps=50))",
    },
    "communication.accumulate": {
        code.FABRIC: "with fabric.no_backward_sync(model, enabled=not is_last_micro_batch):",
        code.TRANSFORMERS: "args = TrainingArguments(..., gradient_accumulation_steps=2)",
        code.LOOP: "contextlib.nullcontext() if is_last_micro_batch else model.no_sync()",
    },
    "batch.size": {
        code.FABRIC: "DataLoader(dataset, ..., batch_size=",
        code.TRANSFORMERS: "args = TrainingArguments(..., per_device_train_batch_size=",
        code.LOOP: "tuneup.track(..., batch_size=",
    },
    "checkpoint.interval": {
        code.FABRIC: 'fabric.save("checkpoints/last.ckpt"',
        code.TRANSFORMERS: 'args = TrainingArguments(..., save_strategy="steps", save_steps=',
        code.LOOP: 'torch.save(state, "last.pt")',
    },
    "data_loading.num_workers": {
        code.FABRIC: "DataLoader(dataset, ..., num_workers=",
        code.TRANSFORMERS: "args = TrainingArguments(..., dataloader_num_workers=",
        code.LOOP: "DataLoader(dataset, ..., num_workers=",
    },
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> RunAnalysis:
    return analyze(make_run(tmp_path_factory.mktemp("trainers") / "run", world_size=2, steps=60))


def as_recorded_by(a: RunAnalysis, adapter: str | None, namespace: str | None = None) -> RunAnalysis:
    return dataclasses.replace(a, run=dataclasses.replace(a.run, adapter=adapter, namespace=namespace))


def context(a: RunAnalysis, runs: list[Observation]) -> AdviceContext:
    econ = Economics(None, None, None, runs[0].samples_per_step)
    return AdviceContext(
        analysis=a,
        observation=runs[0],
        model=fit_step_model(runs),
        economics=econ,
        objective="samples/s",
        model_observations=runs,
    )


def recommendations(a: RunAnalysis) -> dict[str, Recommendation]:
    """Every rule's recommendation that synthetic observations give, on the run `a`."""
    recs = [
        *precision.recommend(context(a, [obs(32, 30.0, precision="bf16-mixed", cpu_bf16=False)])),
        *communication.recommend(context(a, [material(averaging_ms=11.0)])),
        *batch.recommend(context(a, [B32, B64])),
        *checkpoint.recommend(context(_interrupted(a, 4, 7200.0, 30.0, 4), [B32])),
        *data_loading.recommend(context(a, [obs(32, 9.0, data_ms=30.0, cpu_count=8)])),
    ]
    return {r.id: r for r in recs}


@pytest.mark.parametrize("adapter", OTHERS)
def test_each_rule_prints_the_recording_trainers_code(recorded: RunAnalysis, adapter: str) -> None:
    recs = recommendations(
        as_recorded_by(recorded, adapter, "lightning.fabric" if adapter == code.FABRIC else None)
    )
    assert set(recs) == set(EXPECTED)
    for rule, rec in recs.items():
        assert EXPECTED[rule][adapter] in rec.code, (rule, rec.code)
        # No Lightning Trainer and no LightningCLI YAML for a run that had neither.
        assert "Trainer(" not in rec.code and "ModelCheckpoint" not in rec.code, (rule, rec.code)
        assert rec.yaml is None, rule
        compile(rec.code, f"<{rule}>", "exec")  # `...` is Python's Ellipsis: each snippet is Python


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_a_lightning_run_prints_what_it_always_did(recorded: RunAnalysis, namespace: str) -> None:
    recs = recommendations(as_recorded_by(recorded, code.LIGHTNING, namespace))
    assert set(recs) == set(EXPECTED)
    assert (
        recs["communication.accumulate"].code
        == code.trainer_args(namespace, {"accumulate_grad_batches": 2})[0]
    )
    assert recs["precision.fp32_on_cpu"].code == code.trainer_args(namespace, {"precision": "32-true"})[0]
    assert (
        recs["communication.fp16_compression"].code
        == code.sync_strategy(namespace, {"compression": "fp16"})[0]
    )
    for rule, rec in recs.items():
        assert rec.yaml, rule  # the LightningCLI YAML beside the Python
        compile(rec.code, f"<{rule}>", "exec")


def considered(ctx: AdviceContext) -> dict[str, str]:
    return {c.knob: c.reason for c in ctx.considered}


@pytest.mark.parametrize(
    ("adapter", "bucket", "view", "powersgd"),
    [
        (code.LIGHTNING, "DDPStrategy(bucket_cap_mb=100)", "DDPStrategy(gradient_as_bucket_view=True)", ""),
        (
            code.FABRIC,
            "Fabric(strategy=DDPStrategy(bucket_cap_mb=100))",
            "Fabric(strategy=DDPStrategy(gradient_as_bucket_view=True))",
            "needs the Lightning Trainer (Lightning Fabric has no equivalent)",
        ),
        (
            code.TRANSFORMERS,
            "TrainingArguments(ddp_bucket_cap_mb=100)",
            "which TrainingArguments does not set",
            "needs the Lightning Trainer (the Hugging Face Trainer has no equivalent)",
        ),
        (
            code.LOOP,
            "DistributedDataParallel(model, bucket_cap_mb=100)",
            "DistributedDataParallel(model, gradient_as_bucket_view=True)",
            "torch's own powerSGD_hook through model.register_comm_hook",
        ),
    ],
)
def test_what_is_left_alone_names_the_trainers_ddp_arguments(
    recorded: RunAnalysis, adapter: str, bucket: str, view: str, powersgd: str
) -> None:
    # A latency-bound link: 64 buckets of 1 kB, each paying the 100 us of the fit's alpha.
    o = material(bucket_bytes=(1000,) * 64)
    ctx = context(
        as_recorded_by(recorded, adapter, "lightning.pytorch" if adapter == code.LIGHTNING else None), [o]
    )
    communication.recommend(ctx)
    said = considered(ctx)
    assert f"try {bucket}" in said["bucket_cap_mb"]
    assert view in said["gradient_as_bucket_view"]
    assert powersgd in said["PowerSGD"]
    if adapter in (code.TRANSFORMERS, code.LOOP):
        assert "DDPStrategy(" not in said["bucket_cap_mb"] + said["gradient_as_bucket_view"]


def test_the_cpu_bf16_hypothesis_quotes_the_trainers_line(recorded: RunAnalysis) -> None:
    # A CPU with bf16 arithmetic: "try bf16-mixed", a hypothesis whose measurement the advice spells out.
    for adapter, line in (
        (code.FABRIC, 'fabric = Fabric(..., precision="bf16-mixed")'),
        (code.TRANSFORMERS, "TrainingArguments(..., bf16=True)"),
        (code.LOOP, 'with torch.autocast("cpu", dtype=torch.bfloat16):'),
    ):
        ctx = context(as_recorded_by(recorded, adapter), [obs(32, 30.0, cpu_bf16=True)])
        recs = precision.recommend(ctx)
        said = recs[0].code if recs else considered(ctx)["precision 32-true → bf16-mixed"]
        assert line in said and "Trainer(" not in said, adapter


# -- the names printed exist -------------------------------------------------------------------------------


def _snippets(trainer: code.TrainerCode) -> list[str]:
    """Every snippet of `trainer`, each knob with every value the advice gives it."""
    loader = {"num_workers": 3, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 4}
    return [
        trainer.batch_size(64, None)[0],
        trainer.batch_size(64, 2)[0],
        trainer.accumulation(4)[0],
        *(trainer.precision(p, gpu)[0] for p in ("bf16-mixed", "32-true") for gpu in (True, False)),
        trainer.dataloader(loader)[0],
        trainer.dataloader({"num_workers": 2}, threads=1, workers=2)[0],
        trainer.checkpoint(100, 360.0)[0],
        trainer.checkpoint(100)[0],
        trainer.sync_strategy({"compression": "fp16"})[0],
        trainer.sync_strategy({"compression": "bf16"})[0],
        trainer.sync_strategy({"local_sgd_period": 4})[0],
        trainer.sync_strategy({"local_sgd_period": 4, "hierarchical": False})[0],
        trainer.sync_strategy({"compression": "powersgd"})[0],
    ]


def _calls(python: str, name: str) -> list[ast.Call]:
    """The calls of `name` (a plain or dotted name's last part) in `python`."""
    found = []
    for node in ast.walk(ast.parse(python)):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id == name) or (
                isinstance(f, ast.Attribute) and f.attr == name
            ):
                found.append(node)
    return found


def _keywords(python: str, name: str) -> set[str]:
    return {k.arg for call in _calls(python, name) for k in call.keywords if k.arg is not None}


def _parameters(fn: object) -> set[str]:
    return set(inspect.signature(fn).parameters)  # type: ignore[arg-type]


@pytest.mark.parametrize("adapter", OTHERS)
def test_every_snippet_compiles_without_the_lightning_trainer(adapter: str) -> None:
    for python in _snippets(code.for_run(adapter, None)):
        compile(python, "<advice>", "exec")
        assert "Trainer(" not in python and "trainer:" not in python, python


def test_the_training_arguments_printed_are_transformers_own() -> None:
    transformers = pytest.importorskip("transformers")
    hf = code.TransformersCode()
    snippets = _snippets(hf)
    printed = set().union(*(_keywords(p, "TrainingArguments") for p in snippets))
    printed |= _keywords(hf.ddp_args({"bucket_cap_mb": 100}), "TrainingArguments")
    assert {
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "bf16",
        "dataloader_num_workers",
    } <= printed
    assert {"save_steps", "ddp_bucket_cap_mb", "dataloader_prefetch_factor"} <= printed
    assert printed <= _parameters(transformers.TrainingArguments), printed - _parameters(
        transformers.TrainingArguments
    )
    assert set(code.HF_DDP_FIELDS.values()) <= _parameters(transformers.TrainingArguments)
    assert "resume_from_checkpoint" in _parameters(transformers.Trainer.train)


def test_the_fabric_calls_printed_are_fabrics_own() -> None:
    fabric = pytest.importorskip("lightning.fabric")
    from torch.nn.parallel import DistributedDataParallel

    snippets = _snippets(code.FabricCode())
    assert _keywords("\n".join(snippets), "Fabric") <= _parameters(fabric.Fabric.__init__)
    assert _keywords("\n".join(snippets), "no_backward_sync") <= _parameters(fabric.Fabric.no_backward_sync)
    assert {"save", "load", "backward", "setup_dataloaders"} <= set(dir(fabric.Fabric))
    # Fabric's DDPStrategy hands its keywords to DistributedDataParallel.
    inline = code.FabricCode().ddp_args({"bucket_cap_mb": 100, "gradient_as_bucket_view": True})
    assert _keywords(inline.split(" (")[0], "DDPStrategy") <= _parameters(DistributedDataParallel.__init__)


def test_the_torch_calls_a_plain_loop_is_given_are_torchs_own() -> None:
    torch = pytest.importorskip("torch")
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.nn.parallel import DistributedDataParallel

    loop = code.LoopCode()
    snippets = _snippets(loop)
    for python in snippets:  # what each snippet imports is there
        tree = ast.parse(python)
        exec("\n".join(ast.unparse(n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)), {})
    joined = "\n".join(snippets)
    assert _keywords(joined, "PostLocalSGDState") <= _parameters(PostLocalSGDState.__init__)
    assert _keywords(joined, "PeriodicModelAverager") <= _parameters(PeriodicModelAverager.__init__)
    assert _keywords(joined, "register_comm_hook") <= _parameters(DistributedDataParallel.register_comm_hook)
    assert _keywords(joined, "autocast") <= _parameters(torch.autocast.__init__)
    assert callable(DistributedDataParallel.no_sync)
    inline = loop.ddp_args({"bucket_cap_mb": 100, "gradient_as_bucket_view": True})
    assert _keywords(inline, "DistributedDataParallel") <= _parameters(DistributedDataParallel.__init__)


# -- which trainer recorded the run ----------------------------------------------------------------------------


def _record(path: Path, info: dict[str, object], trainer: dict[str, object]) -> Path:
    write_manifest(
        path, {"run_id": "r1", "created_unix": 1.0, "world_size": 1, "num_nodes": 1, "trainer": trainer}
    )
    w = RankWriter(path, 0)
    w.open({"host": "node0", **info})
    for s in range(5):
        w.add_step(step_record(s))
    w.close(status="completed")
    return path


@pytest.mark.parametrize(
    ("info", "trainer", "adapter", "kind"),
    [
        ({"adapter": "transformers"}, {"namespace": "transformers"}, "transformers", code.TransformersCode),
        (
            {"adapter": "lightning.fabric"},
            {"namespace": "lightning.fabric"},
            "lightning.fabric",
            code.FabricCode,
        ),
        ({"adapter": "loop"}, {"adapter": "loop"}, "loop", code.LoopCode),
        ({}, {"adapter": "loop"}, "loop", code.LoopCode),  # the loop's manifest says it too
        ({"adapter": "lightning"}, {"namespace": "pytorch_lightning"}, "lightning", code.LightningCode),
        (
            {},
            {"namespace": "lightning.pytorch"},
            None,
            code.LightningCode,
        ),  # before adapters named themselves
    ],
)
def test_the_run_says_which_trainer_recorded_it(
    tmp_path: Path, info: dict[str, object], trainer: dict[str, object], adapter: str | None, kind: type
) -> None:
    a = analyze(_record(tmp_path / "run", info, trainer))
    assert a.run.adapter == adapter
    ctx = context(a, [B32])
    assert type(ctx.code) is kind
