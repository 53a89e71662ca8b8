"""Where a run is recorded: a new directory (local or on object storage), or the next segment of the run
a restarted job began; and the marker by which the other ranks check that they see the same place.

Rank 0 chooses (`choose_run_dir`) and marks it (`mark_run_dir`) before telling the other ranks; each of them
checks the mark (`warn_if_not_shared`). A directory that already holds a run is never written into again:
a reused name gets a numbered sibling.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneup._log import first_time, warn_once
from tuneup.record.remote import bounded, is_url, join_url, put_text
from tuneup.record.remote import exists as remote_exists
from tuneup.record.schema import ENV_RUN_DIR, MANIFEST_FILE, RUN_MARKER_FILE, new_run_id
from tuneup.record.segments import elastic_identity, existing_manifest, next_segment_index, segment_dir

# An unreachable store must not hold the setup for long: the marker's put and check wait this long at most.
MARKER_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class RunPlace:
    """Where this run is recorded: a directory or a URL, the run's id, and which segment of the run this
    is (None: its first)."""

    location: str
    run_id: str
    segment: dict[str, Any] | None = None


def choose_run_dir(named: str | None, default_root: str) -> RunPlace:
    """A new run, or, after a torchrun restart, the next segment of the run the first attempt began
    (torchrun's run id is the same across its restarts). `named`: the directory asked for (None: the
    environment's `TUNEUP_DIR`, else `<default_root>/tuneup/<run id>`)."""
    run_id = new_run_id()
    elastic_id, restarts = elastic_identity()
    # An explicit directory, then the one `tuneup bench` gives each run through the environment.
    named = named or os.environ.get(ENV_RUN_DIR) or None
    if is_url(named) or (named is None and is_url(default_root)):
        # Object storage: a new run every time (a torchrun restart or a resumed fit starts another).
        if named is not None:
            # Never two runs in one place; a store that does not answer in time is taken as free.
            taken = bounded(lambda: remote_exists(join_url(named, MANIFEST_FILE)), MARKER_TIMEOUT_S, False)
            url = f"{named.rstrip('/')}-{run_id}" if taken else named
            return RunPlace(url, f"{url.rstrip('/').rpartition('/')[2]}-{run_id}")
        return RunPlace(join_url(default_root, "tuneup", run_id), run_id)
    dirpath = Path(named) if named is not None else None
    root = Path(default_root)
    if dirpath is None and elastic_id is not None:
        dirpath = root / "tuneup" / f"elastic-{elastic_id}"
    if dirpath is not None and elastic_id is not None:
        earlier = existing_manifest(dirpath)
        if earlier is not None and earlier.get("elastic_run_id") == elastic_id:
            index = next_segment_index(dirpath)
            segment = {"index": index, "reason": "restart", "restart_count": restarts}
            return RunPlace(str(segment_dir(dirpath, index)), str(earlier.get("run_id")), segment)
    if dirpath is not None:
        run_dir = free_run_dir(dirpath)
        # A directory the user named ("run", "exp42") is not an id: the id names this run anywhere.
        return RunPlace(str(run_dir), f"{run_dir.name}-{run_id}")
    return RunPlace(str(root / "tuneup" / run_id), run_id)


def free_run_dir(base: Path) -> Path:
    """`base`, or its first numbered sibling that is free: never two runs in one directory."""
    if not (base / MANIFEST_FILE).exists() and not any(base.glob("rank-*")):
        return base
    n = 1
    while (base.parent / f"{base.name}-{n}").exists():
        n += 1
    return base.parent / f"{base.name}-{n}"


def segment_root(run_dir: Path, index: int) -> Path:
    """The run's own directory, given one of its segments' directories."""
    return run_dir.parent if index > 0 else run_dir


def mark_run_dir(run_dir: str, run_id: str) -> None:
    """Rank 0 leaves a marker in the run directory before telling the other ranks where it is: a rank
    that cannot see it is writing somewhere rank 0's record will not have."""

    def mark() -> None:
        if is_url(run_dir):
            put_text(join_url(run_dir, RUN_MARKER_FILE), run_id + "\n")
            return
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / RUN_MARKER_FILE).write_text(run_id + "\n", encoding="utf-8")

    try:
        bounded(mark, MARKER_TIMEOUT_S, default=None, raise_errors=True)
    except Exception as exc:  # the writer (or the upload) will say why it cannot write there
        warn_once("run-marker", f"cannot mark the run directory {run_dir} ({type(exc).__name__}: {exc})")


def marked(run_dir: str) -> bool:
    if is_url(run_dir):
        return remote_exists(join_url(run_dir, RUN_MARKER_FILE))
    return (Path(run_dir) / RUN_MARKER_FILE).exists()


def unmark_run_dir(run_dir: Path) -> None:
    """Take the marker back from a run directory left unused, and the directory with it if it is empty."""
    with contextlib.suppress(OSError):  # a spool holds no marker: nothing to take back
        (run_dir / RUN_MARKER_FILE).unlink()
        run_dir.rmdir()


def warn_if_not_shared(run_dir: str, rank: int, hosts: list[str] | None) -> dict[str, Any] | None:
    """A rank that cannot see the marker rank 0 left writes to a directory of the same name on its own
    disk (a node without rank 0's filesystem, or a relative path under another working directory): rank
    0's record will miss it. Said once, with the fix; returns the event's fields for the record, or None
    when the directory is shared."""
    if bounded(lambda: marked(run_dir), MARKER_TIMEOUT_S, default=False):
        return None
    host = socket.gethostname()
    host0 = hosts[0] if hosts else None
    where = f"rank 0 (host {host0})" if host0 else "rank 0"
    warn_once(
        "run-dir-not-shared",
        f"rank {rank} on host {host} cannot see the run directory {run_dir} that {where} chose: "
        "this node's ranks record to their own disk, and the run's report will list them as missing. "
        "Record to a path every node shares (a network filesystem, given as an absolute path in "
        "dirpath= or TUNEUP_DIR) or to object storage (an s3://, gs://... URL), or copy this node's "
        "rank-* directories into the run directory after the job.",
    )
    return {"rank": rank, "host": host, "rank0_host": host0, "run_dir": str(run_dir)}


def print_closing_line(run_dir: Path, url: str | None) -> None:
    """Where the record went, once per run directory. Printed, not logged: Python shows no INFO record
    unless the user configured logging, and this one line is how a user learns where the record went."""
    if first_time(f"wrote:{run_dir}"):
        where = url or run_dir
        spool = f" (local copy: {run_dir})" if url else ""
        print(
            f"tuneup: run record written to {where}{spool}; report it with: tuneup report {where}",
            file=sys.stderr,
            flush=True,
        )
