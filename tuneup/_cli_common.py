"""What the `tuneup` commands share: the error for bad input, the RUN_DIR argument, and --target.

Its own module so that a command defined elsewhere (`tuneup advise`) can use it without importing
tuneup.cli, which imports every command to build its parser: that was an import circle.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tuneup.target import Target, TargetError, parse_target

# How far below a RUN_DIR that is not a run to look for one: `reports/demo/run` is one level down,
# `reports/bench/<time>/candidate/run-00` (a set) two. Deeper would walk whole trees of runs.
RUN_SEARCH_DEPTH = 2
RUNS_LISTED = 5  # in the error for a directory of several runs: enough to pick one, not a wall of paths


class UsageError(Exception):
    """Bad input from the user: reported in one line, exit code 2."""


def runs_under(path: Path, depth: int = RUN_SEARCH_DEPTH) -> list[Path]:
    """The run directories (those with a manifest) under `path`, up to `depth` levels down, sorted.

    A run's own subdirectories are not searched: a resumed run keeps its later segments there, each
    with a manifest of its own, and they are that run, not other runs.
    """
    from tuneup.record.schema import MANIFEST_FILE

    found: list[Path] = []
    try:
        # Hidden directories (.git, a report's scratch directory) hold no run a user means.
        children = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return found  # unreadable: load_run names the directory and the problem
    for child in children:
        if (child / MANIFEST_FILE).is_file():
            found.append(child)
        elif depth > 1:
            found.extend(runs_under(child, depth - 1))
    return found


def resolve_run_dir(path: str | Path, command: str) -> str | Path:
    """The run a RUN_DIR argument names: `path` itself when it is a run (or is no directory at all,
    which load_run then explains, or a URL on object storage, which load_run reads); else the one run
    under it, said on stderr. UsageError names the runs when there are several."""
    from tuneup.record.remote import is_url
    from tuneup.record.schema import MANIFEST_FILE

    if is_url(path):
        return str(path)
    path = Path(path)

    if not path.is_dir() or (path / MANIFEST_FILE).is_file():
        return path
    runs = runs_under(path)
    if not runs:
        return path  # load_run says why it is not a run (empty, or no manifest) and what to pass
    if len(runs) == 1:
        print(f"tuneup {command}: {path} is not a run; using the one run in it, {runs[0]}", file=sys.stderr)
        return runs[0]
    shown = ", ".join(str(r) for r in runs[:RUNS_LISTED])
    more = f" and {len(runs) - RUNS_LISTED} more" if len(runs) > RUNS_LISTED else ""
    raise UsageError(
        f"{path} is not a run but holds {len(runs)} runs ({shown}{more}); pass one of them, "
        f"e.g. tuneup {command} {runs[0]}"
    )


def target_option(args: Any) -> Target | None:
    """The command's --target, parsed (None where not given); UsageError with TargetError's message for one
    that cannot be read. `tuneup report`, `show` and `advise` take it so."""
    text = getattr(args, "target", None)
    if text is None:
        return None
    try:
        return parse_target(text)
    except TargetError as exc:
        raise UsageError(str(exc)) from None
