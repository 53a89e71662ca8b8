"""tuneup.launch: a command's whole tree of processes ends with it (timeout, failure, Ctrl-C, clean exit),
and bench, probe and tune, which start training through it, leave no rank behind."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tuneup.compare.bench import BenchError, Workload, run_bench
from tuneup.launch import CAPTURE, run_tree

# A launcher with three "ranks", as torchrun or Lightning's subprocess launcher would start them: one that
# sleeps, one that ignores SIGTERM (only SIGKILL ends it; or that sleeps too, for a test that would wait out
# its caller's grace), and one that left the process group (a daemon, a setsid). Their pids go to a file
# once they are started; then the launcher waits, exits or fails.
LAUNCHER = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    pids_file, mode, second = sys.argv[1], sys.argv[2], sys.argv[3]
    sleep = "import time; time.sleep(600)"
    if second == "stubborn":
        second = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    else:
        second = sleep
    ranks = [
        subprocess.Popen([sys.executable, "-c", sleep]),
        subprocess.Popen([sys.executable, "-c", second]),
        subprocess.Popen([sys.executable, "-c", sleep], start_new_session=True),
    ]
    with open(pids_file + ".tmp", "w") as f:
        json.dump([os.getpid()] + [r.pid for r in ranks], f)
    os.replace(pids_file + ".tmp", pids_file)
    print("ranks started", flush=True)
    if mode == "wait":
        time.sleep(600)
    time.sleep(0.5)  # long enough for the launcher to have seen the ranks, then leave them behind
    print("Traceback: rank 0 raised", file=sys.stderr)
    print("RuntimeError: boom", file=sys.stderr, flush=True)
    sys.exit(3 if mode == "fail" else 0)
    """
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _survivors(pids: list[int], within_s: float = 2.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.fixture
def pids_file(tmp_path: Path) -> Iterator[Path]:
    """Where the launcher writes its pids; whatever is left of them is killed after the test, pass or fail."""
    path = tmp_path / "pids.json"
    yield path
    if path.exists():
        for pid in json.loads(path.read_text()):
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                command_line = " ".join(process.cmdline())
                if "sleep(600)" in command_line or "launcher.py" in command_line:
                    process.kill()  # ours, not a process that took a freed pid


def _launcher(tmp_path: Path, pids_file: Path, mode: str, second: str = "stubborn") -> list[str]:
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    return [sys.executable, str(script), str(pids_file), mode, second]


def _pids(pids_file: Path) -> list[int]:
    assert pids_file.exists(), "the launcher had not started its ranks yet: the machine is very slow"
    return list(json.loads(pids_file.read_text()))


def test_a_tree_past_its_timeout_ends_with_every_descendant(tmp_path: Path, pids_file: Path) -> None:
    ended = run_tree(_launcher(tmp_path, pids_file, "wait"), timeout_s=2.0, grace_s=0.5, poll_s=0.05)
    assert ended.timed_out and not ended.ok and ended.returncode is not None and ended.returncode < 0
    assert "ranks started" in ended.stdout_tail
    pids = _pids(pids_file)
    assert _survivors(pids) == [], f"outlived the timeout: {_survivors(pids)} of {pids}"


@pytest.mark.parametrize("mode", ["fail", "exit"])
def test_ranks_left_behind_by_a_launcher_that_exits_are_ended(
    tmp_path: Path, pids_file: Path, mode: str
) -> None:
    # Frequent scans, so that the rank that left the group is seen before its parent goes.
    ended = run_tree(_launcher(tmp_path, pids_file, mode), grace_s=0.5, poll_s=0.05, scan_s=0.05)
    assert not ended.timed_out and ended.stopped is None
    if mode == "fail":
        assert ended.returncode == 3 and not ended.ok
        assert ended.tail(2) == "Traceback: rank 0 raised | RuntimeError: boom"
    else:
        assert ended.returncode == 0 and ended.ok
    pids = _pids(pids_file)
    assert _survivors(pids) == [], f"outlived their launcher: {_survivors(pids)} of {pids}"


def test_a_clean_exit_returns_its_code_and_output(tmp_path: Path) -> None:
    code = "import sys; print('out 1'); print('out 2'); print('err 1', file=sys.stderr); sys.exit(0)"
    ended = run_tree([sys.executable, "-c", code], output=CAPTURE, poll_s=0.05)
    assert ended.ok and ended.returncode == 0 and ended.duration_s > 0
    assert ended.stdout_tail.split() == ["out", "1", "out", "2"] and ended.stderr_tail.strip() == "err 1"
    # Into one file, the two streams together: what tune keeps for a trial.
    log = tmp_path / "output.log"
    ended = run_tree([sys.executable, "-c", code.replace("exit(0)", "exit(5)")], output=log, poll_s=0.05)
    assert ended.returncode == 5 and not ended.ok and "err 1" in log.read_text()
    assert ended.tail(3) == "out 1 | out 2 | err 1" and ended.stderr_tail == ""


def test_ctrl_c_ends_the_tree_and_is_raised_again(tmp_path: Path, pids_file: Path) -> None:
    def interrupt_once_started() -> str | None:
        if pids_file.exists():
            raise KeyboardInterrupt
        return None

    argv = _launcher(tmp_path, pids_file, "wait")
    with pytest.raises(KeyboardInterrupt):
        run_tree(argv, watch=interrupt_once_started, timeout_s=60, grace_s=0.5, poll_s=0.05)
    pids = _pids(pids_file)
    assert _survivors(pids) == [], f"outlived Ctrl-C: {_survivors(pids)} of {pids}"


def test_a_command_that_cannot_start_raises_as_subprocess_does() -> None:
    with pytest.raises(FileNotFoundError):
        run_tree(["/no/such/program"])


def test_bench_past_its_timeout_ends_every_rank(tmp_path: Path, pids_file: Path) -> None:
    # subprocess.run(timeout=), which bench used before, killed the launcher only: its ranks slept on.
    # No rank ignores SIGTERM here: bench's grace before SIGKILL is 5 s.
    command = shlex.join(_launcher(tmp_path, pids_file, "wait", second="sleeps"))
    with pytest.raises(BenchError, match="candidate run 1 took longer than 2 s"):
        run_bench([Workload("candidate", command=command)], 1, tmp_path / "bench", timeout_s=2.0)
    pids = _pids(pids_file)
    assert _survivors(pids) == [], f"outlived bench's timeout: {_survivors(pids)} of {pids}"


RANK = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])
    (out / f"rank{os.environ['RANK']}.tmp").write_text(f"{os.getppid()} {os.getpid()}")
    os.replace(out / f"rank{os.environ['RANK']}.tmp", out / f"rank{os.environ['RANK']}")
    time.sleep(600)
    """
)


@pytest.mark.slow
def test_torchrun_and_its_ranks_end_together(tmp_path: Path) -> None:
    """A real torchrun with 2 ranks, stopped once both are up: torchrun (the agent), its launcher and the
    ranks all end. The ranks import nothing but the standard library, so only torchrun pays for torch."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    ranks_dir = tmp_path / "ranks"
    ranks_dir.mkdir()
    rank_files = [ranks_dir / "rank0", ranks_dir / "rank1"]

    def both_ranks_up() -> str | None:
        return "both ranks up" if all(f.exists() for f in rank_files) else None

    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(script), str(ranks_dir),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        ended = run_tree(argv, env=env, watch=both_ranks_up, timeout_s=120, grace_s=5.0, poll_s=0.1)
    finally:
        pids = sorted({int(p) for f in rank_files if f.exists() for p in f.read_text().split()})
    assert ended.stopped == "both ranks up", ended
    assert len(pids) == 3, pids  # the agent (the ranks' parent) and the two ranks
    assert _survivors(pids) == [], f"outlived torchrun's end: {_survivors(pids)} of {pids}"
