"""A run recorded to object storage: written to a local spool, and uploaded from there off the training
thread every flush interval (tuneup.record.remote). This rank's files go up, and rank 0's manifest."""

from __future__ import annotations

from pathlib import Path

from tuneup._log import warn_once
from tuneup.record.remote import Mirror
from tuneup.record.schema import MANIFEST_FILE, RUN_MARKER_FILE, rank_dir_name
from tuneup.record.writer import RankWriter


def start_mirror(spool: Path, url: str, rank: int, writer: RankWriter, interval_s: float) -> Mirror | None:
    """The mirror uploading `spool` to `url`, started; None (said once) where it cannot (a missing fsspec
    backend: the spool keeps the record)."""
    paths = [rank_dir_name(rank)] + ([MANIFEST_FILE, RUN_MARKER_FILE] if rank == 0 else [])
    try:
        mirror = Mirror(spool, url, paths, interval_s=interval_s)
        mirror.start()
        writer.after_flush = mirror.wake  # each flush goes up as its own chunks
        return mirror
    except Exception as exc:
        warn_once(
            "mirror",
            f"cannot upload the run record to {url} ({type(exc).__name__}: {exc}); it stays in {spool}",
        )
        return None
