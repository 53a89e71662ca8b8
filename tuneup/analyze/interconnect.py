"""Collective bandwidth: how fast the ranks' links carried the timed collectives, and what they should carry.

Three questions, answered from timings alone (no torch, numpy or Lightning: reports are made on machines
without them):

- What bandwidth did each collective reach? `collective_table` gives nccl-tests' algbw and busbw per
  (kind, size), from the median time.
- What latency and bandwidth explain the timings? `fit_alpha_beta` fits the latency-bandwidth model
  T = a(p)·α + b(p)·n·β to (bytes, seconds) pairs.
- Is that bandwidth plausible for the hardware? `tuneup.catalog.interconnects.expected_link` picks the
  row of the packaged catalog to compare with, and `link_verdict` says how far the measurement is from it.

Units: bandwidths are bytes per second in the API (`*_bytes_per_s`) and GB/s (10⁹ bytes per second,
as nccl-tests prints them) only in tables and sentences.

Sizes follow nccl-tests: `n` is the size of the whole buffer the collective works on, which is the
output of an all-gather, the input of a reduce-scatter, the send buffer of an all-to-all and the tensor
of an all-reduce or broadcast. `CollectiveRecord.bytes` is taken to be that size, as
tuneup/collect/comm.py writes it (the gathered output of an all-gather). A size known only as a rank's
input tensor (one shard, n/p, for an all-gather) converts with `collective_size_bytes`.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tuneup.catalog.interconnects import GB, Interconnect
from tuneup.record.schema import COLLECTIVE_KINDS, CollectiveRecord

# A measured bus bandwidth under these shares of the reference is "far below" it. The typical figures
# are themselves measurements, so a quarter of their low end is already a different regime (another
# transport, another path), not tuning; against a nominal line rate, which nothing reaches, allow more.
FAR_BELOW_SHARE_OF_TYPICAL = 0.25
FAR_BELOW_SHARE_OF_NOMINAL = 0.10

ALGORITHMS = ("ring", "tree")


# ---------------------------------------------------------------------------------------------------
# Bus bandwidth (nccl-tests, doc/PERFORMANCE.md)
# ---------------------------------------------------------------------------------------------------


def _check_kind(kind: str) -> None:
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(f"unknown collective kind {kind!r}: expected one of {', '.join(COLLECTIVE_KINDS)}")


def _check_world_size(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")


def bus_factor(kind: str, world_size: int) -> float:
    """busbw / algbw for a collective of `kind` over `world_size` ranks, as nccl-tests defines it.

    The factor makes busbw the rate each rank's link ran at under a ring algorithm, so busbw can be
    compared with a link's bandwidth whatever the collective and rank count: 2(p-1)/p for all-reduce
    (every byte leaves each rank twice, once reduce-scattered and once all-gathered, less the rank's
    own share), (p-1)/p for all-gather, reduce-scatter and all-to-all, 1 for broadcast.

    With one rank nothing crosses a link, so the factor is 0 for every kind. nccl-tests prints
    busbw = algbw for a one-rank broadcast; 0 is the honest figure for "bytes over a link".
    """
    _check_kind(kind)
    _check_world_size(world_size)
    p = world_size
    if p == 1:
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (p - 1) / p
    if kind == "broadcast":
        return 1.0
    return (p - 1) / p


def algbw_bytes_per_s(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth: the collective's size (nccl-tests convention, see the module doc) over its time."""
    if not size_bytes >= 0 or math.isinf(size_bytes):
        raise ValueError(f"size must be a finite number of bytes >= 0, got {size_bytes!r}")
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"time must be a finite number of seconds > 0, got {seconds!r}")
    return size_bytes / seconds


def busbw_bytes_per_s(kind: str, world_size: int, size_bytes: float, seconds: float) -> float:
    """Bus bandwidth: algbw × bus_factor(kind, world_size)."""
    return algbw_bytes_per_s(size_bytes, seconds) * bus_factor(kind, world_size)


def collective_size_bytes(kind: str, input_bytes: int, world_size: int) -> int:
    """The nccl-tests size of a collective from the size of one rank's input tensor (as the flight
    recorder's `input_sizes` give it, for instance).

    Only an all-gather differs: its input is one rank's shard, and nccl-tests measures it by the
    gathered output, p times larger. Without this, an all-gather's busbw would read p times too low.
    """
    _check_kind(kind)
    _check_world_size(world_size)
    return input_bytes * world_size if kind == "all_gather" else input_bytes


# ---------------------------------------------------------------------------------------------------
# Latency-bandwidth model
# ---------------------------------------------------------------------------------------------------


def _model_coefficients(kind: str, world_size: int, algorithm: str) -> tuple[float, float]:
    """(a, b) of T = a·α + b·n·β.

    Ring (Thakur, Rabenseifner and Gropp 2005): all-reduce 2(p-1) steps carrying 2(p-1)/p of the
    buffer; all-gather and reduce-scatter (p-1) steps carrying (p-1)/p. Broadcast (a pipelined chain,
    as NCCL runs it) and all-to-all (pairwise exchange) use (p-1) steps and the bus factor. In every
    ring form b is the bus factor, so 1/β is the bus bandwidth, as nccl-tests intends.
    Tree all-reduce (reduce up, broadcast down a binary tree): 2⌈log₂ p⌉ steps, each carrying the whole
    buffer. NCCL's pipelined double binary tree does better on the bandwidth term than this textbook
    form, so β from a tree fit of NCCL timings is pessimistic.
    """
    _check_kind(kind)
    _check_world_size(world_size)
    p = world_size
    if algorithm == "ring":
        steps = 2 * (p - 1) if kind == "all_reduce" else p - 1
        return float(steps), bus_factor(kind, p)
    if algorithm == "tree":
        if kind != "all_reduce":
            raise ValueError(f"the tree model is for all_reduce only, not {kind!r}")
        depth = 2 * math.ceil(math.log2(p)) if p > 1 else 0
        return float(depth), float(depth)
    raise ValueError(f"unknown algorithm {algorithm!r}: expected one of {', '.join(ALGORITHMS)}")


def model_time_s(
    kind: str,
    world_size: int,
    size_bytes: float,
    alpha_s: float,
    beta_s_per_byte: float,
    algorithm: str = "ring",
) -> float:
    """Seconds the latency-bandwidth model predicts for one collective of `size_bytes`."""
    a, b = _model_coefficients(kind, world_size, algorithm)
    return a * alpha_s + b * size_bytes * beta_s_per_byte


@dataclass(frozen=True, slots=True)
class AlphaBetaFit:
    """α and β of the latency-bandwidth model, fitted to measured timings of one kind of collective."""

    kind: str
    world_size: int
    algorithm: str
    alpha_s: float  # latency per algorithm step
    beta_s_per_byte: float  # time per byte over one link
    intercept_s: float  # the fitted line T = intercept + slope·n: a(p)·α
    slope_s_per_byte: float  # b(p)·β
    link_bytes_per_s: float | None  # 1/β; None when β was clamped to 0
    algbw_bytes_per_s: float | None  # the algbw very large collectives approach: 1/slope
    busbw_bytes_per_s: float | None  # that algbw × bus factor; equals 1/β for the ring model
    half_bandwidth_bytes: float | None  # the size that reaches half that algbw (intercept/slope)
    r_squared: float  # of the fit to per-size medians, in relative terms (see fit_alpha_beta)
    points: int  # samples used
    sizes: int  # distinct sizes among them
    alpha_clamped: bool  # the best line had a negative intercept: α set to 0
    beta_clamped: bool  # the best line had a negative slope: β set to 0
    notes: tuple[str, ...] = ()

    def predict(self, size_bytes: float) -> float:
        """Seconds the fitted model predicts for one collective of `size_bytes`."""
        return self.intercept_s + self.slope_s_per_byte * size_bytes


def _weighted_line(xs: Sequence[float], ys: Sequence[float], ws: Sequence[float]) -> tuple[float, float]:
    """Weighted least-squares line (intercept, slope), on centred values so that sizes of 10⁹ bytes do
    not cancel each other's digits away."""
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs, strict=True)) / sw
    my = sum(w * y for w, y in zip(ws, ys, strict=True)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs, strict=True))
    sxy = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys, strict=True))
    slope = sxy / sxx
    return my - slope * mx, slope


def _nonnegative_line(
    xs: Sequence[float], ys: Sequence[float], ws: Sequence[float]
) -> tuple[float, float, bool, bool]:
    """The weighted least-squares line with intercept >= 0 and slope >= 0, and which bound was hit.

    The objective is a convex quadratic in two unknowns: when its unconstrained minimum lies outside the
    quadrant, the constrained one lies on an edge, so try both edges and keep the better.
    """
    c0, c1 = _weighted_line(xs, ys, ws)
    if c0 >= 0 and c1 >= 0:
        return c0, c1, False, False

    def sse(i: float, s: float) -> float:
        return sum(w * (y - i - s * x) ** 2 for w, x, y in zip(ws, xs, ys, strict=True))

    # Slope 0: the weighted mean. Intercept 0: a line through the origin. Times and sizes are >= 0,
    # so neither edge solution can itself be negative.
    flat = (sum(w * y for w, y in zip(ws, ys, strict=True)) / sum(ws), 0.0)
    sxx = sum(w * x * x for w, x in zip(ws, xs, strict=True))
    through_origin = (0.0, sum(w * x * y for w, x, y in zip(ws, xs, ys, strict=True)) / sxx)
    if sse(*flat) <= sse(*through_origin):
        return flat[0], flat[1], False, True
    return through_origin[0], through_origin[1], True, False


def fit_alpha_beta(
    samples: Sequence[tuple[int, float]],
    kind: str,
    world_size: int,
    *,
    algorithm: str = "ring",
) -> AlphaBetaFit:
    """Fit α (s) and β (s/byte) of the latency-bandwidth model to (bytes, seconds) samples.

    Sizes are nccl-tests sizes (see the module doc). The fit is a line T = c0 + c1·n through the
    median time of each size: a stalled collective (a page fault, a straggler, a GC pause) moves a
    mean but not a median of several repeats. With one sample per size those are the raw points, and
    outliers go into the fit unfiltered.

    Each size counts by its relative error (weights 1/T², refined twice from the fitted times): timings
    vary by a share of themselves, so an unweighted fit would let the largest size's noise swamp the
    smallest's latency and α could not be recovered. R² is computed with the same weights.

    Both coefficients are kept >= 0. When the best line slopes down, β is 0 (`beta_clamped`: no
    bandwidth can be inferred); when it crosses zero below the smallest size, α is 0 (`alpha_clamped`).
    `notes` explain either. Samples with a zero duration (a clock too coarse) are left out and noted.

    Raises ValueError for fewer than 2 distinct sizes, one rank, negative or non-finite values.
    """
    a, b = _model_coefficients(kind, world_size, algorithm)
    if world_size < 2:
        raise ValueError("with one rank no byte crosses a link: there is no latency or bandwidth to fit")
    by_size: dict[int, list[float]] = defaultdict(list)
    zero = 0
    for size, seconds in samples:
        if not (isinstance(size, int) and size >= 0):
            raise ValueError(f"sample size must be an integer number of bytes >= 0, got {size!r}")
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"sample time must be a finite number of seconds >= 0, got {seconds!r}")
        if seconds == 0:
            zero += 1
            continue
        by_size[size].append(seconds)
    if len(by_size) < 2:
        got = ", ".join(f"{s} bytes" for s in by_size) or "none with a time above 0"
        raise ValueError(
            f"fitting latency and bandwidth needs timings at 2 or more distinct sizes; got {len(by_size)} ({got})"
        )
    xs = [float(s) for s in sorted(by_size)]
    ys = [statistics.median(by_size[s]) for s in sorted(by_size)]

    ws = [1.0 / (y * y) for y in ys]
    for _ in range(3):
        c0, c1, alpha_clamped, beta_clamped = _nonnegative_line(xs, ys, ws)
        fitted = [c0 + c1 * x for x in xs]
        # A clamped line can predict 0 at size 0; keep the observed time's weight there.
        ws = [1.0 / (f * f) if f > 0 else 1.0 / (y * y) for f, y in zip(fitted, ys, strict=True)]

    my = sum(w * y for w, y in zip(ws, ys, strict=True)) / sum(ws)
    ss_res = sum(w * (y - f) ** 2 for w, y, f in zip(ws, ys, fitted, strict=True))
    ss_tot = sum(w * (y - my) ** 2 for w, y in zip(ws, ys, strict=True))
    r_squared = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)

    notes: list[str] = []
    if beta_clamped:
        notes.append(
            "time did not grow with size (the best line sloped down), so β is set to 0 and no bandwidth "
            "can be inferred: the sizes may all be latency-bound, or timing noise dominates"
        )
    if alpha_clamped:
        notes.append(
            "the best line crossed zero time above zero bytes, so α is set to 0: the smallest size may "
            "not be small enough to show the latency, or the time grows faster than linearly with size"
        )
    if zero:
        notes.append(f"{zero} sample(s) timed at 0 s were left out (a clock too coarse to time them)")

    alpha = c0 / a
    beta = c1 / b
    algbw = 1.0 / c1 if c1 > 0 else None
    return AlphaBetaFit(
        kind=kind,
        world_size=world_size,
        algorithm=algorithm,
        alpha_s=alpha,
        beta_s_per_byte=beta,
        intercept_s=c0,
        slope_s_per_byte=c1,
        link_bytes_per_s=1.0 / beta if beta > 0 else None,
        algbw_bytes_per_s=algbw,
        busbw_bytes_per_s=algbw * bus_factor(kind, world_size) if algbw is not None else None,
        half_bandwidth_bytes=c0 / c1 if c1 > 0 else None,
        r_squared=r_squared,
        points=sum(len(v) for v in by_size.values()),
        sizes=len(by_size),
        alpha_clamped=alpha_clamped,
        beta_clamped=beta_clamped,
        notes=tuple(notes),
    )


# ---------------------------------------------------------------------------------------------------
# The nccl-tests table of a run's collectives
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SizeRow:
    """One line of an nccl-tests-like table: every timed collective of one kind, rank count and size."""

    kind: str
    world_size: int
    size_bytes: int  # nccl-tests size (see the module doc)
    count: int
    median_time_us: float
    algbw_gbytes_per_s: float | None  # None when the median time is 0 (too fast for the clock)
    busbw_gbytes_per_s: float | None


def collective_table(records: Iterable[CollectiveRecord], world_size: int) -> list[SizeRow]:
    """Per (kind, ranks, size): count, median time, and algbw and busbw from that median.

    `bytes` of each record is read as the nccl-tests size (see the module doc).

    A record's own `world_size` wins over the argument, which fills in for records without one: a run
    can mix groups (an intra-node all-gather and an inter-node all-reduce in hybrid sharding), and
    their bandwidths do not mix. Rows come in COLLECTIVE_KINDS order, then by ranks and size.
    """
    _check_world_size(world_size)
    groups: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for rec in records:
        _check_kind(rec.kind)
        p = rec.world_size if rec.world_size is not None else world_size
        groups[(rec.kind, p, rec.bytes)].append(rec.duration_ms)
    rows = []
    for (kind, p, size), durations_ms in groups.items():
        median_s = statistics.median(durations_ms) / 1e3
        algbw = size / median_s / GB if median_s > 0 else None
        rows.append(
            SizeRow(
                kind=kind,
                world_size=p,
                size_bytes=size,
                count=len(durations_ms),
                median_time_us=median_s * 1e6,
                algbw_gbytes_per_s=algbw,
                busbw_gbytes_per_s=algbw * bus_factor(kind, p) if algbw is not None else None,
            )
        )
    rows.sort(key=lambda r: (COLLECTIVE_KINDS.index(r.kind), r.world_size, r.size_bytes))
    return rows


# ---------------------------------------------------------------------------------------------------
# The verdict against the catalog's link
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LinkVerdict:
    link: str  # the catalog row's name
    measured_busbw_bytes_per_s: float
    reference_bytes_per_s: float | None  # the typical low end, or the nominal where there is none
    reference: str  # "typical", "nominal" or "none"
    ratio: float | None  # measured / reference
    far_below: bool
    sentence: str


def _gb(v: float) -> str:
    return f"{v / GB:.0f}" if v >= 100 * GB else f"{v / GB:.1f}"


def _likely_cause(link: Interconnect) -> str:
    key = link.key.split("@")[0]
    if key.startswith("nvlink"):
        return (
            "NCCL may not be using NVLink (peer-to-peer disabled, e.g. NCCL_P2P_DISABLE, or a container "
            "without IPC): check NCCL_DEBUG=INFO for P2P rather than SHM, and nvidia-smi nvlink -s for links down"
        )
    if key.startswith("pcie"):
        return (
            "the GPUs may be running below their PCIe generation or width, or the traffic crosses CPU "
            "sockets: check nvidia-smi -q under load and nvidia-smi topo -m"
        )
    if link.scope == "inter-node":
        return "NCCL may have fallen back to sockets; check NCCL_DEBUG=INFO for NET/Socket instead of NET/IB or NET/OFI"
    return "the host may be short of free cores or memory bandwidth"


def link_verdict(measured_busbw_bytes_per_s: float, link: Interconnect) -> LinkVerdict:
    """How a measured bus bandwidth compares with a link's typical figure (or nominal, where the
    catalog has no typical), and whether it is far below: under a quarter of the typical low end, or
    under a tenth of the nominal.

    Pass a bandwidth-bound figure: the busbw of a fit (`AlphaBetaFit.busbw_bytes_per_s`) or of the
    largest sizes. Small collectives are latency-bound and read far below any link.
    """
    m = measured_busbw_bytes_per_s
    if not (m > 0 and math.isfinite(m)):
        raise ValueError(
            f"a measured bus bandwidth must be a finite number above 0 bytes/s, got {m!r} "
            "(a run with one rank moves nothing over a link)"
        )
    low, high, nominal = (
        link.typical_busbw_low_bytes_per_s,
        link.typical_busbw_high_bytes_per_s,
        link.nominal_bytes_per_s,
    )
    if low is not None:
        ref, kind, threshold = low, "typical", FAR_BELOW_SHARE_OF_TYPICAL
        typical = f"{_gb(low)}-{_gb(high)}" if high is not None and high != low else _gb(low)
        ref_text = f"the typical {typical} GB/s"
    elif nominal is not None:
        ref, kind, threshold = nominal, "nominal", FAR_BELOW_SHARE_OF_NOMINAL
        ref_text = f"the nominal {_gb(nominal)} GB/s per direction"
    else:
        return LinkVerdict(
            link=link.name,
            measured_busbw_bytes_per_s=m,
            reference_bytes_per_s=None,
            reference="none",
            ratio=None,
            far_below=False,
            sentence=f"measured {_gb(m)} GB/s bus bandwidth; the catalog has no figure for {link.name} to compare it with",
        )
    ratio = m / ref
    far_below = ratio < threshold
    head = f"measured {_gb(m)} GB/s bus bandwidth against {ref_text} of {link.name}"
    if far_below:
        sentence = f"{head}: far below ({ratio:.0%} of {_gb(ref)} GB/s); {_likely_cause(link)}"
    elif kind == "nominal":
        sentence = f"{head}: {ratio:.0%} of it, not far below (the catalog has no typical figure)"
    elif ratio < 1:
        sentence = f"{head}: below the typical range ({ratio:.0%} of its low end), not far below"
    else:
        sentence = f"{head}: within or above the typical range ({ratio:.0%} of its low end)"
    return LinkVerdict(
        link=link.name,
        measured_busbw_bytes_per_s=m,
        reference_bytes_per_s=ref,
        reference=kind,
        ratio=ratio,
        far_below=far_below,
        sentence=sentence,
    )
