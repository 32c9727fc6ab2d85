"""A lock file held with flock: one holder at a time across threads and processes."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class FileLock:
    """Re-entrant within a thread (RLock), exclusive across processes (flock on the file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._rlock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._rlock:
            if self._depth == 0:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._fd = fd
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._fd is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                    os.close(self._fd)
                    self._fd = None


class StripedLocks:
    """Per-key exclusion across processes: flock on one of ``stripes`` files chosen by the key.

    One instance belongs to one job: it may hold several stripes at once, and two keys of
    the same job that share a stripe share the hold (the job never works on one key twice
    at a time). Acquired on one thread and released on another, so no thread-bound lock.
    ``acquire`` never blocks; a caller that must wait polls it while holding nothing else,
    which is what keeps two jobs taking keys in different orders from deadlocking.
    """

    def __init__(self, folder: Path, stripes: int = 4096) -> None:
        self.folder = folder
        self.stripes = stripes
        self._held: dict[int, list[int]] = {}  # stripe -> [fd, holds]
        self._mutex = threading.Lock()

    def _stripe(self, key: str) -> int:
        import zlib

        return zlib.crc32(key.encode("utf-8")) % self.stripes

    def acquire(self, key: str) -> bool:
        """Take ``key``'s stripe if no other job holds it; True when this job now holds it."""
        stripe = self._stripe(key)
        with self._mutex:
            held = self._held.get(stripe)
            if held is not None:
                held[1] += 1
                return True
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.folder / f"{stripe:04x}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            self._held[stripe] = [fd, 1]
            return True

    def release(self, key: str) -> None:
        stripe = self._stripe(key)
        with self._mutex:
            held = self._held.get(stripe)
            if held is None:
                return
            held[1] -= 1
            if held[1] == 0:
                del self._held[stripe]
                fcntl.flock(held[0], fcntl.LOCK_UN)
                os.close(held[0])

    def release_all(self) -> None:
        with self._mutex:
            for fd, _n in self._held.values():
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            self._held.clear()


def try_lock(path: Path) -> int | None:
    """flock ``path`` without waiting: the descriptor that holds it, or None if another holds it.

    flock belongs to the open file, so a second holder in the same process (another thread)
    is refused too; the kernel releases it when its holder dies, kill -9 included.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
