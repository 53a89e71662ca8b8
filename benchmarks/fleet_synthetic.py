"""Synthetic run records for the fleet index and dashboard: N runs made from a real one, varied.

    python benchmarks/fleet_synthetic.py OUT_DIR --runs 10000 [--source reports/example/run] [--seed 0]

Each run is the real record (by default reports/example/run, the 2-rank DDP demo: steps, windows,
collectives, events, telemetry and metrics of every rank) transformed consistently, every timestamp and
duration together, so that the analysis reads it as a run of its own:

- tags project / user / experiment from small pools (4 x 6 x 12), recorded as TuneupCallback(tags=...) does;
- an instance from a few clouds' catalog rows, its GPU model in the manifest, a world size it holds (1, 2, 4
  or 8 ranks: one rank is the demo's rank 0 without its collectives, more ranks repeat the two recorded
  ones), and one run in ten unpriced (no instance recorded);
- start dates spread over the 60 days before `--until`, runs of one experiment in time order;
- step times scaled by the instance's speed and a few per cent of noise, and in some experiments a
  slowdown (1.3x) injected from one run on, so that consecutive runs of that tag regress;
- the run cut to 100, 200 or 300 steps (whole windows of 100 steps), validation every 50 steps in most
  runs and none in the rest, and a checkpoint save every 100 steps in some.

Records are laid out `OUT_DIR/<project>/<user>/<run_id>/` (what a team's bucket holds). A few templates
(one per world size, length, speed, validation and checkpoint setting) are built first; each run is a
template with its timestamps moved to its start date, so 10,000 runs take about a minute to write.
`make_fleet` is what tests call with a handful of runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "reports" / "example" / "run"

PROJECTS = ("vision", "speech", "llm", "recsys")
USERS = ("ana", "bo", "chen", "dara", "eli", "fatima")
EXPERIMENTS_PER_PROJECT = 3  # 12 experiments in all: enough groups to regress, few enough to chart
DAYS = 60
SLOWDOWN = 1.3  # step time after an injected regression
UNPRICED_SHARE = 0.1

# (catalog key, GPU model as NVML names it, GPUs per node, step time against an A100's)
INSTANCES = (
    ("aws:p5.48xlarge", "NVIDIA H100 80GB HBM3", 8, 0.5),
    ("aws:p4d.24xlarge", "NVIDIA A100-SXM4-40GB", 8, 1.0),
    ("gcp:a2-highgpu-1g", "NVIDIA A100-SXM4-40GB", 1, 1.0),
    ("gcp:g2-standard-4", "NVIDIA L4", 1, 2.2),
    ("gcp:g2-standard-48", "NVIDIA L4", 4, 2.2),
    ("lambda:gpu_8x_h100_sxm5", "NVIDIA H100 80GB HBM3", 8, 0.5),
    ("lambda:gpu_1x_h100_sxm5", "NVIDIA H100 80GB HBM3", 1, 0.5),
    ("azure:Standard_ND96asr_v4", "NVIDIA A100-SXM4-40GB", 8, 1.0),
)
WORLD_SIZES = ((1, 0.4), (2, 0.35), (4, 0.17), (8, 0.08))
STEPS = (100, 200, 300)
NOISE_LEVELS = (0.97, 1.0, 1.03)  # step-time noise, as template variants (a template per level)
CHECKPOINT_EVERY = 100
CHECKPOINT_S = 0.4  # one save, at the demo's speed

_MS_FIELDS = ("wall_ms", "data_ms", "forward_ms", "backward_ms", "optimizer_ms", "other_ms", "comm_ms",
              "comm_exposed_ms", "sync_ms", "tuneup_ms")  # fmt: skip
_UNIX_INFO = ("start_unix", "fit_start_unix", "process_start_unix", "train_start_unix", "train_end_unix",
              "end_unix", "fit_end_unix")  # fmt: skip
_COMM_STEP_FIELDS = ("comm_ms", "comm_exposed_ms", "comm_bytes", "comm_count", "sync_ms")
# A timestamp of the source run (seconds since 1970 with a fraction): what a template's start date moves.
_TIMESTAMP = re.compile(rb"(?<![\d.])(1[0-9]{9})(?=\.\d)")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@dataclass
class Source:
    manifest: dict[str, Any]
    ranks: list[dict[str, Any]]  # per rank: file name -> list of records (info.json: one dict)
    t0: float  # the run's first timestamp: the origin the templates scale from

    @classmethod
    def read(cls, path: Path) -> Source:
        manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
        ranks = []
        for rank in range(manifest["world_size"]):
            d = path / f"rank-{rank}"
            files = {p.name: _jsonl(p) for p in sorted(d.glob("*.jsonl"))}
            files["info.json"] = json.loads((d / "info.json").read_text(encoding="utf-8"))
            ranks.append(files)
        t0 = min(r["info.json"].get("process_start_unix") or r["info.json"]["start_unix"] for r in ranks)
        return cls(manifest, ranks, t0)


@dataclass(frozen=True)
class Shape:
    world_size: int
    steps: int
    scale: float  # step time against the source's
    validation: bool
    checkpoints: bool


def _timebase(src: Source, shape: Shape) -> tuple[Callable[[float], float], Callable[[float], bool]]:
    """(new time of a source timestamp, whether a source timestamp falls in what the cut removes)."""
    rank0 = src.ranks[0]
    # Ranks step together: every rank's step n-1 ends before any rank's step n does.
    end_of: dict[int, float] = {}
    for files in src.ranks:
        for s in files["steps.jsonl"]:
            end_of[s["step"]] = max(end_of.get(s["step"], s["t_end"]), s["t_end"])
    last = end_of[max(end_of)]
    cut = end_of.get(shape.steps - 1, last)
    gaps: list[tuple[float, float]] = []
    if cut < last:
        gaps.append((cut, -(last - cut)))
    if not shape.validation:
        for e in rank0["events.jsonl"]:
            if e.get("kind") == "validation":
                gaps.append((e["t_start"], -e["duration_ms"] / 1000.0))
    if shape.checkpoints:
        for step in range(CHECKPOINT_EVERY, shape.steps + 1, CHECKPOINT_EVERY):
            if step - 1 in end_of:
                gaps.append((end_of[step - 1] + 1e-4, CHECKPOINT_S))

    def moved(t: float) -> float:
        return src.t0 + shape.scale * ((t - src.t0) + sum(d for at, d in gaps if t > at))

    def removed(t: float) -> bool:
        return cut < t <= last

    return moved, removed


def _scaled_stats(stats: dict[str, Any], scale: float, single: bool) -> dict[str, Any]:
    out = {}
    for name, s in stats.items():
        if single and name in _COMM_STEP_FIELDS:
            continue
        out[name] = {k: (v * scale if k != "n" and name.endswith("_ms") else v) for k, v in s.items()}
    return out


def _rank_files(src: Source, shape: Shape, rank: int) -> dict[str, bytes]:
    """One rank's files of a template run (bytes, as written)."""
    moved, removed = _timebase(src, shape)
    base = src.ranks[rank % len(src.ranks)]
    single = shape.world_size == 1
    n, k = shape.steps, shape.scale

    steps = []
    for s in base["steps.jsonl"]:
        if s["step"] >= n:
            continue
        s = {f: (v * k if f in _MS_FIELDS and isinstance(v, (int, float)) else v) for f, v in s.items()}
        s["t_end"] = round(moved(s["t_end"]), 3)
        if single:
            for f in (*_COMM_STEP_FIELDS, "gns_small_sq", "gns_big_sq", "gns_small_batch", "gns_big_batch"):
                s.pop(f, None)
        steps.append(s)
    windows = []
    for w in base["windows.jsonl"]:
        if w["last_step"] >= n:
            continue
        w = {**w, "t_start": round(moved(w["t_start"]), 3), "t_end": round(moved(w["t_end"]), 3)}
        w["stats"] = _scaled_stats(w["stats"], k, single)
        windows.append(w)
    events = []
    for e in base["events.jsonl"]:
        kind = e.get("kind")
        if (kind == "validation" and not shape.validation) or (e.get("step") or 0) > n or removed(e["t"]):
            continue
        if kind == "target_reached" and not shape.validation:
            continue
        if single and kind in ("ddp_logging", "noise_scale", "noise_scale_sampling"):
            continue
        e = dict(e)
        for f in ("t", "t_start"):
            if f in e:
                e[f] = round(moved(e[f]), 3)
        for f in ("duration_ms", "step_ms", "norm_ms"):
            if isinstance(e.get(f), (int, float)):
                e[f] = round(e[f] * k, 3)
        if isinstance(e.get("elapsed_s"), (int, float)):
            e["elapsed_s"] = round(moved(src.t0 + e["elapsed_s"]) - src.t0, 3)
        events.append(e)
    if shape.checkpoints:
        end_of = {s["step"]: s["t_end"] for s in base["steps.jsonl"]}
        for step in range(CHECKPOINT_EVERY, n + 1, CHECKPOINT_EVERY):
            start = moved(end_of[step - 1] + 1e-4)
            events.append({"t": round(start + CHECKPOINT_S * k, 3), "kind": "checkpoint",
                           "t_start": round(start, 3), "duration_ms": round(CHECKPOINT_S * k * 1000.0, 3),
                           "step": step})  # fmt: skip
        events.sort(key=lambda e: e["t"])
    metrics = [
        {**m, "t": round(moved(m["t"]), 3)}
        for m in base["metrics.jsonl"]
        if m.get("step", 0) <= n and (shape.validation or m.get("source") != "validation")
    ]
    telemetry = [{**t, "t": round(moved(t["t"]), 3)} for t in base["telemetry.jsonl"] if not removed(t["t"])]
    info = dict(base["info.json"])
    info.update(rank=rank, local_rank=rank, world_size=shape.world_size, pid=10_000 + rank)
    for f in _UNIX_INFO:
        if isinstance(info.get(f), (int, float)):
            info[f] = round(moved(info[f]), 3)
    info.update(last_step=n - 1, steps_seen=n, steps_kept=n, steps_at_end=n, optimizer_steps_at_end=n)
    files = {
        "steps.jsonl": steps,
        "windows.jsonl": windows,
        "events.jsonl": events,
        "metrics.jsonl": metrics,
        "telemetry.jsonl": telemetry,
    }
    if not single:
        files["collectives.jsonl"] = [
            {
                **c,
                "duration_ms": round(c["duration_ms"] * k, 3),
                "start_ms": round(c["start_ms"] * k, 3),
                "world_size": shape.world_size,
            }
            for c in base.get("collectives.jsonl", [])
            if c["step"] < n
        ]
    out = {name: _lines(records) for name, records in files.items()}
    out["info.json"] = json.dumps(info, indent=1).encode("utf-8")
    return out


def _lines(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode("utf-8")


def _manifest(src: Source, shape: Shape, moved_created: float) -> dict[str, Any]:
    m = copy.deepcopy(src.manifest)
    ws = shape.world_size
    m["world_size"] = ws
    m["hosts_by_rank"] = ["node0"] * ws
    t = m["trainer"]
    t.update(devices=ws, world_size=ws, device_ids=list(range(ws)), max_steps=shape.steps,
             estimated_stepping_batches=shape.steps, accelerator="CUDAAccelerator",
             val_check_interval=50 if shape.validation else None)  # fmt: skip
    if ws == 1:
        t["strategy"] = "SingleDeviceStrategy"
    m["communication"].update(world_size=ws, ranks_per_node=ws, backend="nccl" if ws > 1 else None)
    if not shape.validation:
        m["recording"]["target"] = None
    m["created_unix"] = moved_created
    return m


class Templates:
    """Template runs (manifest and every rank's files), built once per shape."""

    def __init__(self, source: Path) -> None:
        self.src = Source.read(source)
        self._built: dict[Shape, tuple[dict[str, Any], list[dict[str, tuple[bytes, list[int]]]]]] = {}

    def get(self, shape: Shape) -> tuple[dict[str, Any], list[dict[str, tuple[bytes, list[int]]]]]:
        """(manifest, per rank: file name -> (bytes, the distinct seconds of its timestamps))."""
        hit = self._built.get(shape)
        if hit is None:
            moved, _ = _timebase(self.src, shape)
            manifest = _manifest(self.src, shape, round(moved(self.src.manifest["created_unix"]), 3))
            ranks = [_rank_files(self.src, shape, r) for r in range(shape.world_size)]
            hit = (manifest, [{n: (d, _seconds(d)) for n, d in files.items()} for files in ranks])
            self._built[shape] = hit
        return hit


def _seconds(data: bytes) -> list[int]:
    """The distinct whole seconds of the timestamps in `data`, ascending."""
    return sorted({int(m) for m in _TIMESTAMP.findall(data)})


def _shift(data: bytes, seconds_in: list[int], shift_s: int) -> bytes:
    """`data` with every timestamp `shift_s` later (whole seconds: only the integer part changes).

    One `bytes.replace` per distinct second of the template (a run spans a few dozen) rather than a regex
    callback per timestamp. A replaced second never equals one still to be replaced when the shift is
    longer than the template's span; otherwise the regex does it."""
    if not seconds_in or abs(shift_s) <= seconds_in[-1] - seconds_in[0]:
        return _TIMESTAMP.sub(lambda m: str(int(m.group(1)) + shift_s).encode("ascii"), data)
    for second in seconds_in:
        data = data.replace(b"%d." % second, b"%d." % (second + shift_s))
    return data


@dataclass(frozen=True)
class Plan:
    """One synthetic run: where it goes and what it is."""

    index: int
    project: str
    user: str
    experiment: str
    instance: tuple[str, str, int, float]
    priced: bool
    shape: Shape
    start_unix: int


def plan_fleet(runs: int, seed: int = 0, until_unix: float | None = None) -> list[Plan]:
    """What each of `runs` synthetic runs is, reproducibly from `seed`."""
    rng = random.Random(seed)
    until = int(until_unix if until_unix is not None else time.time())
    experiments = [(p, f"{p}-exp{i}") for p in PROJECTS for i in range(EXPERIMENTS_PER_PROJECT)]
    # Some experiments regress from a point in their history on (a third of them, at a random run).
    regress_from = {e: rng.uniform(0.3, 0.8) for _, e in experiments if rng.random() < 1 / 3}
    starts = sorted(rng.uniform(until - DAYS * 86_400, until - 3_600) for _ in range(runs))
    plans = []
    for i, start in enumerate(starts):
        project, experiment = experiments[rng.randrange(len(experiments))]
        world_size = rng.choices([w for w, _ in WORLD_SIZES], [p for _, p in WORLD_SIZES])[0]
        fitting = [inst for inst in INSTANCES if inst[2] >= world_size]
        instance = fitting[rng.randrange(len(fitting))]
        progress = (start - (until - DAYS * 86_400)) / (DAYS * 86_400)
        slow = experiment in regress_from and progress >= regress_from[experiment]
        scale = instance[3] * rng.choice(NOISE_LEVELS) * (SLOWDOWN if slow else 1.0)
        shape = Shape(world_size, rng.choice(STEPS), round(scale, 4), rng.random() < 0.8, rng.random() < 0.3)
        plans.append(
            Plan(
                i,
                project,
                USERS[rng.randrange(len(USERS))],
                experiment,
                instance,
                rng.random() >= UNPRICED_SHARE,
                shape,
                int(start),
            )
        )
    return plans


def write_run(out: Path, plan: Plan, templates: Templates) -> Path:
    """Write `plan`'s run under `out`; returns its directory."""
    manifest, ranks = templates.get(plan.shape)
    offset = plan.start_unix - int(manifest["created_unix"])
    run_id = f"run-{plan.index:06d}-{plan.experiment}"
    run_dir = out / plan.project / plan.user / run_id
    m = copy.copy(manifest)
    key, gpu, _, _ = plan.instance
    m.update(
        run_id=run_id,
        created_unix=manifest["created_unix"] + offset,
        tags={"project": plan.project, "user": plan.user, "experiment": plan.experiment},
        gpus={
            "driver_version": "550.54.15",
            "gpus": [{"index": i, "name": gpu} for i in range(plan.instance[2])],
        },
        pricing={"instance": key, "source": "callback", "electricity_usd_per_kwh": None}
        if plan.priced
        else {"electricity_usd_per_kwh": None},
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "manifest.json").write_text(json.dumps(m, indent=1), encoding="utf-8")
    (run_dir / ".tuneup-run").write_text(run_id + "\n", encoding="utf-8")
    for rank, files in enumerate(ranks):
        d = run_dir / f"rank-{rank}"
        d.mkdir(exist_ok=True)
        for name, (data, seconds_in) in files.items():
            (d / name).write_bytes(_shift(data, seconds_in, offset))
    return run_dir


def make_fleet(
    out: Path, runs: int, seed: int = 0, source: Path = SOURCE, until_unix: float | None = None
) -> list[Path]:
    """Write `runs` synthetic runs under `out` (see the module's docstring); returns their directories."""
    templates = Templates(source)
    return [write_run(out, plan, templates) for plan in plan_fleet(runs, seed, until_unix)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--source", type=Path, default=SOURCE)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    dirs = make_fleet(args.out, args.runs, args.seed, args.source)
    print(f"{len(dirs)} synthetic runs written under {args.out} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
