"""The tuner's knob registry (tuneup.tune.knobs): every entry is complete, and a knob added as one entry
(registered here for the test) flows through the command line, the space, the search's model, the trial
in the training process and the report, without another module knowing its name."""

from __future__ import annotations

import dataclasses
import json
import keyword
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tuneup.advise.model import Setting
from tuneup.tune import knobs as registry
from tuneup.tune.knobs import Knob, KnobCode, SpaceContext, StepShares, TrialContext
from tuneup.tune.space import Config, SearchSpace, SpaceError
from tuneup.tune.state import OK, Trial, TuneState, load_state, save_state

JOBS = [
    SpaceContext(world_size=1, ranks_per_node=1, on_gpu=False, cpus=2),
    SpaceContext(world_size=8, ranks_per_node=4, on_gpu=True, cpus=64),
]
SHARES = [
    StepShares(data=d, comm=c, on_gpu=g) for d in (0.0, 0.5, 1.0) for c in (0.0, 0.5, 1.0) for g in (0, 1)
]
# Names a knob cannot take: Config's and SearchSpace's own attributes would hide it.
TAKEN = {name for cls in (Config, SearchSpace) for name in dir(cls)} | {"keep_global_batch"}


def _samples(entry: Knob) -> list[Any]:
    """Values of the knob's type that its space accepts."""
    return list(entry.choices) if entry.value_type is str else [entry.minimum, entry.minimum + 3]


@pytest.mark.parametrize("entry", registry.knobs(), ids=lambda k: k.name)
def test_every_registered_knob_is_complete(entry: Knob) -> None:
    assert entry.name.isidentifier() and not keyword.iskeyword(entry.name) and entry.name not in TAKEN
    assert entry.title and entry.help and entry.metavar
    assert entry.option.startswith("--") and entry.option[2:].replace("-", "").isalnum()
    assert entry.value_type in (int, str)
    if entry.value_type is str:
        assert entry.choices, "a str knob names the values it allows"
    else:
        assert isinstance(entry.minimum, int) and not entry.choices
    # The trial in the training process: an apply function that says how it applies the knob.
    assert callable(entry.apply) and (entry.apply.__doc__ or "").strip()
    # The search's model: the step-time model predicts it (under its own name), or the trials measure its
    # effects and an unmeasured level has bounds around 1.
    assert entry.model_input or entry.unmeasured is not None
    if entry.model_input:
        assert entry.name in {f.name for f in dataclasses.fields(Setting)}
    if entry.unmeasured is not None:
        for value in _samples(entry):
            for shares in SHARES:
                low, high = entry.unmeasured(value, shares)
                assert 0 < low <= 1 <= high and math.isfinite(high), (value, shares)
    assert not entry.verify or entry.from_run is not None  # a run is checked against what it recorded
    assert not (entry.cli_key and entry.cli_arg)
    for value in _samples(entry):
        assert entry.check([value]) == (value,)
        label = entry.label(value)
        # Labels are joined with spaces, and with dashes into trial directory names.
        assert label and " " not in label and "/" not in label
        code = entry.code(value)
        assert isinstance(code, KnobCode)
        assert code.dataloader or code.trainer or code.ddp or code.ddp_strategy or code.notes
    for job in JOBS:
        for current in [None, *_samples(entry)]:
            defaults = entry.defaults(current, job)
            assert entry.check(defaults) == tuple(sorted(defaults) if entry.value_type is int else defaults)


def test_options_and_labels_are_unique() -> None:
    entries = registry.knobs()
    assert len({k.option for k in entries}) == len(entries)
    assert len({k.title for k in entries}) == len(entries)
    with pytest.raises(ValueError, match="already registered"):
        registry.register(entries[0])


# -- a knob added as one entry ---------------------------------------------------------------------------


def apply_prefetch(ctx: TrialContext, value: Any) -> None:
    """The datamodule's `prefetch_factor` attribute, and the training DataLoader's at on_train_start."""
    datamodule = ctx.trainer.datamodule
    if not hasattr(datamodule, "prefetch_factor"):
        ctx.refused("prefetch_factor", "the datamodule has no `prefetch_factor` attribute")
        return
    datamodule.prefetch_factor = int(value)

    def on_the_loader() -> None:
        ctx.trainer.train_dataloader.prefetch_factor = int(value)
        ctx.applied("prefetch_factor", int(value))

    ctx.at_train_start("prefetch_factor", on_the_loader)


PREFETCH = Knob(
    name="prefetch_factor",
    title="batches prefetched per worker",
    value_type=int,
    option="--prefetch",
    metavar="N,...",
    help="DataLoader prefetch_factor values",
    label_format="p{}",
    apply=apply_prefetch,
    argument_of="dataloader",
    defaults=lambda current, job: (2, 4) if current is not None else (),
    unmeasured=lambda level, shares: (1.0 - 0.5 * shares.data, 1.05),
)

BASE = Config(batch_size=32, accumulate_grad_batches=1, num_workers=2, precision="32-true")


def _fit(settings: dict[str, Any], status: Path) -> tuple[Any, dict[str, Any]]:
    """The trial's side, as TuneupCallback drives it, on a stand-in Trainer."""
    from tuneup.plugins.lightning.trial import TrialControl
    from tuneup.tune.protocol import TrialSpec

    loader = SimpleNamespace(prefetch_factor=2)
    trainer = SimpleNamespace(
        datamodule=SimpleNamespace(prefetch_factor=2), train_dataloader=loader, global_step=0, callbacks=[]
    )
    control = TrialControl(TrialSpec(trial="01", settings=settings, status_dir=str(status)), rank=0)
    control.apply_at_setup(trainer, SimpleNamespace(), on_cuda=False)
    control.apply_at_train_start(trainer)
    return trainer, json.loads((status / "applied.json").read_text())


def test_a_knob_registered_as_one_entry_flows_through_the_tuner(tmp_path: Path) -> None:
    from tuneup.cli import build_parser
    from tuneup.tune.command import _requested
    from tuneup.tune.predict import TrialModel
    from tuneup.tune.render import format_tune_text, rendered_summary
    from tuneup.tune.script import Script, cli_script
    from tuneup.tune.session import default_space

    with registry.registered(PREFETCH):
        # The command line: `tuneup tune --prefetch 2,4`.
        args = build_parser().parse_args(["tune", "--prefetch", "4,2", "--", "python", "train.py"])
        requested = _requested(args)
        assert requested == {"prefetch_factor": [4, 2]}
        with pytest.raises(SpaceError, match="--prefetch values must be whole numbers >= 1"):
            SearchSpace(prefetch_factor=(0,))

        # The space: the values asked for, every combination, a label.
        base = BASE.replace(prefetch_factor=2)
        space = default_space(requested, base, world_size=1, ranks_per_node=1, on_gpu=False, cpus=4)
        assert space.prefetch_factor == (2, 4) and "prefetch_factor" in space.tuned()
        winner = base.replace(batch_size=64, prefetch_factor=4)
        assert winner in space.configs(base)
        assert winner.label() == "b64 a1 w2 32-true p4"
        assert SearchSpace.from_dict(json.loads(json.dumps(space.as_dict()))) == space

        # The search's model: a level no trial measured widens the prediction by the knob's bounds.
        model = TrialModel(world_size=1, baseline=base, on_gpu=False, model=None, fallback=(base, 10.0))
        assert model.unmeasured_knobs(base.replace(prefetch_factor=4)) == ["prefetch_factor"]
        assert model.predict(base.replace(prefetch_factor=4)).low < model.predict(base).low

        # How the trial gets it: through TuneupCallback, or as a LightningCLI override where the script's
        # config takes it.
        _, settings = Script(("python", "train.py"), "callback").trial_argv(winner, base)
        assert settings == {"batch_size": 64, "prefetch_factor": 4}
        cli = cli_script(
            ["main.py", "fit"], {"trainer": {}, "data": {"prefetch_factor": 2, "batch_size": 32}}
        )
        assert cli.trial_argv(winner, base)[0][2:] == [
            "--trainer.callbacks+=tuneup.TuneupCallback",
            "--data.batch_size=64",
            "--data.prefetch_factor=4",
        ]

        # The trial applies it with its apply function, and says so.
        status = tmp_path / "status"
        status.mkdir()
        trainer, applied = _fit({"prefetch_factor": 4}, status)
        assert applied == {"applied": {"prefetch_factor": 4}, "not_applied": {}}
        assert trainer.datamodule.prefetch_factor == 4 and trainer.train_dataloader.prefetch_factor == 4

        # The session keeps it in tune.json, and the report says it and prints its code.
        state = TuneState(command=["python", "train.py"], script_kind="callback", objective="throughput")
        state.space = space
        state.trials = [
            Trial(
                index=0,
                name="00-baseline",
                config=base,
                role="baseline",
                samples_per_s=100.0,
                objective=100.0,
            ),
            Trial(index=1, name="01", config=winner, role="search", samples_per_s=150.0, objective=150.0),
        ]
        state.result = {"best_trial": 1, "winner": winner.as_dict(), "kept_current": False,
                        "verdict": "IMPROVEMENT", "reason": "faster", "gain": 0.5}  # fmt: skip
        save_state(tmp_path, state)
        state = load_state(tmp_path)
        assert state.trials[1].config == winner and state.trials[1].status == OK
        summary = rendered_summary(state)
        assert summary["changes"]["prefetch_factor"] == {"current": 2, "new": 4}
        assert "prefetch_factor=4" in summary["settings"]["python"]
        assert "prefetch_factor: 4" in summary["settings"]["yaml"]
        text = format_tune_text(state)
        assert "batches prefetched per worker 2 → 4" in text and "b64 a1 w2 32-true p4" in text

    # Gone with its entry: nothing else held it.
    with pytest.raises(SpaceError, match="unknown knob"):
        Config(prefetch_factor=4)
    assert "--prefetch" not in _tune_help()


def _tune_help() -> str:
    import argparse

    from tuneup.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    return str(commands["tune"].format_help())


def test_a_knob_the_script_cannot_take_is_refused_with_the_reason(tmp_path: Path) -> None:
    from tuneup.plugins.lightning.trial import TrialControl
    from tuneup.tune.protocol import TrialSpec

    with registry.registered(PREFETCH):
        control = TrialControl(
            TrialSpec(trial="01", settings={"prefetch_factor": 4, "nonsense": 1}, status_dir=str(tmp_path)), 0
        )
        trainer = SimpleNamespace(datamodule=object(), global_step=0)
        control.apply_at_setup(trainer, SimpleNamespace(), on_cuda=False)
        control.apply_at_train_start(trainer)
    assert control.applied == {}
    assert "no `prefetch_factor` attribute" in control.not_applied["prefetch_factor"]
    assert "not a knob" in control.not_applied["nonsense"]
