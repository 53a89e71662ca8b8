"""Where the run went, for a launching process that did not train: Lightning's `ddp_spawn` and `ddp_fork`
(and `torch.multiprocessing.spawn` in general) run the fit in worker processes, each with a pickled copy of
the session, and give the launching process back only metrics and weights. Rank 0's copy leaves the run
directory in a small file named by a token the copies share; the launching process's session reads it when
asked for `run_dir`."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path


class RunDirHandoff:
    def __init__(self) -> None:
        self._token = secrets.token_hex(8)
        self._creator_pid = os.getpid()

    @property
    def _path(self) -> Path:
        return Path(tempfile.gettempdir()) / f"tuneup-run-dir-{self._token}"

    @property
    def in_worker(self) -> bool:
        """True in a process that got this object by pickling (a spawned or forked worker)."""
        return os.getpid() != self._creator_pid

    def publish(self, run_dir: Path) -> None:
        """In a worker: leave the run directory for the launching process (a plain text file)."""
        if self.in_worker:
            with contextlib.suppress(OSError):
                self._path.write_text(str(run_dir), encoding="utf-8")

    def take(self) -> Path | None:
        """In the launching process: the run directory a worker left, once; None if there is none."""
        if self.in_worker:
            return None
        try:
            text = self._path.read_text(encoding="utf-8").strip()
        except OSError:
            return None
        with contextlib.suppress(OSError):
            self._path.unlink()
        return Path(text) if text else None
