"""report.schema.json, generated from the typed analysis and advice.

The dataclasses of tuneup.analyze.model (RunAnalysis) and tuneup.advise.model (Advice, under
"recommendations") are the contract; the schema follows them field by field, so that it cannot miss one.
What a type cannot say is written here, once, keyed by "Class.field" (or by "Class" for a whole object): a
description, a range ("minimum"), an enumeration, a condition between fields. A refinement naming a field
that does not exist stops the generation, so none outlives its field.

Rules of the generation:
- every dataclass is an object of `$defs`, closed (`additionalProperties: false`): report.json holds its
  fields and nothing else;
- a field without a default is required (report.json always writes it, null where not measured); a field
  with a default may be absent (a report written before the field existed);
- `X | None` admits null; `list[X]` is an array of X; `dict[str, X]` an object whose values are X (open
  keys, unless a refinement names them); `Any` is anything.

Regenerate after changing the model (tests/test_schema_generated.py fails until you do):

    python -m tuneup.report.json_schema --write
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from tuneup.advise.model import Advice
from tuneup.analyze.model import REPORT_SCHEMA_VERSION, TIMELINE_PARTS, Energy, RunAnalysis
from tuneup.analyze.ranks import LOCAL_PHASES
from tuneup.record.schema import PHASE_NAMES, STEP_TIME_LINES

SCHEMA_FILE = Path(__file__).with_name("report.schema.json")
REGENERATE = "python -m tuneup.report.json_schema --write"

_HEADER: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"tuneup-report-v{REPORT_SCHEMA_VERSION}",
    "title": f"tuneup report, version {REPORT_SCHEMA_VERSION}",
    "description": (
        "What `tuneup report --format json` writes: the run's analysis (tuneup/analyze/model.py, RunAnalysis) "
        "and the advice on it under `recommendations` (tuneup/advise/model.py, Advice). GENERATED from those "
        f"dataclasses by tuneup/report/json_schema.py: do not edit; run `{REGENERATE}`. Times are unix "
        "seconds (`*_unix`) or durations whose name ends in their unit (`_ms`, `_s`); byte counts end in "
        "`_bytes`; shares are fractions of 1. A figure that could not be measured is null, never absent, "
        "where its field is required; a field that is not required may be absent from a report written "
        "before it existed."
    ),
}


def _defaulted(cls: type) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]


def _each(keys: str, **schema: Any) -> dict[str, dict[str, Any]]:
    """The same refinement for several space-separated "Class.field" keys."""
    return {key: dict(schema) for key in keys.split()}


def _merge(*parts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for key, schema in part.items():
            out.setdefault(key, {}).update(schema)
    return out


_PHASE_KEYS = {"propertyNames": {"enum": list(STEP_TIME_LINES)}}

# What the types cannot say. Keys: "Class.field" (merged into that property's schema) or "Class" (into the
# object's own schema).
REFINEMENTS: dict[str, dict[str, Any]] = _merge(
    # -- ranges: counts and durations no measurement makes negative, sizes that are at least one --------
    _each(
        "RunInfo.steps_recorded Warmup.steps DataLoading.stall_count Telemetry.samples "
        "Telemetry.gpu_allocated_peak_bytes RankThroughput.samples_per_s RankThroughput.tokens_per_s "
        "RankThroughput.steps_per_s Throughput.samples_per_s Throughput.tokens_per_s Throughput.steps_per_s "
        "Price.spot_usd_per_hour Cost.steps_per_epoch Cost.epoch_s "
        "Money.usd_per_hour Money.samples_per_usd Money.tokens_per_usd Money.usd_per_million_tokens "
        "Money.usd_per_epoch Money.usd_so_far Projection.total_steps Projection.steps_remaining "
        "Projection.time_s Projection.usd Projection.usd_spot Compute.flops_per_step Compute.flops_per_sample "
        "Compute.achieved_tflops_per_s Compute.achieved_tflops_per_s_per_device "
        "Compute.peak_tflops_per_device Compute.mfu Energy.gpus Energy.span_s Energy.energy_kwh "
        "Energy.mean_power_w Energy.j_per_step Energy.kwh_per_million_tokens Energy.electricity_usd_per_kwh "
        "Energy.electricity_usd Energy.electricity_usd_per_million_tokens Segment.index Segment.step_ms "
        "Segment.downtime_before_s Segment.redone_steps Segment.redone_s Interruptions.interruptions "
        "Interruptions.downtime_s Interruptions.redone_s Interruptions.lost_s "
        "Interruptions.checkpoint_saves_seen Interruptions.recommended_checkpoint_interval_s "
        "Interruptions.usd_all_segments Interruptions.usd_lost Interruptions.user_stops NoiseScale.steps "
        "NoiseScale.b_simple NoiseScale.ci_low NoiseScale.ci_high SyncStrategy.start_step "
        "SyncStrategy.started_at SyncStrategy.end_step SyncStrategy.steps SyncStrategy.exact_bytes_per_step "
        "SyncStrategy.strategy_steps SyncStrategy.sent_bytes_per_step SyncStrategy.bytes_ratio "
        "SyncStrategy.cross_node_exact_bytes_per_step SyncStrategy.cross_node_sent_bytes_per_step "
        "SyncStrategy.cross_node_ratio SyncStrategy.check_bytes SyncStrategy.check_overhead_share "
        "SyncStrategy.exact_steps_timed SyncStrategy.strategy_steps_timed SyncStrategy.exact_exposed_comm_ms "
        "SyncStrategy.strategy_exposed_comm_ms SyncStrategy.exact_step_ms SyncStrategy.strategy_step_ms "
        "SyncCheck.step SyncFallback.step TimelinePart.seconds TimelinePart.share "
        "Timeline.first_step_extra_s Hardware.gpus_per_node",
        minimum=0,
    ),
    _each(
        "RunInfo.world_size RunInfo.num_nodes HostRanks.ranks Price.devices Price.nodes "
        "PricedInstance.gpu_count Segment.world_size NoiseScale.small_batch NoiseScale.big_batch "
        "SyncStrategy.nodes SyncStrategy.ranks_per_node",
        minimum=1,
    ),
    {
        "Warmup.share": {"minimum": 0, "maximum": 1},
        "Price.usd_per_hour": {"exclusiveMinimum": 0},
        # -- enumerations: names a section chooses from a fixed list ------------------------------------
        "RunAnalysis.report_schema_version": {"const": REPORT_SCHEMA_VERSION},
        "TimeSeries.source": {"enum": ["steps", "windows"]},
        "StragglerInfo.phase": {"enum": [p.removesuffix("_ms") for p in LOCAL_PHASES]},
        "Finding.severity": {"enum": ["warning", "info"]},
        "Energy.source": {"enum": [None, "counter", "power samples", "counter and power samples"]},
        "Recommendation.confidence": {"enum": ["high", "medium", "low"]},
        "TimelinePart.name": {"enum": list(TIMELINE_PARTS)},
        "PhaseOperators.phase": {"enum": list(PHASE_NAMES)},
        "StepTime.phases_not_timed": {"items": {"enum": list(PHASE_NAMES)}},
        # The step's lines are the run record's one list (tuneup.record.schema): the phases, and tuneup's
        # own time where the record keeps it apart; every rank's record has every phase.
        "StepTime.phases": _PHASE_KEYS,
        "RankStepTime.phase_median_ms": {**_PHASE_KEYS, "required": list(PHASE_NAMES)},
        "RankStepTime.phase_mean_ms": {**_PHASE_KEYS, "required": list(PHASE_NAMES)},
        # The manifest's allow-listed environment variables are strings (tuneup.record.reader checks it).
        "Environment.env": {"additionalProperties": {"type": "string"}},
        # -- conditions between fields ------------------------------------------------------------------
        "Cost": {
            "if": {"properties": {"priced": {"const": True}}},
            "then": {"properties": {"price": {"type": "object"}}},
            "else": {"properties": {"price": {"type": "null"}, "not_priced_reason": {"type": "string"}}},
        },
        # Energy that was measured has every figure (null where a figure has no input, never absent).
        "Energy": {
            "if": {"properties": {"source": {"type": "string"}}},
            "then": {"required": _defaulted(Energy)},
        },
    },
    # -- descriptions ---------------------------------------------------------------------------------
    {
        "RunInfo.steps_seen": {
            "description": "steps the ranks ran (the most of any rank); steps_recorded of them were kept"
        },
        "RunInfo.detail_steps": {"description": "every step was kept up to this many"},
        "RunInfo.sample_every": {"description": "past detail_steps, the multiples of this stride were kept"},
        "StepTime.phases": {
            "description": "Mean per steady step of each phase (data, forward, backward, optimizer, sync, "
            "other) and of tuneup's own time (`tuneup`: its hooks, the noise scale's norms; absent where the "
            "record holds it inside the phases), over all ranks; they add up to mean_ms. Empty without "
            "steady steps."
        },
        "Ranks.median_step_ms": {
            "description": "The spread of the ranks' median steady steps; null without steady steps."
        },
        "Ranks.slowest": {"description": "Up to 5 ranks with the slowest median steady step, slowest first."},
        "Ranks.fastest": {"description": "Up to 5 ranks with the fastest median steady step, fastest first."},
        "Ranks.per_host": {"description": "One row per host: how its ranks' median steady steps spread."},
        "Telemetry.gpu_allocated_peak_bytes": {
            "description": "The CUDA caching allocator's peak over the steady steps, the largest of any "
            "rank; null off GPU."
        },
        "RunAnalysis.communication": {
            "description": "Filled by communication profiling (timed collectives); null without them."
        },
        "RunAnalysis.cost": {
            "description": "What the job costs and what it buys. Money is USD. Every figure is null when "
            "what it needs was not recorded (no price, no token count, no FLOPs, no NVML), never 0; "
            "`not_priced_reason`, `flops.note` and `energy.note` say why. Version-1 reports written before "
            "cost figures existed hold null here."
        },
        "Price.basis": {"description": "One sentence: where the price comes from."},
        "Price.source": {"description": "callback, environment or command line."},
        "PricedInstance.as_of_date": {"description": "ISO date; null when the price is undated."},
        "PricedInstance.origin": {"description": "packaged, or the path of the user's catalog."},
        "Cost.figures_spot": {
            "description": "The same figures at the catalog's spot price; null unless priced on-demand from "
            "an instance with a spot price."
        },
        "Compute.mfu": {"description": "A fraction of 1; null where it is not defined (CPU, no peak)."},
        "RunAnalysis.timeline": {
            "description": "Where the fit's wall time went (tuneup/analyze/timeline.py): setup, "
            "sanity_check, training_steps, validation, checkpoint_saves, other_fit_loop and teardown, of the "
            "reporting rank and per rank, from each rank's real start and end. Seconds. Null or absent in "
            "reports written before it existed."
        },
        "Timeline.compiled": {
            "description": 'modules torch.compile wraps, seen at setup ("": the LightningModule); null: not '
            "recorded"
        },
        "Timeline.first_step_extra_s": {
            "description": "the first training step's time above the steady step time"
        },
        "RunAnalysis.operators": {
            "description": "The top operators of each phase of the steps profiled with "
            "TuneupCallback(profile_steps=N) (tuneup/analyze/operators.py), means per profiled step over the "
            "profiled ranks; null where no step was profiled."
        },
        "RunAnalysis.interruptions": {
            "description": "The run's segments (resumes, restarts), what each interruption cost, and the "
            "Young/Daly checkpoint interval. Seconds and USD; null where not measured. Absent in reports "
            "written before segments existed."
        },
        "Interruptions.user_stops": {"description": "segments the user stopped (Ctrl-C): no interruption"},
        "RunAnalysis.noise_scale": {
            "description": "The gradient noise scale B_simple = tr(Σ)/|G|² (McCandlish et al. 2018) from a "
            "small- and a big-batch gradient norm per step (tuneup/analyze/noise_scale.py): the steady "
            "steps' mean estimates divided, with a 95% interval (b_simple null: the mean |G|² estimate was "
            "not positive, B_simple is larger than can be measured; ci_high null: unbounded above), and the "
            "moving-average series. Null where it was not measured; absent in reports written before it "
            "existed."
        },
        "RunAnalysis.sync_strategy": {
            "description": "What TuneupDDPStrategy's gradient compression or local SGD did "
            "(tuneup/analyze/sync_strategy.py). Steps count optimizer steps taken; the strategy's phase runs "
            "from started_at to the first fallback (end_step) or the end. Bytes are per rank and step: "
            "exact_bytes_per_step what an exact all-reduce sends, sent_bytes_per_step what the step records' "
            "collectives sent in the phase, bytes_ratio exact / sent; the cross_node_* figures only for "
            "hierarchical runs over several nodes; counted_bytes_per_step the strategy's own count, a "
            "cross-check. Times compare the steady exact steps before the start with the phase's steps of "
            "the same run (time_saved_ms_per_step below 0: it cost time). checks: the safeguard's measured "
            "error against its bound, and the loss; fallbacks: when and why it gave a mode up. Null where "
            "the run used no such strategy; absent in reports written before it existed."
        },
        "RunAnalysis.recommendations": {
            "description": "tuneup advise on this run (tuneup/advise/model.py, Advice), or a string saying "
            "why there is none (no steady state, no batch size). Each recommendation has its knob changes, "
            "the objective's predicted relative change `gain` (+0.2 = 20% better) with its interval, a "
            "confidence, the evidence, the Lightning code and YAML, caveats, and the model's figures now and "
            "after; `considered` lists the knobs looked at and left alone, with the reason; `model` the "
            "fitted step-time model's terms; `whatif` the same workload on the catalog's instances. Absent "
            "in reports written before the advice existed."
        },
    },
)

# report.json's document is the analysis plus the advice (tuneup.report.report_document), which no
# dataclass field holds: added to the top object as a field that may be absent.
_EXTRA_TOP_FIELDS = {"recommendations": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/Advice"}]}}


class _Builder:
    def __init__(self) -> None:
        self.defs: dict[str, dict[str, Any]] = {}
        self.classes: dict[str, type] = {}

    def ref(self, cls: type) -> dict[str, Any]:
        name = cls.__name__
        known = self.classes.get(name)
        if known is not None and known is not cls:
            raise ValueError(f"two dataclasses named {name} ({known.__module__}, {cls.__module__})")
        if known is None:
            self.classes[name] = cls
            self.defs[name] = {}  # reserved first: a class that refers to itself ends here
            self.defs[name] = self.object(cls)
        return {"$ref": f"#/$defs/{name}"}

    def object(self, cls: type, extra: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
        properties: dict[str, Any] = {}
        required: list[str] = []
        for f in dataclasses.fields(cls):
            schema = self.type(hints[f.name])
            properties[f.name] = {**schema, **REFINEMENTS.get(f"{cls.__name__}.{f.name}", {})}
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                required.append(f.name)
        for name, schema in (extra or {}).items():
            properties[name] = {**schema, **REFINEMENTS.get(f"{cls.__name__}.{name}", {})}
        out: dict[str, Any] = {"type": "object"}
        doc = (cls.__doc__ or "").strip()
        if doc and not doc.startswith(f"{cls.__name__}("):  # not dataclass's generated signature
            out["description"] = " ".join(doc.split())
        out.update(properties=properties, required=required, additionalProperties=False)
        out.update(REFINEMENTS.get(cls.__name__, {}))
        return out

    def type(self, tp: Any) -> dict[str, Any]:
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            args = typing.get_args(tp)
            nullable = type(None) in args
            options = [self.type(a) for a in args if a is not type(None)]
            if all(set(o) == {"type"} and isinstance(o["type"], str) for o in options):
                names = [o["type"] for o in options] + ["null"] * nullable
                return {"type": names[0] if len(names) == 1 else names}
            if nullable:
                options.append({"type": "null"})
            return {"anyOf": options}
        if tp is Any:
            return {}
        if origin in (list, tuple):
            args = typing.get_args(tp)
            if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):
                raise ValueError(f"cannot express {tp!r}: only tuple[X, ...]")
            items = self.type(args[0])
            return {"type": "array", "items": items} if items else {"type": "array"}
        if origin is dict:
            key, value = typing.get_args(tp)
            if key is not str:
                raise ValueError(f"cannot express {tp!r}: JSON object keys are strings")
            values = self.type(value)
            return {"type": "object", "additionalProperties": values} if values else {"type": "object"}
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self.ref(tp)
        simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
        if tp in simple:
            return {"type": simple[tp]}
        raise ValueError(f"cannot express {tp!r} in the report's schema")


def build_schema() -> dict[str, Any]:
    """The JSON schema of report.json, from RunAnalysis and Advice."""
    builder = _Builder()
    builder.ref(Advice)
    top = builder.object(RunAnalysis, _EXTRA_TOP_FIELDS)
    top.pop("description", None)  # the header's says what the document is
    builder.classes["RunAnalysis"] = RunAnalysis
    _check_refinements(builder.classes)
    return {**_HEADER, **top, "$defs": dict(sorted(builder.defs.items()))}


def _check_refinements(classes: dict[str, type]) -> None:
    for key in REFINEMENTS:
        name, _, field_name = key.partition(".")
        cls = classes.get(name)
        if cls is None:
            raise ValueError(f"refinement {key!r}: no class {name} in report.json")
        if field_name and field_name not in {f.name for f in dataclasses.fields(cls)} | set(
            _EXTRA_TOP_FIELDS if cls is RunAnalysis else ()
        ):
            raise ValueError(f"refinement {key!r}: {name} has no field {field_name}")


def render(schema: dict[str, Any]) -> str:
    """The schema as the committed file holds it: a value that fits on a line is written on one."""
    return _render(schema, 0) + "\n"


def _render(value: Any, level: int, width: int = 110) -> str:
    flat = json.dumps(value, ensure_ascii=False)
    if not isinstance(value, (dict, list)) or not value or 2 * level + len(flat) <= width:
        return flat
    pad = "  " * (level + 1)
    if isinstance(value, list):
        items = [pad + _render(v, level + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + "  " * level + "]"
    items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {_render(v, level + 1)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + "  " * level + "}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tuneup.report.json_schema",
        description="Generate report.schema.json from the analysis and advice dataclasses.",
    )
    parser.add_argument("--write", action="store_true", help=f"write {SCHEMA_FILE.name} (else print it)")
    args = parser.parse_args(argv)
    text = render(build_schema())
    if args.write:
        SCHEMA_FILE.write_text(text, encoding="utf-8")
        print(f"wrote {SCHEMA_FILE}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
