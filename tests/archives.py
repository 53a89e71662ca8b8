"""The tests' own archives of recorded runs (tests/data/*.tgz), unpacked the same way everywhere."""

from __future__ import annotations

import tarfile
from collections.abc import Sequence
from pathlib import Path


def extract_all(tar: tarfile.TarFile, out: Path, members: Sequence[tarfile.TarInfo] | None = None) -> None:
    """`tar.extractall` with the "data" filter (no absolute paths, no links out of `out`) where tarfile has
    it: it came in 3.11.4 and 3.10.12, and Debian's python3.11, which `make` prefers, is 3.11.2. These
    archives are the project's own, so unfiltered extraction there is as safe as their commits."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(out, members=members, filter="data")
    else:
        tar.extractall(out, members=members)
