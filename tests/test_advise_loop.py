"""The closed loop on one case (benchmarks/advise_loop.py has both, with repeats): a data-starved run gets a
DataLoader-workers recommendation, and applying exactly its changes speeds the run up by about what was
predicted."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

LOOP = Path(__file__).resolve().parents[1] / "benchmarks" / "advise_loop.py"


def _loop_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("advise_loop", LOOP)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["advise_loop"] = module
    spec.loader.exec_module(module)
    return module


def test_data_starved_run_gets_workers_and_the_gain_is_real(tmp_path: Path) -> None:
    from tuneup.advise import AdviceOptions, advise
    from tuneup.report import analyze

    loop = _loop_module()
    knobs = {"accum": 1, "workers": 0, **loop.CASES["data"]}
    base_dir = loop._run(tmp_path, "base", knobs, 60)
    base_rate, base = loop._measured(base_dir)
    advice = advise([base], AdviceOptions(whatif=False))
    rec = next(r for r in advice.recommendations if r.id == "data_loading.num_workers")
    # The Dataset waits 1 ms a sample (as storage would): on 2 CPUs that is one worker, Lightning's bound, or
    # two where the process's CPU time shows the loading waited (sleeping workers need no CPU of their own).
    (workers,) = [int(c.proposed) for c in rec.changes if c.knob == "num_workers"]
    assert workers in (1, 2) and f"num_workers={workers}" in rec.code
    # Recommended: its interval excludes a loss, the worker's hand-over of each batch counted in the low end.
    assert rec.gain.value >= 0.05 and rec.gain.low > 0 and rec.evidence
    new_knobs = loop.apply(knobs, rec)
    assert new_knobs is not None and new_knobs["workers"] == workers

    def rate(name: str, run_knobs: dict) -> float:
        return float(analyze(loop._run(tmp_path, name, run_knobs, 60)).throughput.samples_per_s)

    # The direction and the size: more than half the predicted interval's low end (the machine is shared,
    # so no tighter than that in a test; benchmarks/advise_loop.py compares with the interval itself). One
    # pair of runs on a shared 2-CPU host can differ by 20% with nothing changed (A/A), so a pair that falls
    # short is followed by two more, interleaved, and the median of the three pairs decides: a
    # recommendation that truly slows the run still fails, a neighbour's burst during one run does not.
    floor = max(rec.gain.low, 0.05) / 2
    gains = [rate("after-0", new_knobs) / base_rate - 1]
    if gains[0] <= floor:
        for i in (1, 2):
            before = rate(f"base-{i}", knobs)
            gains.append(rate(f"after-{i}", new_knobs) / before - 1)
    assert statistics.median(gains) > floor, (gains, rec.gain)
