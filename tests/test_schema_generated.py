"""report.schema.json is generated from the analysis and advice dataclasses, and holds report.json to them."""

from __future__ import annotations

import copy
import dataclasses
import typing
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.synthetic import make_run
from tuneup.advise.model import Advice
from tuneup.analyze.model import RunAnalysis
from tuneup.record.schema import STEP_TIME_LINES
from tuneup.report import build_report, json_schema, report_schema


def test_the_committed_schema_is_the_generated_one() -> None:
    generated = json_schema.render(json_schema.build_schema())
    committed = json_schema.SCHEMA_FILE.read_text(encoding="utf-8")
    assert committed == generated, (
        "tuneup/report/report.schema.json is not what the dataclasses generate: run "
        f"`{json_schema.REGENERATE}` and commit the file"
    )
    assert report_schema() == json_schema.build_schema()


def _dataclasses(root: type) -> dict[str, type]:
    """Every dataclass report.json holds below `root`, by name."""
    found: dict[str, type] = {}
    todo = [root]
    while todo:
        cls = todo.pop()
        if cls.__name__ in found:
            continue
        found[cls.__name__] = cls
        for hint in typing.get_type_hints(cls).values():
            stack = [hint]
            while stack:
                tp = stack.pop()
                stack.extend(typing.get_args(tp))
                if isinstance(tp, type) and dataclasses.is_dataclass(tp):
                    todo.append(tp)
    return found


def test_every_field_of_the_model_is_in_the_schema_and_every_object_is_closed() -> None:
    schema = report_schema()
    classes = {**_dataclasses(RunAnalysis), **_dataclasses(Advice)}
    assert len(classes) > 50
    for name, cls in classes.items():
        obj = schema if cls is RunAnalysis else schema["$defs"][name]
        assert obj["additionalProperties"] is False, name
        names = [f.name for f in dataclasses.fields(cls)]
        assert list(obj["properties"])[: len(names)] == names, name
        defaulted = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        }
        assert set(obj["required"]) == set(names) - defaulted, name


def test_a_refinement_of_a_field_that_does_not_exist_stops_the_generation(monkeypatch) -> None:
    monkeypatch.setitem(json_schema.REFINEMENTS, "StepTime.no_such_field", {"minimum": 0})
    with pytest.raises(ValueError, match="StepTime has no field no_such_field"):
        json_schema.build_schema()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run = make_run(tmp_path_factory.mktemp("run") / "run", world_size=2, steps=30)
    return build_report(run)


def test_a_report_validates(report: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(report_schema())
    assert not [e.message for e in validator.iter_errors(report)]
    assert set(report["step_time"]["phases"]) <= set(STEP_TIME_LINES)


def _set(path: str, value: Any) -> Any:
    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            doc = doc[int(key)] if isinstance(doc, list) else doc[key]
        doc[last] = value

    return change


def _drop(path: str) -> Any:
    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            doc = doc[int(key)] if isinstance(doc, list) else doc[key]
        del doc[last]

    return change


# Reports the model cannot read. All but the last four passed the hand-written schema, which left most
# fields unchecked.
@pytest.mark.parametrize(
    "breaking",
    [
        _set("run.max_steps", "many"),  # a field the hand-written schema did not list
        _set("run.hardware.driver_version", 550),
        _set("run.unknown_field", 1),  # an object is closed: no field the model does not have
        _set("step_time.phases.data.noisy", "yes"),
        _set("step_time.slow_periods", [{"first_step": 1}]),
        _set("step_time.per_rank.0.phase_mean_ms.nap", 1.0),  # not a line of the step
        _drop("step_time.per_rank.0.phase_median_ms.sync"),  # every rank's record has every phase
        _set("data_loader.num_workers", 1.5),
        _set("data_loader.worst_stalls", [{"rank": 0, "step": 1, "data_ms": "1", "wall_ms": 2.0}]),
        _set("throughput.per_rank.0.extra", None),
        _set("telemetry.processes.0.memory_measure", None),
        _set("environment.git", 5),
        _set("warmup.no_steady_state", 3),
        # The hand-written schema refused these too.
        _set("step_time.phases.idle", {"ms": 1.0, "share": 0.1}),  # not a line of the step
        _set("step_time.phases.data.ms", "1"),
        _set("timeline", {"rank": 0}),
        _set("cost.figures.usd_per_hour", "7"),
    ],
)
def test_the_schema_refuses_what_the_model_cannot_read(report: dict[str, Any], breaking: Any) -> None:
    bad = copy.deepcopy(report)
    breaking(bad)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, report_schema())


def test_fields_added_after_version_1_may_be_absent(report: dict[str, Any]) -> None:
    """A report written before a field existed (a field with a default) still validates."""
    old = copy.deepcopy(report)
    for key in ("interruptions", "operators", "timeline", "noise_scale", "sync_strategy", "recommendations"):
        old.pop(key, None)
    del old["run"]["steps_seen"]
    jsonschema.validate(old, report_schema())


def test_the_generator_writes_the_file_it_checks(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "report.schema.json"
    monkeypatch.setattr(json_schema, "SCHEMA_FILE", target)
    assert json_schema.main(["--write"]) == 0
    assert target.read_text(encoding="utf-8") == json_schema.render(json_schema.build_schema())
