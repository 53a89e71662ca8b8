"""The `tuneup` command.

    tuneup show RUN_DIR     headline figures and warnings of a recorded run, in the terminal
    tuneup demo             train a small transformer LM with the callback, then show its run

Input errors print one line on stderr and exit with code 2; they never print a traceback. Heavy
imports (torch, Lightning) happen only inside the commands that train, so `tuneup --help` is fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tuneup._version import __version__

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user: reported in one line, exit code 2."""


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _rate(value: float | None, unit: str) -> str | None:
    return None if value is None else f"{value:,.1f} {unit}"


def format_summary(run_dir: Path) -> str:
    from tuneup.analyze.summary import summarize_run
    from tuneup.record import load_run

    run = load_run(run_dir)
    s = summarize_run(run)
    m = run.manifest
    t = m.trainer
    lines = [f"tuneup run {s.run_id}  ({run_dir})"]
    host = (m.environment.get("host") or {}).get("hostname")
    lines.append(
        f"  world size {m.world_size} on {m.num_nodes} node(s){f' ({host})' if host else ''}; "
        f"{t.get('namespace', '?')} {t.get('strategy', '?')}, precision {t.get('precision', '?')}, "
        f"accumulate {t.get('accumulate_grad_batches', '?')}"
    )
    params = m.model.get("parameters")
    batch = m.dataloader.get("batch_size")
    lines.append(
        f"  model {m.model.get('class', '?')}"
        + (f": {params / 1e6:,.2f} M parameters" if isinstance(params, int) else "")
        + (f"; batch size {batch} per rank" if batch else "")
    )
    if not s.ranks:
        lines.append("  no steps recorded")
    else:
        r0 = s.ranks[0]
        lines.append(
            f"  steps recorded {r0.steps_recorded} per rank (first {r0.warmup_steps} left out as warm-up)"
        )
        rates = [
            x
            for x in (
                _rate(s.samples_per_s, "samples/s"),
                _rate(s.tokens_per_s, "tokens/s"),
                _rate(s.steps_per_s, "optimizer steps/s"),
            )
            if x
        ]
        lines.append("")
        lines.append(f"  throughput (steady state, all ranks): {' | '.join(rates)}")
        step_ms = sum(r0.phase_ms.values())
        lines.append(f"  step time: median {r0.median_step_ms:,.2f} ms (rank 0); where it goes, all ranks:")
        for phase, share in s.phase_share.items():
            ms = sum(r.phase_ms[phase] for r in s.ranks) / len(s.ranks)
            lines.append(f"    {phase.removesuffix('_ms'):<10}{ms:>10.2f} ms {share:>7.1%}")
        del step_ms
        if len(s.ranks) > 1:
            lines.append(
                "  per rank median step: "
                + ", ".join(f"rank {r.rank} {r.median_step_ms:.2f} ms" for r in s.ranks)
            )
    tel = s.telemetry
    hw = []
    if "process_cpu_percent_mean" in tel:
        hw.append(f"process CPU {tel['process_cpu_percent_mean']:.0f}% (100% = one core)")
    if "process_rss_bytes_max" in tel:
        hw.append(f"peak RSS {_mib(tel['process_rss_bytes_max'])}")
    if "gpu_util_percent_mean" in tel:
        hw.append(f"GPU utilization {tel['gpu_util_percent_mean']:.0f}%")
    if "gpu_power_w_mean" in tel:
        hw.append(f"GPU power {tel['gpu_power_w_mean']:.0f} W")
    if hw:
        lines.append("  hardware: " + ", ".join(hw))
    if s.warnings:
        lines.append("")
        lines.append("  warnings:")
        lines.extend(f"    - {w}" for w in s.warnings)
    return "\n".join(lines)


def cmd_show(args: argparse.Namespace) -> int:
    from tuneup.record import RunRecordError

    try:
        print(format_summary(Path(args.run_dir)))
    except RunRecordError as exc:
        raise UsageError(str(exc)) from None
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from tuneup.demo import DemoConfig, run_demo

    try:
        config = DemoConfig(out_dir=Path(args.out), max_steps=args.steps, devices=args.devices)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    run_dir = run_demo(config)
    if run_dir is not None:  # rank 0 only; the other DDP ranks return None
        print()
        print(format_summary(run_dir))
        print()
        print(f"run record: {run_dir}")
        print(f"see it again with: tuneup show {run_dir}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tuneup",
        description="Where the time and money of a PyTorch Lightning training run go, and what to change.",
    )
    parser.add_argument("--version", action="version", version=f"tuneup {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    show = sub.add_parser("show", help="headline figures and warnings of a recorded run")
    show.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by TuneupCallback")
    show.set_defaults(func=cmd_show)

    demo = sub.add_parser(
        "demo",
        help="train a small transformer LM on synthetic tokens with TuneupCallback, then show the run",
        description="Train a small transformer language model on synthetic tokens with TuneupCallback "
        "(DDP over 2 processes where 2 CPU cores or GPUs exist), then show the recorded run.",
    )
    demo.add_argument(
        "--out", default="reports/demo", help="where the run record goes (default: %(default)s)"
    )
    demo.add_argument(
        "--steps", type=int, default=300, help="optimizer steps to train (default: %(default)s)"
    )
    demo.add_argument(
        "--devices",
        type=int,
        default=None,
        help="processes/GPUs (default: 2 where 2 cores or GPUs exist, else 1)",
    )
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"tuneup {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("tuneup: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
