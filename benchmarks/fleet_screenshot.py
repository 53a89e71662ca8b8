"""The fleet dashboard at 10 and at 10,000 runs: how long it takes to render, how big its page is, and what a
real browser shows (a headless Chromium screenshot of each page).

    .venv/bin/python benchmarks/fleet_screenshot.py [--out /tmp/fleet_shots] [--runs 10,10000] [--no-shots]

Each index is synthetic, written with pyarrow in the index's layout (runs.parquet, steps.parquet): varied
projects, users, instance types, world sizes, precisions and batches over a year, prices and ledgers that add
up, and a few real slowdowns (a run whose step windows are 15% slower than its predecessor's) for the
regressions table to find. `write_index` is also the tests' writer of small hand-made indexes.

Chromium: /usr/bin/chromium (Debian's `apt-get install -y chromium`), run headless without a sandbox,
with a fresh profile, no network features and a 1400x3000 window.
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tuneup.analyze.model import BADPUT_CATEGORIES  # noqa: E402
from tuneup.fleet.index import RUNS_SCHEMA, STEPS_SCHEMA  # noqa: E402

CHROMIUM = "/usr/bin/chromium"


def write_index(index_dir: Path, runs: list[dict[str, Any]], steps: list[dict[str, Any]]) -> Path:
    """runs.parquet and steps.parquet in `index_dir` (tuneup.fleet.index's schemas) from row dicts (a missing column is null; `tags` a
    dict; `start`/`end` datetimes or unix seconds)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    index_dir.mkdir(parents=True, exist_ok=True)
    schema = RUNS_SCHEMA
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    for row in runs:
        for name in schema.names:
            value = row.get(name)
            if name in ("start", "end") and isinstance(value, (int, float)):
                value = datetime.fromtimestamp(value, tz=timezone.utc)
            if name == "tags":
                value = list((value or {}).items())
            columns[name].append(value)
    pq.write_table(pa.table(columns, schema=schema), index_dir / "runs.parquet")
    steps_schema = STEPS_SCHEMA
    step_columns = {name: [row.get(name) for row in steps] for name in steps_schema.names}
    pq.write_table(pa.table(step_columns, schema=steps_schema), index_dir / "steps.parquet")
    return index_dir


# Instance types with their price per hour and GPUs, a few of the packaged catalog's kind.
_INSTANCES = (
    ("p4d.24xlarge", "A100-SXM4-40GB", 8, 32.77),
    ("p5.48xlarge", "H100-SXM5-80GB", 8, 98.32),
    ("g5.12xlarge", "A10G", 4, 5.67),
    ("a2-highgpu-1g", "A100-SXM4-40GB", 1, 3.67),
    ("g6e.xlarge", "L40S", 1, 1.86),
)
_PROJECTS = (
    "llm-pretrain",
    "vision",
    "recsys",
    "speech",
    "rl",
    "search",
    "ads",
    "maps",
    "translate",
    "safety",
    "code",
    "embeddings",
)
_USERS = ("ana", "bo", "chen", "dev", "eli", "fay")
_RECOMMENDATIONS = (
    "raise num_workers to 8: the data wait is 21% of the step",
    "bf16-mixed precision: 1.7x on the matmuls",
    "overlap gradient all-reduce with backward (bucket_cap_mb=100)",
    "double the batch to 512: the device is 40% idle",
    None,
)


def synthetic_runs(
    n: int, seed: int = 0, days: int = 365
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`n` varied runs (and their step windows) over `days` ending 2026-12-01; every 40th run of a series
    is 15% slower than the one before it, and every 97th run is unreadable (an error row)."""
    rng = random.Random(seed)
    end = datetime(2026, 12, 1, tzinfo=timezone.utc)
    runs: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for i in range(n):
        project = _PROJECTS[min(int(rng.expovariate(0.35)), len(_PROJECTS) - 1)]
        key = f"s3://ml-runs/{project}/run-{i:05d}"
        start = end - timedelta(seconds=days * 86400 * (1 - i / max(n, 1)))
        if i % 97 == 96:
            runs.append(
                {
                    "run_key": key,
                    "run_id": f"run-{i:05d}",
                    "error": "manifest.json: truncated",
                    "indexed_unix": end.timestamp(),
                }
            )
            continue
        # A small index varies less, so that its runs still form series of one configuration.
        small = n < 100
        instance, gpu, gpus, price = _INSTANCES[i % (2 if small else len(_INSTANCES))]
        nodes = 1 if gpus < 8 or small else rng.choice((1, 1, 2, 4))
        world = gpus * nodes
        precision = "bf16-mixed" if small else rng.choice(("bf16-mixed", "bf16-mixed", "32-true", "16-mixed"))
        if small:
            project = _PROJECTS[i % 2]
            key = f"s3://ml-runs/{project}/run-{i:05d}"
        batch = 32 * world * (2 if precision != "32-true" else 1)
        duration_s = rng.lognormvariate(math.log(3600), 1.0)
        usd_per_hour = price * nodes
        usd = duration_s / 3600 * usd_per_hour
        slow = 0.85 if i % 40 == 39 or (small and i == n - 2) else 1.0
        samples_per_s = (
            400.0 * world * (0.7 if precision == "32-true" else 1.0) * slow * rng.uniform(0.97, 1.03)
        )
        samples = int(samples_per_s * duration_s)
        shares = [rng.uniform(0.5, 1.5) * w for w in (60, 4, 8, 6, 3, 5, 3, 2, 2, 1)]
        total = sum(shares)
        ledger = {}
        for category, part in zip(BADPUT_CATEGORIES, shares, strict=True):
            ledger[f"{category}_s"] = duration_s * part / total
            ledger[f"{category}_usd"] = usd * part / total
        useful = ledger["productive_compute_s"] / duration_s
        recommendation = _RECOMMENDATIONS[(i // len(_INSTANCES)) % len(_RECOMMENDATIONS)]
        runs.append(
            {
                "run_key": key,
                "run_id": f"run-{i:05d}",
                "fingerprint": f"fp{i % 50}",
                "indexed_unix": end.timestamp(),
                "start": start,
                "end": start + timedelta(seconds=duration_s),
                "duration_s": duration_s,
                "tags": {"project": project, "user": _USERS[i % len(_USERS)], "experiment": f"exp-{i % 30}"},
                "instance": instance,
                "gpu": gpu,
                "world_size": world,
                "num_nodes": nodes,
                "strategy": "ddp" if world > 1 else "single_device",
                "precision": precision,
                "global_batch_size": batch,
                "accumulate_grad_batches": 1,
                "git_commit": f"{rng.getrandbits(40):010x}",
                "git_dirty": rng.random() < 0.2,
                "status": "finished",
                "usd": usd,
                "usd_per_hour": usd_per_hour,
                "device_hours": duration_s / 3600 * world,
                "samples": samples,
                "tokens": samples * 2048,
                "samples_per_s": samples_per_s,
                "tokens_per_s": samples_per_s * 2048,
                "usd_per_million_samples": usd / samples * 1e6,
                "usd_per_million_tokens": usd / (samples * 2048) * 1e6,
                "mfu": rng.uniform(0.2, 0.55),
                "step_median_ms": batch / samples_per_s * 1000,
                "step_p95_ms": batch / samples_per_s * 1100,
                "useful_share": useful,
                "badput_usd": usd * (1 - useful),
                **ledger,
                "top_recommendation": recommendation,
                "top_gain": rng.uniform(0.05, 0.4) if recommendation else None,
                "recommendations": 3 if recommendation else 0,
            }
        )
        for w in range(32):
            warm = 0.5 if w == 0 else 1.0
            steps.append(
                {
                    "run_key": key,
                    "window": w,
                    "first_step": w * 100,
                    "last_step": w * 100 + 99,
                    "samples_per_s": samples_per_s * warm * rng.uniform(0.98, 1.02),
                    "step_median_ms": batch / samples_per_s * 1000 / warm,
                }
            )
    return runs, steps


def screenshot(html: Path, png: Path, chromium: str = CHROMIUM) -> float:
    """A headless Chromium screenshot of `html` (1400x3000) into `png`; returns the seconds it took."""
    profile = Path(tempfile.mkdtemp(prefix="fleet-chromium-"))
    try:
        began = time.perf_counter()
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--screenshot={png}",
                "--window-size=1400,3000",
                html.resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        return time.perf_counter() - began
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/fleet_shots", help="where indexes, pages and PNGs go")
    parser.add_argument("--runs", default="10,10000", help="index sizes, comma-separated")
    parser.add_argument("--no-shots", action="store_true", help="time and size only, no browser")
    args = parser.parse_args(argv)

    from tuneup.fleet.dashboard import build_fleet_view
    from tuneup.fleet.render import render_html

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for n in (int(v) for v in args.runs.split(",")):
        index = out / f"index-{n}"
        shutil.rmtree(index, ignore_errors=True)
        began = time.perf_counter()
        write_index(index, *synthetic_runs(n))
        written_s = time.perf_counter() - began
        began = time.perf_counter()
        view = build_fleet_view(index)
        viewed_s = time.perf_counter() - began
        page_dir = out / f"page-{n}"
        page_dir.mkdir(exist_ok=True)
        began = time.perf_counter()
        html = render_html(view, page_dir)
        rendered_s = time.perf_counter() - began
        page = page_dir / "fleet.html"
        page.write_text(html, encoding="utf-8")
        size = page.stat().st_size
        print(
            f"{n:>6} runs: index written in {written_s:.2f} s; view {viewed_s:.2f} s + page {rendered_s:.2f} s "
            f"= {viewed_s + rendered_s:.2f} s; page {size:,} bytes ({size / 2**20:.2f} MiB), "
            f"{len(view.slices)} slices, {view.regressions.pairs_judged} pairs judged "
            f"({view.regressions.verdicts})"
        )
        if not args.no_shots:
            png = out / f"fleet-{n}.png"
            shot_s = screenshot(page, png)
            print(f"        screenshot {png} ({png.stat().st_size:,} bytes, {shot_s:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
