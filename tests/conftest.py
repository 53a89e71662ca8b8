from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuneup._log import reset_said

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "tests" / "workloads" / "tiny.py"


@pytest.fixture(autouse=True)
def _fresh_warnings(caplog: pytest.LogCaptureFixture) -> None:
    # warn_once remembers across tests in one process; each test must see its own warnings.
    reset_said()
    caplog.set_level(logging.INFO, logger="tuneup")


def run_workload(
    out: Path, *args: str, timeout: float = 240, check: bool = True
) -> subprocess.CompletedProcess:
    """Run tests/workloads/tiny.py in its own process (DDP relaunches it for the other ranks)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(WORKLOAD), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(out.parent),
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"workload failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc
