"""One number per run for each compared metric, and the sides of a comparison: a run, a set, a baseline file.

Steps within a run are autocorrelated and are not independent samples (DESIGN.md), so a run gives one
figure per metric: the report's own headline figure (steady state, warm-up left out). A side is a run
directory, a directory whose subdirectories are runs, or a committed baseline file (`tuneup baseline`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tuneup._version import __version__
from tuneup.analyze.analysis import analyze_run
from tuneup.analyze.model import ProcessTelemetry, RunAnalysis
from tuneup.compare.to_target import RunToTarget, run_to_target
from tuneup.record import RunRecordError, load_run
from tuneup.record.schema import MANIFEST_FILE, Run
from tuneup.target import Target

BASELINE_FORMAT = 1


class CompareInputError(ValueError):
    """A side that cannot be compared: one line naming the path and the fix (exit code 2)."""


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    higher_is_better: bool
    # A figure that repeats from run to run of the same workload (the allocator's peak), judged against
    # the rule's deterministic_tolerance rather than run-to-run noise (tuneup.compare.rule.decide).
    # Throughput, step time and cost per sample (throughput priced) vary with the machine: not these.
    deterministic: bool = False


METRICS: dict[str, Metric] = {
    m.key: m
    for m in (
        # The report's figures: throughput is the steady-state mean, step time the mean steady step.
        Metric("throughput", "throughput", "samples/s", True),
        Metric("step_time", "step time", "ms", False),
        Metric("peak_memory", "peak memory", "bytes", False, deterministic=True),
        Metric("cost_per_sample", "cost per sample", "USD", False),
        # Collective time a step waited for (DDP, FSDP; none on one process): a step-time regression's
        # cause, and one that step time can hide while compute shrinks.
        Metric("exposed_comm", "exposed communication", "ms", False),
    )
}


@dataclass(frozen=True)
class RunSummary:
    """A run's figures for comparison; None where the run did not record what a metric needs."""

    run_id: str
    path: str
    throughput: float | None
    throughput_unit: str  # "samples/s", or "steps/s" where samples per batch were not known
    step_time_ms: float | None
    peak_memory_bytes: float | None
    memory_kind: str | None  # "GPU allocated", or "process HWM" (PSS, USS, RSS: the report's measure)
    usd_per_sample: float | None
    steady_steps: int
    fingerprint: dict[str, Any] = field(default_factory=dict)
    # The time and cost to `compare --target`'s target (None: no target asked for). A baseline file keeps
    # no metric curve: its runs say so rather than carry a figure from another target.
    to_target: RunToTarget | None = None
    # The commit the run's git state recorded (for the CI history), and the exposed communication a step
    # (collectives the step waited for; None on one process). Neither is kept in a baseline file.
    commit: str | None = None
    exposed_comm_ms: float | None = None

    def value(self, metric: str) -> float | None:
        return {
            "throughput": self.throughput,
            "step_time": self.step_time_ms,
            "peak_memory": self.peak_memory_bytes,
            "cost_per_sample": self.usd_per_sample,
            "exposed_comm": self.exposed_comm_ms,
        }[metric]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fingerprint(run: Run) -> dict[str, Any]:
    """What must be equal for two runs' speeds to be comparable: the hardware and the workload's shape."""
    m = run.manifest
    t, d, env = m.trainer, m.dataloader, m.environment
    gpus = (m.gpus or {}).get("gpus") or []
    return {
        "hardware": {
            "accelerator": t.get("accelerator"),
            "gpus": sorted(str(g.get("name")) for g in gpus if isinstance(g, dict)),
            "cpu_model": (env.get("host") or {}).get("cpu_model"),
            "world_size": m.world_size,
            "num_nodes": m.num_nodes,
        },
        "workload": {
            "model": m.model.get("class"),
            "parameters": m.model.get("parameters"),
            "batch_size": d.get("batch_size"),
            "accumulate_grad_batches": t.get("accumulate_grad_batches"),
            "precision": t.get("precision"),
            "strategy": t.get("strategy"),
        },
    }


def summarize_run(run: Run, analysis: RunAnalysis | None = None, target: Target | None = None) -> RunSummary:
    """The run's headline figures, as the report states them (one definition: tuneup.analyze.throughput):
    steady-state mean throughput, the mean steady step, peak memory, and USD per sample at the recorded
    price; with `target`, its time and cost to it (the convergence section's). `analysis`: the run's
    analysis where the caller has it already (made with `target` where one is given)."""
    analysis = analysis if analysis is not None else analyze_run(run, target=target)
    rates = analysis.throughput
    throughput, unit = rates.samples_per_s, "samples/s"
    if throughput is None and rates.steps_per_s is not None:
        throughput, unit = rates.steps_per_s, "steps/s"
    tel = analysis.telemetry
    if tel.gpu_allocated_peak_bytes is not None:
        memory, kind = float(tel.gpu_allocated_peak_bytes), "GPU allocated"
    else:
        memory, kind = _process_memory(tel.processes)
    samples_per_usd = analysis.cost.figures.samples_per_usd if analysis.cost is not None else None
    git = analysis.environment.git or {}
    comm = analysis.communication
    return RunSummary(
        run_id=run.run_id,
        path=run.location,
        throughput=throughput,
        throughput_unit=unit,
        step_time_ms=analysis.step_time.mean_ms,
        peak_memory_bytes=memory,
        memory_kind=kind if memory is not None else None,
        usd_per_sample=1.0 / samples_per_usd if samples_per_usd else None,
        steady_steps=min((r.steps for r in analysis.step_time.per_rank), default=0),
        fingerprint=fingerprint(run),
        commit=git.get("commit") if isinstance(git.get("commit"), str) else None,
        exposed_comm_ms=comm.exposed_ms_per_step if comm is not None else None,
        to_target=None
        if target is None
        else run_to_target(
            run.run_id, analysis.convergence.target if analysis.convergence is not None else None
        ),
    )


def _process_memory(processes: Sequence[ProcessTelemetry]) -> tuple[float | None, str]:
    """The largest rank's process-tree memory peak, as the report states it, and its kind. A run recorded
    before PSS was has "process RSS" (shared pages counted per process): compare skips peak memory
    between it and a "process PSS" run rather than call the drop an improvement."""
    peaks = [(p.memory_bytes_max, p.memory_measure) for p in processes if p.memory_bytes_max is not None]
    if not peaks:
        return None, "process RSS"
    return float(max(b for b, _ in peaks)), "process " + "/".join(sorted({m.upper() for _, m in peaks}))


# -- sides -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One side of a comparison: its runs' summaries and where they came from."""

    label: str
    kind: str  # "run", "set" or "baseline file"
    runs: tuple[RunSummary, ...]

    @property
    def fingerprint(self) -> dict[str, Any]:
        return self.runs[0].fingerprint if self.runs else {}


def _load_one(path: str | Path, target: Target | None = None) -> RunSummary:
    return summarize_run(load_run(path), target=target)


def _without_curves(side: Side, target: Target | None) -> Side:
    """A baseline file's runs, each saying it has no time to `target` (the file keeps no metric curve)."""
    if target is None or side.kind != "baseline file":
        return side
    why = "a baseline file keeps no metric curve; compare with the run directories"
    runs = tuple(replace(r, to_target=RunToTarget(r.run_id, "unknown", why)) for r in side.runs)
    return Side(side.label, side.kind, runs)


def load_side(path: str | Path, target: Target | None = None) -> Side:
    """A run directory (or a run's URL on object storage), a directory of run directories, or a baseline
    file; CompareInputError otherwise. With `target`, each run's time and cost to it too."""
    from tuneup.record.remote import is_url

    if is_url(path):
        return _without_curves(_load_url_side(str(path), target), target)
    p = Path(path)
    if not p.exists():
        raise CompareInputError(
            f"{p}: no such file or directory; give a run directory, a set of runs or a baseline file"
        )
    if p.is_file():
        return _without_curves(load_baseline(p), target)
    try:
        if (p / MANIFEST_FILE).is_file():
            return Side(str(p), "run", (_load_one(p, target),))
        subdirs = sorted(q for q in p.iterdir() if q.is_dir() and (q / MANIFEST_FILE).is_file())
        if not subdirs:
            raise CompareInputError(
                f"{p}: an empty set: neither a run (no {MANIFEST_FILE}) nor a directory of runs; "
                "point at what `tuneup bench` or TuneupCallback wrote"
            )
        runs = tuple(_load_one(q, target) for q in subdirs)
    except RunRecordError as exc:
        raise CompareInputError(str(exc)) from None
    side = Side(str(p), "set", runs)
    differs = mismatches(runs[0].fingerprint, [r.fingerprint for r in runs[1:]])
    if differs:
        raise CompareInputError(f"{p}: the runs of this set differ from each other ({'; '.join(differs)})")
    return side


def mismatches(reference: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> list[str]:
    """What differs between fingerprints, as 'hardware.world_size: 2 vs 4' phrases."""
    out: list[str] = []
    for other in others:
        for group in sorted(set(reference) | set(other)):
            a, b = reference.get(group) or {}, other.get(group) or {}
            for key in sorted(set(a) | set(b)):
                phrase = f"{group}.{key}: {a.get(key)!r} vs {b.get(key)!r}"
                if a.get(key) != b.get(key) and phrase not in out:
                    out.append(phrase)
    return out


# -- baseline files ----------------------------------------------------------------------------------


# A baseline file keeps the compared figures; these history-only fields stay out, so that its format is
# unchanged (a file written now reads in an older tuneup and the reverse).
_NOT_IN_FILES = ("commit", "exposed_comm_ms")


def baseline_document(runs: Sequence[RunSummary], *, created: str | None = None) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "tuneup_baseline": BASELINE_FORMAT,
        "tuneup_version": __version__,
        "created": created or now,
        "updated": now,
        "fingerprint": runs[0].fingerprint if runs else {},
        "runs": [
            {k: v for k, v in r.as_dict().items() if k not in ("fingerprint", "to_target", *_NOT_IN_FILES)}
            for r in runs
        ],
    }


def _load_url_side(url: str, target: Target | None = None) -> Side:
    """A run's URL on object storage, or a baseline file's (a .json object)."""
    if url.endswith(".json"):
        import tempfile

        from tuneup.record.remote import filesystem

        try:
            fs, where = filesystem(url)
            data = fs.cat_file(where)
        except Exception as exc:  # a missing backend, no such object, no credentials: one line
            raise CompareInputError(f"{url}: cannot read it ({type(exc).__name__}: {exc})") from None
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / "baseline.json"
            local.write_bytes(data)
            side = load_baseline(local)
        return Side(url, side.kind, side.runs)
    try:
        return Side(url, "run", (_load_one(url, target),))
    except RunRecordError as exc:
        raise CompareInputError(str(exc)) from None


def load_baseline(path: Path) -> Side:
    """A committed baseline file; a damaged one is CompareInputError naming the file and the problem."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise CompareInputError(f"{path}: not a tuneup baseline file (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise CompareInputError(
            f"{path}: not a tuneup baseline file (invalid JSON at line {exc.lineno}, column {exc.colno}); "
            "recreate it with `tuneup baseline save`"
        ) from None
    except OSError as exc:
        raise CompareInputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if not isinstance(data, dict) or "tuneup_baseline" not in data:
        raise CompareInputError(f"{path}: not a tuneup baseline file (no 'tuneup_baseline' key)")
    if data["tuneup_baseline"] != BASELINE_FORMAT:
        raise CompareInputError(
            f"{path}: baseline format {data['tuneup_baseline']!r}, this tuneup reads {BASELINE_FORMAT}; "
            "recreate it with this version's `tuneup baseline save`"
        )
    entries = data.get("runs")
    fp = data.get("fingerprint")
    if not isinstance(entries, list) or not entries or not isinstance(fp, dict):
        raise CompareInputError(f"{path}: a baseline file without runs; save one with `tuneup baseline save`")
    runs = []
    for i, entry in enumerate(entries):
        try:
            runs.append(_baseline_run(entry, fp))
        except (TypeError, ValueError, KeyError) as exc:
            raise CompareInputError(f"{path}: run {i + 1} of the baseline is damaged ({exc})") from None
    return Side(str(path), "baseline file", tuple(runs))


def _number(entry: Mapping[str, Any], key: str) -> float | None:
    value = entry.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{key} must be a positive number or null, got {value!r}")
    return float(value)


def _baseline_run(entry: Any, fp: dict[str, Any]) -> RunSummary:
    if not isinstance(entry, dict):
        raise TypeError("not an object")
    return RunSummary(
        run_id=str(entry["run_id"]),
        path=str(entry.get("path", "")),
        throughput=_number(entry, "throughput"),
        throughput_unit=str(entry.get("throughput_unit", "samples/s")),
        step_time_ms=_number(entry, "step_time_ms"),
        peak_memory_bytes=_number(entry, "peak_memory_bytes"),
        memory_kind=entry.get("memory_kind"),
        usd_per_sample=_number(entry, "usd_per_sample"),
        steady_steps=int(entry.get("steady_steps", 0)),
        fingerprint=fp,
    )
