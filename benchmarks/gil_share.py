"""What a background thread's Python work costs a training thread through the GIL, and what giving it back
between pieces saves.

    python benchmarks/gil_share.py [--repeats 7] [--work-ms 2] [--period-ms 50]

The "training" thread runs 256x256 matrix products (about 0.3 ms each, the GIL released inside). A
background thread wakes every `--period-ms` and runs `--work-ms` of pure Python, in one of these ways:

    none       no background thread (the baseline)
    whole      all of it at once
    pacer      through tuneup.collect.gil.GilPacer, as tuneup's writer and sampler threads work: a
               time.sleep(0) after every 100 us of work
    sleep50us  the same pieces, each followed by a 50 us sleep instead

Each repeat times 4000 products per way, the ways interleaved in blocks of 500 products in a shuffled
order; the figure is the median over repeats of each way's time per product against `none`. The point is
the difference between the ways, not the absolute figure: with no other cost in the loop, every
microsecond the training thread waits for the GIL shows.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable

import torch

from tuneup.collect.gil import PIECE_S, GilPacer

WAYS = ("none", "whole", "pacer", "sleep50us")


class Sleep50usPacer:
    """GilPacer's schedule, with a 50 us sleep for the pause."""

    def __init__(self) -> None:
        self.since = time.perf_counter()

    def __call__(self) -> None:
        if time.perf_counter() - self.since >= PIECE_S:
            time.sleep(50e-6)
            self.since = time.perf_counter()


def busy_python(seconds: float, make_pause: Callable[[], Callable[[], None]] | None) -> None:
    """Pure Python work for `seconds`, in units of about a microsecond, `pause()` called after each."""
    pause = make_pause() if make_pause is not None else None
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        sum(range(30))
        if pause is not None:
            pause()


class Background:
    def __init__(self, way: str, work_s: float, period_s: float) -> None:
        self.pause: Callable[[], Callable[[], None]] | None = {
            "whole": None,
            "pacer": GilPacer,
            "sleep50us": Sleep50usPacer,
        }[way]
        self.work_s, self.period_s = work_s, period_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(self.period_s):
            busy_python(self.work_s, self.pause)

    def __enter__(self) -> Background:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--work-ms", type=float, default=2.0, help="Python work per wake-up (default 2)")
    p.add_argument("--period-ms", type=float, default=50.0, help="time between wake-ups (default 50)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    for _ in range(200):
        torch.mm(a, b)
    rng = random.Random(0)
    per_way: dict[str, list[float]] = {w: [] for w in WAYS}
    for _ in range(args.repeats):
        totals = dict.fromkeys(WAYS, 0.0)
        for _ in range(8):  # blocks of 500 products per way, shuffled
            order = list(WAYS)
            rng.shuffle(order)
            for way in order:
                background = (
                    None if way == "none" else Background(way, args.work_ms / 1e3, args.period_ms / 1e3)
                )
                if background is not None:
                    background.__enter__()
                start = time.perf_counter()
                for _ in range(500):
                    torch.mm(a, b)
                totals[way] += time.perf_counter() - start
                if background is not None:
                    background.__exit__()
        for way in WAYS:
            per_way[way].append(totals[way] / 4000 * 1e6)
    base = statistics.median(per_way["none"])
    share = 100.0 * args.work_ms / args.period_ms
    print(
        f"training thread: 256x256 products, 1 intra-op thread; background: {args.work_ms:g} ms of Python every "
        f"{args.period_ms:g} ms ({share:.1f}% of the time), {args.repeats} repeats"
    )
    print(f"  {'way':<10} {'us/product':>11} {'slower':>8}   [min, max] over repeats")
    for way in WAYS:
        values = per_way[way]
        ratios = [100.0 * (v / n - 1.0) for v, n in zip(values, per_way["none"], strict=True)]
        slower = "-" if way == "none" else f"{100.0 * (statistics.median(values) / base - 1.0):+.1f}%"
        spread = "" if way == "none" else f"[{min(ratios):+.1f}, {max(ratios):+.1f}]"
        print(f"  {way:<10} {statistics.median(values):>11.1f} {slower:>8}   {spread}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
