"""Segments: one run, continued after an interruption, never mixed into what came before.

A run resumed from a Lightning checkpoint, or restarted by torchrun (`--max-restarts`), possibly with
another world size, goes on as a new segment: a `segment-<k>` directory inside the run directory, with
its own manifest and rank streams in the usual format. The run directory itself is segment 0, so a
reader that knows nothing of segments still reads the first one correctly.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from tuneup.record.schema import MANIFEST_FILE, Run

SEGMENT_PREFIX = "segment-"
_SEGMENT_NAME = re.compile(rf"^{SEGMENT_PREFIX}(\d+)$")
ENV_ELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
ENV_ELASTIC_RESTARTS = "TORCHELASTIC_RESTART_COUNT"


def segment_dir(root: Path, index: int) -> Path:
    return root if index == 0 else root / f"{SEGMENT_PREFIX}{index}"


def segment_indices(root: Path) -> list[int]:
    """The segments recorded under `root` (0 being root itself, when it holds a run), in order."""
    found = [0] if (root / MANIFEST_FILE).is_file() else []
    try:
        for child in root.iterdir():
            m = _SEGMENT_NAME.match(child.name)
            if m and child.is_dir():
                found.append(int(m.group(1)))
    except OSError:
        pass
    return sorted(found)


def next_segment_index(root: Path) -> int:
    return max(segment_indices(root), default=-1) + 1


def existing_manifest(path: Path) -> dict[str, Any] | None:
    """The raw manifest of a run already at `path`, or None (none there, or unreadable)."""
    try:
        data = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def elastic_identity(environ: dict[str, str] | None = None) -> tuple[str | None, int]:
    """torchrun's run id (the same across its restarts) and how many restarts came before this one."""
    env = os.environ if environ is None else environ
    run_id = env.get(ENV_ELASTIC_RUN_ID) or None
    if run_id is not None and run_id.lower() == "none":
        run_id = None  # torchrun's default when no --rdzv-id is given: not an identity
    try:
        restarts = int(env.get(ENV_ELASTIC_RESTARTS) or 0)
    except ValueError:
        restarts = 0
    return run_id, restarts


def load_segments(path: str | os.PathLike[str]) -> list[Run]:
    """Every segment of the run at `path`, first to last; a run without segments is a list of one.

    Raises `RunRecordError` for the first segment as `load_run` does; a later segment that cannot be
    read is left out with a warning on the first, so one damaged segment never hides the others.
    """
    from tuneup.record.reader import RunRecordError, load_run
    from tuneup.record.remote import is_url

    first = load_run(path)
    # A run on object storage is read through a local copy, segments and all (load_run makes it).
    root = first.path if is_url(path) else Path(path)
    runs = [first]
    for index in segment_indices(root):
        if index == 0:
            continue
        try:
            runs.append(load_run(segment_dir(root, index)))
        except RunRecordError as exc:
            first.warnings.append(f"segment {index} left out: {exc}")
    return runs
