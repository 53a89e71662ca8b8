"""SIGKILL at random moments of training: every record left behind loads and reports (benchmarks/kill_runs.py
kills 20; CI kills 3 of them, the same way)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "kill_runs.py"


@pytest.mark.slow
def test_runs_killed_at_random_moments_load_and_report(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("kill_runs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kill_runs"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    results = module.kill_runs(3, seed=1, flush_every_steps=10, tmp=tmp_path)
    killed = [r for r in results if not r.note]
    assert len(killed) == 3
    for r in killed:
        assert r.loads and r.reports and r.says_unclosed, r
        assert r.finished_steps > 0
        # About one flush interval (10 steps) is lost; two if the writer thread was starved of CPU.
        assert r.lost_steps <= 21, r
