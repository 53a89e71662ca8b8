"""The package as users get it: a built wheel, installed without the source tree on the path."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy without build/: setuptools reuses build/lib, where a module from an earlier build
    # would hide a package that pyproject no longer (or never) lists.
    source = tmp_path_factory.mktemp("source") / "tuneup"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "reports", "__pycache__"),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("tuneup-*.whl")
    return path


def test_wheel_installs_plugins_under_tuneup_and_no_top_level_plugins(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "tuneup/plugins/lightning/callback.py" in names
    assert "tuneup/cli.py" in names and "tuneup/record/reader.py" in names
    assert "tuneup/report/report.schema.json" in names and "tuneup/data/interconnects.csv" in names
    top_level = {n.split("/")[0] for n in names if not n.startswith("tuneup-")}
    assert top_level == {"tuneup"}, top_level
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "tuneup = tuneup.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_wheel_holds_every_module_of_the_source_tree(wheel: Path) -> None:
    # pyproject lists the packages by name (plugins/ maps to tuneup.plugins): a new package left off the
    # list installs nothing, and an editable install would hide it (tuneup.report.sections once was).
    names = set(zipfile.ZipFile(wheel).namelist())
    source = {f"tuneup/{p.relative_to(ROOT / 'tuneup').as_posix()}" for p in (ROOT / "tuneup").rglob("*.py")}
    source |= {
        f"tuneup/plugins/{p.relative_to(ROOT / 'plugins').as_posix()}"
        for p in (ROOT / "plugins").rglob("*.py")
    }
    assert source - names == set()


def test_installed_wheel_imports_without_the_source_tree(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    code = (
        "import sys, tuneup, tuneup.plugins.lightning as pl, tuneup.report.sections, tuneup.advise.batch;"
        "assert tuneup.__file__.startswith(sys.argv[1]), tuneup.__file__;"
        "assert tuneup.TuneupCallback is pl.TuneupCallback;"
        "print('ok')"
    )
    # The installed copy first, then the dependencies of this environment; cwd away from the source tree.
    env = {"PYTHONPATH": f"{target}:{sysconfig.get_paths()['purelib']}", "PYTHONNOUSERSITE": "1"}
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code, str(target)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_cli_help_and_version_start_without_torch() -> None:
    code = (
        "import sys; from tuneup.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "assert 'torch' not in sys.modules and 'lightning' not in sys.modules, 'heavy import at start-up'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("tuneup ")
