"""`tuneup probe-network`: how long this machine's collectives take, size by size, like nccl-tests.

`run(args)` resolves the options, launches `worker_main` in N processes under torchrun, waits, then reads
the run directory the workers wrote back with `load_run` and prints, per collective, a table of median
time, algorithm bandwidth and bus bandwidth per size, and the latency-bandwidth (α, β) fit. The printout
is made from the record alone, as a report would be, so what the user sees is what the record holds.

Each worker times every iteration on its own: barrier, clock, collective, wait for completion, clock.
Iterations go in rounds, every size once per round in a shuffled order (see `_round_order`). Each one
becomes a CollectiveRecord per rank (source "probe", step = a running iteration index, the same on every
rank), so the record can be analysed again later without rerunning the probe.

torch is imported only inside the functions that need it: `tuneup --help` must not pay for it.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneup.record.schema import new_run_id

if TYPE_CHECKING:
    from tuneup.analyze.interconnect import AlphaBetaFit
    from tuneup.record import CollectiveRecord, Run

__all__ = [
    "COLLECTIVES",
    "ProbeConfig",
    "add_arguments",
    "describe_fit",
    "format_probe",
    "parse_size",
    "resolve_config",
    "run",
    "size_ladder",
    "worker_main",
]

KIB = 1024
MIB = 1024 * KIB

# The collectives the probe can time, named as torch.distributed and the record's CollectiveRecord.kind
# name them.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
BACKENDS = ("gloo", "nccl")
DTYPE = "float32"
ITEMSIZE_BYTES = 4

DEFAULT_MIN_BYTES = 1 * KIB
# CPU memory bandwidth and loopback make 64 MiB slow on gloo without telling anything 16 MiB does not.
DEFAULT_MAX_BYTES_GPU = 64 * MIB
DEFAULT_MAX_BYTES_CPU = 16 * MIB
DEFAULT_FACTOR = 2
DEFAULT_ITERS = 20
DEFAULT_WARMUP = 5
DEFAULT_TIMEOUT_S = 300.0

_SIZE_UNITS = {"": 1, "k": KIB, "m": MIB, "g": 1024 * MIB}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str | int, option: str) -> int:
    """Bytes from "4096", "4K", "4KiB", "16M", "1G" (K, M, G are powers of 1024, as in nccl-tests)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE_RE.match(str(text))
        if match is None:
            raise ValueError(
                f"{option} {text!r} is not a size; give bytes, optionally with K, M or G (e.g. 4096, 4K, 16M)"
            )
        value = int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if value <= 0:
        raise ValueError(f"{option} must be a positive number of bytes, got {text!r}")
    return value


def format_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1024 * MIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def size_ladder(min_bytes: int, max_bytes: int, factor: int, quantum_bytes: int) -> list[int]:
    """min, min·factor, min·factor², ... up to max, each rounded down to a multiple of `quantum_bytes`.

    The quantum is one element times the world size where a collective splits its buffer across ranks
    (all_gather's input, reduce_scatter's output are 1/world of it), so every rank gets whole elements;
    nccl-tests rounds its counts the same way.
    """
    sizes: list[int] = []
    size = min_bytes
    while size <= max_bytes:
        rounded = size - size % quantum_bytes
        if rounded > 0 and (not sizes or rounded != sizes[-1]):
            sizes.append(rounded)
        size *= factor
    return sizes


@dataclass(frozen=True)
class ProbeConfig:
    """Everything a probe run needs, resolved and checked: the launcher passes it to every worker."""

    nproc: int
    backend: str
    collectives: tuple[str, ...]
    sizes_bytes: tuple[int, ...]
    iters: int
    warmup: int
    out_dir: Path
    run_id: str
    timeout_s: float
    # A multi-node probe: torchrun's rendezvous. Every node runs the same command (same --rdzv-id and
    # --out) and records into one run; nnodes 1 is the single-node (--standalone) probe.
    nnodes: int = 1
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None

    def worker_args(self) -> list[str]:
        return [
            "--worker",
            "--backend",
            self.backend,
            "--collectives",
            ",".join(self.collectives),
            "--sizes",
            ",".join(str(s) for s in self.sizes_bytes),
            "--iters",
            str(self.iters),
            "--warmup",
            str(self.warmup),
            "--out",
            # Absolute, so that a worker's idea of the directory never depends on where it started.
            str(self.out_dir.resolve()),
            "--run-id",
            self.run_id,
            "--timeout-s",
            str(self.timeout_s),
        ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `tuneup probe-network`. Values are checked by `run`, which raises ValueError."""
    parser.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="processes (ranks) to launch (default: the number of GPUs; on CPU 2, or 1 on a 1-core machine)",
    )
    parser.add_argument(
        "--backend",
        default=None,
        help="process-group backend: nccl or gloo (default: nccl on GPU, else gloo)",
    )
    parser.add_argument(
        "--collectives",
        default=",".join(COLLECTIVES),
        help="comma-separated, from: " + ", ".join(COLLECTIVES) + " (default: all)",
    )
    parser.add_argument(
        "--min-bytes",
        default=str(DEFAULT_MIN_BYTES),
        help="smallest size, bytes with an optional K, M, G suffix (default: 1K)",
    )
    parser.add_argument("--max-bytes", default=None, help="largest size (default: 64M on GPU, 16M on CPU)")
    parser.add_argument(
        "--factor",
        type=int,
        default=DEFAULT_FACTOR,
        help="each size is the previous one times this: 2 doubles, 4 quadruples (default: %(default)s)",
    )
    parser.add_argument(
        "--iters", type=int, default=DEFAULT_ITERS, help="timed iterations per size (default: %(default)s)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=DEFAULT_WARMUP,
        help="untimed iterations per size before the timed ones (default: %(default)s)",
    )
    parser.add_argument(
        "--out", default=None, help="run directory to write (default: reports/probe/<run id>)"
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="stop the probe after this many seconds (default: %(default)s)",
    )
    # torchrun's multi-node rendezvous, under its own names: run the same command on every node.
    parser.add_argument(
        "--nnodes", type=int, default=1, help="nodes taking part (default: 1, this node alone)"
    )
    parser.add_argument(
        "--node-rank", type=int, default=None, help="this node's rank (default: assigned by the rendezvous)"
    )
    parser.add_argument(
        "--rdzv-endpoint",
        default=None,
        help="HOST:PORT every node can reach, where the nodes meet (with --nnodes above 1: the first node's)",
    )
    parser.add_argument(
        "--rdzv-id",
        default=None,
        help="the job's id, the same on every node; it names the run (with --nnodes above 1)",
    )


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _positive_int(value: Any, option: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        least = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
        raise ValueError(f"{option} must be {least}, got {value!r}")
    return value


def resolve_config(args: argparse.Namespace, gpu_count: Callable[[], int] = _gpu_count) -> ProbeConfig:
    """Check the options and fill in the defaults that depend on the machine. Raises ValueError naming
    the option. Options that need no knowledge of the machine are checked first, so a typo fails fast,
    before torch is imported to count GPUs."""
    iters = _positive_int(args.iters, "--iters")
    warmup = _positive_int(args.warmup, "--warmup", minimum=0)
    factor = _positive_int(args.factor, "--factor", minimum=2)
    if args.nproc is not None:
        _positive_int(args.nproc, "--nproc")
    timeout_s = args.timeout_s
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"--timeout-s must be a positive number of seconds, got {timeout_s!r}")

    names = [c.strip() for c in str(args.collectives).split(",") if c.strip()]
    unknown = [c for c in names if c not in COLLECTIVES]
    if unknown or not names:
        what = f"unknown collective {unknown[0]!r}" if unknown else "no collective given"
        raise ValueError(f"--collectives: {what}; choose from {', '.join(COLLECTIVES)}")
    collectives = tuple(dict.fromkeys(names))  # keeps the user's order, drops repeats

    backend = args.backend
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"--backend {backend!r} is not supported; choose from {', '.join(BACKENDS)}")
    min_bytes = parse_size(args.min_bytes, "--min-bytes")
    max_given = args.max_bytes is not None
    if max_given:
        max_bytes = parse_size(args.max_bytes, "--max-bytes")
        if min_bytes > max_bytes:
            raise ValueError(
                f"--min-bytes ({format_bytes(min_bytes)}) is larger than --max-bytes ({format_bytes(max_bytes)})"
            )

    # Only nccl (asked for, or the default where GPUs exist) needs the GPUs counted, which imports torch.
    gpus = gpu_count() if backend in (None, "nccl") else 0
    if backend is None:
        backend = "nccl" if gpus > 0 else "gloo"
    if backend == "nccl" and gpus == 0:
        raise ValueError("--backend nccl needs CUDA GPUs and none is visible; use --backend gloo")
    on_gpu = backend == "nccl"
    # One rank per GPU; on CPU two ranks are enough to put bytes on the loopback link.
    default_nproc = gpus if on_gpu else min(2, _usable_cpus())
    nproc = args.nproc if args.nproc is not None else default_nproc
    if on_gpu and nproc > gpus:
        raise ValueError(
            f"--nproc {nproc} is more than the {gpus} GPU(s) visible; nccl needs one GPU per rank"
        )
    if not max_given:
        max_bytes = DEFAULT_MAX_BYTES_GPU if on_gpu else DEFAULT_MAX_BYTES_CPU
        if min_bytes > max_bytes:
            raise ValueError(
                f"--min-bytes ({format_bytes(min_bytes)}) is larger than the default --max-bytes "
                f"({format_bytes(max_bytes)}); give --max-bytes too"
            )

    splits = any(c in ("all_gather", "reduce_scatter") for c in collectives)
    nnodes = args.nnodes if isinstance(args.nnodes, int) and args.nnodes > 0 else 1
    quantum = ITEMSIZE_BYTES * (nproc * nnodes if splits else 1)
    if min_bytes < quantum:
        raise ValueError(
            f"--min-bytes {min_bytes} is too small: each of {nproc} rank(s) needs at least one {DTYPE} "
            f"element, so give at least {quantum}"
        )
    sizes = size_ladder(min_bytes, max_bytes, factor, quantum)

    nnodes, node_rank, endpoint, rdzv_id = _rendezvous(args)
    # Every node must name the same run: the rendezvous id does, where there is one.
    run_id = f"probe-{rdzv_id}" if rdzv_id else new_run_id("probe")
    out_dir = Path(args.out) if args.out else Path("reports") / "probe" / run_id
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} is a file; give a directory")
    if out_dir.is_dir() and _holds_another_run(out_dir, run_id if nnodes > 1 else None):
        # Two runs in one directory would mix their records.
        raise ValueError(f"--out {out_dir} already holds a run; give a new directory")
    return ProbeConfig(
        nproc=nproc,
        backend=backend,
        collectives=collectives,
        sizes_bytes=tuple(sizes),
        iters=iters,
        warmup=warmup,
        out_dir=out_dir,
        run_id=run_id if rdzv_id or not args.out else out_dir.name,
        timeout_s=float(timeout_s),
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=endpoint,
        rdzv_id=rdzv_id,
    )


def _rendezvous(args: argparse.Namespace) -> tuple[int, int | None, str | None, str | None]:
    """(nnodes, node rank, rendezvous endpoint, rendezvous id), checked."""
    nnodes = _positive_int(args.nnodes, "--nnodes")
    node_rank = args.node_rank
    if node_rank is not None and not (isinstance(node_rank, int) and 0 <= node_rank < nnodes):
        raise ValueError(f"--node-rank must be from 0 to {nnodes - 1} (--nnodes {nnodes}), got {node_rank!r}")
    endpoint, rdzv_id = args.rdzv_endpoint, args.rdzv_id
    if nnodes == 1:
        if endpoint or rdzv_id or node_rank:
            raise ValueError("--rdzv-endpoint, --rdzv-id and --node-rank are for --nnodes above 1")
        return 1, None, None, None
    if not endpoint or not re.fullmatch(r"[^\s:]+:\d+", str(endpoint)):
        raise ValueError(
            f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT, where the nodes meet (an address of the "
            f"first node that every node can reach), got {endpoint!r}"
        )
    if not rdzv_id or not re.fullmatch(r"[A-Za-z0-9_.-]+", str(rdzv_id)):
        raise ValueError(
            f"--nnodes {nnodes} needs --rdzv-id, the same on every node (letters, digits, . _ -): it names "
            f"the run every node records into, got {rdzv_id!r}"
        )
    return nnodes, node_rank, str(endpoint), str(rdzv_id)


def _holds_another_run(out_dir: Path, run_id: str | None) -> bool:
    """Whether `out_dir` holds a run other than `run_id` (None: any run at all). The nodes of one
    multi-node probe record into one directory, and one of them may have started writing already."""
    manifest = out_dir / "manifest.json"
    if run_id is not None:
        from tuneup.record.segments import existing_manifest

        earlier = existing_manifest(out_dir)
        return manifest.exists() and (earlier is None or earlier.get("run_id") != run_id)
    return manifest.exists() or any(out_dir.glob("rank-*"))


# -- the launcher ----------------------------------------------------------------------------------


def _torchrun_command(config: ProbeConfig) -> list[str]:
    if config.nnodes == 1:
        where = ["--standalone"]
    else:
        where = [
            "--nnodes", str(config.nnodes), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", str(config.rdzv_endpoint), "--rdzv-id", str(config.rdzv_id),
            *(["--node-rank", str(config.node_rank)] if config.node_rank is not None else []),
        ]  # fmt: skip
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *where,
        "--nproc-per-node",
        str(config.nproc),
        "-m",
        "tuneup.probe",
        *config.worker_args(),
    ]


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # The workers must import this very tuneup, installed or not, whatever the current directory is.
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    # The probe computes nothing between collectives: intra-op threads would only compete with the
    # backend's own threads for cores. Setting it also keeps torchrun from printing its banner about it.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def launch(config: ProbeConfig) -> int:
    """Run the workers under torchrun; their output goes to this process's stdout and stderr. Returns
    torchrun's exit code, or 124 when the probe ran past `config.timeout_s` and was stopped."""
    from tuneup.launch import INHERIT, run_tree

    config.out_dir.mkdir(parents=True, exist_ok=True)
    # A session of its own, so that a timeout or Ctrl-C stops torchrun's workers too, and nothing else.
    ended = run_tree(
        _torchrun_command(config),
        env=_worker_env(),
        output=INHERIT,
        timeout_s=config.timeout_s,
        grace_s=10.0,
        poll_s=0.1,
    )
    if ended.timed_out:
        return 124
    return ended.returncode if ended.returncode is not None else 1


def run(args: argparse.Namespace) -> int:
    """`tuneup probe-network`: launch the probe, wait, print what the record says. Bad options raise
    ValueError (one line, naming the option); the command line turns it into exit code 2."""
    config = resolve_config(args)
    try:
        config.out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {config.out_dir}: cannot create it ({exc.strerror or exc})") from None
    print(
        f"probing {', '.join(config.collectives)} on {config.nproc} rank(s)"
        + (
            f" on each of {config.nnodes} nodes (rendezvous {config.rdzv_endpoint})"
            if config.nnodes > 1
            else ""
        )
        + f" over {config.backend}: "
        f"{len(config.sizes_bytes)} sizes from {format_bytes(config.sizes_bytes[0])} to "
        f"{format_bytes(config.sizes_bytes[-1])}, {config.warmup} warm-up + {config.iters} timed iterations each",
        flush=True,
    )
    if config.nproc == 1 and config.nnodes == 1:
        print("note: with 1 rank no data crosses any link; the times are local copies only", flush=True)
    code = launch(config)
    if code != 0:
        why = (
            f"ran past --timeout-s {config.timeout_s:g}"
            if code == 124
            else f"torchrun exited with code {code}"
        )
        print(
            f"tuneup probe-network: error: the probe {why}; its output is above, a partial record may be in {config.out_dir}",
            file=sys.stderr,
        )
        return 1

    from tuneup.record import RunRecordError, load_run

    try:
        record = load_run(config.out_dir)
    except RunRecordError as exc:
        print(f"tuneup probe-network: error: the probe left no readable record: {exc}", file=sys.stderr)
        return 1
    print()
    print(format_probe(record))
    for warning in record.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print()
    print(f"run record: {config.out_dir}")
    return 0


# -- reading the record back -------------------------------------------------------------------------


def probe_records(run: Run) -> list[CollectiveRecord]:
    """Every rank's probe CollectiveRecords."""
    return [c for rank in run.ranks.values() for c in rank.collectives if c.source == "probe"]


# The probe's time for a size is the lower quartile of its iterations on every rank. On a shared machine
# other work only ever adds time (a rank descheduled mid-collective stalls both), and how many iterations
# a burst of load hits differs from size to size: the median moves with the neighbours' load, the lower
# quartile stays with the link. Measured on a loaded 2-core VM: held-out sizes predicted within 2-13%
# from lower quartiles, against 32-35% from medians of the same iterations.
PROBE_QUANTILE = 0.25


def probe_points(records: Sequence[CollectiveRecord], kind: str) -> list[tuple[int, float, int]]:
    """(size in bytes, seconds, iterations) per size of `kind`: the time is PROBE_QUANTILE of every
    rank's iterations of that size. What the table shows and the fit takes."""
    from tuneup._stats import quantile

    by_size: dict[int, list[float]] = {}
    for r in records:
        if r.kind == kind:
            by_size.setdefault(r.bytes, []).append(r.duration_ms / 1e3)
    return [(size, quantile(sorted(t), PROBE_QUANTILE), len(t)) for size, t in sorted(by_size.items())]


def format_probe(run: Run) -> str:
    """The nccl-tests-like table and the α/β fit of every collective of a probe run, from its record: over
    every rank, and, where a multi-node probe also timed them, within each node, fitted apart."""
    probe = run.manifest.raw.get("probe") or {}
    world_size = run.world_size
    records = probe_records(run)
    dtype = probe.get("dtype", DTYPE)
    nodes = run.manifest.num_nodes
    lines = [
        f"# {run.run_id}: {probe.get('backend', '?')}, {world_size} rank(s)"
        + (f" on {nodes} nodes" if nodes > 1 else "")
        + f", {dtype}, {probe.get('iters', '?')} timed iterations per size on every rank",
        "# time: lower quartile over every rank's iterations (host clock, barrier before each; other work "
        "on the machine only adds time); algbw = size / time; busbw = algbw x bus factor",
    ]
    across = [r for r in records if r.scope is None]
    within = [r for r in records if r.scope == "node"]
    where = f" across {nodes} nodes ({world_size} ranks)" if nodes > 1 else ""
    lines += _probe_tables(across, world_size, dtype, where)
    if within:
        ranks = within[0].world_size or 1
        lines += _probe_tables(within, ranks, dtype, f" within each node ({ranks} ranks)")
    return "\n".join(lines)


def _probe_tables(records: Sequence[CollectiveRecord], ranks: int, dtype: str, where: str) -> list[str]:
    from tuneup.analyze.interconnect import GB, algbw_bytes_per_s, busbw_bytes_per_s, fit_alpha_beta

    itemsize = ITEMSIZE_BYTES if dtype == DTYPE else None
    lines: list[str] = []
    for kind in [k for k in COLLECTIVES if any(r.kind == k for r in records)]:
        lines.append("")
        lines.append(f"# {kind}{where}")
        lines.append(
            f"#{'size (B)':>13} {'count (elem)':>13} {'type':>8} {'time (us)':>11} "
            f"{'algbw (GB/s)':>13} {'busbw (GB/s)':>13} {'samples':>8}"
        )
        points = probe_points(records, kind)
        for size, seconds, n in points:
            count = str(size // itemsize) if itemsize else "?"
            algbw = algbw_bytes_per_s(size, seconds) / GB if seconds > 0 else None
            busbw = busbw_bytes_per_s(kind, ranks, size, seconds) / GB if seconds > 0 else None
            lines.append(
                f"{size:>14} {count:>13} {dtype:>8} {seconds * 1e6:>11.1f} {_gbps(algbw):>13} {_gbps(busbw):>13} {n:>8}"
            )
        try:
            fit = fit_alpha_beta([(size, seconds) for size, seconds, _ in points], kind, ranks)
        except ValueError as exc:
            lines.append(f"# no alpha-beta fit: {exc}")
            continue
        lines.extend(f"# {line}" for line in describe_fit(fit))
    return lines


def _gbps(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _approx_bytes(n: float) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n / KIB:.0f} KiB" if n >= KIB else f"{n:.0f} B"


def describe_fit(fit: AlphaBetaFit) -> list[str]:
    """The fit in words: α and β, what they mean as a line through the medians, and how well it fits."""
    link = f"1/beta {fit.link_bytes_per_s / 1e9:.3f} GB/s" if fit.link_bytes_per_s else "no bandwidth"
    half = (
        f"; half the peak algbw at {_approx_bytes(fit.half_bandwidth_bytes)}"
        if fit.half_bandwidth_bytes
        else ""
    )
    lines = [
        f"alpha-beta fit ({fit.algorithm}, {fit.world_size} ranks): alpha {fit.alpha_s * 1e6:.1f} us per step, "
        f"beta {fit.beta_s_per_byte * 1e9:.4f} ns/B ({link}); "
        f"T = {fit.intercept_s * 1e6:.1f} us + size x {fit.slope_s_per_byte * 1e9:.4f} ns/B{half}; "
        f"R^2 {fit.r_squared:.3f} (relative) over {fit.sizes} sizes"
    ]
    lines.extend(f"  note: {note}" for note in fit.notes)
    if fit.r_squared < 0.9:
        # On a busy host the medians wander from size to size; more rounds steady them.
        lines.append(
            "  note: the line explains the medians poorly; if other work shares these cores or links, "
            "rerun with more --iters or when they are idle"
        )
    return lines


# -- the worker --------------------------------------------------------------------------------------


def _worker_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tuneup.probe", description="one rank of tuneup probe-network"
    )
    parser.add_argument("--worker", action="store_true", required=True)
    parser.add_argument("--backend", required=True, choices=BACKENDS)
    parser.add_argument("--collectives", required=True)
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--iters", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--timeout-s", type=float, required=True)
    return parser


def _make_collective(
    kind: str, size_bytes: int, world_size: int, device: Any, group: Any = None
) -> Callable[[], None]:
    """A call that runs one `kind` collective of `size_bytes` over `group` of `world_size` ranks (None:
    all of them). The size is nccl-tests': the full buffer; the per-rank shard is 1/world of it for
    all_gather's input and reduce_scatter's output."""
    import functools

    import torch
    import torch.distributed as dist

    count = size_bytes // ITEMSIZE_BYTES
    # Zeros: values do not change the time, and repeated sums of zeros can never overflow to inf.
    if kind == "all_reduce":
        buffer = torch.zeros(count, dtype=torch.float32, device=device)
        return lambda: dist.all_reduce(buffer, group=group)
    # torch 2.13 names the tensor forms all_gather_single / reduce_scatter_single and deprecates the
    # older *_into_tensor / *_tensor names; use whichever this torch has, without the warning.
    if kind == "all_gather":
        shard = torch.zeros(count // world_size, dtype=torch.float32, device=device)
        gathered = torch.zeros(count, dtype=torch.float32, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return functools.partial(gather, gathered, shard, group=group)
    if kind == "reduce_scatter":
        full = torch.zeros(count, dtype=torch.float32, device=device)
        shard = torch.zeros(count // world_size, dtype=torch.float32, device=device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return functools.partial(scatter, shard, full, group=group)
    raise ValueError(f"unknown collective {kind!r}")


def _round_order(n_sizes: int, round_index: int) -> list[int]:
    """The order of the sizes in one round of timed iterations: a shuffle seeded by the round, so that
    every rank computes the same one (ranks that disagreed would pair collectives of different sizes).

    Iterations go in rounds, every size once per round, rather than all of one size then the next: load
    from other processes comes in bursts, and a burst then slows a few iterations of every size instead
    of most of one size's, which would bend the size-time curve the alpha-beta fit reads. The shuffle
    keeps any size from always following the largest one (whose buffers have just evicted the cache).
    """
    order = list(range(n_sizes))
    random.Random(round_index).shuffle(order)
    return order


def worker_main(argv: Sequence[str] | None = None) -> None:
    """One rank of the probe, inside a torchrun process: time every collective at every size and record
    each iteration. Rank 0 also writes the manifest."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    args = _worker_parser().parse_args(argv)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # The timeout turns a rank that never arrives into an error instead of a hang.
    timeout = timedelta(seconds=args.timeout_s)
    if args.backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        # device_id binds the group to this rank's GPU, so that barrier() knows which device to use.
        dist.init_process_group(args.backend, timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(args.backend, timeout=timeout)
    try:
        _record_probe(args, device)
    finally:
        # A gloo group still alive at interpreter exit can abort the process; end it explicitly.
        dist.destroy_process_group()


def _write_probe_manifest(args: argparse.Namespace, world_size: int, on_cuda: bool, nodes: _Nodes) -> None:
    from tuneup.collect.environment import capture_environment
    from tuneup.record import write_manifest

    manifest: dict[str, Any] = {
        "run_id": args.run_id,
        "created_unix": round(time.time(), 3),
        "world_size": world_size,
        "num_nodes": len(nodes.ranks),
        # Which ranks each node ran, and on which host: the probe's intra- and inter-node figures.
        "nodes": {str(n): {"host": nodes.hosts[n], "ranks": r} for n, r in sorted(nodes.ranks.items())},
        "probe": {
            "backend": args.backend,
            "collectives": args.collectives.split(","),
            "sizes_bytes": [int(s) for s in args.sizes.split(",")],
            "iters": args.iters,
            "warmup": args.warmup,
            "dtype": DTYPE,
            "timing": "host",
        },
        "environment": capture_environment(),
    }
    if on_cuda:
        from tuneup.collect.nvml import gpu_inventory

        # The GPUs' link facts are what a measured bandwidth is judged against.
        manifest["gpus"] = gpu_inventory()
    write_manifest(args.out, manifest)


@dataclass
class _Nodes:
    """The job's nodes (torchrun's GROUP_RANK), their ranks and hosts, and this rank's node group."""

    ranks: dict[int, list[int]]
    hosts: dict[int, str]
    group: Any = None  # this node's process group, where the job spans nodes and the node holds 2 ranks+
    group_size: int = 1


def _nodes(rank: int, world_size: int) -> _Nodes:
    import torch.distributed as dist

    mine = (int(os.environ.get("GROUP_RANK", "0")), socket.gethostname())
    every: list[Any] = [None] * world_size
    dist.all_gather_object(every, mine)
    ranks: dict[int, list[int]] = {}
    hosts: dict[int, str] = {}
    for r, (node, host) in enumerate(every):
        ranks.setdefault(int(node), []).append(r)
        hosts[int(node)] = str(host)
    nodes = _Nodes(ranks, hosts)
    if len(ranks) > 1:
        # Every rank creates every node's group, in one order, as new_group requires.
        for node in sorted(ranks):
            group = dist.new_group(ranks[node])
            if rank in ranks[node]:
                nodes.group, nodes.group_size = group, len(ranks[node])
    return nodes


def _record_probe(args: argparse.Namespace, device: Any) -> None:
    import torch
    import torch.distributed as dist

    from tuneup.record import RankWriter

    rank, world_size = dist.get_rank(), dist.get_world_size()
    on_cuda = device.type == "cuda"
    nodes = _nodes(rank, world_size)
    writer = RankWriter(args.out, rank)
    writer.open(
        {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            "node_rank": int(os.environ.get("GROUP_RANK", "0")),
            "world_size": world_size,
            "device": str(device),
            "timing": "host",
            "start_unix": round(time.time(), 3),
        }
    )
    if rank == 0:
        _write_probe_manifest(args, world_size, on_cuda, nodes)

    def sync() -> None:
        # A benchmark, not training: waiting for the device here is the point. NCCL calls return once
        # the kernel is queued; only a device synchronize makes the second clock read mean "done".
        if on_cuda:
            torch.cuda.synchronize(device)

    sizes = [int(s) for s in args.sizes.split(",")]
    # Over every rank; then, where the job spans nodes with several ranks on each, within each node too
    # (scope "node"), so that the link between nodes and the one inside a node are fitted apart.
    iteration = _time_collectives(args, writer, sizes, device, sync, None, world_size, None, 0)
    if nodes.group is not None and nodes.group_size > 1:
        _time_collectives(args, writer, sizes, device, sync, nodes.group, nodes.group_size, "node", iteration)
    writer.close(status="completed")


def _time_collectives(
    args: argparse.Namespace,
    writer: Any,
    sizes: list[int],
    device: Any,
    sync: Callable[[], None],
    group: Any,
    group_size: int,
    scope: str | None,
    iteration: int,
) -> int:
    """Time every collective at every size over `group` (None: every rank); returns the next iteration."""
    import torch.distributed as dist

    for kind in args.collectives.split(","):
        collectives = [_make_collective(kind, size, group_size, device, group) for size in sizes]
        for collective in collectives:
            for _ in range(args.warmup):
                dist.barrier(group=group)
                collective()
                sync()
        for round_index in range(args.iters):
            for i in _round_order(len(sizes), round_index):
                # The barrier lines the ranks up, so that a rank's time is the collective's, not its
                # wait for a rank that started late. The sync after it makes t0 follow the barrier's
                # kernel on a GPU, not its launch.
                dist.barrier(group=group)
                sync()
                t0 = time.perf_counter()
                collectives[i]()
                sync()
                t1 = time.perf_counter()
                record = {
                    "step": iteration,
                    "kind": kind,
                    # nccl-tests' size, as CollectiveRecord.bytes is defined: the gathered output of an
                    # all-gather, the input of a reduce-scatter, never a shard.
                    "bytes": sizes[i],
                    "duration_ms": (t1 - t0) * 1e3,
                    "dtype": DTYPE,
                    "world_size": group_size,
                    "source": "probe",
                }
                if scope is not None:
                    record["scope"] = scope
                writer.add_collective(record)
                iteration += 1
            # Between rounds, never inside the timed loop: writing a file is not part of a collective.
            writer.flush()
        del collectives
    return iteration


if __name__ == "__main__":
    worker_main()
