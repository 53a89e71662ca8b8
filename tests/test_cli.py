"""The `tuneup` command as a user runs it: exit codes, one-line errors, and the demo end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuneup.cli import main

from synthetic import make_run


def test_show_prints_headline_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run", world_size=2, steps=40)
    assert main(["show", str(run)]) == 0
    out = capsys.readouterr().out
    assert "world size 2" in out
    # 8 samples per 10 ms step on rank 0 and per 11 ms on rank 1: 800 + 727.3 samples/s.
    assert "1,527 samples/s" in out  # the report's number format
    assert "data" in out and "forward" in out and "backward" in out


def test_show_says_plainly_when_a_rank_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run", world_size=2, steps=10)
    for f in (run / "rank-1").iterdir():
        f.unlink()
    (run / "rank-1").rmdir()
    assert main(["show", str(run)]) == 0
    assert "1 of 2 rank(s) left no record (rank 1)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "is empty"),
        (lambda p: (p / "x.txt").write_text("x") and p / "x.txt", "is a file"),
    ],
)
def test_bad_run_dir_is_one_line_and_exit_2(tmp_path: Path, make, message: str) -> None:
    path = make(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "tuneup", "show", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_newer_schema_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["schema_version"] = 99
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert main(["show", str(run)]) == 2
    assert "upgrade tuneup" in capsys.readouterr().err


def test_usage_errors_exit_2() -> None:
    with pytest.raises(SystemExit) as info:
        main(["report-nothing"])
    assert info.value.code == 2
    assert main(["demo", "--steps", "0"]) == 2


def test_demo_trains_and_shows_the_run(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuneup",
            "demo",
            "--steps",
            "12",  # enough for a steady state (at least 5 steps past warm-up) whatever the warm-up
            "--devices",
            "1",
            "--out",
            str(tmp_path / "demo"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tokens/s" in proc.stdout and "TinyLM" in proc.stdout
    from tuneup import load_run

    run = load_run(tmp_path / "demo" / "run")
    steps = run.steps(0)
    assert len(steps) == 12 and steps[0].tokens == 16 * 64 and steps[0].samples == 16
