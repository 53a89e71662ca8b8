"""The recording session: one run's record under any trainer (DESIGN.md, "One direction of flow").

Trainer adapters (tuneup.plugins: the Lightning callback, the plain-loop `track`, Fabric, Hugging Face)
translate their trainer's events into `RecordingSession` calls; the session drives tuneup.collect (step
clock, telemetry, comm probe, noise scale, FLOPs, profiler) and tuneup.record (the writer, the manifest, the
run directory and its segments, object storage). It imports no adapter and no trainer; torch only inside the
functions that need it.

Modules, one question each: `policies` (the options), `run_dir` (where the run goes), `ranks` (this process
among the job's), `handoff` (where it went, for a launching process), `facts` (what the adapter tells),
`manifest`, `describe` (the model and the loader, for the manifest), `mirror` (object storage),
`telemetry`, `noise` (the gradient noise scale's steps), `headline` (figures for the trainer's loggers),
`device`, and `session` itself.
"""

from tuneup.record.writer import RecordingPolicy
from tuneup.recording.facts import TrainingFacts
from tuneup.recording.policies import PricingPolicy, ProfilingPolicy, SessionOptions, policies_from_keywords
from tuneup.recording.ranks import Ranks, TorchRanks, TrainerRanks
from tuneup.recording.session import RecordingSession

__all__ = [
    "PricingPolicy",
    "ProfilingPolicy",
    "Ranks",
    "RecordingPolicy",
    "RecordingSession",
    "SessionOptions",
    "TorchRanks",
    "TrainerRanks",
    "TrainingFacts",
    "policies_from_keywords",
]
