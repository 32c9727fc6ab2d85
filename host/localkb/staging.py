"""Work in progress that must leave no trace if the process dies: a private folder per kind of
job, each job holding an flock on its own lock file for as long as it runs.

``Staging(root / "imports").job(name)`` gives a job folder entry (lock held); ``sweep`` removes
the files of every job whose lock nobody holds any more (its process was killed), so the next
open of the store finds them gone. A lock file is created under a temporary name, locked, and
only then renamed into place, so a sweeper can never take the lock of a job just starting.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from localkb.perms import create_private_file

_STALE_TMP_SECONDS = 3600


class Staging:
    """One folder of jobs (``<data dir>/imports``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    @contextlib.contextmanager
    def job(self, name: str) -> Iterator[Path]:
        """Hold the lock of job ``name`` and yield the path its files start with; always cleaned up."""
        tmp = self.folder / f".{name}.{uuid.uuid4().hex[:8]}.lock.tmp"
        fd = create_private_file(tmp)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.replace(tmp, self.folder / f"{name}.lock")
            yield self.folder / name
        finally:
            self._remove(name)
            os.close(fd)
            tmp.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # not empty: another job is running
                self.folder.rmdir()

    def _remove(self, name: str) -> None:
        for path in self.folder.glob(f"{name}*"):
            if path.name != f"{name}.lock":
                path.unlink(missing_ok=True)
        (self.folder / f"{name}.lock").unlink(missing_ok=True)

    def sweep(self) -> list[str]:
        """Remove what killed jobs left; returns their names."""
        if not self.folder.is_dir():
            return []
        swept = []
        for lock in self.folder.glob("*.lock"):
            name = lock.name[: -len(".lock")]
            try:
                fd = os.open(lock, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue  # its job is running
            try:
                self._remove(name)
                swept.append(name)
            finally:
                os.close(fd)
        locked = {p.name[: -len(".lock")] for p in self.folder.glob("*.lock")}
        cutoff = time.time() - _STALE_TMP_SECONDS
        for path in self.folder.iterdir():
            name = path.name.split(".", 1)[0]
            orphan = not path.name.endswith(".lock") and not path.name.startswith(".") \
                and name not in locked
            stale_tmp = path.name.endswith(".lock.tmp") and path.stat().st_mtime < cutoff
            if orphan or stale_tmp:
                path.unlink(missing_ok=True)
                swept.append(name)
        return swept


def import_staging(data_dir: Path) -> Staging:
    """Where ``.awkb`` imports stage their rows: ``<data dir>/imports`` of the local store or of a
    team server, swept when either starts (a killed import's files go with it)."""
    return Staging(Path(data_dir) / "imports")
