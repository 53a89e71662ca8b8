"""The run record: the one contract between what is measured and what is reported.

A run directory holds a manifest written by rank 0 and, per rank, append-only JSON-lines streams that only
that rank writes. `load_run` reads it back into typed objects. Nothing here imports torch or Lightning.
"""

from tuneup.record.reader import RunRecordError, load_run
from tuneup.record.schema import (
    PHASE_NAMES,
    SCHEMA_VERSION,
    STEP_METRICS,
    CollectiveRecord,
    Manifest,
    RankInfo,
    RankRecord,
    RecordedStep,
    Run,
    StepRecord,
    WindowAggregate,
)
from tuneup.record.writer import RankWriter, RecordingPolicy, write_manifest

__all__ = [
    "PHASE_NAMES",
    "SCHEMA_VERSION",
    "STEP_METRICS",
    "CollectiveRecord",
    "Manifest",
    "RankInfo",
    "RankRecord",
    "RankWriter",
    "RecordedStep",
    "RecordingPolicy",
    "Run",
    "RunRecordError",
    "StepRecord",
    "WindowAggregate",
    "load_run",
    "write_manifest",
]
