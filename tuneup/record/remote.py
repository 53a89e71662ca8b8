"""Run directories on object storage (fsspec URLs: `s3://`, `gs://`, `abfs://`, `memory://`, ...).

Object stores cannot append, and a node that is reclaimed takes its disk with it. So each rank writes its
record locally, as always (a spool directory), and `Mirror` copies it to the URL from a thread of its own,
every flush interval and once more at close:

- an append-only stream (`*.jsonl`) goes up as whole, immutable chunks, `<file>.chunks/<seq>.jsonl`, each
  the complete lines written since the last one: an object is never rewritten, and a killed node loses at
  most what it wrote since its last upload;
- a small whole-file record (`manifest.json`, `info.json`, the run marker) is put whole whenever it
  changed (a put replaces an object in one piece).

Uploads are retried with backoff; after `MAX_FAILED_SYNCS` failed rounds in a row the mirror stops,
warns once, and names the spool, which keeps the whole record. Nothing here runs on the training thread
except `close()`, which waits at most `close_timeout_s`.

`materialize(url)` is the reader's side: it lays the objects out as a local run directory (chunks
concatenated in order), which `load_run` reads as any other. Credentials are the fsspec backend's own
chains (environment, profiles, instance roles); tuneup never records or prints them.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuneup._log import warn_once

# A URL's scheme, two characters at least (so that a Windows drive, "C:/", is a path). file:// is a path.
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")
CHUNKS_SUFFIX = ".chunks"
MAX_FAILED_SYNCS = 3
RETRY_DELAYS_S = (0.5, 2.0)


def is_url(location: Any) -> bool:
    if not isinstance(location, (str, os.PathLike)):
        return False
    match = _URL.match(os.fspath(location))
    return match is not None and match.group(1).lower() != "file"


def join_url(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts)])


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, its path) of `url`; a missing backend is named with its package."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise ValueError(
            f"cannot open {url}: {exc} (install the fsspec backend for it, e.g. s3fs for s3://)"
        ) from exc


def spool_dir(run_id: str) -> Path:
    """Where a URL run's record is written on this node before it is uploaded: one per run, shared by the
    node's ranks (each writes its own rank directory)."""
    root = Path(os.environ.get("TUNEUP_SPOOL", "")) if os.environ.get("TUNEUP_SPOOL") else None
    return (root or Path(tempfile.gettempdir()) / "tuneup-spool") / run_id


class Mirror:
    """Copies the files of one rank (and, for rank 0, the run's own) from a spool to a URL."""

    def __init__(
        self, spool: Path, url: str, paths: list[str], interval_s: float, close_timeout_s: float = 10.0
    ) -> None:
        self.spool = spool
        self.url = url
        self.paths = paths  # relative to the spool: files, or directories whose files are mirrored
        self.interval_s = interval_s
        self.close_timeout_s = close_timeout_s
        self.fs, self.root = filesystem(url)
        self._offsets: dict[str, int] = {}  # .jsonl: bytes uploaded so far
        self._chunks: dict[str, int] = {}  # .jsonl: chunks uploaded so far
        self._stamps: dict[str, tuple[int, int]] = {}  # whole files: (mtime_ns, size) last uploaded
        self._failed_syncs = 0
        self._last_error: str | None = None
        self.stopped = False  # gave up: the spool keeps the record
        self.uploaded_bytes = 0
        self._lock = threading.Lock()  # one sync at a time (the thread's, close's)
        self._wake = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the thread ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tuneup-mirror", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Upload now (after a flush), on the mirror's thread: returns at once."""
        self._wake.set()

    def _run(self) -> None:
        while not self._done.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._done.is_set():
                return
            self.sync()

    def close(self) -> None:
        """The last upload, after the writer's last flush. Waits at most close_timeout_s in all, and not
        at all for a store that has been failing: its uploads would most likely fail again, slowly."""
        deadline = time.monotonic() + self.close_timeout_s
        self._done.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.close_timeout_s)
            if self._thread.is_alive():
                self._give_up(f"an upload still ran after {self.close_timeout_s:g} s")
                return
        if self.stopped or self._failed_syncs:
            self._give_up(self._last_error or "the store failed")
            return
        if bounded(self.sync, max(0.0, deadline - time.monotonic()), default=None) is None:
            self._give_up(f"the last upload did not finish in {self.close_timeout_s:g} s")

    def _give_up(self, why: str) -> None:
        self.stopped = True
        warn_once(
            f"mirror-stopped:{self.url}",
            f"cannot upload the run record to {self.url} ({why}); uploads stop, training goes on, and the "
            f"whole record stays in {self.spool}",
        )

    # -- one round -----------------------------------------------------------------------------------

    def sync(self) -> bool:
        """Upload what is new; returns whether the round succeeded. Never raises."""
        if self.stopped:
            return False
        with self._lock:
            error: Exception | None = None
            for attempt, delay in enumerate((0.0, *RETRY_DELAYS_S)):
                if delay:
                    time.sleep(delay)
                try:
                    self._sync_once()
                    self._failed_syncs = 0
                    return True
                except Exception as exc:
                    error = exc
                    if attempt == len(RETRY_DELAYS_S):
                        break
            self._failed_syncs += 1
            self._last_error = f"{type(error).__name__}: {error}"
            if self._failed_syncs >= MAX_FAILED_SYNCS:
                self._give_up(self._last_error)
            return False

    def _files(self) -> list[Path]:
        out = []
        for rel in self.paths:
            path = self.spool / rel
            if path.is_dir():
                out.extend(sorted(p for p in path.iterdir() if p.is_file()))
            elif path.is_file():
                out.append(path)
        return out

    def _sync_once(self) -> None:
        for path in self._files():
            rel = path.relative_to(self.spool).as_posix()
            if path.suffix == ".jsonl":
                self._upload_new_lines(path, rel)
            else:
                self._upload_if_changed(path, rel)

    def _upload_new_lines(self, path: Path, rel: str) -> None:
        offset = self._offsets.get(rel, 0)
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
        # Whole lines only: a line being written is left for the next round.
        end = data.rfind(b"\n") + 1
        if end == 0:
            return
        seq = self._chunks.get(rel, 0)
        self.fs.pipe_file(f"{self.root}/{rel}{CHUNKS_SUFFIX}/{seq:08d}.jsonl", data[:end])
        self._offsets[rel] = offset + end
        self._chunks[rel] = seq + 1
        self.uploaded_bytes += end

    def _upload_if_changed(self, path: Path, rel: str) -> None:
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        if self._stamps.get(rel) == stamp:
            return
        data = path.read_bytes()
        self.fs.pipe_file(f"{self.root}/{rel}", data)
        self._stamps[rel] = stamp
        self.uploaded_bytes += len(data)


def bounded(fn: Callable[[], Any], timeout_s: float, default: Any, raise_errors: bool = False) -> Any:
    """fn() on a thread of its own, waited for at most timeout_s: `default` after that (or on an error,
    unless raise_errors). For calls to a store that may not answer, which must not hold training."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="tuneup-bounded", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if errors and raise_errors:
        raise errors[0]
    return result[0] if result else default


def exists(url: str) -> bool:
    try:
        fs, path = filesystem(url)
        return bool(fs.exists(path))
    except Exception:
        return False


def put_text(url: str, text: str) -> None:
    fs, path = filesystem(url)
    fs.pipe_file(path, text.encode("utf-8"))


def materialize(url: str, into: Path | None = None) -> Path:
    """The run at `url` laid out as a local run directory (chunks concatenated in their order); returns
    the directory, a fresh temporary one unless `into` is given."""
    fs, root = filesystem(url)
    root = root.rstrip("/")
    try:
        fs.invalidate_cache()  # a listing cached earlier in this process would miss what came since
        objects = sorted(fs.find(root))
    except Exception as exc:
        raise ValueError(f"cannot list {url}: {type(exc).__name__}: {exc}") from exc
    if not objects:
        raise FileNotFoundError(url)
    local = into or Path(tempfile.mkdtemp(prefix="tuneup-run-"))
    chunked: dict[str, list[str]] = {}
    for obj in objects:
        rel = obj[len(root) :].lstrip("/")
        parent = rel.rpartition("/")[0]
        if parent.endswith(CHUNKS_SUFFIX):
            chunked.setdefault(parent[: -len(CHUNKS_SUFFIX)], []).append(obj)
            continue
        target = local / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(fs.cat_file(obj))
    for rel, parts in chunked.items():
        target = local / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as out:
            for obj in sorted(parts):  # zero-padded sequence numbers sort in upload order
                out.write(fs.cat_file(obj))
    return local
