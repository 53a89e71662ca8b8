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

# `make` installs transformers here, off the environment's default path, so that the tests' many other
# processes do not import it with Lightning (see the Makefile). This process and the Hugging Face Trainer's
# test processes (`hf_environ`) find it.
HF_SITE = Path(sys.prefix) / "hf-site"
# And the `ci` extra (ruptures, SciPy) here, for the change-point tests that run in this process: beside
# Lightning, SciPy costs every `import lightning` 1.0 s (torchmetrics imports scipy.signal when it can).
CI_SITE = Path(sys.prefix) / "ci-site"
# Lightning is imported before either goes on the path: torchmetrics, which every import of Lightning
# imports, looks for SciPy and transformers as it is imported, and would import scipy.signal and transformers'
# metadata checks into each of pytest's three processes (2 s of each one's collection). No test in this
# process uses torchmetrics; the tests' own processes get the directories only where they ask (hf_environ).
import lightning.pytorch  # noqa: E402, F401

for _site in (HF_SITE, CI_SITE):
    if _site.is_dir() and str(_site) not in sys.path:
        sys.path.append(str(_site))


def hf_environ(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) with transformers' directory on PYTHONPATH, for a
    process that trains with the Hugging Face Trainer."""
    env = dict(os.environ if env is None else env)
    if HF_SITE.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(HF_SITE)) if p)
    return env


# Tests that time something against the wall clock (injected delays coming back in their phase, a bench
# verdict, the callback's overhead, a CPU-burning neighbour flagged, a recommendation's measured gain) or
# that read the host's CPU contention: `make test` runs them alone, after the rest has run in parallel
# (pytest-xdist), so that no other test's processes share their CPUs. A test elsewhere that times
# something takes `@pytest.mark.timing`.
TIMING_MODULES = frozenset(
    {
        "test_advise_loop.py",
        "test_advise_measure.py",
        "test_callback.py",
        "test_compare.py",
        "test_fabric_adapter.py",
        "test_hf_adapter.py",
        "test_noise.py",
        "test_plain_loop.py",
        "test_telemetry.py",
        "test_training_loops.py",
    }
)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The timing pass (`-m timing`, `make test`'s second) collects only the modules that hold timing tests:
    importing the other 60-odd only to deselect all their tests cost it about 5 s."""
    if config.getoption("markexpr") != "timing" or not collection_path.name.startswith("test_"):
        return None
    if collection_path.suffix != ".py" or collection_path.name in TIMING_MODULES:
        return None
    return "mark.timing" not in collection_path.read_text()


# The modules that take longest in the parallel pass, longest first (`--durations=0`, summed per module,
# on the 2-core machine: test_tune_live about 210 s of a worker, test_render_cost 16 s). `make test` hands
# modules to its 2 workers in collection order (`--no-loadscope-reorder`), so these go first and the many
# short modules fill the end: handed out as pytest-xdist orders them by default (most tests first), the
# longest came last and one worker ran them alone while the other had finished.
LONGEST_FIRST = (
    "test_tune_live.py",
    "test_sync.py",
    "test_noise_scale.py",
    "test_multinode.py",
    "test_comm.py",
    "test_probe.py",
    "test_fuzz.py",
    "test_segments.py",
    "test_distributed.py",
    "test_fit_defects.py",
    "test_advise_rules.py",
    "test_plots.py",
    "test_render_cost.py",
)
# A renamed module would drop out of either list without a word (run with the rest, or handed out late).
_unknown = sorted(n for n in (*TIMING_MODULES, *LONGEST_FIRST) if not (ROOT / "tests" / n).is_file())
if _unknown:
    raise pytest.UsageError(f"tests/conftest.py names test modules that do not exist: {', '.join(_unknown)}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in TIMING_MODULES:
            item.add_marker(pytest.mark.timing)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _fresh_warnings(caplog: pytest.LogCaptureFixture) -> None:
    # warn_once remembers across tests in one process; each test must see its own warnings.
    reset_said()
    caplog.set_level(logging.INFO, logger="tuneup")


def free_port() -> int:
    """A loopback TCP port nothing listens on now (for a rendezvous or a test server)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_workload(
    out: Path | str,
    *args: str,
    timeout: float = 240,
    check: bool = True,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run tests/workloads/tiny.py in its own process (DDP relaunches it for the other ranks). `out` is
    the run directory (or its URL, with `cwd` then given); `env` is added to this process's."""
    environ = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, str(WORKLOAD), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environ,
        cwd=str(cwd if cwd is not None else Path(out).parent),
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"workload failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


# One 2-process DDP run with a straggler serves the recording tests and the report tests alike:
# rank 1 sleeps STRAGGLER_SLEEP_MS in every training_step, under accumulate_grad_batches=2.
STRAGGLER_SLEEP_MS = 25
STRAGGLER_STEPS = 16


@pytest.fixture(scope="session")
def ddp_straggler_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp-straggler") / "run"
    run_workload(
        out,
        *("--devices", "2", "--strategy", "ddp", "--max-steps", str(STRAGGLER_STEPS), "--accumulate", "2"),
        *("--slow-step-ms", str(STRAGGLER_SLEEP_MS), "--slow-rank", "1"),
    )
    return out
