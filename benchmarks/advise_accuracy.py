"""How accurate is `tuneup advise` on workloads it was not built on? Record each workload, ask
`tuneup advise RUN --format json`, apply every recommendation exactly as printed, rerun it interleaved with
its baseline, and compare the measured gain with the predicted interval.

    python benchmarks/advise_accuracy.py [--workloads a,b] [--pairs 2] [--out DIR] [--archive TGZ] [--quick]

The workloads (benchmarks/accuracy_workloads.py) are as different as users' are: data-, compute-, loop- and
communication-bound, 1 and 2 gloo ranks, both Lightning namespaces, a LightningCLI script, a two-optimizer
manual loop, one already well set. For each:

- the baseline is recorded with TuneupCallback and advised (`tuneup advise RUN --format json --no-whatif`);
- every recommendation's changes are mapped to the workload's own arguments (the LightningCLI workload gets
  the printed YAML as a --config file); a knob the harness cannot apply is reported "not applied";
- standard alternatives the advice did not recommend (batch x2, two DataLoader workers, accumulation x2 on 2
  ranks, 32-true for a bf16 run) run beside them: one that gains > 5% is a recommendation withheld that would
  have paid (a miss of omission);
- every arm runs interleaved with the baseline, A B1 B2 ... A B2 B1 ... (`--pairs` rounds, the arms' order
  reversed every other round); pair p of an arm is its run of round p against the baseline's run of round p.

Measured gain: the ratio of median samples/s (the record's steady state) over the pairs, in the advice's
objective (goodput where the noise scale was measured: samples/s times the statistical efficiency at the new
global batch). Point error: |(1 + predicted) / (1 + measured) - 1|, the relative error of the predicted
throughput. A recommendation lost when it measured worse than -2% in every pair. The A/A spread is the
baseline's later rounds against its first.

`--archive` writes the advised baselines, their reruns and the applied recommendations' runs with the
measurements (results.json) as a tgz, which tests/test_advise_replay.py replays the model on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy_workloads import WORKLOADS, Workload

WORKER = Path(__file__).resolve().parent / "accuracy_workloads.py"
QUICK = ("mlp-small", "cnn-io-pl", "well-set")
LOSS = -0.02  # a recommendation lost if every pair measured below this
OMISSION_GAIN = 0.05  # an alternative that gained this much was worth recommending (the advice's MIN_GAIN)


@dataclass
class Arm:
    """One setting run beside the baseline: an applied recommendation or a standard alternative."""

    name: str
    kind: str  # "recommended" or "alternative"
    changes: dict[str, str]  # knob -> proposed, as printed
    title: str = ""
    objective: str = "samples/s"
    predicted: dict[str, float] | None = None  # gain: value, low, high
    confidence: str | None = None
    knobs: dict[str, Any] | None = None  # the workload's arguments; None: not applied
    not_applied: list[str] = field(default_factory=list)
    yaml: str | None = None
    runs: list[str] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)  # samples/s per round
    global_batch: int | None = None
    pair_gains: list[float] = field(default_factory=list)  # in the objective
    measured: float | None = None
    inside: bool | None = None
    point_error: float | None = None
    applied_as: dict[str, Any] | None = None  # what the applied run recorded (batch, accumulation, ...)
    breakdown: dict[str, Any] | None = None  # predicted terms against the applied run's phases
    two_run_fit_error: float | None = None  # the model fitted to the baseline and this run, on its own runs


def base_knobs(w: Workload) -> dict[str, Any]:
    return {
        "batch": w.batch, "accum": w.accum, "workers": w.workers, "threads": w.threads,
        "precision": w.precision, "prefetch": 0, "persistent_workers": False, "pin_memory": False,
        "strategy_args": "", "sharding": w.sharding, "reshard_after_forward": "true",
    }  # fmt: skip


def _strategy_args(code: str) -> str | None:
    """The arguments of the printed `TuneupDDPStrategy(...)` (either namespace's class)."""
    m = re.search(r"TuneupDDPStrategy\((.*)\)", code)
    return m.group(1) if m else None


def apply(w: Workload, knobs: dict[str, Any], changes: dict[str, str], code: str = "") -> tuple[dict, list]:
    """The workload's arguments with the changes, and the knobs that have no argument here."""
    new = dict(knobs)
    missing = []
    for knob, proposed in changes.items():
        if knob == "batch_size":
            new["batch"] = int(proposed)
        elif knob == "accumulate_grad_batches":
            new["accum"] = int(proposed)
        elif knob == "num_workers":
            new["workers"] = int(proposed)
        elif knob == "torch intra-op threads":
            new["threads"] = int(proposed)
        elif knob == "persistent_workers":
            new["persistent_workers"] = proposed == "True"
        elif knob == "prefetch_factor":
            new["prefetch"] = int(proposed)
        elif knob == "pin_memory":
            new["pin_memory"] = proposed == "True"
        elif knob == "precision":
            new["precision"] = proposed
        elif knob == "reshard_after_forward" and w.sharding == "fsdp2":
            new["reshard_after_forward"] = str(proposed).lower()
        elif knob == "strategy" and w.sharding and str(proposed).lower().startswith("ddp"):
            new["sharding"] = "ddp"
        elif knob in ("compression", "local_sgd_period") and w.devices > 1:
            printed = _strategy_args(code)
            if printed is None:
                missing.append(f"{knob} (no TuneupDDPStrategy in the printed code)")
            else:
                new["strategy_args"] = printed
        else:
            missing.append(knob)
    return new, missing


def _command(name: str, w: Workload, knobs: dict[str, Any], run_dir: Path, yaml_file: Path | None) -> list:
    cmd = [sys.executable, str(WORKER), "--workload", name, "--run-dir", str(run_dir)]
    if not w.cli:
        for key in ("batch", "accum", "workers", "threads", "precision", "prefetch"):
            cmd += [f"--{key}", str(knobs[key])]
        for flag in ("persistent_workers", "pin_memory"):
            if knobs[flag]:
                cmd.append(f"--{flag.replace('_', '-')}")
        if knobs["strategy_args"]:
            cmd += ["--strategy-args", knobs["strategy_args"]]
        if w.sharding:
            cmd += [
                "--sharding",
                knobs["sharding"] or "ddp",
                "--reshard-after-forward",
                knobs["reshard_after_forward"],
            ]
        return cmd
    # LightningCLI: the script's arguments, then the recommendation's YAML exactly as printed, which wins.
    cmd += ["--threads", str(knobs["threads"]), "--"]
    cmd += [
        f"--model.threads={knobs['threads']}", f"--data.batch_size={knobs['batch']}",
        f"--data.num_workers={knobs['workers']}", f"--trainer.accumulate_grad_batches={knobs['accum']}",
        f"--trainer.precision={knobs['precision']}",
    ]  # fmt: skip
    if knobs["workers"]:
        cmd += [f"--data.persistent_workers={knobs['persistent_workers']}"]
        if knobs["prefetch"]:
            cmd += [f"--data.prefetch_factor={knobs['prefetch']}"]
    if yaml_file is not None:
        cmd += ["--config", str(yaml_file)]
    return cmd


def record(name: str, knobs: dict[str, Any], run_dir: Path, yaml: str | None = None) -> Path:
    w = WORKLOADS[name]
    yaml_file = None
    if yaml and w.cli:
        yaml_file = run_dir.parent / f"{run_dir.name}.yaml"
        yaml_file.write_text(yaml + "\n", encoding="utf-8")
        # The CLI's own arguments carry the baseline; the YAML carries the change.
        knobs = {**knobs, **{k: v for k, v in _baseline_for_yaml(w, knobs).items()}}
    env = {**os.environ, "OMP_NUM_THREADS": str(knobs["threads"]), "PYTHONWARNINGS": "ignore"}
    env.pop("TUNEUP_DIR", None)
    proc = subprocess.run(
        _command(name, w, knobs, run_dir, yaml_file), env=env, capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0 or not (run_dir / "manifest.json").exists():
        raise RuntimeError(f"{run_dir.name} failed (rc {proc.returncode}):\n{proc.stderr[-2500:]}")
    return run_dir


def _baseline_for_yaml(w: Workload, knobs: dict[str, Any]) -> dict[str, Any]:
    # Knobs a LightningCLI YAML can carry start at the baseline's value, so that only the YAML changes them;
    # torch threads have no YAML key (the harness's own model argument carries them).
    base = base_knobs(w)
    return {k: base[k] for k in ("batch", "accum", "workers", "precision", "prefetch", "persistent_workers")}


def advise_json(run_dir: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "tuneup", "advise", str(run_dir), "--format", "json", "--no-whatif"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if proc.returncode == 0:
        return json.loads(proc.stdout)
    # The command itself broke (its module mid-edit, say): the same document from the library, said aloud.
    print(
        f"   tuneup advise failed ({proc.stderr.strip().splitlines()[-1:]}); advising in-process",
        file=sys.stderr,
    )
    from tuneup.advise import AdviceOptions, advise
    from tuneup.analyze.model import to_json

    return json.loads(json.dumps(to_json(advise([measure(run_dir)[1]], AdviceOptions(whatif=False)))))


def measure(run_dir: Path) -> tuple[float, Any]:
    from tuneup.report import analyze

    a = analyze(run_dir)
    return float(a.throughput.samples_per_s or 0.0), a


def efficiency(b_noise: float | None, b0: int, b1: int) -> float:
    """Goodput's factor for a global batch b1 against b0 (1 where the noise scale was not measured)."""
    from tuneup.analyze.noise_scale import statistical_efficiency

    return statistical_efficiency(b_noise, b0, b1) if b_noise else 1.0


def alternatives(w: Workload, knobs: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """Standard changes a user might try, whether or not the advice recommends them."""
    alts = [("batch-x2", {"batch_size": str(knobs["batch"] * 2)})]
    if knobs["workers"] == 0 and (w.item_ms or w.aug_passes or w.collate_ms):
        alts.append(("workers-2", {"num_workers": "2"}))
    elif w.devices > 1:
        alts.append(("accum-x2", {"accumulate_grad_batches": str(knobs["accum"] * 2)}))
    if knobs["precision"] != "32-true":
        alts.append(("precision-32", {"precision": "32-true"}))
    if w.sharding == "fsdp2":  # the sharding knobs a user of FSDP2 would try
        alts.append(("no-reshard", {"reshard_after_forward": "False"}))
        alts.append(("ddp", {"strategy": "ddp"}))
    return alts


def _observed(a: Any) -> dict[str, Any]:
    from tuneup.advise.observe import observe

    o = observe(a)
    compute = max(0.0, o.forward_ms + o.backward_ms - (o.exposed_ms or 0.0))
    return {
        "batch": o.batch_size, "accum": o.accumulation, "workers": o.num_workers, "precision": o.precision,
        "step_mean_ms": round(o.step_mean_ms, 3), "data": round(o.data_ms, 3), "compute": round(compute, 3),
        "exposed_comm": round(o.exposed_ms or 0.0, 3), "optimizer": round(o.optimizer_ms, 3),
        "other": round(o.other_ms + o.sync_ms, 3),
    }  # fmt: skip


def _two_run_fit_error(base: Any, applied: Any) -> float | None:
    """The largest relative error of the step-time model fitted to both runs, on those runs (issue 25: the
    two-run fit should give back its own input runs)."""
    if applied is None:
        return None
    from tuneup.advise import AdviceOptions, advise

    try:
        model = advise([base, applied], AdviceOptions(whatif=False)).model
    except Exception as exc:  # a fit that refuses the pair is a finding, not a crash of the benchmark
        print(f"   two-run advice failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    return model.fit_error if model is not None else None


def run_workload(name: str, out: Path, pairs: int) -> dict[str, Any]:
    w = WORKLOADS[name]
    wdir = out / name
    wdir.mkdir(parents=True, exist_ok=True)
    knobs = base_knobs(w)
    b0 = w.batch * w.accum * w.devices
    t0 = time.monotonic()
    base_runs = [record(name, knobs, wdir / "base-0")]
    base_rate, base_analysis = measure(base_runs[0])
    advice = advise_json(base_runs[0])
    ns = base_analysis.noise_scale
    b_noise = ns.b_simple if ns is not None and ns.b_simple and ns.b_simple > 0 else None
    if advice["objective"] != "goodput":
        b_noise = None
    arms: list[Arm] = []
    for rec in advice["recommendations"]:
        changes = {c["knob"]: c["proposed"] for c in rec["changes"]}
        new, missing = apply(w, knobs, changes, rec.get("code") or "")
        arms.append(
            Arm(
                name=f"rec-{len(arms)}",
                kind="recommended",
                changes=changes,
                title=rec["title"],
                objective=rec["objective"],
                predicted=rec["gain"],
                confidence=rec["confidence"],
                knobs=None if missing else new,
                not_applied=missing,
                yaml=rec.get("yaml"),
            )
        )
    recommended = [a.changes for a in arms]
    for alt_name, changes in alternatives(w, knobs):
        if changes in recommended:
            continue
        new, missing = apply(w, knobs, changes)
        arms.append(Arm(alt_name, "alternative", changes, objective=advice["objective"], knobs=new))
    runnable = [a for a in arms if a.knobs is not None]
    base_rates = [base_rate]
    analyses: dict[str, Any] = {}
    for p in range(pairs):
        if p:
            base_runs.append(record(name, knobs, wdir / f"base-{p}"))
            base_rates.append(measure(base_runs[-1])[0])
        for arm in runnable if p % 2 == 0 else list(reversed(runnable)):
            assert arm.knobs is not None
            run_dir = wdir / f"{arm.name}-{p}"
            try:
                record(name, arm.knobs, run_dir, arm.yaml if arm.kind == "recommended" else None)
            except RuntimeError as exc:
                print(f"   {name} {arm.name} round {p}: {exc}", file=sys.stderr)
                arm.rates.append(float("nan"))
                continue
            rate, a = measure(run_dir)
            arm.runs.append(run_dir.name)
            arm.rates.append(rate)
            analyses.setdefault(arm.name, a)
    for arm in runnable:
        k = arm.knobs or {}
        arm.global_batch = k["batch"] * k["accum"] * w.devices
        eff = efficiency(b_noise, b0, arm.global_batch)
        arm.pair_gains = [r / b * eff - 1 for r, b in zip(arm.rates, base_rates, strict=True) if r == r]
        ok = [r for r in arm.rates if r == r]
        if not ok:
            continue
        arm.measured = statistics.median(ok) / statistics.median(base_rates) * eff - 1
        if arm.name in analyses:
            arm.applied_as = _observed(analyses[arm.name])
            wrong = {
                key: (arm.applied_as[key], k[key])
                for key in ("batch", "accum", "workers", "precision")
                if arm.applied_as[key] is not None and str(arm.applied_as[key]) != str(k[key])
            }
            if wrong:  # the change did not reach the run (a YAML key the script ignores, say): say so
                print(f"   {name} {arm.name}: the run recorded {wrong} (recorded, intended)", file=sys.stderr)
        if arm.predicted is not None:
            g = arm.predicted
            arm.inside = g["low"] <= arm.measured <= g["high"]
            arm.point_error = abs((1 + g["value"]) / (1 + arm.measured) - 1)
            rec = next(r for r in advice["recommendations"] if r["title"] == arm.title)
            predicted_terms = (rec.get("predicted") or {}).get("breakdown_ms")
            current_terms = (rec.get("current") or {}).get("breakdown_ms")
            arm.two_run_fit_error = _two_run_fit_error(base_analysis, analyses.get(arm.name))
            arm.breakdown = {
                "current_predicted": current_terms,
                "predicted": predicted_terms,
                "base_observed": _observed(base_analysis),
                "applied_observed": arm.applied_as,
            }
    aa = [r / base_rates[0] - 1 for r in base_rates[1:]]
    return {
        "workload": name,
        "description": w.description,
        "namespace": w.namespace,
        "devices": w.devices,
        "cli": w.cli,
        "objective": advice["objective"],
        "b_noise": b_noise,
        "global_batch": b0,
        "base_runs": [p.name for p in base_runs],
        "base_rates": base_rates,
        "aa": aa,
        "considered": advice["considered"],
        "notes": advice.get("notes", []),
        "arms": [asdict(a) for a in arms],
        "seconds": round(time.monotonic() - t0, 1),
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _changes(changes: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in changes.items())


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    recs = [a for r in results for a in r["arms"] if a["kind"] == "recommended"]
    applied = [a for a in recs if a["measured"] is not None]
    inside = [a for a in applied if a["inside"]]
    errors = [a["point_error"] for a in applied if a["point_error"] is not None]
    lost = [a for a in applied if a["pair_gains"] and all(g < LOSS for g in a["pair_gains"])]
    omissions = []
    for r in results:
        for a in r["arms"]:
            gains = a["pair_gains"]
            if (
                a["kind"] == "alternative" and a["measured"] is not None and a["measured"] > OMISSION_GAIN
                and gains and all(g > 0 for g in gains)
            ):  # fmt: skip
                omissions.append((r["workload"], a))
    aa = [abs(x) for r in results for x in r["aa"]]
    return {
        "workloads": len(results),
        "recommendations": len(recs),
        "applied": len(applied),
        "not_applied": [(a["title"], a["not_applied"]) for a in recs if a["knobs"] is None],
        "inside": len(inside),
        "coverage": len(inside) / len(applied) if applied else None,
        "median_point_error": statistics.median(errors) if errors else None,
        "lost": [a["title"] for a in lost],
        "omissions": [(w, a["name"], _changes(a["changes"]), a["measured"]) for w, a in omissions],
        "aa_median_abs": statistics.median(aa) if aa else None,
        "aa_max_abs": max(aa) if aa else None,
    }


def print_table(results: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    print(
        "\n| workload | change | predicted (interval) | measured per pair | measured | inside | point error |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        arms = r["arms"]
        if not any(a["kind"] == "recommended" for a in arms):
            print(f"| {r['workload']} | (no recommendation) | - | - | - | - | - |")
        for a in arms:
            pairs = ", ".join(_pct(g) for g in a["pair_gains"]) or "-"
            if a["kind"] == "recommended":
                g = a["predicted"]
                pred = f"{g['value']:+.1%} [{g['low']:+.1%}, {g['high']:+.1%}] ({a['confidence']})"
                if a["knobs"] is None:
                    print(f"| {r['workload']} | {_changes(a['changes'])} | {pred} | not applied: "
                          f"{', '.join(a['not_applied'])} | - | - | - |")  # fmt: skip
                    continue
                inside = "yes" if a["inside"] else "**no**"
                err = "-" if a["point_error"] is None else f"{a['point_error']:.1%}"
                print(f"| {r['workload']} | {_changes(a['changes'])} | {pred} | {pairs} | "
                      f"{_pct(a['measured'])} | {inside} | {err} |")  # fmt: skip
            else:
                print(f"| {r['workload']} | *not advised:* {_changes(a['changes'])} | - | {pairs} | "
                      f"{_pct(a['measured'])} | - | - |")  # fmt: skip
    print("\nA/A (baseline reruns against the first): " + "; ".join(
        f"{r['workload']} {', '.join(_pct(x) for x in r['aa'])}" for r in results if r["aa"]
    ))  # fmt: skip
    s = summary
    cov = "-" if s["coverage"] is None else f"{s['coverage']:.0%}"
    err = "-" if s["median_point_error"] is None else f"{s['median_point_error']:.1%}"
    print(
        f"\nworkloads {s['workloads']}; recommendations {s['recommendations']}, applied {s['applied']}; "
        f"inside the interval {s['inside']}/{s['applied']} = {cov} (goal >= 80%); median point error {err} "
        f"(goal < 25%); lost (< {LOSS:+.0%} in every pair) {len(s['lost'])} (goal 0)"
    )
    for title, knobs in s["not_applied"]:
        print(f"  not applied: {title}: {', '.join(knobs)}")
    for title in s["lost"]:
        print(f"  lost: {title}")
    print(f"withheld that would have paid (> {OMISSION_GAIN:.0%}, every pair up): {len(s['omissions'])}")
    for w, _name, changes, gain in s["omissions"]:
        print(f"  {w}: {changes} measured {gain:+.1%}")
    if s["aa_median_abs"] is not None:
        print(f"A/A spread: median |{s['aa_median_abs']:.1%}|, max |{s['aa_max_abs']:.1%}|")


def print_misses(results: list[dict[str, Any]]) -> None:
    """The figures to explain each miss by: the model's terms against the applied run's phases."""
    for r in results:
        for a in r["arms"]:
            if a["kind"] != "recommended" or a["inside"] is not False:
                continue
            print(
                f"\nMISS {r['workload']}: {a['title']}: predicted {a['predicted']}, measured {_pct(a['measured'])}"
            )
            b = a["breakdown"] or {}
            print(f"   two-run fit's largest error on its own runs: {a.get('two_run_fit_error')}")
            for key in ("current_predicted", "base_observed", "predicted", "applied_observed"):
                print(f"   {key:18} {b.get(key)}")
        for a in r["arms"]:
            if a["kind"] == "alternative" and (a["measured"] or 0) > OMISSION_GAIN:
                knobs = set(a["changes"])
                why = [c["reason"] for c in r["considered"] if any(k in c["knob"] for k in knobs)]
                print(f"\nOMISSION? {r['workload']}: {_changes(a['changes'])} measured {_pct(a['measured'])} "
                      f"pairs {[_pct(g) for g in a['pair_gains']]}")  # fmt: skip
                for reason in why:
                    print(f"   considered: {reason}")


def write_archive(out: Path, results: list[dict[str, Any]], archive: Path) -> None:
    """Each advised baseline and the first run of each applied recommendation (a pair a two-run fit can be
    checked on), with results.json (every run's figures), under advise_accuracy/ in a tgz. The other
    rounds' runs and the alternatives' stay in --out: all of them would be 2.8 MB, 440 KiB compressed."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz", compresslevel=9) as tar:
        data = json.dumps({"results": results}, indent=1).encode()
        info = tarfile.TarInfo("advise_accuracy/results.json")
        info.size, info.mtime = len(data), int(time.time())
        import io

        tar.addfile(info, io.BytesIO(data))
        for r in results:
            keep = r["base_runs"][:1] + [
                a["runs"][0] for a in r["arms"] if a["kind"] == "recommended" and a["runs"]
            ]
            for run in keep:
                tar.add(out / r["workload"] / run, arcname=f"advise_accuracy/{r['workload']}/{run}")
    print(f"archive {archive}: {archive.stat().st_size / 1024:.0f} KiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=None, help=f"comma-separated, of: {', '.join(WORKLOADS)}")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--archive", type=Path, default=None, help="write the runs and results as this tgz")
    parser.add_argument("--quick", action="store_true", help=f"{', '.join(QUICK)}, one pair")
    args = parser.parse_args(argv)
    names = list(QUICK) if args.quick else list(WORKLOADS)
    if args.workloads:
        names = args.workloads.split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    pairs = 1 if args.quick else args.pairs
    out = args.out or Path(tempfile.mkdtemp(prefix="tuneup-advise-accuracy-"))
    t0 = time.monotonic()
    results = []
    for name in names:
        try:
            r = run_workload(name, out, pairs)
        except Exception as exc:  # one workload's failure must not lose the others' figures
            print(f"== {name}: FAILED {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        results.append(r)
        n_rec = sum(a["kind"] == "recommended" for a in r["arms"])
        print(f"== {name}: base {r['base_rates'][0]:,.0f} samples/s, {n_rec} recommendation(s), "
              f"{r['seconds']:.0f} s", flush=True)  # fmt: skip
        (out / "results.json").write_text(json.dumps({"results": results}, indent=1), encoding="utf-8")
    summary = summarize(results)
    print_table(results, summary)
    print_misses(results)
    (out / "results.json").write_text(json.dumps({"results": results, "summary": summary}, indent=1))
    if args.archive:
        write_archive(out, results, args.archive)
    print(f"\nruns and results.json in {out}; {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
