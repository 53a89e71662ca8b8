"""Does the noise-scale goodput model predict what it takes to reach a target loss? A check on a real task.

    python benchmarks/goodput_check.py [--seeds 3] [--target 0.30] [--out results.json] [--quick]

Each run trains benchmarks/convergence_workload.py (a noisy teacher-student regression, held-out loss
floor 0.25, plain SGD with the learning rate scaled linearly up to batch 64 and fixed above) with
TuneupCallback until `val_loss` reaches the target: one process at each global batch of `--batches`
(two micro-batches of B/2, so the callback measures the gradient noise scale), and at `--ddp-batch` two
gloo ranks with exact DDP and with local SGD (TuneupDDPStrategy(local_sgd_period=4)). The configurations
are interleaved within each seed, so a slow spell of this shared machine falls on all of them alike.

Measured per run, from its record (`run.ranks[0].metrics`: the first validation whose val_loss meets the
target): the steps and samples to it, the wall time from the process's start (startup included) and from
the first training step (startup excluded), the dollars at `--usd-per-hour` per device for the wall time,
each run's own time per step (validation included), and the gradient noise scale B_simple as tuneup's
analysis reports it (`analyze_run(run).noise_scale`), over the whole run and over the last quarter of the
steps before the target.

Predicted, as the goodput model does (tuneup/analyze/noise_scale.py: steps S = S_min(1 + B_noise/B),
samples E = E_min(1 + B/B_noise), the Pollux efficiency (B_noise + B₀)/(B_noise + B)): B_noise is the
smallest batch's measured B_simple (its runs pooled), S_min solved from that batch's measured steps, and
the time at each batch is the predicted steps times that run's own measured time per step, so the time's
error is the statistical part alone. The prediction is made with the whole-run B_simple (the figure the
advice weighs batches with) and with the late one (the noise scale near the target, which the theory
asks for); the B_noise that best fits the measured steps at every batch is printed beside them. The model
says nothing of local SGD's convergence: it is predicted as the exact run of the same global batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuneup.analyze.analysis import analyze_run  # noqa: E402
from tuneup.analyze.noise_scale import per_step_estimates, ratio_of_means, statistical_efficiency  # noqa: E402
from tuneup.record import load_run  # noqa: E402
from tuneup.record.schema import Run  # noqa: E402
from tuneup.report.format import aligned_table  # noqa: E402
from tuneup.target import Target, parse_target  # noqa: E402

WORKLOAD = ROOT / "benchmarks" / "convergence_workload.py"
LATE_FRACTION = 0.25  # the "late" noise scale: the last quarter of the steps before the target


@dataclass(frozen=True, slots=True)
class Config:
    name: str
    batch: int  # global: samples per optimizer step
    devices: int = 1
    local_sgd_period: int | None = None


@dataclass(frozen=True, slots=True)
class RunResult:
    config: str
    seed: int
    reached: bool
    steps: int | None  # optimizer steps at the first validation meeting the target
    samples: int | None  # steps x global batch
    wall_s: float | None  # process start -> that validation (startup included)
    train_s: float | None  # first training step's start -> that validation
    startup_s: float  # process start -> first training step
    usd: float | None  # wall_s at the price per device-hour, times the devices
    step_s: float | None  # train_s / steps: the run's own time per step, validation included
    b_simple: float | None  # tuneup's analysis of the whole run (steady steps)
    b_low: float | None
    b_high: float | None
    b_late: float | None  # the last quarter of the steps before the target, pooled over ranks
    final_val_loss: float | None


def train(out: Path, config: Config, seed: int, target: float, max_steps: int) -> None:
    args = [
        sys.executable,
        str(WORKLOAD),
        str(out),
        "--batch",
        str(config.batch),
        "--devices",
        str(config.devices),
    ]
    args += ["--target", str(target), "--max-steps", str(max_steps), "--seed", str(seed)]
    if config.local_sgd_period:
        args += ["--local-sgd-period", str(config.local_sgd_period)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{out}: training failed\n{proc.stderr[-3000:]}")


def gns_estimates(run: Run, last_step: int, first_step: int = 0) -> tuple[list[float], list[float]]:
    """Per-step (|G|², tr(Σ)) estimates of the steps in [first_step, last_step), in step order: the small-
    batch squared norm averaged over the ranks that recorded it, the big-batch one the same on every rank
    (DDP) or rank 0's (one process with accumulation)."""
    by_step: dict[int, list[tuple[float, float, int, int]]] = {}
    for rank in run.ranks.values():
        for s in rank.steps:
            if not first_step <= s.step < last_step or s.gns_small_sq is None or s.gns_big_sq is None:
                continue
            if not s.gns_small_batch or not s.gns_big_batch or s.gns_small_batch >= s.gns_big_batch:
                continue
            by_step.setdefault(s.step, []).append(
                (s.gns_small_sq, s.gns_big_sq, s.gns_small_batch, s.gns_big_batch)
            )
    grad_sq, trace_sigma = [], []
    for step in sorted(by_step):
        recs = by_step[step]
        small = statistics.fmean(r[0] for r in recs)
        big = statistics.fmean(r[1] for r in recs)
        g, t = per_step_estimates(small, big, recs[0][2], recs[0][3])
        if math.isfinite(g) and math.isfinite(t):
            grad_sq.append(g)
            trace_sigma.append(t)
    return grad_sq, trace_sigma


def late_start(end_step: int) -> int:
    """The first step of the late window: the last quarter of the steps before the target (by step
    number, so that a run that measured only its first steps, local SGD's exact warm-up, has none)."""
    return int(end_step * (1 - LATE_FRACTION))


def measure(out: Path, config: Config, seed: int, target: Target, usd_per_hour: float) -> RunResult:
    result = json.loads((out / "result.json").read_text())
    run = load_run(out / "run")
    steps = run.steps(0)
    first_start = steps[0].t_end - steps[0].wall_ms / 1000.0
    startup_s = first_start - result["process_start_unix"]
    vals = sorted(
        (m for m in run.ranks[0].metrics if m.name == target.metric and m.source == "validation"),
        key=lambda m: m.step,
    )
    hit = next((m for m in vals if target.reached(m.value)), None)
    ns = analyze_run(run).noise_scale
    end_step = hit.step if hit is not None else result["steps"]
    g, t = gns_estimates(run, end_step, late_start(end_step))
    b_late = ratio_of_means(g, t)[0] if g else None
    common = {
        "config": config.name,
        "seed": seed,
        "startup_s": startup_s,
        "b_simple": ns.b_simple if ns else None,
        "b_low": ns.ci_low if ns else None,
        "b_high": ns.ci_high if ns else None,
        "b_late": b_late,
        "final_val_loss": vals[-1].value if vals else None,
    }
    if hit is None:
        return RunResult(
            reached=False,
            steps=None,
            samples=None,
            wall_s=None,
            train_s=None,
            usd=None,
            step_s=None,
            **common,
        )
    wall_s = hit.t - result["process_start_unix"]
    train_s = hit.t - first_start
    return RunResult(
        reached=True,
        steps=hit.step,
        samples=hit.step * config.batch,
        wall_s=wall_s,
        train_s=train_s,
        usd=wall_s / 3600.0 * usd_per_hour * config.devices,
        step_s=train_s / hit.step,
        **common,
    )


def predicted_steps(b_noise: float, b0: int, s0: float, b: int) -> float:
    """S(B) = S_min(1 + B_noise/B), S_min solved from S(B₀) = s0."""
    s_min = s0 / (1.0 + b_noise / b0)
    return s_min * (1.0 + b_noise / b)


def best_fit_b_noise(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(B_noise, S_min) minimizing the squared error of log S over the points (a log-spaced grid over
    B_noise, S_min in closed form for each)."""
    best: tuple[float, float, float] | None = None
    for i in range(601):
        bn = 10 ** (i / 100.0)  # 1 to 1e6
        logs = [math.log(s) - math.log(1 + bn / b) for b, s in points]
        log_smin = statistics.fmean(logs)
        err = sum((v - log_smin) ** 2 for v in logs)
        if best is None or err < best[0]:
            best = (err, bn, math.exp(log_smin))
    assert best is not None
    return best[1], best[2]


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _err(pred: float, meas: float | None) -> str:
    return "-" if not meas else f"{pred:.0f} ({pred / meas - 1:+.0%})"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument(
        "--ddp-batch", type=int, default=256, help="exact DDP and local SGD at this batch; 0: none"
    )
    parser.add_argument("--local-sgd-period", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--target", default="val_loss<=0.30")
    parser.add_argument("--max-steps", type=int, default=8000)
    parser.add_argument("--usd-per-hour", type=float, default=1.20, help="price per device-hour")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where the runs go (default: a temporary dir)"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument(
        "--reuse", action="store_true", help="measure the runs already in --workdir again instead of training"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: batches 64 and 256, one seed, target 0.34"
    )
    args = parser.parse_args()
    if args.quick:
        args.batches, args.seeds, args.target, args.max_steps = [64, 256], 1, "val_loss<=0.34", 3000
    target = parse_target(args.target)
    if target.metric != "val_loss" or not target.lower_is_better:
        raise SystemExit(f"--target {args.target}: the workload logs val_loss; give val_loss<=VALUE")
    batches = sorted(args.batches)
    configs = [Config(f"B={b}", b) for b in batches]
    if args.ddp_batch:
        configs += [
            Config(f"B={args.ddp_batch} DDP x2", args.ddp_batch, devices=2),
            Config(
                f"B={args.ddp_batch} local SGD H={args.local_sgd_period} x2",
                args.ddp_batch,
                devices=2,
                local_sgd_period=args.local_sgd_period,
            ),
        ]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="goodput_check-"))
    started = time.monotonic()
    results: dict[str, list[RunResult]] = {c.name: [] for c in configs}
    for seed in range(args.seeds):
        for config in configs:
            out = workdir / f"{config.name.replace(' ', '_').replace('=', '')}-seed{seed}"
            t0 = time.monotonic()
            if not (args.reuse and (out / "result.json").exists()):
                train(out, config, seed, target.value, args.max_steps)
            r = measure(out, config, seed, target, args.usd_per_hour)
            results[config.name].append(r)
            print(
                f"seed {seed} {config.name:24s} "
                + (f"steps {r.steps:5d}  train {r.train_s:6.2f} s" if r.reached else "target not reached")
                + f"  B_simple {_fmt(r.b_simple, '.0f')} (late {_fmt(r.b_late, '.0f')})  "
                f"({time.monotonic() - t0:.0f} s)",
                flush=True,
            )

    # The smallest batch's runs give the prediction: their noise scale pooled, their mean steps as S(B₀).
    b0 = batches[0]
    base = [r for r in results[f"B={b0}"] if r.reached]
    if not base:
        raise SystemExit(f"B={b0} never reached {target}: no prediction (raise --max-steps or the target)")
    s0 = statistics.fmean(r.steps for r in base)  # type: ignore[misc]
    g_all: list[float] = []
    t_all: list[float] = []
    g_late: list[float] = []
    t_late: list[float] = []
    for seed, r in enumerate(results[f"B={b0}"]):
        if not r.reached:
            continue
        out = workdir / f"B{b0}-seed{seed}"
        run = load_run(out / "run")
        g, t = gns_estimates(run, r.steps)  # type: ignore[arg-type]
        g_all += g
        t_all += t
        g, t = gns_estimates(run, r.steps, late_start(r.steps))  # type: ignore[arg-type]
        g_late += g
        t_late += t
    bn_whole, bn_whole_low, bn_whole_high = ratio_of_means(g_all, t_all)
    bn_late, bn_late_low, bn_late_high = ratio_of_means(g_late, t_late)
    measured_points = [
        (c.batch, statistics.fmean(r.steps for r in results[c.name] if r.reached))  # type: ignore[misc]
        for c in configs
        if c.devices == 1 and any(r.reached for r in results[c.name])
    ]
    bn_fit, smin_fit = best_fit_b_noise(measured_points) if len(measured_points) >= 3 else (None, None)

    rows = []
    summary = []
    for c in configs:
        runs = results[c.name]
        reached = [r for r in runs if r.reached]
        steps = _mean([r.steps for r in reached])
        steps_sd = statistics.stdev([r.steps for r in reached]) if len(reached) > 1 else None  # type: ignore[misc]
        step_s = _mean([r.step_s for r in reached])
        startup = _mean([r.startup_s for r in runs])
        pred: dict[str, float | None] = {}
        for label, bn in (("whole", bn_whole), ("late", bn_late), ("fit", bn_fit)):
            if bn is None:
                pred[label] = None
            elif label == "fit":
                pred[label] = smin_fit * (1 + bn / c.batch)  # type: ignore[operator]
            else:
                pred[label] = predicted_steps(bn, b0, s0, c.batch)
        s_pred = pred["whole"]
        time_pred = s_pred * step_s if s_pred is not None and step_s is not None else None
        usd_pred = (
            (time_pred + startup) / 3600 * args.usd_per_hour * c.devices
            if time_pred is not None and startup is not None
            else None
        )
        entry = {
            "config": c.name,
            "batch": c.batch,
            "devices": c.devices,
            "local_sgd_period": c.local_sgd_period,
            "reached": f"{len(reached)}/{len(runs)}",
            "steps": steps,
            "steps_sd": steps_sd,
            "samples": _mean([r.samples for r in reached]),
            "wall_s": _mean([r.wall_s for r in reached]),
            "train_s": _mean([r.train_s for r in reached]),
            "startup_s": startup,
            "usd": _mean([r.usd for r in reached]),
            "step_ms": step_s * 1000 if step_s is not None else None,
            "samples_per_s": _mean([r.samples / r.train_s for r in reached if r.samples and r.train_s]),
            "b_simple": _mean([r.b_simple for r in runs]),
            "b_late": _mean([r.b_late for r in runs]),
            "predicted_steps_whole": pred["whole"],
            "predicted_steps_late": pred["late"],
            "predicted_steps_fit": pred["fit"],
            "predicted_train_s": time_pred,
            "predicted_usd": usd_pred,
            "pollux_efficiency_whole": statistical_efficiency(bn_whole, b0, c.batch) if bn_whole else None,
        }
        summary.append(entry)
        rows.append(
            [
                c.name,
                entry["reached"],
                f"{steps:.0f}" + (f" ± {steps_sd:.0f}" if steps_sd is not None else "") if steps else "-",
                _fmt(entry["samples"], ",.0f"),
                _fmt(entry["samples_per_s"], ",.0f"),
                _fmt(entry["train_s"], ".1f"),
                _fmt(entry["wall_s"], ".1f"),
                _fmt(entry["usd"] * 1000 if entry["usd"] else None, ".2f"),
                _fmt(entry["b_simple"], ".0f") + " / " + _fmt(entry["b_late"], ".0f"),
                _err(pred["whole"], steps) if pred["whole"] is not None else "-",
                _err(pred["late"], steps) if pred["late"] is not None else "-",
                _err(pred["fit"], steps) if pred["fit"] is not None else "-",
                _fmt(time_pred, ".1f"),
                _fmt(usd_pred * 1000 if usd_pred else None, ".2f"),
            ]
        )
    header = [
        "run",
        "reached",
        "steps (sd)",
        "samples",
        "samples/s",
        "train s",
        "wall s",
        "m$",
        "B_simple whole/late",
        "pred steps (whole)",
        "pred steps (late)",
        "best fit",
        "pred train s",
        "pred m$",
    ]
    elapsed = time.monotonic() - started
    print()
    print(
        f"{target}, {args.seeds} seed(s), ${args.usd_per_hour:.2f} per device-hour (m$: thousandths of a dollar, "
        "wall time startup included); means over the seeds that reached the target"
    )
    print("\n".join(aligned_table(header, rows, right=range(1, len(header)))))
    print(
        f"\nB_noise from B={b0}'s runs pooled: whole run {_fmt(bn_whole, '.0f')} "
        f"[{_fmt(bn_whole_low, '.0f')}, {_fmt(bn_whole_high, '.0f')}], last quarter {_fmt(bn_late, '.0f')} "
        f"[{_fmt(bn_late_low, '.0f')}, {_fmt(bn_late_high, '.0f')}]; S(B={b0}) = {s0:.0f} measured. "
        f"Best fit of S_min(1 + B_noise/B) to the measured steps: B_noise {_fmt(bn_fit, '.0f')}, "
        f"S_min {_fmt(smin_fit, '.0f')}. Pollux efficiency at B = (B_noise + {b0})/(B_noise + B) gives the "
        "same samples as E_min(1 + B/B_noise): the same prediction."
    )
    if any(c.local_sgd_period for c in configs):
        print(
            "Local SGD records the noise scale's norms on its exact warm-up steps only (no gradient is "
            "all-reduced after them): its B_simple is the early one, and it has no late window."
        )
    print(f"runs in {workdir}; {elapsed:.0f} s in all")
    if args.out:
        payload = {
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "target": str(target),
            "seeds": args.seeds,
            "usd_per_device_hour": args.usd_per_hour,
            "b0": b0,
            "s0": s0,
            "b_noise_whole": [bn_whole, bn_whole_low, bn_whole_high],
            "b_noise_late": [bn_late, bn_late_low, bn_late_high],
            "b_noise_best_fit": bn_fit,
            "s_min_best_fit": smin_fit,
            "summary": summary,
            "runs": {name: [asdict(r) for r in rs] for name, rs in results.items()},
            "elapsed_s": elapsed,
        }
        args.out.write_text(json.dumps(payload, indent=1))
        print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
