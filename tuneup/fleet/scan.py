"""Which run records are under a location, each with a cheap fingerprint of its files.

`tuneup index` walks local directories and object-storage prefixes (fsspec URLs) for run records: a
directory holding a manifest is a run, and nothing below it is another run (a resumed run keeps its later
segments inside it, and they are that run). The fingerprint says whether a run changed since it was last
indexed without reading a line of it: the names, sizes and modification times of its files (locally, one
`scandir` pass that finds the runs too), or the names, sizes and ETags (else modification or creation times)
that one `find(detail=True)` listing of the prefix returns.

Not `tuneup._cli_common.runs_under`: that looks two levels down for a RUN_DIR argument, while a fleet keeps
its runs as deep as its teams like (project/user/run), and the walk here takes each file's size and time
in the same pass.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneup.record.remote import filesystem, is_url
from tuneup.record.schema import MANIFEST_FILE

# How far below a given location a run may be: deep enough for any team's layout (project/user/date/run),
# shallow enough that a mistaken `tuneup index /` gives up rather than walking a whole disk.
MAX_DEPTH = 8


class ScanError(Exception):
    """A location that cannot be walked: missing, unreadable, or a URL with no fsspec backend."""


@dataclass(frozen=True, slots=True)
class FoundRun:
    key: str  # the run's location as the index keys it: an absolute path, or a URL under the one given
    fingerprint: str  # changes whenever a file of the run is added, removed, resized or rewritten


def _digest(entries: list[Any]) -> str:
    text = "\n".join(f"{name}\t{size}\t{stamp}" for name, size, stamp in sorted(entries))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def normalized_location(location: str) -> str:
    """A location as the index keys it: a URL without its trailing slash, a path made absolute."""
    if is_url(location):
        return location.rstrip("/")
    return str(Path(location).expanduser().absolute())


def scan(location: str) -> list[FoundRun]:
    """The runs at or under `location` (a directory or an fsspec URL), sorted by key; ScanError names a
    location that cannot be walked. A location that holds no run gives an empty list."""
    if is_url(location):
        return _scan_url(location)
    return _scan_local(Path(normalized_location(location)))


# -- local directories ---------------------------------------------------------------------------------


def _run_files(run_dir: str) -> list[tuple[str, int, int]]:
    """(relative name, size, mtime in ns) of every file of the run, segments included."""
    entries: list[tuple[str, int, int]] = []
    stack = [(run_dir, "")]
    while stack:
        path, rel = stack.pop()
        with os.scandir(path) as it:
            for entry in it:
                name = f"{rel}{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, f"{name}/"))
                elif entry.is_file():
                    st = entry.stat()
                    entries.append((name, st.st_size, st.st_mtime_ns))
    return entries


def _scan_local(root: Path) -> list[FoundRun]:
    if not root.exists():
        raise ScanError(f"{root} does not exist; pass a run directory or a directory of runs")
    if not root.is_dir():
        raise ScanError(f"{root} is a file; pass a run directory or a directory of runs")
    found: list[FoundRun] = []
    stack = [(str(root), 0)]
    while stack:
        path, depth = stack.pop()
        try:
            if os.path.isfile(os.path.join(path, MANIFEST_FILE)):
                found.append(FoundRun(path, _digest(_run_files(path))))
                continue
            if depth >= MAX_DEPTH:
                continue
            with os.scandir(path) as it:
                # Hidden directories (.git, a report's scratch directory) hold no run a user means.
                stack.extend(
                    (e.path, depth + 1)
                    for e in it
                    if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")
                )
        except OSError as exc:
            if path == str(root):
                raise ScanError(f"cannot read {root}: {exc.strerror or exc}") from None
            # A run that vanished or cannot be listed mid-walk: load_run says why when it is read.
            continue
    return sorted(found, key=lambda r: r.key)


# -- object storage ------------------------------------------------------------------------------------

# What a listing says of an object that changes when it is rewritten, in the order trusted: S3's and GCS's
# ETag (a content hash), else a modification time, else (memory://) the time it was created.
_STAMPS = ("ETag", "etag", "md5Hash", "mtime", "LastModified", "last_modified", "updated", "created")


def _stamp(info: dict[str, Any]) -> Any:
    for key in _STAMPS:
        value = info.get(key)
        if value is not None:
            return value
    return None


def _scan_url(url: str) -> list[FoundRun]:
    url = url.rstrip("/")
    try:
        fs, root = filesystem(url)
    except ValueError as exc:
        raise ScanError(str(exc)) from None
    root = root.rstrip("/")
    try:
        fs.invalidate_cache()  # a listing cached earlier in this process would miss what came since
        listing = fs.find(root, detail=True)
    except Exception as exc:  # no credentials, no bucket, no network: one line, named
        raise ScanError(f"cannot list {url}: {type(exc).__name__}: {exc}") from None
    objects: dict[str, dict[str, Any]] = {}
    for name, info in listing.items():
        rel = name.rstrip("/")[len(root) :].strip("/") if name.startswith(root) else None
        if rel is not None and info.get("type", "file") != "directory":
            objects[rel] = info
    # A run is the shallowest directory holding a manifest: deeper manifests are its segments.
    run_dirs = sorted(
        {rel.rpartition("/")[0] for rel in objects if rel.rpartition("/")[2] == MANIFEST_FILE},
        key=lambda d: (d.count("/"), d),
    )
    roots: list[str] = []
    for d in run_dirs:
        if d.count("/") >= MAX_DEPTH:
            continue
        if not any(d == r or d.startswith(f"{r}/") or r == "" for r in roots):
            roots.append(d)
    files: dict[str, list[tuple[str, Any, Any]]] = {r: [] for r in roots}
    owners = frozenset(roots)
    for rel, info in objects.items():
        owner = _owning_run(rel, owners)
        if owner is not None:
            inside = rel[len(owner) :].lstrip("/")
            files[owner].append((inside, info.get("size"), _stamp(info)))
    found = [FoundRun(f"{url}/{r}" if r else url, _digest(entries)) for r, entries in files.items()]
    return sorted(found, key=lambda r: r.key)


def _owning_run(rel: str, roots: frozenset[str]) -> str | None:
    """The run directory (of `roots`, none inside another) that object `rel` belongs to, if any."""
    parts = rel.split("/")
    for depth in range(len(parts) - 1, -1, -1):
        candidate = "/".join(parts[:depth])
        if candidate in roots:
            return candidate
    return None
