"""Defects a user found in the `tuneup` command, each run as the user ran it (a real subprocess).

- output into a pipe whose reader stopped early (`| head -1`) ends quietly, with exit status 141;
- `tuneup show/report DIR` takes a directory that holds one run, and names the runs when it holds several;
- `import tuneup` reaches its subpackages lazily (`tuneup.report.build_report`), without torch or matplotlib;
- `tuneup catalog --gpu X` counts and dates the rows it shows, and says why a row is doubtful;
- `tuneup compare` and `tuneup baseline` write every figure in one format.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tuneup.catalog import load_instances
from tuneup.record import RankWriter, write_manifest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_RUN = ROOT / "reports" / "example" / "run"
TIMEOUT_S = 180
# 128 + SIGPIPE, as a shell reports `cat` cut off by `| head`; the cli docstring documents it.
EXIT_BROKEN_PIPE = 141


def tuneup(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuneup", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        cwd=cwd,
    )


def named_run(path: Path, run_id: str, step_ms: float = 10.0, steps: int = 30) -> Path:
    """A one-rank run through the real writer, every step `step_ms` long with 8 samples, with its own run
    id (compare refuses a run compared with itself)."""
    write_manifest(
        path,
        {
            "run_id": run_id,
            "created_unix": 1.0,
            "world_size": 1,
            "num_nodes": 1,
            "trainer": {"accelerator": "CPUAccelerator", "accumulate_grad_batches": 1},
            "dataloader": {"batch_size": 8},
            "model": {"class": "Net", "parameters": 1000},
        },
    )
    writer = RankWriter(path, 0)
    writer.open({"host": "node0"})
    for step in range(steps):
        writer.add_step(
            {
                "step": step,
                "epoch": 0,
                "t_end": 1000.0 + (step + 1) * step_ms / 1000.0,
                "wall_ms": step_ms,
                **dict.fromkeys(("data_ms", "forward_ms", "backward_ms", "optimizer_ms"), 0.0),
                "other_ms": step_ms,
                "micro_batches": 1,
                "samples": 8,
            }
        )
    writer.add_telemetry({"t": 1000.0, "process": {"rss_bytes": 100e6}})
    writer.close(status="completed")
    return path


# -- 1. a reader that stops early ---------------------------------------------------------------------


def into_closed_pipe(*args: str, unbuffered: bool) -> subprocess.CompletedProcess[str]:
    """Run tuneup with stdout a pipe whose reader is gone before the first byte: every write to it fails
    with EPIPE, as `| head -1` makes the writes after the first line fail, but without the race."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ}
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:  # print itself fails, inside the command, instead of the flush at the end
        env["PYTHONUNBUFFERED"] = "1"
    try:
        return subprocess.run(
            [sys.executable, "-m", "tuneup", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
        )
    finally:
        os.close(write_end)


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two runs a side, all alike: compare's verdicts are NO CHANGE, so it has nothing to warn of."""
    root = tmp_path_factory.mktemp("sets")
    for side in ("a", "b"):
        for i in range(2):
            named_run(root / side / f"run-{i}", f"{side}-{i}")
    return root / "a", root / "b"


COMMANDS = {
    "catalog": lambda sets, tmp: ["catalog"],
    "catalog --gpu": lambda sets, tmp: ["catalog", "--gpu", "H100"],
    "show": lambda sets, tmp: ["show", str(sets[0] / "run-0")],
    "report": lambda sets, tmp: [
        "report",
        str(sets[0] / "run-0"),
        "-o",
        str(tmp / "out"),
        "--format",
        "md,json",
    ],
    "compare": lambda sets, tmp: ["compare", str(sets[0]), str(sets[1])],
    "baseline save": lambda sets, tmp: ["baseline", "save", str(sets[0]), "-o", str(tmp / "base.json")],
}


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_closed_pipe_ends_quietly_with_141(
    command: str, unbuffered: bool, two_sets: tuple[Path, Path], tmp_path: Path
) -> None:
    proc = into_closed_pipe(*COMMANDS[command](two_sets, tmp_path), unbuffered=unbuffered)
    # Not "internal error: BrokenPipeError", not "Exception ignored ... BrokenPipeError", not exit 1 or 2.
    assert proc.stderr == ""
    assert proc.returncode == EXIT_BROKEN_PIPE


@pytest.mark.parametrize("option", ["--help", "--version"])
def test_argparse_output_into_a_closed_pipe_too(option: str) -> None:
    # Buffered only: unbuffered, argparse writes these itself and ignores the failed write (exit 0).
    proc = into_closed_pipe(option, unbuffered=False)
    assert proc.stderr == ""
    assert proc.returncode == EXIT_BROKEN_PIPE


def test_a_closed_stdout_does_not_hide_an_error_on_stderr(tmp_path: Path) -> None:
    proc = into_closed_pipe("show", str(tmp_path / "missing"), unbuffered=False)
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and proc.stderr.count("\n") == 1


def test_head_minus_one_through_a_shell() -> None:
    # The user's own command line; `head` may exit before or after tuneup writes, so only what must hold
    # either way is checked: one line out, nothing on stderr, and never an error exit.
    proc = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m tuneup catalog | head -1; exit "${{PIPESTATUS[0]}}"'],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.stdout.startswith("catalog ") and proc.stdout.count("\n") == 1
    assert proc.stderr == ""
    assert proc.returncode in (0, EXIT_BROKEN_PIPE)


# -- 2. a directory that holds a run ------------------------------------------------------------------


def test_show_uses_the_one_run_in_a_directory_and_says_which(tmp_path: Path) -> None:
    # As `tuneup demo` leaves it: the run one level down, the report's files beside it.
    run = named_run(tmp_path / "demo" / "run", "run-1")
    (tmp_path / "demo" / "report.md").write_text("# report\n")
    proc = tuneup("show", str(tmp_path / "demo"))
    assert proc.returncode == 0, proc.stderr
    assert "tuneup run run-1" in proc.stdout
    assert str(run) in proc.stderr and "using the one run" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_the_run_may_be_two_levels_down(tmp_path: Path) -> None:
    named_run(tmp_path / "jobs" / "bench" / "run-00", "run-00")
    proc = tuneup("show", str(tmp_path / "jobs"))
    assert proc.returncode == 0, proc.stderr
    assert "tuneup run run-00" in proc.stdout


def test_a_resumed_runs_segments_are_one_run(tmp_path: Path) -> None:
    # A segment holds a manifest of its own, but it is part of its run, not a second run.
    run = named_run(tmp_path / "outer" / "run", "run-1")
    named_run(run / "segment-1", "run-1")
    proc = tuneup("show", str(tmp_path / "outer"))
    assert proc.returncode == 0, proc.stderr
    assert str(run) in proc.stderr


def test_several_runs_are_listed_and_the_user_told_to_pass_one(tmp_path: Path) -> None:
    for i in range(7):
        named_run(tmp_path / "set" / ("candidate" if i % 2 else "baseline") / f"run-{i}", f"run-{i}")
    proc = tuneup("show", str(tmp_path / "set"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "holds 7 runs" in proc.stderr and "pass one of them" in proc.stderr
    assert str(tmp_path / "set" / "baseline" / "run-0") in proc.stderr and "and 2 more" in proc.stderr


def test_report_resolves_the_directory_as_show_does(tmp_path: Path) -> None:
    named_run(tmp_path / "demo" / "run", "run-1")
    proc = tuneup("report", str(tmp_path / "demo"), "-o", str(tmp_path / "out"), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert "using the one run" in proc.stderr
    assert json.loads((tmp_path / "out" / "report.json").read_text())["run"]["run_id"] == "run-1"


def test_an_empty_directory_is_still_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    proc = tuneup("show", str(tmp_path / "empty"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


# -- 3. the subpackages from a plain `import tuneup` --------------------------------------------------

LAZY_IMPORTS = """
import sys
import tuneup

heavy = ("torch", "matplotlib", "lightning", "tuneup.report", "tuneup.compare", "tuneup.cost")
assert not [m for m in heavy if m in sys.modules], [m for m in heavy if m in sys.modules]
assert callable(tuneup.report.build_report) and callable(tuneup.report.analyze)
assert "matplotlib" not in sys.modules, "the report's plots are imported only when drawn"
assert tuneup.analyze.__name__ == "tuneup.analyze"
assert callable(tuneup.record.load_run)
assert callable(tuneup.compare.decide)
assert callable(tuneup.catalog.load_instances)
assert tuneup.cost.__name__ == "tuneup.cost"
assert {"report", "analyze", "record", "compare", "catalog", "cost"} <= set(dir(tuneup))
assert "torch" not in sys.modules and "matplotlib" not in sys.modules
try:
    tuneup.no_such_thing
except AttributeError as exc:
    assert "no_such_thing" in str(exc)
else:
    raise AssertionError("an unknown attribute must raise AttributeError")
print("ok")
"""


def test_import_tuneup_reaches_its_subpackages_lazily() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", LAZY_IMPORTS], capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_the_readme_calls_work_on_the_example_run() -> None:
    # README's "Reading it back" calls, on the committed example run (README names reports/demo/run,
    # which exists only after `tuneup demo`).
    code = f"""
import tuneup
run = tuneup.load_run({str(EXAMPLE_RUN)!r})
run.manifest.trainer["strategy"], run.world_size, run.rank_hosts
steps = list(run.steps(rank=0))
steps[0].step, steps[0].wall_ms, steps[0].data_ms, steps[0].forward_ms, steps[0].backward_ms
analysis = tuneup.report.analyze({str(EXAMPLE_RUN)!r})
analysis.throughput.samples_per_s, analysis.step_time.mean_ms, analysis.step_time.phases["data"].share
document = tuneup.report.build_report({str(EXAMPLE_RUN)!r})
assert document["run"]["run_id"] == run.run_id
try:
    tuneup.load_run({str(EXAMPLE_RUN.parent)!r})
except tuneup.RunRecordError:
    pass
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


# -- 4 and 5. the catalog's counts and doubts ---------------------------------------------------------


def table_rows(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("key ")) + 1
    rows = []
    for line in lines[start:]:
        if not line.startswith("  ") or line.lstrip().startswith("["):
            break
        rows.append(line)
    return rows


@pytest.mark.parametrize("gpu", ["H100", "A10G", "L4", "V100"])
def test_catalog_counts_and_dates_describe_the_rows_shown(gpu: str) -> None:
    proc = tuneup("catalog", "--gpu", gpu)
    assert proc.returncode == 0, proc.stderr
    header = proc.stdout.splitlines()[0]
    rows = table_rows(proc.stdout)
    shown = list(load_instances().with_gpu(gpu).rows)  # whole parts of the name: L4 is not L40S
    assert len(rows) == len(shown) > 0
    assert re.search(rf"\b{len(rows)} instances?\b", header), header
    undated = sum(" undated " in f"{row} " for row in rows)
    assert undated == sum(1 for r in shown if not r.as_of_date)
    if undated:
        assert f"({undated} undated)" in header, header
    else:
        assert "undated)" not in header, header
    dated = sorted(r.as_of_date for r in shown if r.as_of_date)
    if dated:
        assert dated[0] in header and dated[-1] in header, header
        every_date = {r.as_of_date for r in load_instances() if r.as_of_date}
        assert not [d for d in every_date - set(dated) if d in header], header


def test_catalog_says_why_a_row_is_doubtful() -> None:
    proc = tuneup("catalog", "--gpu", "H100")  # into a pipe, not a terminal: each doubt in full
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    rows = table_rows(out)
    assert not any(row.rstrip().endswith(" yes") for row in rows)
    notes = dict(re.findall(r"^  \[(\d+)\] (.+)$", out, flags=re.MULTILINE))
    by_key = {r.qualified_key: r for r in load_instances()}
    doubtful = 0
    for row in rows:
        key = row.split()[0]
        mark = re.search(r"\[(\d+)\]$", row.rstrip())
        if by_key[key].doubt:
            doubtful += 1
            assert mark, row
            assert notes[mark.group(1)] == by_key[key].doubt
        else:
            assert mark is None, row
    assert doubtful >= 2
    # Rows with the same doubt share its footnote rather than repeat it.
    assert len(notes) == len({by_key[row.split()[0]].doubt for row in rows} - {None})


def test_catalog_doubts_fit_the_width_given() -> None:
    from tuneup.cli import format_catalog

    text = format_catalog(load_instances(), doubt_width=80)
    notes = [line for line in text.splitlines() if re.match(r"^  \[\d+\] ", line)]
    assert len(notes) >= 10
    assert all(len(line) <= 80 for line in notes), max(notes, key=len)
    cut = [line for line in notes if line.endswith(" ...")]
    assert cut, "the packaged catalog has doubts longer than a line"
    assert not [line for line in cut if line.endswith("- ...")], "cut at a hyphen"
    assert "shows them in full" in text
    full = format_catalog(load_instances())
    assert "shows them in full" not in full and not [
        line for line in full.splitlines() if line.endswith(" ...")
    ]


def test_catalog_on_a_terminal_keeps_each_doubt_to_one_line() -> None:
    primary, secondary = pty.openpty()
    env = {**os.environ, "COLUMNS": "90"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuneup", "catalog"], stdout=secondary, stderr=subprocess.PIPE, env=env
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the terminal's other end is closed, the command is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    assert proc.wait(timeout=TIMEOUT_S) == 0
    out = b"".join(chunks).decode().replace("\r\n", "\n")
    notes = [line for line in out.splitlines() if re.match(r"^  \[\d+\] ", line)]
    assert notes and all(len(line) <= 90 for line in notes)
    assert any(line.endswith(" ...") for line in notes)


# -- 6. one number format in compare's output ---------------------------------------------------------

FIGURE = re.compile(r"(\S+) (samples/s|steps/s|ms|MiB|KiB|GiB)\b")
GROUPED = re.compile(r"^\d{1,3}(,\d{3})*(\.\d+)?$")


def test_compare_and_baseline_write_figures_alike(tmp_path: Path) -> None:
    # 8 samples per 0.7 ms step: 11,429 samples/s, a figure that "g" formats would write as 1.143e+04.
    base = named_run(tmp_path / "base", "base-1", step_ms=0.7)
    cand = named_run(tmp_path / "cand", "cand-1", step_ms=0.8)
    saved = tuneup("baseline", "save", str(base), "-o", str(tmp_path / "b.json"))
    compared = tuneup("compare", str(base), str(cand))
    assert saved.returncode == 0, saved.stderr
    assert compared.returncode == 0, compared.stderr  # one run a side: INCONCLUSIVE, which passes
    for out in (saved.stdout, compared.stdout):
        figures = FIGURE.findall(out)
        assert figures, out
        for value, unit in figures:
            assert GROUPED.match(value), f"{value} {unit} in:\n{out}"
    (per_run,) = re.findall(r"base-1: (.+)$", saved.stdout, flags=re.MULTILINE)
    assert per_run == "11,429 samples/s"
    assert per_run in compared.stdout  # the baseline's median is its one run: the same figure, alike


def test_format_value_never_writes_an_exponent() -> None:
    from tuneup.compare.compare import format_value

    assert format_value(11428.57, "samples/s") == "11,429 samples/s"
    assert format_value(3.2, "steps/s") == "3.20 steps/s"
    assert format_value(0.7, "ms") == "0.70 ms"
    assert format_value(100e6, "bytes") == "95.4 MiB"
    assert format_value(1.234e-5, "USD") == "$0.0000123"
    assert format_value(None, "ms") == "-"
    for value in (1.234e-7, 2.5e-3, 1.5e4, 2.5e7):
        for unit in ("samples/s", "ms", "bytes", "USD"):
            assert "e" not in format_value(value, unit).replace("samples", "").replace("steps", ""), (
                value,
                unit,
            )


def test_catalog_gpu_filter_matches_whole_parts_of_the_name_not_substrings() -> None:
    # Defect: --gpu L4 listed the L40S rows and --gpu A10 the A100 rows, the substring trap DESIGN.md
    # names in Lightning's MFU table.
    from tuneup.catalog import load_instances

    catalog = load_instances()
    assert {r.gpu for r in catalog.with_gpu("L4").rows} == {"L4"}
    assert {r.gpu for r in catalog.with_gpu("a10").rows} == {"A10"}
    a100 = {r.gpu for r in catalog.with_gpu("A100").rows}
    assert a100 and all(g.startswith("A100-") for g in a100)
    assert {r.gpu for r in catalog.with_gpu("a100-80gb").rows} == {g for g in a100 if g.endswith("80GB")}


def test_a_bug_of_tuneups_is_one_line_and_exit_70_not_a_regressions_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A CI gate reads exit 1 as "regression": tuneup's own failure must not look like one.
    import tuneup.cli as cli

    def broken(args: object) -> int:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cli, "cmd_catalog", broken)
    monkeypatch.delenv("TUNEUP_DEBUG", raising=False)
    assert cli.main(["catalog"]) == cli.EXIT_INTERNAL_ERROR == 70
    err = capsys.readouterr().err
    assert (
        err.startswith("tuneup catalog: internal error: ZeroDivisionError: a bug") and "Traceback" not in err
    )
