"""Where tuneup's time goes inside a training step: each of its per-step functions, timed in place.

    python benchmarks/hook_costs.py [--width 512] [--steps 3000]

One fit of the overhead benchmark's MLP (`benchmarks/overhead.py`, 1 intra-op thread) with
`TuneupCallback()`, with tuneup's per-step functions wrapped at class level by a clock: the callback's
hooks, the step clock's marks, the batch counter, and the trainer taps' wrappers (whose time includes
the trainer method they wrap). Times are inclusive (a hook's time contains the marks it takes) and per
step, over the whole fit. Each wrapper adds about 0.3 us to what it wraps, so small entries read high;
the point is the ranking, and that the times are taken in the real loop, where the step's own work has
just emptied the caches (a function that costs 0.1 us in a tight loop costs 1-2 us here).

Width 512 gives about a 2 ms step on this project's machine, 1296 about 10 ms.
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import overhead  # the benchmark's workload and fit

from tuneup.collect import batch, step_clock
from tuneup.plugins.lightning import callback, trainer_taps

TOTAL_S: collections.Counter[str] = collections.Counter()
CALLS: collections.Counter[str] = collections.Counter()

CLOCK_MARKS = (
    "fetch_start",
    "fetch_end",
    "batch_start",
    "before_backward",
    "after_backward",
    "before_optimizer",
    "after_optimizer",
    "batch_end",
    "sync_start",
    "sync_end",
    "close_step",
    "own_since",  # the hooks' own time handed back, out of the user's phases
)
CALLBACK_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_train_batch_end",
)


def timed(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TOTAL_S[label] += time.perf_counter() - start
            CALLS[label] += 1

    return wrapper


def instrument() -> None:
    for cls, names in (
        (step_clock.StepClock, CLOCK_MARKS),
        (batch.BatchCounter, ("samples", "tokens")),
        (callback.TuneupCallback, CALLBACK_HOOKS),
    ):
        for name in names:
            setattr(cls, name, timed(getattr(cls, name), f"{cls.__name__}.{name}"))
    install = trainer_taps.TrainerTaps.install

    def install_timed(self: Any, trainer: Any) -> None:
        install(self, trainer)
        for obj, name, wrapper in self._patched:
            setattr(obj, name, timed(wrapper, f"tap: {type(obj).__name__}.{name} (with the method)"))

    trainer_taps.TrainerTaps.install = install_timed  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=512, help="MLP width (512: ~2 ms steps here; 1296: ~10 ms)")
    p.add_argument("--steps", type=int, default=3000)
    args = p.parse_args(argv)
    overhead.quiet_lightning()
    torch.set_num_threads(1)
    instrument()
    with tempfile.TemporaryDirectory() as tmp:
        result = overhead.fit_once(
            overhead.TUNEUP,
            args.width,
            args.steps,
            overhead.make_batches(),
            Path(tmp) / "run",
            warmup_steps=0,
        )
    print(f"MLP width {args.width}: {result.wall_ms_per_step:.3f} ms/step, {args.steps} steps")
    print(f"  {'function':<58} {'us/step':>8} {'calls/step':>11}")
    for label, total_s in TOTAL_S.most_common():
        print(f"  {label:<58} {total_s * 1e6 / args.steps:>8.2f} {CALLS[label] / args.steps:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
