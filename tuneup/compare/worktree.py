"""`tuneup bench --baseline-ref REF`: the baseline's code checked out in a git worktree of its own.

A CI job holds the candidate's checkout (the pull request); the baseline is another commit (main). The
worktree is a second checkout of the same repository at REF, detached, beside the runs (`--out`), so the
two sides run the same command each in its own tree: a relative path in the command (`python train.py`,
`.venv/bin/python ...`) finds the baseline's files there. Its Python imports come from it too: the
worktree's root (and its `src/`, for a src layout) go first on PYTHONPATH, ahead of an editable install of
the candidate, whose finders come after the path entries. A setup command (`--baseline-setup`, say
`make .venv` or `pip install -e .` into the worktree's own environment) runs once in it before any run.
The worktree is removed when the bench ends, also on an error.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tuneup.compare.bench import BenchError
from tuneup.launch import CAPTURE, run_tree


def _git(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise BenchError("--baseline-ref needs git on PATH") from None


def repository_root(cwd: Path | None = None) -> Path:
    """The git checkout this bench runs in; BenchError outside one."""
    done = _git(["rev-parse", "--show-toplevel"], cwd)
    if done.returncode != 0:
        raise BenchError(
            "--baseline-ref needs a git checkout: run tuneup bench inside the repository (the candidate's "
            "checkout), or give the baseline as --baseline-cmd"
        )
    return Path(done.stdout.strip())


def resolve_ref(ref: str, root: Path) -> str:
    """REF's commit; BenchError naming it when git does not know it (a shallow CI clone often lacks it)."""
    done = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], root)
    if done.returncode != 0:
        raise BenchError(
            f"--baseline-ref {ref!r}: no such commit in {root}; fetch it first "
            f"(git fetch origin {shlex.quote(ref)}, or a deeper clone: fetch-depth: 0 in actions/checkout)"
        )
    return done.stdout.strip()


def python_path(tree: Path, inherited: str | None) -> str:
    """PYTHONPATH with the tree's root and its src/ (if any) first."""
    entries = [str(tree)] + ([str(tree / "src")] if (tree / "src").is_dir() else [])
    return os.pathsep.join(entries + ([inherited] if inherited else []))


@contextmanager
def baseline_worktree(
    ref: str, into: Path, *, setup: str | None = None, timeout_s: float = 3600.0
) -> Iterator[Path]:
    """A detached worktree of the current repository at `ref` in `into`; runs `setup` there first. Yields
    the directory of the tree where the current one is in the checkout (the tree's root from outside it),
    and removes the worktree afterwards."""
    root = repository_root()
    commit = resolve_ref(ref, root)
    if into.exists():
        raise BenchError(f"{into} already exists; give --out an empty or new directory")
    into.parent.mkdir(parents=True, exist_ok=True)
    added = _git(["worktree", "add", "--detach", str(into), commit], root)
    if added.returncode != 0:
        raise BenchError(f"git worktree add {into} {ref}: {added.stderr.strip() or added.stdout.strip()}")
    try:
        if setup:
            ended = run_tree(["sh", "-c", setup], cwd=into, output=CAPTURE, timeout_s=timeout_s)
            if ended.timed_out or ended.returncode != 0:
                why = "timed out" if ended.timed_out else f"exited with {ended.returncode}"
                raise BenchError(f"--baseline-setup {setup!r} in {into} {why}: {ended.tail(3)}")
        # The candidate runs where tuneup bench was started: the baseline in the same place of its tree.
        try:
            here = into / Path.cwd().resolve().relative_to(root.resolve())
        except ValueError:
            here = into
        yield here
    finally:
        _git(["worktree", "remove", "--force", str(into)], root)
        _git(["worktree", "prune"], root)
